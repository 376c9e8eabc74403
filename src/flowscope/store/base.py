"""The ``EventStore`` port: what the engine, the CLI and the collectors need from a store.

Methods are synchronous on purpose: an embedded SQLite call takes microseconds and
belongs on the event loop, not in a thread. Adapters: :mod:`.memory`, :mod:`.sqlite`;
:mod:`.testing` holds the contract every adapter must pass.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Literal, Mapping, Sequence

from ..errors import ConcurrencyConflict, LeaseLost, StoreError
from ..events import Event, JobResultReceived
from ..fold import OPEN_STATES, NodeState, containers
from ..liveness import ORPHANED, OVERDUE, classify_open_run, owner_alive
from ..ownership import Lease, Owner

__all__ = [
    "EventStore",
    "SessionInfo",
    "NodeRun",
    "OpenRunGroup",
    "Claim",
    "ClaimReason",
    "WorkerInfo",
    "QueuedGroup",
    "JobResultGroup",
    "number_events",
    "summarize_open_runs",
    "count_dead_owners",
    "claim_reason",
    "owned_elsewhere",
    "lease_lost",
    "one_renewal",
    "WORKER_RETENTION_S",
    "AppendBatch",
    "FINISHED_SESSION_STATUSES",
    "Message",
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
#: What a :class:`Message` may ask of a session's owner: ``answer`` carries input values
#: (``body["inputs"]``, by interrupt id) and job results (``body["jobs"]``, by job id);
#: ``cancel`` a ``reason``; ``retry`` a ``from_path`` (or None) and a ``reason``.
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


@dataclass(frozen=True, slots=True)
class Claim:
    """A session :meth:`EventStore.claim` took for its caller, and the lease it holds."""

    session_id: str
    workflow: str
    reason: ClaimReason
    lease: Lease


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


def claim_reason(
    status: str,
    owner: Owner | None,
    lease_expires_at: float | None,
    now: float,
    *,
    host: str | None = None,
    mail: bool = False,
) -> ClaimReason | None:
    """Why a worker may claim a session in this state, or None: the claim rule, one copy.

    ``queued`` and ``answered`` sessions nobody holds (with ``mail``, a message in its
    inbox, a ``paused`` one counts as answered and a ``failed`` or ``completed`` one, which
    only a retry can have mail for, as queued), and ``running`` sessions whose recorded
    owner is no longer alive (:func:`~flowscope.liveness.owner_alive`). A running session
    without an owner (a bridge, an older flowscope) is never claimed: only ``flowscope
    resume`` takes it over.
    """
    if mail and status in MAILED_STATUSES:
        status = "answered" if status == "paused" else "queued"
    if status == "queued":
        return None if owner_alive(owner, lease_expires_at, now, host=host) else "queued"
    if status == "answered":
        return None if owner_alive(owner, lease_expires_at, now, host=host) else "answered"
    if status == "running" and owner is not None and not owner_alive(owner, lease_expires_at, now, host=host):
        return "orphaned"
    return None


def owned_elsewhere(
    session_id: str, owner: Owner, lease_expires_at: float | None, renewed_at: float | None, now: float
) -> ConcurrencyConflict:
    """The error :meth:`EventStore.acquire` raises for a session a live owner holds."""
    renewed = f"lease renewed {now - renewed_at:.1f}s ago, " if renewed_at is not None else ""
    left = (lease_expires_at or 0.0) - now
    return ConcurrencyConflict(
        f"session {session_id!r} is owned by {owner.describe()} ({renewed}expires in {left:.1f}s); "
        "wait for it, or stop that process"
    )


def lease_lost(session_id: str, current_epoch: int, current_owner: Owner | None, epoch: int) -> LeaseLost:
    """The error for an append or renewal under ``epoch`` when the session is at ``current_epoch``."""
    by = f" by {current_owner.describe()}" if current_owner is not None else ""
    return LeaseLost(
        f"session {session_id!r} was taken over{by} (its epoch is {current_epoch}, this lease's is {epoch}); "
        "nothing was written"
    )


def count_dead_owners(
    rows: Iterable[Sequence[Any]],
    same_host: Iterable[tuple[str, str, Owner | None, float | None, int]],
    now: float,
    host: str,
) -> list[OpenRunGroup]:
    """A SQL open-run summary (``rows`` of :class:`OpenRunGroup` fields) with the running
    runs of dead same-host owners added to ``orphaned``.

    SQL can compare a lease with the clock, but only this process can tell whether an
    owner's process on this host is gone: ``same_host`` holds, per (workflow, node, owner,
    lease), the count of running runs whose lease has not expired, and the owner rule
    (:func:`flowscope.liveness.owner_alive`, one process check per owner) decides.
    """
    dead: dict[tuple[str, str], int] = {}
    alive: dict[tuple[Owner | None, float | None], bool] = {}
    for workflow, node, owner, lease, count in same_host:
        key = (owner, lease)
        if key not in alive:
            alive[key] = owner_alive(owner, lease, now, host=host)
        if not alive[key]:
            dead[(workflow, node)] = dead.get((workflow, node), 0) + count
    groups = [OpenRunGroup(*r) for r in rows]
    if dead:
        groups = [
            dataclasses.replace(g, orphaned=g.orphaned + dead.get((g.workflow, g.node), 0)) if g.state == "running" else g
            for g in groups
        ]
    return groups


def summarize_open_runs(
    runs: Iterable[NodeRun],
    now: float,
    stale_after_s: float,
    owners: Mapping[str, tuple[Owner | None, float | None]] | None = None,
    *,
    host: str | None = None,
) -> list[OpenRunGroup]:
    """Fold ``NodeRun`` records (``store.open_runs()``) into :class:`OpenRunGroup` rows.

    ``owners`` maps a session id to its ``(owner, lease_expires_at)``: the runs of a
    session found there are classified by the owner rule, the others by their heartbeat.
    The reference definition a store's ``open_run_summary`` must match; groups come in
    the order their first run comes. A container (a run with an open run below it,
    :func:`flowscope.fold.containers`) is not counted: its open state is its descendant's,
    counted once at the deepest path.
    """
    owners = owners or {}
    runs = [r for r in runs if r.status in OPEN_STATES]
    by_session: dict[str, list[str]] = {}
    for r in runs:
        by_session.setdefault(r.session_id, []).append(r.path)
    enclosing = {(sid, p) for sid, paths in by_session.items() if len(paths) > 1 for p in containers(paths)}
    # key -> [count, oldest_started_at, orphaned, overdue]
    acc: dict[tuple[str, str, str], list[Any]] = {}
    for r in runs:
        state = r.status
        if enclosing and (r.session_id, r.path) in enclosing:
            continue
        key = (r.workflow or "", r.node or "", state)
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0, None, 0, 0]
        a[0] += 1
        started = r.started_at
        if started is not None and (a[1] is None or started < a[1]):
            a[1] = started
        owner, lease = owners.get(r.session_id, (None, None))
        cls = classify_open_run(
            state, started, r.heartbeat_at, r.job_deadline_at, now, stale_after_s,
            owner=owner, lease_expires_at=lease, host=host,
        )
        if cls == ORPHANED:
            a[2] += 1
        elif cls == OVERDUE:
            a[3] += 1
    return [OpenRunGroup(wf, node, state, *a) for (wf, node, state), a in acc.items()]


def one_renewal(results: Sequence[Lease | LeaseLost]) -> Lease:
    """:meth:`EventStore.renew` as a round of one :meth:`~EventStore.renew_many`: the
    renewed lease, or its ``LeaseLost`` raised (adapters renew one way, not two)."""
    [result] = results
    if isinstance(result, LeaseLost):
        raise result
    return result


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
    def append(
        self, session_id: str, events: Sequence[Event], expected_last_seq: int, *, epoch: int | None = None
    ) -> list[Event]:
        """Append ``events`` atomically if the session is at ``expected_last_seq``.

        Raises :class:`~flowscope.errors.ConcurrencyConflict` (writing nothing) otherwise.
        With ``epoch`` (the caller's :attr:`Lease.epoch`), raises
        :class:`~flowscope.errors.LeaseLost` and writes nothing if the session's epoch is
        another: it was taken over. Returns the events as stored, each with its ``seq``.
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

        The default folds :meth:`open_runs` (:func:`summarize_open_runs`) with the owners
        of :meth:`sessions`; a store with a query language answers it with aggregate
        queries and must give the same groups.
        """
        owners = {s.session_id: (s.owner, s.lease_expires_at) for s in self.sessions() if s.owner is not None}
        return summarize_open_runs(self.open_runs(), now, stale_after_s, owners)

    def session_info(self, session_id: str) -> SessionInfo | None:
        """One session as :meth:`sessions` lists it, or None. The default scans :meth:`sessions`."""
        return next((s for s in self.sessions() if s.session_id == session_id), None)

    # -- ownership: owners, leases and the fence (flowscope.ownership, flowscope.liveness)

    @abstractmethod
    def acquire(
        self, session_id: str, owner: Owner, lease_s: float, *, force: bool = False, now: float | None = None
    ) -> Lease:
        """Take the session (it need not exist yet) for ``owner`` until ``now + lease_s``.

        If another owner (another ``worker_id``) holds it and is alive
        (:func:`~flowscope.liveness.owner_alive`) and not ``force``, raises
        :class:`~flowscope.errors.ConcurrencyConflict` naming its host, pid and lease
        (:func:`owned_elsewhere`). Otherwise advances the epoch and records the owner and
        lease, atomically; re-acquiring by the same owner advances the epoch too.
        """

    @abstractmethod
    def renew(self, lease: Lease, lease_s: float, *, now: float | None = None) -> Lease:
        """Extend ``lease`` to ``now + lease_s``; :class:`~flowscope.errors.LeaseLost` if the
        session's epoch is no longer ``lease.epoch``. Callable from any thread."""

    def renew_many(self, leases: Sequence[Lease], lease_s: float, *, now: float | None = None) -> list[Lease | LeaseLost]:
        """Renew each of ``leases`` (one round of a lease keeper): in order, the renewed
        lease or the :class:`~flowscope.errors.LeaseLost` of one whose epoch moved on.

        This default calls :meth:`renew` for each; the SQLite and PostgreSQL stores renew
        them all in one transaction, so a process running many sessions pays one commit
        per round rather than one per session. Callable from any thread."""
        out: list[Lease | LeaseLost] = []
        for lease in leases:
            try:
                out.append(self.renew(lease, lease_s, now=now))
            except LeaseLost as exc:
                out.append(exc)
        return out

    def heartbeat_many(self, beats: Mapping[str, Iterable[str]], ts: float | None = None) -> None:
        """:meth:`heartbeat` for several sessions (``session_id -> paths``); adapters write
        them in one transaction. Callable from any thread."""
        for session_id, paths in beats.items():
            self.heartbeat(session_id, paths, ts)

    @abstractmethod
    def release(self, lease: Lease) -> None:
        """End ``lease`` (expiry 0, the owner stays recorded) if its epoch is still current;
        a superseded lease is ignored."""

    @abstractmethod
    def claim(
        self,
        owner: Owner,
        workflows: Collection[str],
        lease_s: float,
        *,
        limit: int,
        max_recoveries: int | None = None,
        now: float | None = None,
    ) -> list[Claim]:
        """Take up to ``limit`` sessions of ``workflows`` that :func:`claim_reason` allows.

        Each gets epoch + 1 and ``owner``'s lease, all in one atomic step, so two claimers
        never get the same session. Oldest first: queued by submit time, answered and
        orphaned by their last event. With ``max_recoveries``, a session
        already taken over as orphaned more than that many times is left alone (it shows
        as orphaned in ``flowscope stuck``).
        """

    @abstractmethod
    def workers_seen(self, owner: Owner, workflows: Collection[str], ts: float | None = None) -> None:
        """Record that worker ``owner`` serves ``workflows`` as of ``ts`` (now); workers not
        seen for :data:`WORKER_RETENTION_S` are forgotten."""

    @abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """The workers recorded by :meth:`workers_seen`, most recently seen first."""

    def queued_summary(self) -> list[QueuedGroup]:
        """Queued sessions per workflow: count and oldest submit time, by workflow name.

        The default groups :meth:`sessions`; an SQL store answers from an index.
        """
        acc: dict[str, list[Any]] = {}
        for s in self.sessions():
            if s.status != "queued":
                continue
            a = acc.setdefault(s.workflow, [0, None])
            a[0] += 1
            if s.submitted_at is not None and (a[1] is None or s.submitted_at < a[1]):
                a[1] = s.submitted_at
        return [QueuedGroup(wf, n, oldest) for wf, (n, oldest) in sorted(acc.items())]

    def job_result_summary(self) -> list[JobResultGroup]:
        """The ``JobResultReceived`` events in the log per (workflow, node, result), whichever
        process appended them (a worker, ``flowscope.answer()``, ``flowscope resume --job``):
        what the ``StoreCollector`` counts as ``flowscope_job_results_total``.

        The default reads every session's log; the SQLite store keeps a running count per
        store object and reads only the results appended since its last call (so results
        of sessions deleted since are still counted: a count of results recorded, never
        falling); PostgreSQL answers with one ``GROUP BY``.
        """
        acc: dict[tuple[str, str, str], int] = {}
        for s in self.sessions():
            for e in self.read(s.session_id):
                if isinstance(e, JobResultReceived):
                    key = (s.workflow or "", e.node, e.result)
                    acc[key] = acc.get(key, 0) + 1
        return [JobResultGroup(*k, n) for k, n in sorted(acc.items())]

    def wait_for_work(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds, or less if the store learns that a session became
        claimable (an append made one queued or answered, a lease was released); True if
        woken so. A worker calls it between claims, off the event loop. The default sleeps
        (polling); a store with notifications (PostgreSQL's LISTEN) wakes at once."""
        time.sleep(timeout)
        return False

    def save_snapshot(self, session_id: str, seq: int, data: str) -> None:
        """Keep ``data``, the JSON of the session's state after event ``seq``, to speed up
        the next resume. Optional: a store that keeps none ignores it."""

    def load_snapshot(self, session_id: str) -> tuple[int, str] | None:
        """The last snapshot saved for the session as ``(seq, data)``, or None."""
        return None

    # ------------------------------------------------------------------ pruning (flowscope prune)

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        """Delete whole sessions (log, projections, snapshot, inbox, owner and lease) in one
        transaction; return the ids deleted, in the order given.

        Only a session whose status is in :data:`FINISHED_SESSION_STATUSES`, that has no
        open run (running, waiting_input, waiting_job) and no live owner
        (:func:`~flowscope.liveness.owner_alive`) is deleted; any other id, or one that
        does not exist, is skipped, so a racing resume never loses its log. A store that
        cannot delete raises :class:`~flowscope.errors.StoreError`.
        """
        raise StoreError(f"{type(self).__name__} cannot delete sessions")

    def storage_bytes(self) -> int | None:
        """Bytes the store's data occupies now (what ``delete_sessions`` frees), or None if
        the store cannot tell."""
        return None

    def has_session(self, session_id: str) -> bool:
        return self.last_seq(session_id) > 0

    # -- the inbox: messages for a session's owner (one writer per session) ----------------

    def send(self, session_id: str, kind: str, body: Mapping[str, Any], *, ts: float | None = None) -> Message:
        """Keep a :class:`Message` for the session's owner, durably, and return it; a
        paused session with a message is claimable as ``answered``. ``body`` is JSON data.
        The default refuses: a store that holds no messages cannot be answered while its
        sessions run (and :meth:`inbox` is always empty)."""
        raise StoreError(f"{type(self).__name__} cannot hold messages for a session's owner")

    def inbox(self, session_id: str) -> list[Message]:
        """The session's messages not yet taken in, oldest first."""
        return []

    def sessions_with_mail(self, session_ids: Collection[str]) -> set[str]:
        """Which of ``session_ids`` have a message in their inbox: what an owner's lease
        keeper asks once per round, so that a cancel reaches a live run within a lease."""
        return {sid for sid in session_ids if self.inbox(sid)}

    def take_in(
        self,
        session_id: str,
        events: Sequence[Event],
        expected_last_seq: int,
        message_ids: Collection[int],
        *,
        epoch: int,
    ) -> list[Event]:
        """Append ``events`` (what the messages say; may be none) as :meth:`append` does,
        under the owner's ``epoch``, and delete the messages ``message_ids``, in one
        transaction: a message is taken in exactly when its events are durable."""
        raise StoreError(f"{type(self).__name__} cannot hold messages for a session's owner")

    # -- span shipping and group commit (issue 15): optional, with defaults ----------------

    def append_many(self, batches: Sequence[AppendBatch]) -> list[list[Event] | BaseException]:
        """Append several sessions' batches ``(session_id, events, expected_last_seq,
        epoch)``; one result per batch, in order: its stored events, or the exception that
        refused it (a conflict, a lost lease). Adapters that can do it in one transaction
        (SQLite) override this; the default appends one batch after another. An error of
        the store itself (a lock, a full disk) is raised, and then no batch is kept."""
        out: list[list[Event] | BaseException] = []
        for session_id, events, expected, epoch in batches:
            try:
                out.append(self.append(session_id, events, expected, epoch=epoch))
            except (ConcurrencyConflict, LeaseLost) as exc:
                out.append(exc)
        return out

    def exported_seq(self, session_id: str) -> int:
        """The span-shipping watermark: every span the log ended at or before this ``seq``
        has been accepted by an exporter (0: none known). See
        :mod:`flowscope.observability.shipping`."""
        return self.__dict__.get("_exported_seqs", {}).get(session_id, 0)

    def set_exported_seq(self, session_id: str, seq: int) -> None:
        """Advance the watermark (never moves it back). The default keeps it in this object."""
        marks = self.__dict__.setdefault("_exported_seqs", {})
        if seq > marks.get(session_id, 0):
            marks[session_id] = seq

    def set_exported_seqs(self, marks: Mapping[str, int]) -> None:
        """:meth:`set_exported_seq` for several sessions (``session_id -> seq``): what one
        export of a batch of spans completed. This default advances them one by one; the
        SQLite and PostgreSQL stores write them in one transaction, so a process shipping
        the spans of a thousand sessions pays one commit per export, not one per session.
        Callable from any thread (exporters run on their processor's)."""
        for session_id, seq in marks.items():
            self.set_exported_seq(session_id, seq)

    def unexported(self) -> list[tuple[SessionInfo, int]]:
        """The sessions whose log has moved past their span watermark, each with it: what a
        span follower (``flowscope export --follow``) looks at on a pass. This default reads
        every session; the SQLite and PostgreSQL stores ask for those rows alone."""
        out = []
        for info in self.sessions():
            mark = self.exported_seq(info.session_id)
            if mark < info.last_seq:
                out.append((info, mark))
        return out

    def refresh(self) -> None:
        """Follow the storage if it was replaced under this store (a file restored from a
        backup) or raise ``StoreUnavailable`` if it is gone; a long-lived reader (the
        metrics endpoint) calls it before each read. Nothing to do for most adapters."""

    def close(self) -> None:
        """Release resources; the store is not used afterwards."""

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
