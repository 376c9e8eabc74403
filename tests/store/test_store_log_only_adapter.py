"""A third-party store that implements the event log role alone passes that role's contract.

``LogOnlyStore`` is what a user would write first: events as JSON text in a SQLite table
(``flowscope.events.encode``/``decode``), every projection the fold of the log
(``flowscope.fold.rebuild``). It has no leases, no inbox and no upkeep, and
``EventLogContract`` asks for none of them. An adapter that leaves out one method of a role
cannot be made at all: the role's ABC names what is missing.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence

import pytest

from flowscope.events import Event, RunSubmitted, decode, encode
from flowscope.fold import OPEN_STATES, rebuild
from flowscope.store.base import (
    EventLog,
    EventStore,
    Inbox,
    NodeRun,
    Ownership,
    SessionInfo,
    Upkeep,
    number_events,
)
from flowscope.store.testing import EventLogContract


class LogOnlyStore(EventLog):
    """The event log role over one SQLite table; projections folded from the log on read."""

    def __init__(self) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            "CREATE TABLE events (session_id TEXT, seq INTEGER, body TEXT, PRIMARY KEY (session_id, seq))"
        )
        self._beats: dict[tuple[str, str], float] = {}

    def append(
        self, session_id: str, events: Sequence[Event], expected_last_seq: int, *, epoch: int | None = None
    ) -> list[Event]:
        with self._db:  # one transaction: all the events or none
            numbered = number_events(session_id, events, self.last_seq(session_id), expected_last_seq)
            self._db.executemany(
                "INSERT INTO events VALUES (?, ?, ?)", [(session_id, e.seq, encode(e)) for e in numbered]
            )
        return numbered

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        rows = self._db.execute(
            "SELECT body FROM events WHERE session_id = ? AND seq > ? ORDER BY seq", (session_id, after_seq)
        )
        return [decode(body) for (body,) in rows]

    def last_seq(self, session_id: str) -> int:
        (seq,) = self._db.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?", (session_id,)
        ).fetchone()
        return int(seq)

    def _session_ids(self) -> list[str]:
        return [sid for (sid,) in self._db.execute("SELECT DISTINCT session_id FROM events")]

    def sessions(self) -> list[SessionInfo]:
        out = []
        for sid in self._session_ids():
            log = self.read(sid)
            s = rebuild(log)
            # submitted_at: the last RunSubmitted's (a retry queues the session again)
            submitted = next((e.ts for e in reversed(log) if isinstance(e, RunSubmitted)), None)
            out.append(
                SessionInfo(
                    sid,
                    s.workflow,
                    s.status,
                    s.started_at,
                    s.updated_at,
                    s.last_seq,
                    s.invocations,
                    submitted_at=submitted,
                )
            )
        return sorted(out, key=lambda s: s.updated_at or 0.0, reverse=True)

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        running = {r.path for r in self.node_runs(session_id) if r.status == "running"}
        for path in paths:
            if path in running:
                self._beats[(session_id, path)] = now

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        out = []
        for sid in [session_id] if session_id is not None else self._session_ids():
            s = rebuild(self.read(sid))
            for ns in s.nodes.values():
                beat = self._beats.get((sid, ns.path)) if ns.status == "running" else None
                if beat is not None:
                    ns.heartbeat_at = beat
                out.append(NodeRun.from_state(sid, s.workflow, ns))
        return out

    def open_runs(self) -> list[NodeRun]:
        return sorted(
            (r for r in self.node_runs() if r.status in OPEN_STATES), key=lambda r: r.started_at or 0.0
        )

    def close(self) -> None:
        self._db.close()


class TestLogOnlyStore(EventLogContract):
    def create_store(self) -> EventLog:
        return LogOnlyStore()


def test_a_log_only_store_is_not_a_whole_store() -> None:
    store = LogOnlyStore()
    assert isinstance(store, EventLog)
    assert not isinstance(store, (Ownership, Inbox, Upkeep, EventStore))


@pytest.mark.parametrize("role", [EventLog, Ownership, Inbox, Upkeep, EventStore])
def test_an_adapter_missing_a_method_of_its_role_cannot_be_made_and_is_told_which(role: type) -> None:
    abstract = sorted(role.__abstractmethods__)  # type: ignore[attr-defined]
    assert abstract, f"{role.__name__} has no abstract method: nothing would make an adapter implement it"
    left_out = abstract[0]
    # Every abstract method but one implemented: the ABC refuses the class and names the one.
    partial = type("Partial", (role,), {name: (lambda self, *a, **k: None) for name in abstract[1:]})
    with pytest.raises(TypeError, match=left_out):
        partial()


def test_the_roles_are_the_whole_port() -> None:
    """Every abstract method of EventStore belongs to exactly one role."""
    roles = (EventLog, Ownership, Inbox, Upkeep)
    own = {
        role: set(role.__abstractmethods__)
        - (set(EventLog.__abstractmethods__) if role is not EventLog else set())
        for role in roles
    }
    assert set().union(*own.values()) == set(EventStore.__abstractmethods__)
    for a in roles:
        for b in roles:
            if a is not b:
                assert not own[a] & own[b], (a.__name__, b.__name__)


def test_the_cli_listing_views_need_only_the_event_log() -> None:
    """``runs``, ``show`` and the retry history read a store that is a log and nothing else."""
    from flowscope.cli.history import retry_reasons
    from flowscope.cli.views import load_session, runs_rows, session_rows
    from flowscope.store.testing.helpers import SID, liveness_log

    store = LogOnlyStore()
    store.append(SID, liveness_log(), 0)
    rows = runs_rows(store)
    assert [r["session_id"] for r in rows] == [SID]
    assert rows[0]["node_runs"] == len(store.node_runs(SID)) > 0
    assert session_rows(store, store.sessions()) == rows
    assert load_session(store, SID).session_id == SID
    assert isinstance(retry_reasons(store, store.node_runs(SID)), dict)
