"""The sessions the operator's bulk commands and prune select: the store's own guards, seen
before acting, so that ``--dry-run`` lists what the action would really touch; and the
store a dry run hands an action, which reads and never writes."""

from __future__ import annotations

import pytest

from flowscope.actions import cancel, retry
from flowscope.cli.session_ops import DryRunStore, WouldAct, prune_candidates
from flowscope.cli.views import parse_duration
from flowscope.errors import ResumeError
from flowscope.ownership import this_process
from flowscope.store import EventStore, SqliteEventStore
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


#: Every method of the store that changes it: a dry run must stop at each.
WRITES = (
    "append",
    "append_many",
    "append_and_release",
    "heartbeat",
    "heartbeat_many",
    "send",
    "take_in",
    "acquire",
    "acquire_new",
    "acquire_new_many",
    "renew",
    "renew_many",
    "release",
    "claim",
    "workers_seen",
    "set_exported_seq",
    "set_exported_seqs",
    "save_snapshot",
    "delete_sessions",
)


def test_a_dry_run_store_lets_the_stores_reads_through_and_stops_an_action_at_its_first_write(tmp_path):
    with SqliteEventStore(tmp_path / "d.db") as store:
        finished_session(store, "failed", "failed")
        finished_session(store, "done", "completed")
        before = {s.session_id: s.last_seq for s in store.sessions()}
        dry = DryRunStore(store)
        assert all(callable(getattr(EventStore, name, None)) for name in WRITES)
        assert not DryRunStore.READS & set(WRITES)
        assert all(hasattr(store, name) for name in DryRunStore.READS)  # no name the store lacks
        for name in WRITES:
            with pytest.raises(WouldAct):
                getattr(dry, name)
        with pytest.raises(WouldAct):  # every check of the action passed: its send is where it stops
            retry(dry, "failed")
        with pytest.raises(ResumeError, match="already completed"):  # the action's own refusal
            cancel(dry, "done")
        assert {s.session_id: s.last_seq for s in store.sessions()} == before
        assert store.inbox("failed") == []
