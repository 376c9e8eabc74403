"""The ``EventStore`` port: what the engine, the CLI and the collectors need from a store.

Methods are synchronous on purpose: an embedded SQLite call takes microseconds and
belongs on the event loop, not in a thread. Adapters: :mod:`.memory`, :mod:`.sqlite`;
:mod:`.testing` holds the contract every adapter must pass.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..errors import ConcurrencyConflict
from ..events import Event
from ..fold import OPEN_STATES, NodeState
from ..liveness import ORPHANED, OVERDUE, classify_open_run

__all__ = ["EventStore", "SessionInfo", "NodeRun", "OpenRunGroup", "number_events", "summarize_open_runs"]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session as the store lists it."""

    session_id: str
    workflow: str
    status: str
    started_at: float | None
    updated_at: float | None
    last_seq: int
    invocations: int


@dataclass(frozen=True, slots=True)
class NodeRun:
    """One row of the ``node_runs`` projection: the latest state of one node run."""

    session_id: str
    workflow: str
    node: str
    path: str
    kind: str
    status: str
    attempt: int
    retries: int
    recoveries: int
    started_at: float | None
    ended_at: float | None
    heartbeat_at: float | None
    error_code: str | None
    error_type: str | None
    job_deadline_at: float | None

    @classmethod
    def from_state(cls, session_id: str, workflow: str, ns: NodeState) -> "NodeRun":
        return cls(
            session_id=session_id,
            workflow=workflow,
            node=ns.node,
            path=ns.path,
            kind=ns.kind,
            status=ns.status,
            attempt=ns.attempt,
            retries=ns.retries,
            recoveries=ns.recoveries,
            started_at=ns.started_at,
            ended_at=ns.ended_at,
            heartbeat_at=ns.heartbeat_at,
            error_code=ns.error_code,
            error_type=ns.error_type,
            job_deadline_at=ns.job_deadline_at,
        )


@dataclass(frozen=True, slots=True)
class OpenRunGroup:
    """The open runs of one (workflow, node, state), aggregated.

    What :meth:`EventStore.open_run_summary` returns a list of: ``count`` runs, the
    earliest ``oldest_started_at``; ``orphaned`` counts ``running`` runs and ``overdue``
    counts ``waiting_job`` runs as :func:`flowscope.liveness.classify_open_run` names them.
    """

    workflow: str
    node: str
    state: str
    count: int
    oldest_started_at: float | None
    orphaned: int = 0
    overdue: int = 0


def summarize_open_runs(runs: Iterable[NodeRun], now: float, stale_after_s: float) -> list[OpenRunGroup]:
    """Fold ``NodeRun`` records (``store.open_runs()``) into :class:`OpenRunGroup` rows.

    The reference definition a store's ``open_run_summary`` must match; groups come in
    the order their first run comes.
    """
    # key -> [count, oldest_started_at, orphaned, overdue]
    acc: dict[tuple[str, str, str], list[Any]] = {}
    for r in runs:
        state = r.status
        if state not in OPEN_STATES:
            continue
        key = (r.workflow or "", r.node or "", state)
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0, None, 0, 0]
        a[0] += 1
        started = r.started_at
        if started is not None and (a[1] is None or started < a[1]):
            a[1] = started
        cls = classify_open_run(state, started, r.heartbeat_at, r.job_deadline_at, now, stale_after_s)
        if cls == ORPHANED:
            a[2] += 1
        elif cls == OVERDUE:
            a[3] += 1
    return [OpenRunGroup(wf, node, state, *a) for (wf, node, state), a in acc.items()]


def number_events(session_id: str, events: Sequence[Event], last_seq: int, expected_last_seq: int) -> list[Event]:
    """Check optimistic concurrency and give every event its ``seq``.

    Events that already carry a ``seq`` (the runner numbers its own) must continue the
    log without a gap; events with ``seq=0`` are numbered here.
    """
    if expected_last_seq != last_seq:
        raise ConcurrencyConflict(
            f"session {session_id!r} is at seq {last_seq}, not {expected_last_seq}: "
            "another process appended first; reload the session and retry"
        )
    out: list[Event] = []
    seq = last_seq
    for e in events:
        seq += 1
        if e.session_id != session_id:
            raise ValueError(f"event for session {e.session_id!r} appended to {session_id!r}")
        if e.seq == 0:
            e = dataclasses.replace(e, seq=seq)
        elif e.seq != seq:
            raise ValueError(f"event seq {e.seq} does not continue session {session_id!r} at {seq}")
        out.append(e)
    return out


class EventStore(ABC):
    """An append-only, per-session event log with a node-runs projection."""

    @abstractmethod
    def append(self, session_id: str, events: Sequence[Event], expected_last_seq: int) -> list[Event]:
        """Append ``events`` atomically if the session is at ``expected_last_seq``.

        Raises :class:`~flowscope.errors.ConcurrencyConflict` (writing nothing) otherwise.
        Returns the events as stored, each with its ``seq``.
        """

    @abstractmethod
    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        """The session's events with ``seq > after_seq``, in order."""

    @abstractmethod
    def last_seq(self, session_id: str) -> int:
        """The ``seq`` of the session's last event, 0 if it has none."""

    @abstractmethod
    def sessions(self) -> list[SessionInfo]:
        """Every session, most recently updated first."""

    @abstractmethod
    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        """Record that the runs at ``paths`` are alive (only runs still ``running`` change)."""

    @abstractmethod
    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        """Rows of the node-runs projection, for one session or all."""

    @abstractmethod
    def open_runs(self) -> list[NodeRun]:
        """Runs that are running, waiting for input or waiting for a job, oldest first."""

    def open_run_summary(self, now: float, stale_after_s: float) -> list[OpenRunGroup]:
        """Open runs aggregated per (workflow, node, state), for a metrics scrape.

        The default folds :meth:`open_runs` (:func:`summarize_open_runs`); a store with a
        query language answers it with one aggregate query and must give the same groups.
        """
        return summarize_open_runs(self.open_runs(), now, stale_after_s)

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        """Keep ``data``, the JSON of the session's state after event ``seq``, to speed up
        the next resume. Optional: a store that keeps none ignores it."""

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The last snapshot saved for the session as ``(seq, data)``, or None."""
        return None

    def has_session(self, session_id: str) -> bool:
        return self.last_seq(session_id) > 0

    def close(self) -> None:
        """Release resources; the store is not used afterwards."""

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
