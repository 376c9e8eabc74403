"""The ``EventStore`` port: what the engine, the CLI and the collectors need from a store.

Methods are synchronous on purpose: an embedded SQLite call takes microseconds and
belongs on the event loop, not in a thread. Adapters: :mod:`.memory`, :mod:`.sqlite`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import ConcurrencyConflict, StoreError
from ..events import Event
from ..fold import NodeState

__all__ = ["EventStore", "SessionInfo", "NodeRun", "number_events", "FINISHED_SESSION_STATUSES"]

#: Session statuses that are over for good: only such sessions may be deleted.
FINISHED_SESSION_STATUSES = ("completed", "failed", "cancelled")


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

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        """Keep ``data``, the JSON of the session's state after event ``seq``, to speed up
        the next resume. Optional: a store that keeps none ignores it."""

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The last snapshot saved for the session as ``(seq, data)``, or None."""
        return None

    # ------------------------------------------------------------------ pruning (flowscope prune)

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        """Delete whole sessions (log, projections, snapshot) in one transaction; return the
        ids deleted, in the order given.

        Only a session whose status is in :data:`FINISHED_SESSION_STATUSES` and that has no
        open run (running, waiting_input, waiting_job) is deleted; any other id, or one
        that does not exist, is skipped, so a racing resume never loses its log. A store
        that cannot delete raises :class:`~flowscope.errors.StoreError`.
        """
        raise StoreError(f"{type(self).__name__} cannot delete sessions")

    def storage_bytes(self) -> int | None:
        """Bytes the store's data occupies now (what ``delete_sessions`` frees), or None if
        the store cannot tell."""
        return None

    def has_session(self, session_id: str) -> bool:
        return self.last_seq(session_id) > 0

    def close(self) -> None:
        """Release resources; the store is not used afterwards."""

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
