"""The ``EventStore`` port: what the engine, the CLI and the collectors need from a store.

It is the composition of four roles, each a small ABC an adapter implements in full:

- :class:`~.log.EventLog`: append, read, and the projections (sessions, node runs);
- :class:`~.ownership.Ownership`: leases, claims and the fence;
- :class:`~.inbox.Inbox`: messages for a session's owner;
- :class:`~.upkeep.Upkeep`: span watermarks, group commit, snapshots, pruning.

A part of flowscope that needs one role is typed with it; the runner and the worker need
them all. Adapters: :mod:`.memory`, :mod:`.sqlite`, :mod:`.postgres`; :mod:`.testing`
holds the contract every adapter passes, cut the same way. This module re-exports the
names of the role modules, where they were before the port was cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import ConcurrencyConflict
from ..events import Event
from ..ownership import Lease, Owner
from .inbox import Inbox
from .log import EventLog, number_events, summarize_open_runs
from .ownership import (
    Ownership,
    claim_reason,
    count_dead_owners,
    dead_owners,
    lease_lost,
    one_renewal,
    one_start,
    owned_elsewhere,
    unmailed,
    wraps_acquire,
)
from .records import (
    FINISHED_SESSION_STATUSES,
    MAILED_STATUSES,
    MESSAGE_KINDS,
    SESSION_STATUSES,
    WORKER_RETENTION_S,
    AppendBatch,
    Claim,
    ClaimReason,
    JobResultGroup,
    Message,
    NodeRun,
    NodeRunGroup,
    OpenRunGroup,
    QueuedGroup,
    SessionInfo,
    SessionQuery,
    WorkerInfo,
)
from .upkeep import Upkeep

__all__ = [
    "EventStore",
    "EventLog",
    "Ownership",
    "Inbox",
    "Upkeep",
    "SessionInfo",
    "SessionQuery",
    "NodeRun",
    "NodeRunGroup",
    "OpenRunGroup",
    "Claim",
    "ClaimReason",
    "WorkerInfo",
    "QueuedGroup",
    "JobResultGroup",
    "number_events",
    "summarize_open_runs",
    "count_dead_owners",
    "dead_owners",
    "claim_reason",
    "owned_elsewhere",
    "lease_lost",
    "one_renewal",
    "one_start",
    "wraps_acquire",
    "WORKER_RETENTION_S",
    "AppendBatch",
    "FINISHED_SESSION_STATUSES",
    "SESSION_STATUSES",
    "Message",
    "MESSAGE_KINDS",
    "MAILED_STATUSES",
]


class EventStore(Inbox, Upkeep, Ownership):
    """Every role: the store a runner with workers, an operator's inbox and span shipping
    needs (the memory, SQLite and PostgreSQL adapters).

    :class:`EventLog` is in it through :class:`Inbox` and :class:`Upkeep`, which are built
    on the log (``take_in`` appends; pruning and the watermark's defaults read sessions):
    naming it before them as a base too would give no consistent method order."""

    def __enter__(self) -> EventStore:
        return self

    # -- derived across roles: an invocation's first and last steps, in one step where the
    # store can (the SQLite adapter: one transaction each)

    def acquire_new(
        self, session_id: str, owner: Owner, lease_s: float, *, now: float | None = None
    ) -> Lease | None:
        """:meth:`acquire` a session that has no events yet (what ``Runner.run`` starts),
        or None, with nothing written, if it has some: the check and the lease in one step.

        This default reads :meth:`last_seq` and then acquires; the SQLite store does both in
        one transaction."""
        if self.last_seq(session_id) > 0:
            return None
        return self.acquire(session_id, owner, lease_s, now=now)

    def acquire_new_many(
        self, session_ids: Sequence[str], owner: Owner, lease_s: float, *, now: float | None = None
    ) -> list[Lease | None | ConcurrencyConflict]:
        """:meth:`acquire_new` of each of ``session_ids`` (the sessions a runner starts in one
        loop turn): in order, the lease, None (the session has events), or the
        :class:`~flowscope.errors.ConcurrencyConflict` that refused it, which refuses no other.

        This default calls :meth:`acquire_new` for each; the SQLite and PostgreSQL stores
        take them all in one transaction, so a thousand sessions started together pay one
        commit, not a thousand."""
        out: list[Lease | None | ConcurrencyConflict] = []
        for session_id in session_ids:
            try:
                out.append(self.acquire_new(session_id, owner, lease_s, now=now))
            except ConcurrencyConflict as exc:
                out.append(exc)
        return out

    def append_and_release(
        self, batches: Sequence[AppendBatch], leases: Mapping[str, Lease]
    ) -> tuple[list[list[Event] | BaseException], set[str]]:
        """:meth:`append_many`, then the end of the ``leases`` (by session id) of the
        sessions whose batch was appended and whose inbox holds no message (their owner
        takes those in first, :mod:`flowscope.engine.inbox`): an invocation's last append
        and the release of its lease. Returns the batches' results, as ``append_many``'s,
        and the sessions whose lease was released.

        This default calls :meth:`append_many`, :meth:`sessions_with_mail` and
        :meth:`release`, and releases nothing if one of those fails after the append (the
        caller releases then); the SQLite store does all of it in one transaction, the
        PostgreSQL store for a group of sessions."""
        results = self.append_many(batches)
        appended = [
            sid
            for (sid, _events, _expected, _epoch), r in zip(batches, results)
            if not isinstance(r, BaseException)
        ]
        released: set[str] = set()
        try:
            for lease in unmailed(leases, appended, self.sessions_with_mail):
                self.release(lease)
                released.add(lease.session_id)
        except Exception:  # best effort: the appends stand; the caller releases what is left
            pass
        return results, released
