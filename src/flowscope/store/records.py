"""The records the store's roles pass: sessions, node runs, claims, workers, messages.

Frozen dataclasses (and the constants that name their statuses), shared by every role
(:mod:`.log`, :mod:`.ownership`, :mod:`.inbox`, :mod:`.upkeep`) and every adapter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..events import Event
from ..fold import NodeState
from ..ownership import Lease, Owner

__all__ = [
    "SessionInfo",
    "SessionQuery",
    "ascii_lower",
    "NodeRun",
    "NodeRunGroup",
    "OpenRunGroup",
    "Claim",
    "ClaimReason",
    "WorkerInfo",
    "QueuedGroup",
    "JobResultGroup",
    "Message",
    "AppendBatch",
    "WORKER_RETENTION_S",
    "FINISHED_SESSION_STATUSES",
    "SESSION_STATUSES",
    "MESSAGE_KINDS",
    "MAILED_STATUSES",
]

#: One session's part of :meth:`EventStore.append_many`: (session_id, events, expected_last_seq, epoch).
AppendBatch = tuple[str, Sequence[Event], int, "int | None"]
#: Why :meth:`EventStore.claim` took a session.
ClaimReason = Literal["queued", "answered", "orphaned"]
#: How long a worker that stopped recording itself stays in :meth:`EventStore.workers`.
WORKER_RETENTION_S = 86400.0
#: Session statuses that are over for good: only such sessions may be deleted.
FINISHED_SESSION_STATUSES = ("completed", "failed", "cancelled")
#: Every status :meth:`EventStore.sessions` gives a session (the fold's, but ``new``).
SESSION_STATUSES = ("queued", "running", "paused", "answered", *FINISHED_SESSION_STATUSES)
#: What a :class:`Message` may ask of a session's owner: ``answer`` carries input values
#: (``body["inputs"]``, by interrupt id) and job results (``body["jobs"]``, by job id);
#: ``cancel`` a ``reason``; ``retry`` a ``from_path`` (or None), a ``reason`` and ``seen``, the
#: log's last seq its sender read (absent in messages sent before retries carried it).
MESSAGE_KINDS = ("answer", "cancel", "retry")
#: Statuses in which a message in the inbox makes a session claimable (:func:`claim_reason`).
MAILED_STATUSES = ("paused", "failed", "completed")


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
    #: Who runs (or last ran) the session; None if no owner ever took it.
    owner: Owner | None = None
    #: The fencing epoch: every takeover (acquire, claim) advances it.
    epoch: int = 0
    #: When the owner's lease ends (0 once released; None without an owner).
    lease_expires_at: float | None = None
    #: When the run was submitted to be started by a worker (``RunSubmitted``), else None.
    submitted_at: float | None = None


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """``text`` with its ASCII letters lower-cased and nothing else changed: the case rule
    of :class:`SessionQuery`'s text filters, which SQL's ``lower()`` gives in SQLite and
    under PostgreSQL's ``"C"`` collation."""
    return text.translate(_ASCII_LOWER)


@dataclass(frozen=True, slots=True)
class SessionQuery:
    """Which sessions :meth:`EventLog.find_sessions` and :meth:`EventLog.status_counts`
    select: each field that is set narrows the selection, and :meth:`matches` is the rule
    (a store with a query language answers with a query that selects the same sessions)."""

    statuses: frozenset[str] | None = None
    workflow: str | None = None
    #: Last updated at or after / at or before (epoch seconds).
    updated_since: float | None = None
    updated_until: float | None = None
    #: Submitted at or before (for a session never submitted, last updated at or before):
    #: how long a queued session has waited.
    submitted_until: float | None = None
    #: Text in the session id, or in the owner's worker id or host (ASCII letters in
    #: either case, :func:`ascii_lower`).
    id_contains: str | None = None
    owner_contains: str | None = None
    session_ids: frozenset[str] | None = None

    def matches(self, s: SessionInfo) -> bool:
        """Whether the query selects ``s``."""
        if self.statuses is not None and s.status not in self.statuses:
            return False
        if self.workflow is not None and s.workflow != self.workflow:
            return False
        if self.session_ids is not None and s.session_id not in self.session_ids:
            return False
        if self.updated_since is not None and (s.updated_at is None or s.updated_at < self.updated_since):
            return False
        if self.updated_until is not None and (s.updated_at is None or s.updated_at > self.updated_until):
            return False
        if self.submitted_until is not None:
            since = s.submitted_at if s.submitted_at is not None else s.updated_at
            if since is None or since > self.submitted_until:
                return False
        if self.id_contains is not None and ascii_lower(self.id_contains) not in ascii_lower(s.session_id):
            return False
        if self.owner_contains is not None:
            o, needle = s.owner, ascii_lower(self.owner_contains)
            if o is None or (needle not in ascii_lower(o.worker_id) and needle not in ascii_lower(o.host)):
                return False
        return True


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
    #: the latest start of a run that started more than once (NodeState.restarted_at)
    restarted_at: float | None = None

    @property
    def last_started_at(self) -> float | None:
        """When its current run began: its latest start (a resumed or recovered run's
        restart), from which its age counts; its first start is ``started_at``."""
        return self.restarted_at if self.restarted_at is not None else self.started_at

    @classmethod
    def from_state(cls, session_id: str, workflow: str, ns: NodeState) -> NodeRun:
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
            restarted_at=ns.restarted_at,
        )


@dataclass(frozen=True, slots=True)
class NodeRunGroup:
    """The node runs of one (workflow, root or not, kind, node), counted: what ``flowscope
    audit`` sums per row (a workflow's root run and a node of its name are two groups)."""

    workflow: str
    root: bool  # the path has no "/": an invocation's own run
    kind: str
    node: str
    runs: int
    completed: int
    failed: int
    cancelled: int
    attempts: int
    max_attempt: int
    retries: int
    recoveries: int


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


@dataclass(frozen=True, slots=True)
class Claim:
    """A session :meth:`EventStore.claim` took for its caller, and the lease it holds."""

    session_id: str
    workflow: str
    reason: ClaimReason
    lease: Lease
    #: A worker's take-back of a session a store fault halted in its hands (``reason`` is
    #: the first claim's): the same claim again, not a new one.
    taken_back: bool = False
    #: An orphan its owner handed back as it drained (``Owner.handed_back``): the runs it
    #: left running were cut off, not crashed (``Runner.resume(handed_back=True)``).
    handed_back: bool = False


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker as it last recorded itself (:meth:`EventStore.workers_seen`)."""

    worker_id: str
    host: str
    pid: int
    workflows: tuple[str, ...]
    seen_at: float


@dataclass(frozen=True, slots=True)
class QueuedGroup:
    """Queued sessions of one workflow (:meth:`EventStore.queued_summary`)."""

    workflow: str
    count: int
    oldest_submitted_at: float | None


@dataclass(frozen=True, slots=True)
class JobResultGroup:
    """Job results recorded in the log for one (workflow, node, result)
    (:meth:`EventStore.job_result_summary`). ``result`` is the guard's verdict
    (success, failed, empty); ``workflow`` the session's."""

    workflow: str
    node: str
    result: str
    count: int


@dataclass(frozen=True, slots=True)
class Message:
    """A request for a session's owner, kept in the store beside the log (its inbox).

    One writer per session: a process that does not own a live session (an operator's
    answer, a job's result) never appends to its log; it sends a message, durable at
    once, which the owner takes in at its next step, or the next owner when it takes the
    session (:meth:`EventStore.take_in` appends what it says and deletes it, atomically).
    ``message_id`` is the store's, increasing in the order messages were sent.
    """

    session_id: str
    message_id: int
    kind: str
    body: Mapping[str, Any]
    sent_at: float
