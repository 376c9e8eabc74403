"""The sessions the operator's bulk commands and prune select: the store's own guards, seen
before acting, so that ``--dry-run`` lists what the action would really touch."""

from __future__ import annotations

import pytest

from flowscope.cli.session_ops import prune_candidates
from flowscope.cli.views import parse_duration
from flowscope.ownership import this_process
from flowscope.store import SqliteEventStore
from flowscope.store.testing import finished_session


def test_prune_lists_no_finished_session_a_live_owner_holds(tmp_path):
    """The store's prune guard skips a session with a live owner: the dry run lists only
    what the prune deletes, and the prune deletes all it listed."""
    store = SqliteEventStore(tmp_path / "p.db")
    for sid in ("free", "held"):
        finished_session(store, sid, "completed")
    store.acquire("held", this_process(), 60.0)  # a live process holds it (an operator's resume)
    listed = [c.session_id for c in prune_candidates(store, 0.0)]
    assert listed == ["free"]
    assert store.delete_sessions(listed) == ["free"] and store.has_session("held")


@pytest.mark.parametrize("text", ["9" * 400 + "d", "1e308d", "inf"])
def test_a_duration_no_clock_can_hold_is_refused(text):
    with pytest.raises(ValueError, match="not a duration|longer than a century"):
        parse_duration(text)
