"""A bridge's heartbeat thread writes the heartbeats of every session in flight in one
store call per round (one transaction on SQLite), never one call per session, and a
failed round loses nothing but that round."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from flowscope.adapters._heartbeats import BridgeHeartbeats
from flowscope.events import NodeStarted, RunStarted
from flowscope.store.sqlite import SqliteEventStore
from flowscope.store.testing.helpers import ev, node_ev, run_of
from waiting import wait_for


class CountingStore(SqliteEventStore):
    """Records the heartbeat calls it is given (from the bridge's thread)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.lock = threading.Lock()
        self.single: list[str] = []
        self.rounds: list[set[str]] = []
        self.fail = False

    def heartbeat(self, session_id: str, paths: Any, ts: Any = None) -> None:
        with self.lock:
            self.single.append(session_id)
        super().heartbeat(session_id, paths, ts)

    def heartbeat_many(self, beats: Any, ts: Any = None) -> None:
        with self.lock:
            self.rounds.append(set(beats))
        if self.fail:
            raise OSError("disk I/O error")
        super().heartbeat_many(beats, ts)


def started(store: SqliteEventStore, sid: str, path: str, ts: float) -> None:
    store.append(
        sid, [ev(RunStarted, sid=sid, workflow="wf", ts=ts), node_ev(NodeStarted, path, ts, sid=sid)], 0
    )


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_one_round_beats_every_session_in_flight_in_one_store_call(tmp_path):
    store = CountingStore(str(tmp_path / "f.db"))
    sessions = [f"t{i}" for i in range(20)]
    t0 = time.time() - 60
    for sid in sessions:
        started(store, sid, "graph@1/step@1", t0)
    beats = BridgeHeartbeats(store, interval=0.05)
    try:
        for sid in sessions:
            beats.track(sid, "graph@1/step@1", True)
        wait_for(lambda: any(r == set(sessions) for r in list(store.rounds)))
    finally:
        beats.close()
    assert store.single == []  # never a session at a time
    assert set(sessions) in store.rounds  # the 20 in one call (a round while tracking has fewer)
    assert all(run_of(store, "graph@1/step@1", sid).heartbeat_at > t0 + 30 for sid in sessions)
    store.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_failed_round_is_logged_and_the_next_round_beats_again(tmp_path, caplog):
    store = CountingStore(str(tmp_path / "f.db"))
    t0 = time.time() - 60
    started(store, "t1", "graph@1/step@1", t0)
    store.fail = True
    beats = BridgeHeartbeats(store, interval=0.05)
    try:
        beats.track("t1", "graph@1/step@1", True)
        wait_for(lambda: len(store.rounds) >= 2)  # the thread lives on after a failure
        assert run_of(store, "graph@1/step@1", "t1").heartbeat_at == pytest.approx(t0)
        store.fail = False
        wait_for(lambda: run_of(store, "graph@1/step@1", "t1").heartbeat_at > t0 + 30)
    finally:
        beats.close()
    failed = [r for r in caplog.records if "heartbeats failed for 1 sessions" in r.getMessage()]
    assert failed and "OSError: disk I/O error" in failed[0].getMessage()
    store.close()


def test_a_failed_heartbeat_of_one_session_is_logged_as_one_redacted_line(tmp_path, caplog):
    store = CountingStore(str(tmp_path / "f.db"))
    started(store, "t1", "graph@1/step@1", time.time())

    def refuse(session_id: str, paths: Any, ts: Any = None) -> None:
        raise OSError("cannot write /home/alice/secret/f.db")

    store.heartbeat = refuse  # type: ignore[method-assign]
    BridgeHeartbeats(store, interval=0).beat("t1", ["graph@1/step@1"])  # never raises
    (line,) = [r.getMessage() for r in caplog.records if "heartbeat failed for session t1" in r.getMessage()]
    assert "OSError: cannot write" in line and "alice" not in line
    store.close()
