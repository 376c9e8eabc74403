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

from .inbox import Inbox
from .log import EventLog, number_events, summarize_open_runs
from .ownership import Ownership, claim_reason, count_dead_owners, lease_lost, one_renewal, owned_elsewhere
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
    OpenRunGroup,
    QueuedGroup,
    SessionInfo,
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
