"""An in-memory :class:`EventStore`: for tests, benchmarks and throwaway runs."""

from __future__ import annotations

import time
from typing import Iterable, Sequence

from ..events import Event
from .base import EventStore, NodeRun, SessionInfo, number_events
from .projection import OPEN_STATES, WorkflowState

__all__ = ["MemoryEventStore"]


class MemoryEventStore(EventStore):
    """Keeps each session's events in a list and its state folded as they arrive."""

    def __init__(self) -> None:
        self._events: dict[str, list[Event]] = {}
        self._states: dict[str, WorkflowState] = {}

    def append(self, session_id: str, events: Sequence[Event], expected_last_seq: int) -> list[Event]:
        log = self._events.get(session_id)
        numbered = number_events(session_id, events, len(log) if log else 0, expected_last_seq)
        if not numbered:
            return numbered
        if log is None:
            log = self._events[session_id] = []
            self._states[session_id] = WorkflowState(session_id=session_id)
        log.extend(numbered)
        apply = self._states[session_id].apply
        for e in numbered:
            apply(e)
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
        state = self._states.get(session_id)
        if state is None:
            return
        now = time.time() if ts is None else ts
        for path in paths:
            ns = state.nodes.get(path)
            if ns is not None and ns.status == "running":
                ns.heartbeat_at = now

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        sids = [session_id] if session_id is not None else list(self._states)
        return [
            NodeRun.from_state(sid, self._states[sid].workflow, ns)
            for sid in sids
            if sid in self._states
            for ns in self._states[sid].nodes.values()
        ]

    def open_runs(self) -> list[NodeRun]:
        runs = [r for r in self.node_runs() if r.status in OPEN_STATES]
        runs.sort(key=lambda r: r.started_at or 0.0)
        return runs
