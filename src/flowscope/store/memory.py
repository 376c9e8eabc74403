"""An in-memory :class:`EventStore`: for tests, benchmarks and throwaway runs."""

from __future__ import annotations

import time
from typing import Iterable, Sequence

from ..events import Event
from .base import FINISHED_SESSION_STATUSES, EventStore, NodeRun, SessionInfo, number_events
from ..fold import OPEN_STATES, WorkflowState

__all__ = ["MemoryEventStore"]


class MemoryEventStore(EventStore):
    """Keeps each session's events in a list; folds them into its state when asked.

    The fold is lazy: the runner folds every event it emits into its own state already,
    so folding again on every append would double the per-event cost of a run on the
    memory store. ``sessions()``, ``node_runs()``, ``open_runs()`` and ``heartbeat()``
    catch the fold up first.
    """

    def __init__(self) -> None:
        self._events: dict[str, list[Event]] = {}
        self._folds: dict[str, WorkflowState] = {}
        self._folded: dict[str, int] = {}  # how many of a session's events are folded

    @property
    def _states(self) -> dict[str, WorkflowState]:
        for sid in self._events:
            self._state(sid)
        return self._folds

    def _state(self, session_id: str) -> WorkflowState | None:
        log = self._events.get(session_id)
        if log is None:
            return None
        state = self._folds.get(session_id)
        if state is None:
            state = self._folds[session_id] = WorkflowState(session_id=session_id)
        done = self._folded.get(session_id, 0)
        if done < len(log):
            apply = state.apply
            for e in log[done:]:
                apply(e)
            self._folded[session_id] = len(log)
        return state

    def append(self, session_id: str, events: Sequence[Event], expected_last_seq: int) -> list[Event]:
        log = self._events.get(session_id)
        numbered = number_events(session_id, events, len(log) if log else 0, expected_last_seq)
        if not numbered:
            return numbered
        if log is None:
            log = self._events[session_id] = []
        log.extend(numbered)
        return numbered

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        return list(self._events.get(session_id, ())[after_seq:])

    def last_seq(self, session_id: str) -> int:
        return len(self._events.get(session_id, ()))

    def sessions(self) -> list[SessionInfo]:
        out = [
            SessionInfo(sid, s.workflow, s.status, s.started_at, s.updated_at, s.last_seq, s.invocations)
            for sid, s in self._states.items()
        ]
        out.sort(key=lambda s: s.updated_at or 0.0, reverse=True)
        return out

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        state = self._state(session_id)
        if state is None:
            return
        now = time.time() if ts is None else ts
        for path in paths:
            ns = state.nodes.get(path)
            if ns is not None and ns.status == "running":
                ns.heartbeat_at = now

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        states = self._states
        sids = [session_id] if session_id is not None else list(states)
        return [
            NodeRun.from_state(sid, states[sid].workflow, ns)
            for sid in sids
            if sid in states
            for ns in states[sid].nodes.values()
        ]

    def open_runs(self) -> list[NodeRun]:
        runs = [r for r in self.node_runs() if r.status in OPEN_STATES]
        runs.sort(key=lambda r: r.started_at or 0.0)
        return runs

    # ------------------------------------------------------------------ pruning

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        deleted = []
        for sid in dict.fromkeys(session_ids):
            state = self._state(sid)
            if state is None or state.status not in FINISHED_SESSION_STATUSES:
                continue
            if any(ns.is_open for ns in state.nodes.values()):
                continue
            del self._events[sid]
            self._folds.pop(sid, None)
            self._folded.pop(sid, None)
            deleted.append(sid)
        return deleted
