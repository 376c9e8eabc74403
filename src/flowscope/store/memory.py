"""An in-memory :class:`EventStore`: for tests, benchmarks and throwaway runs."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..events import Event, RunSubmitted, own_values
from ..fold import OPEN_STATES, WorkflowState
from ..liveness import lease_held, owner_alive
from ..ownership import Lease, Owner, this_host
from .appending import session_columns
from .base import (
    FINISHED_SESSION_STATUSES,
    WORKER_RETENTION_S,
    AppendBatch,
    Claim,
    EventStore,
    Message,
    NodeRun,
    SessionInfo,
    WorkerInfo,
    dead_owners,
    number_events,
)
from .takeover import (
    ClaimCandidate,
    ClaimPick,
    LeaseClock,
    check_acquire,
    claim_cut,
    claim_rule,
    claimable_since,
    handed_back_orphan,
    lost_lease,
)

__all__ = ["MemoryEventStore"]


@dataclass(slots=True)
class _Ownership:
    """What the store keeps beside a session's log: its owner, lease and fence."""

    owner: Owner | None = None
    epoch: int = 0
    lease_expires_at: float | None = None
    lease_renewed_at: float | None = None
    submitted_at: float | None = None
    recoveries: int = 0  # times claim() took it over as orphaned


class MemoryEventStore(EventStore):
    """Keeps each session's events in a list; folds them into its state when asked.

    The fold is lazy: the runner folds every event it emits into its own state already,
    so folding again on every append would double the per-event cost of a run on the
    memory store. ``sessions()``, ``node_runs()``, ``open_runs()`` and ``heartbeat()``
    catch the fold up first. A lock makes the ownership calls atomic (a lease is renewed
    from another thread than the event loop's). Its events are immutable as a durable
    store's are: the log keeps its own copy of each list or dict an event holds, and a read
    hands out copies (:func:`~flowscope.events.own_values`; ~2 us for an event with a small dict, nothing copied
    for one without).
    """

    def __init__(self) -> None:
        self._events: dict[str, list[Event]] = {}
        self._folds: dict[str, WorkflowState] = {}
        self._folded: dict[str, int] = {}  # how many of a session's events are folded
        self._own: dict[str, _Ownership] = {}
        self._workers: dict[str, WorkerInfo] = {}
        self._mail: dict[str, list[Message]] = {}  # the inbox: messages not yet taken in
        self._next_message = 1
        self._exported: dict[str, int] = {}  # the span-shipping watermark per session
        self._lock = threading.RLock()

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

    def append(
        self, session_id: str, events: Sequence[Event], expected_last_seq: int, *, epoch: int | None = None
    ) -> list[Event]:
        with self._lock:
            own = self._own.get(session_id)
            if epoch is not None and (own.epoch if own is not None else 0) != epoch:
                raise lost_lease(session_id, own, epoch)
            log = self._events.get(session_id)
            numbered = number_events(session_id, events, len(log) if log else 0, expected_last_seq)
            if not numbered:
                return numbered
            if log is None:
                log = self._events[session_id] = []
            log.extend([own_values(e) for e in numbered])  # the log's own values
            for e in numbered:
                if type(e) is RunSubmitted:
                    own = self._own.setdefault(session_id, _Ownership())
                    own.submitted_at = e.ts  # the first submit, or a retry that queues it again
            return numbered

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        return [own_values(e) for e in self._events.get(session_id, ())[after_seq:]]

    def last_seq(self, session_id: str) -> int:
        return len(self._events.get(session_id, ()))

    def _info(self, sid: str, s: WorkflowState) -> SessionInfo:
        own = self._own.get(sid) or _Ownership()
        return SessionInfo(
            sid, *session_columns(s), own.owner, own.epoch, own.lease_expires_at, own.submitted_at
        )

    def sessions(self) -> list[SessionInfo]:
        with self._lock:
            out = [self._info(sid, s) for sid, s in self._states.items()]
        out.sort(key=lambda s: s.updated_at or 0.0, reverse=True)
        return out

    def session_info(self, session_id: str) -> SessionInfo | None:
        with self._lock:
            state = self._state(session_id)
            return None if state is None else self._info(session_id, state)

    def heartbeat(self, session_id: str, paths: Iterable[str], ts: float | None = None) -> None:
        with self._lock:
            state = self._state(session_id)
            if state is None:
                return
            now = time.time() if ts is None else ts
            for path in paths:
                ns = state.nodes.get(path)
                if ns is not None and ns.status == "running":
                    ns.heartbeat_at = now

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        with self._lock:
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

    # ------------------------------------------------------------------ ownership

    def acquire(
        self, session_id: str, owner: Owner, lease_s: float, *, force: bool = False, now: float | None = None
    ) -> Lease:
        with self._lock:
            clock = LeaseClock(now)
            own = self._own.setdefault(session_id, _Ownership())
            check_acquire(session_id, owner, own, clock.now, force=force)
            return self._take(session_id, own, owner, lease_s, clock)

    def _take(
        self, session_id: str, own: _Ownership, owner: Owner, lease_s: float, clock: LeaseClock
    ) -> Lease:
        start = clock.grant()
        own.owner, own.epoch = owner, own.epoch + 1
        own.lease_expires_at, own.lease_renewed_at = start + lease_s, start
        return Lease(session_id, owner, own.epoch, start + lease_s)

    def acquire_new(
        self, session_id: str, owner: Owner, lease_s: float, *, now: float | None = None
    ) -> Lease | None:
        with self._lock:  # the check and the lease under one lock
            clock = LeaseClock(now)
            if self._events.get(session_id):
                return None
            own = self._own.setdefault(session_id, _Ownership())
            check_acquire(session_id, owner, own, clock.now, force=False)
            return self._take(session_id, own, owner, lease_s, clock)

    def append_and_release(
        self, batches: Sequence[AppendBatch], leases: Mapping[str, Lease]
    ) -> tuple[list[list[Event] | BaseException], set[str]]:
        with self._lock:  # the appends, the inbox check and the releases under one lock
            results = self.append_many(batches)
            released: set[str] = set()
            for (sid, _events, _expected, _epoch), r in zip(batches, results):
                lease = leases.get(sid)
                if lease is not None and not isinstance(r, BaseException) and not self._mail.get(sid):
                    own = self._own.get(sid)
                    if own is not None and own.epoch == lease.epoch:
                        own.lease_expires_at = 0.0
                        released.add(sid)
            return results, released

    def renew(self, lease: Lease, lease_s: float, *, now: float | None = None) -> Lease:
        now = time.time() if now is None else now
        with self._lock:
            own = self._own.get(lease.session_id)
            if own is None or own.epoch != lease.epoch:
                raise lost_lease(lease.session_id, own, lease.epoch)
            own.lease_expires_at, own.lease_renewed_at = now + lease_s, now
            return dataclasses.replace(lease, expires_at=now + lease_s)

    def release(self, lease: Lease) -> None:
        with self._lock:
            own = self._own.get(lease.session_id)
            if own is not None and own.epoch == lease.epoch:
                own.lease_expires_at = 0.0

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
        wanted = set(workflows)
        with self._lock:
            clock = LeaseClock(now)  # once the store is this claim's
            now = clock.now
            # as the SQL stores do: each holder of a lease not ended is asked about once,
            # and only the sessions of the dead ones among them go on to the rule
            held = {o.owner for o in self._own.values() if lease_held(o.owner, o.lease_expires_at, now)}
            dead = set(dead_owners(((o, o) for o in held), this_host()))
            found: list[ClaimPick] = []
            for sid, s in self._states.items():
                if s.workflow not in wanted:
                    continue
                own = self._own.get(sid) or _Ownership()
                if lease_held(own.owner, own.lease_expires_at, now) and own.owner not in dead:
                    continue  # a live owner's
                candidate = ClaimCandidate(
                    sid,
                    s.workflow,
                    s.status,
                    own.owner,
                    own.lease_expires_at,
                    own.recoveries,
                    None,
                    mail=bool(self._mail.get(sid)),
                )
                reason = claim_rule(candidate, now, host=None, max_recoveries=max_recoveries)
                if reason is None:
                    continue
                since = claimable_since(s.status, own.submitted_at, s.updated_at, own.lease_expires_at, now)
                found.append(
                    ClaimPick(since, sid, s.workflow, reason, 0, handed_back_orphan(candidate, reason))
                )
            out: list[Claim] = []
            for pick in claim_cut(found, limit):
                own = self._own.setdefault(pick.session_id, _Ownership())
                if pick.recovers:
                    own.recoveries += 1
                lease = self._take(pick.session_id, own, owner, lease_s, clock)
                out.append(
                    Claim(pick.session_id, pick.workflow, pick.reason, lease, handed_back=pick.handed_back)
                )
            return out

    # ------------------------------------------------------------------ the inbox

    def send(
        self, session_id: str, kind: str, body: Mapping[str, Any], *, ts: float | None = None
    ) -> Message:
        with self._lock:
            msg = Message(session_id, self._next_message, kind, dict(body), time.time() if ts is None else ts)
            self._next_message += 1
            self._mail.setdefault(session_id, []).append(msg)
            return msg

    def inbox(self, session_id: str) -> list[Message]:
        with self._lock:
            return list(self._mail.get(session_id, ()))

    def sessions_with_mail(self, session_ids: Collection[str]) -> set[str]:
        with self._lock:
            return {sid for sid in session_ids if self._mail.get(sid)}

    def take_in(
        self,
        session_id: str,
        events: Sequence[Event],
        expected_last_seq: int,
        message_ids: Collection[int],
        *,
        epoch: int,
    ) -> list[Event]:
        with self._lock:  # the lock makes the append and the deletion one step
            stored = self.append(session_id, events, expected_last_seq, epoch=epoch) if events else []
            if not events:
                own = self._own.get(session_id)
                if (own.epoch if own is not None else 0) != epoch:  # the fence holds for the deletion too
                    raise lost_lease(session_id, own, epoch)
            taken = set(message_ids)
            left = [m for m in self._mail.get(session_id, ()) if m.message_id not in taken]
            if left:
                self._mail[session_id] = left
            else:
                self._mail.pop(session_id, None)
            return stored

    def workers_seen(self, owner: Owner, workflows: Collection[str], ts: float | None = None) -> None:
        now = time.time() if ts is None else ts
        with self._lock:
            self._workers[owner.worker_id] = WorkerInfo(
                owner.worker_id, owner.host, owner.pid, tuple(sorted(workflows)), now
            )
            for wid in [w for w, info in self._workers.items() if info.seen_at < now - WORKER_RETENTION_S]:
                del self._workers[wid]

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            return sorted(self._workers.values(), key=lambda w: w.seen_at, reverse=True)

    # ------------------------------------------------------------------ pruning

    def delete_sessions(self, session_ids: Iterable[str]) -> list[str]:
        deleted = []
        now = time.time()
        with self._lock:
            for sid in dict.fromkeys(session_ids):
                state = self._state(sid)
                if state is None or state.status not in FINISHED_SESSION_STATUSES:
                    continue
                if any(ns.is_open for ns in state.nodes.values()):
                    continue
                own = self._own.get(sid)
                if own is not None and owner_alive(own.owner, own.lease_expires_at, now):
                    continue
                del self._events[sid]
                self._folds.pop(sid, None)
                self._folded.pop(sid, None)
                self._own.pop(sid, None)
                self._mail.pop(sid, None)
                self._exported.pop(sid, None)
                deleted.append(sid)
        return deleted

    # -- upkeep: the span watermark ------------------------------------------------------

    def exported_seq(self, session_id: str) -> int:
        return self._exported.get(session_id, 0)

    def set_exported_seq(self, session_id: str, seq: int) -> None:
        with self._lock:
            if seq > self._exported.get(session_id, 0):
                self._exported[session_id] = seq
