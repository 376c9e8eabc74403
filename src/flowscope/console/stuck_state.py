"""What ``flowscope stuck`` says of one session, for its page: orphaned or overdue, and the fix.

A session's status hides both: a session whose worker died mid-run is still ``running``
(its owner is gone: ``stuck`` says orphaned, ``flowscope resume ID``), and one whose job
is past its deadline is still ``paused`` (``stuck`` says overdue, ``resume --job``). The
page shows the rows :func:`flowscope.cli.views.stuck_rows` gives for the session, so the
page, ``stuck`` and the attention tabs call a run the same thing by the one liveness rule
(:mod:`flowscope.liveness`); nothing here classifies a run itself.
"""

from __future__ import annotations

from typing import Any, cast

from ..cli import views
from ..fold import OPEN_STATES
from ..liveness import ORPHANED, OVERDUE
from ..store.base import FINISHED_SESSION_STATUSES, EventStore, NodeRun

__all__ = ["SHOWN", "session_stuck"]

#: The states of ``stuck`` a session page shows beside the status: those the status hides.
SHOWN = (ORPHANED, OVERDUE)


class _OneSession:
    """``store`` as :func:`~flowscope.cli.views.stuck_rows` reads it, its open runs
    narrowed to one session's (in the store's order: oldest first). ``stuck_rows`` reads
    every open run of the store (70,739 of them, 0.7 s, at a million sessions): a page of
    one session reads that session's runs alone. Everything else is the store's own."""

    def __init__(self, store: EventStore, session_id: str) -> None:
        self._store = store
        self._session_id = session_id

    def open_runs(self) -> list[NodeRun]:
        runs = [r for r in self._store.node_runs(self._session_id) if r.status in OPEN_STATES]
        # the store's order (``ORDER BY started_at``): a run not started yet sorts first
        return sorted(runs, key=lambda r: (r.started_at is not None, r.started_at or 0.0))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def session_stuck(
    store: EventStore, session_id: str, *, stale_after_s: float, prefix: str, now: float | None = None
) -> list[dict[str, Any]]:
    """The rows of ``flowscope stuck --older-than 0s --state orphaned --state overdue`` for
    ``session_id`` alone (the keys of ``STUCK_KEYS``, ``action`` the command to run), or
    none: a session that ended, or is unknown, reads no run."""
    info = store.session_info(session_id)
    if info is None or info.status in FINISHED_SESSION_STATUSES:  # no open run: nothing of it is stuck
        return []
    narrowed = cast(EventStore, _OneSession(store, session_id))
    return views.stuck_rows(narrowed, 0.0, stale_after_s, states=SHOWN, now=now, prefix=prefix)
