"""The event log role: append and read a session's events, and the projections the fold
keeps of them (sessions, node runs, open runs).

The smallest store a user can write implements :class:`EventLog` alone; it passes
:class:`flowscope.store.testing.EventLogContract`. Methods are synchronous on purpose: an
embedded SQLite call takes microseconds and belongs on the event loop, not in a thread.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import ConcurrencyConflict
from ..events import Event, JobResultReceived
from ..fold import OPEN_STATES, containers
from ..liveness import ORPHANED, OVERDUE, classify_open_run
from ..ownership import Owner
from .records import (
    JobResultGroup,
    NodeRun,
    NodeRunGroup,
    OpenRunGroup,
    QueuedGroup,
    SessionInfo,
    SessionQuery,
)

__all__ = ["EventLog", "number_events", "summarize_open_runs", "group_node_runs"]


def number_events(
    session_id: str, events: Sequence[Event], last_seq: int, expected_last_seq: int
) -> list[Event]:
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


def group_node_runs(runs: Iterable[NodeRun]) -> list[NodeRunGroup]:
    """``runs`` counted per (workflow, root or not, kind, node), in the order each group's
    first run comes: the rule :meth:`EventLog.node_run_groups` applies."""
    acc: dict[tuple[str, bool, str, str], list[int]] = {}
    for r in runs:
        key = (r.workflow, "/" not in r.path, r.kind, r.node)
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0] * 8
        a[0] += 1
        a[1] += r.status == "completed"
        a[2] += r.status == "failed"
        a[3] += r.status == "cancelled"
        a[4] += r.attempt
        a[5] = max(a[5], r.attempt)
        a[6] += r.retries
        a[7] += r.recoveries
    return [NodeRunGroup(*key, *a) for key, a in acc.items()]


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
        started = r.last_started_at  # a resumed run's age counts from its restart
        if started is not None and (a[1] is None or started < a[1]):
            a[1] = started
        owner, lease = owners.get(r.session_id, (None, None))
        cls = classify_open_run(
            state,
            r.started_at,
            r.heartbeat_at,
            r.job_deadline_at,
            now,
            stale_after_s,
            owner=owner,
            lease_expires_at=lease,
            host=host,
        )
        if cls == ORPHANED:
            a[2] += 1
        elif cls == OVERDUE:
            a[3] += 1
    return [OpenRunGroup(wf, node, state, *a) for (wf, node, state), a in acc.items()]


class EventLog(ABC):
    """An append-only, per-session event log with a node-runs projection.

    The abstract methods are the role; the others derive from them, and an adapter with a
    query language overrides them for speed (giving the same rows)."""

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

    def find_node_runs(
        self, statuses: Collection[str] | None = None, *, workflow: str | None = None, retried: bool = False
    ) -> list[NodeRun]:
        """The rows of :meth:`node_runs` in one of ``statuses``, of ``workflow``, and (with
        ``retried``) retried at least once, each only when given, in the same order. The
        default filters :meth:`node_runs`; an SQL store selects in the query."""
        return [
            r
            for r in self.node_runs()
            if (statuses is None or r.status in statuses)
            and (workflow is None or r.workflow == workflow)
            and (not retried or r.retries > 0)
        ]

    def node_run_groups(self, workflow: str | None = None) -> list[NodeRunGroup]:
        """Every node run (of ``workflow``, when given) counted per group
        (:func:`group_node_runs`): what ``flowscope audit`` sums, without holding every run
        (two million runs took it 12 s and 1.7 GB). An SQL store answers with one
        ``GROUP BY``, its groups in any order."""
        return group_node_runs(self.find_node_runs(workflow=workflow))

    def find_sessions(
        self, query: SessionQuery | None = None, *, limit: int | None = None, offset: int = 0
    ) -> list[SessionInfo]:
        """The sessions ``query`` selects (None: all), most recently updated first, from the
        ``offset``-th, at most ``limit`` (None: all): what ``flowscope runs`` lists and the
        console pages. The default filters :meth:`sessions`; an SQL store answers with one
        query that keeps no more than ``offset + limit`` rows (a million sessions held in
        memory took ``runs`` 7 s and half a gigabyte to print fifty, the console 11 s and
        1.6 GB per page)."""
        out = self.sessions() if query is None else [s for s in self.sessions() if query.matches(s)]
        start = max(offset, 0)
        return out[start:] if limit is None else out[start : start + max(limit, 0)]

    def status_counts(self, query: SessionQuery | None = None) -> dict[str, int]:
        """How many sessions ``query`` selects (None: all), per status (only statuses it
        selects some of): the console's totals and tabs. The default counts
        :meth:`sessions`; an SQL store answers with one ``GROUP BY``."""
        out: dict[str, int] = {}
        for s in self.sessions():
            if query is None or query.matches(s):
                out[s.status] = out.get(s.status, 0) + 1
        return out

    def session_info(self, session_id: str) -> SessionInfo | None:
        """One session as :meth:`sessions` lists it, or None. The default scans :meth:`sessions`."""
        return next((s for s in self.sessions() if s.session_id == session_id), None)

    def has_session(self, session_id: str) -> bool:
        """Whether the session has any event."""
        return self.last_seq(session_id) > 0

    def heartbeat_many(self, beats: Mapping[str, Iterable[str]], ts: float | None = None) -> None:
        """:meth:`heartbeat` for several sessions (``session_id -> paths``); adapters write
        them in one transaction. Callable from any thread."""
        for session_id, paths in beats.items():
            self.heartbeat(session_id, paths, ts)

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

    def change_mark(self) -> Hashable:
        """A value that differs after any append, deletion or takeover: how the console
        tells that the store changed. The default is every session's ``(id, last_seq,
        status, updated_at, epoch)``; a store with a query language answers with one
        aggregate row (a sum of ``last_seq`` grows with every append)."""
        return tuple((s.session_id, s.last_seq, s.status, s.updated_at, s.epoch) for s in self.sessions())

    def refresh(self) -> None:
        """Follow the storage if it was replaced under this store (a file restored from a
        backup) or raise ``StoreUnavailable`` if it is gone; a long-lived reader (the
        metrics endpoint) calls it before each read. Nothing to do for most adapters."""

    def close(self) -> None:
        """Release resources; the store is not used afterwards."""

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
