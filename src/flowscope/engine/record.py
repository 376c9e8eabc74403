"""The record of one invocation: its live state, and the events it emits and flushes.

:class:`Recorder` is the part of an invocation every other part records through
(``attempts.py``, ``pauses.py``, ``invocation.py``). It keeps the session's
:class:`~flowscope.fold.WorkflowState` live: every event emitted is folded at once, so
the state is always at the last emitted event. Events are buffered and appended in one
transaction per flush (group commit); the scheduler flushes before a node body starts,
so a terminal event is durable before anything after it runs.

An invocation that cannot record any more (an append failed, or its lease was lost) is
*halted*: it appends nothing more, its in-memory state is never used again, and the
signal :class:`Halted` unwinds its runs as cancellations up to the runner, which raises
the original error to the caller.

An invocation acts only while its lease is safe by its own clocks (``lease.py``,
:func:`~flowscope.engine.lease.safe_until`): :meth:`Recorder.check_lease` runs before a
node body starts, before a retry's next attempt and before every flush, a read of each
clock and no store call. A lease found unsafe there, by the lease keeper (its thread, or its
timer on the loop at the lease's safe end) or by :meth:`Runner.check_leases
<flowscope.engine.runner.Runner.check_leases>` halts the invocation with
:class:`~flowscope.errors.LeaseExpired` and cancels its runs in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from ..errors import ErrorInfo, Redactor, classify
from ..events import Event, RunFinished, own_values
from ..fold import WorkflowState
from ..jsontext import copy_json
from ..ownership import Lease
from ..states import RunStatus
from ..store.base import EventStore
from .commit import GroupCommit, TurnWait
from .context import NodeContext
from .hooks import PluginDispatcher
from .lease import SafeUntil, lease_expired, safe_until
from .state import TrackedState
from .tasks import RunTasks
from .values import is_native, json_value

__all__ = ["Recorder", "Halted", "TrackedState", "NodeResult", "Reported", "json_value", "is_native"]

log = logging.getLogger("flowscope.engine")

E = TypeVar("E", bound=Event)


class Halted(BaseException):
    """Unwinds an invocation that can record no more; ``error`` is why (the store's own
    exception, or ``LeaseLost``). A ``BaseException`` so that ``except Exception`` in a
    node body cannot swallow it and go on running work that would not be recorded."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"the invocation stopped: {type(error).__name__}")
        self.error = error


class NodeResult(NamedTuple):
    """What a node run hands the scheduler: its output, the route it chose, and whether
    it produced an output at all (a run without one is no workflow's terminal)."""

    output: Any
    route: str | int | None
    has_output: bool


class Reported(NamedTuple):
    """Where a failure was recorded in this invocation (R5, docs/design.md): the exception
    object, the path of its ``NodeErrorEvent``, and the code and (redacted) message recorded."""

    error: BaseException
    path: str
    code: str
    message: str


class Recorder:
    """The record of one ``run``/``resume`` call: its live fold, the events it emits and
    flushes under its lease, and the failures it recorded.

    The part every other part of an invocation records through. It implements the lease
    keeper's :class:`~flowscope.engine.lease.Leased` (the lease is what every flush is
    fenced by) and the group committer's ``Committing``.
    """

    def __init__(
        self,
        *,
        store: EventStore,
        commits: GroupCommit,
        plugins: PluginDispatcher,
        error_codes: Mapping[type, str],
        redact: Redactor,
        session_id: str,
        invocation_id: str,
        ws: WorkflowState,
        runs: RunTasks,
        lease: Lease,
        lease_s: float,
        on_event: Callable[[Event], None] | None = None,
        on_mail: Callable[[Any], None] | None = None,
        mail_for: Any = None,
    ) -> None:
        self.session_id = session_id
        self.invocation_id = invocation_id
        self._store = store
        self._commits = commits
        self._plugins = plugins
        self._error_codes = error_codes
        self._redact = redact  # every message recorded passes through it (R13, docs/design.md)
        self._runs = runs  # cancelled when the lease is lost
        self._lease = lease  # renewed by the runner's lease keeper, from its thread
        self._lease_s = lease_s
        #: Until when the lease is safe: one record, replaced whole by the keeper's thread,
        #: so the loop never reads half of a renewal.
        self._lease_until = safe_until(lease, lease_s)
        #: Why the keeper's last renewal failed, if the store refused the write (a full disk).
        self._renew_fault: BaseException | None = None
        self._epoch = lease.epoch  # every append is fenced by it
        self._ws = ws
        self._state = TrackedState(copy_json(ws.state))  # not the fold's own values
        self._snapshot_seq = ws.snapshot_seq
        self._flushed_seq = ws.last_seq
        self._submitted_seq = ws.last_seq  # the last seq handed to the committer
        self._buffer: list[Event] = []
        #: Why this invocation can record no more (a failed append, a lost lease), or None.
        self._halted: BaseException | None = None
        # id(exc) -> where a failure was recorded in this invocation, so enclosing runs
        # propagate it without recording it again (R5, docs/design.md). Keyed per
        # invocation: the same exception object raised in another invocation is a new
        # failure and is recorded again.
        self._reported: dict[int, Reported] = {}
        self._on_event = on_event
        #: Called on the loop when the lease keeper finds a message in the session's inbox.
        self._on_mail = on_mail
        self._mail_for = mail_for  # what on_mail is called with (the invocation)
        #: The keeper found mail not read yet: the next body start reads it, since a sync
        #: body holding the loop keeps the keeper's callback from running before it.
        self.mail_waiting = False
        self._released = False

    # -- what the record holds ---------------------------------------------------------

    @property
    def ws(self) -> WorkflowState:
        """The session's live fold, always at the last emitted event (read it, never change it)."""
        return self._ws

    @property
    def state(self) -> TrackedState:
        """``ctx.state``: the session's state, its changes recorded after each run."""
        return self._state

    @property
    def halted(self) -> BaseException | None:
        """Why this invocation can record no more (a failed append, a lost lease), or None."""
        return self._halted

    @property
    def snapshot_seq(self) -> int:
        """The seq of the snapshot the session was loaded from (0: none)."""
        return self._snapshot_seq

    @property
    def released(self) -> bool:
        """Did the last flush end the lease (``flush(release=True)``, the session had no mail)?"""
        return self._released

    def in_sync(self) -> bool:
        """Is the live fold exactly what the log holds (not halted, everything flushed)?"""
        return self._halted is None and not self._buffer and self._flushed_seq == self._ws.last_seq

    # -- failures ----------------------------------------------------------------------

    def classify(self, exc: BaseException) -> ErrorInfo:
        """How this invocation names a failure: its error codes, its redaction."""
        return classify(exc, self._error_codes, self._redact)

    def note_failure(self, exc: BaseException, path: str, info: ErrorInfo) -> None:
        """``exc`` was recorded as failing at ``path`` (its ``NodeErrorEvent`` emitted)."""
        self._reported[id(exc)] = Reported(exc, path, info.code, info.message)

    def failure_of(self, exc: BaseException) -> Reported | None:
        """Where this invocation recorded ``exc``, or None if it did not."""
        prior = self._reported.get(id(exc))
        return prior if prior is not None and prior.error is exc else None

    # -- emit and flush ----------------------------------------------------------------

    def emit(self, cls: type[E], path: str, node: str, **fields: Any) -> E:
        """Buffer a new event and fold it into the live state (a halted invocation only
        builds it: nothing more is recorded)."""
        e = cls(
            session_id=self.session_id,
            invocation_id=self.invocation_id,
            seq=self._ws.last_seq + 1,  # the live fold is always at the last emitted event
            ts=time.time(),
            path=path,
            node=node,
            **fields,
        )
        if self._halted is None:
            self._buffer.append(e)
            # the live fold keeps its own lists and dicts: a node that changes its input in
            # place (the value just recorded) changes neither a snapshot nor a replay of it
            self._ws.apply(own_values(e))
        return e

    async def flush(self, release: bool = False) -> None:
        """Append everything buffered in one transaction (shared with other sessions ready
        in the same loop turn, ``commit.py``) and return once it is committed.

        ``release``: the invocation's last flush; the lease ends in the same step unless
        the session has mail (:attr:`released` says whether it did), so that the lease
        keeper must no longer renew it.

        If the append fails, the invocation halts: the store's error is kept and
        :class:`Halted` raised, and nothing is appended after it.
        """
        fut = self.flush_start(release)
        if fut is not None:
            await fut
            self.flush_end()

    def flush_start(self, release: bool = False) -> TurnWait | None:
        """:meth:`flush` up to its wait, for a caller on the hot path that awaits without a
        coroutine of its own: None when there is nothing to wait for (nothing buffered, or
        appended now: :class:`Halted` raised if that failed), else the wait to await,
        then :meth:`flush_end`."""
        batch = self._buffer
        if not batch or self._halted is not None:
            return None
        until = self._lease_until
        if time.monotonic() >= until.monotonic or time.time() >= until.wall:
            self.check_lease()  # the lease may have expired: record nothing (raises Halted)
        self._buffer = []
        expected, self._submitted_seq = self._submitted_seq, batch[-1].seq
        fut = self._commits.submit(
            self, self.session_id, batch, expected, self._epoch, self._lease if release else None
        )
        if fut is None:
            self.flush_end()
        return fut

    def flush_end(self) -> None:
        """After :meth:`flush_start`'s wait: raise :class:`Halted` if the append failed."""
        if self._halted is not None:
            raise Halted(self._halted) from self._halted

    def committed(self, batch: Sequence[Event], error: BaseException | None, released: bool = False) -> None:
        """The committer settled ``batch``: halt on ``error``, else tell plugins and streams.
        ``released``: the lease ended with it (a last flush, :meth:`flush`)."""
        if error is not None:  # a lock, a full disk, a lost lease: all end the invocation
            self.halt(error)
            return
        self._flushed_seq = batch[-1].seq
        self._released = released
        if self._plugins.has_on_event:
            self._plugins.on_events(batch)  # one call per plugin and append, not per event
        if self._on_event is not None:
            for e in batch:
                self._on_event(e)

    def halt(self, error: BaseException) -> None:
        """Record nothing more: ``error`` is what the caller will get."""
        if self._halted is None:
            self._halted = error
        self._buffer = []

    def finish(
        self,
        status: RunStatus,
        *,
        replayed: int,
        recovered: int,
        output: Any = None,
        error_code: str | None = None,
        error_path: str | None = None,
        final: bool = False,
    ) -> None:
        """Emit the invocation's ``RunFinished`` (the caller flushes it)."""
        self.emit(
            RunFinished,
            "",
            "",
            status=status,
            output=output,
            error_code=error_code,
            error_path=error_path,
            replayed=replayed,
            recovered=recovered,
            final=final,
        )

    def heartbeat(self, paths: Iterable[str]) -> None:
        self._store.heartbeat(self.session_id, list(paths))

    # -- the lease (Leased, for the keeper) --------------------------------------------

    @property
    def lease(self) -> Lease:
        """The lease as last renewed."""
        return self._lease

    @property
    def lease_until(self) -> SafeUntil:
        return self._lease_until

    @property
    def renew_fault(self) -> BaseException | None:
        return self._renew_fault

    @property
    def in_flight(self) -> Mapping[str, NodeContext]:
        return self._runs.in_flight

    def lose_lease(self, exc: BaseException) -> None:
        """Called on the loop when the lease is gone (taken over, or no longer safe): halt,
        and cancel the runs (a cancellation, never a failure).

        Every branch task is cancelled here, not only the root: a branch woken by its timer
        in the same loop turn would otherwise take its step (the rest of its body up to its
        next ``await``) before the root's cancellation reached it. Called from the keeper
        (``call_soon_threadsafe``) or from a signal handler (:meth:`Runner.check_leases
        <flowscope.engine.runner.Runner.check_leases>`): it takes no lock and calls no store.
        """
        if self._halted is not None:
            return
        self.halt(exc)
        self._runs.cancel_all()

    def lease_ok(self) -> bool:
        """Is the lease still safe by this process's clocks (``lease.py``)?"""
        until = self._lease_until
        return time.monotonic() < until.monotonic and time.time() < until.wall

    def expire_if_unsafe(self) -> bool:
        """Lose the lease with ``LeaseExpired`` if it is no longer safe by this process's
        clocks; True if it did (:meth:`Runner.check_leases`)."""
        if self._halted is not None or self.lease_ok():
            return False
        self.lose_lease(lease_expired(self.session_id, self._renew_fault))
        return True

    def renewed(self, lease: Lease, t0: float) -> None:
        """The keeper renewed the lease (requested at monotonic ``t0``). Its thread calls this."""
        self._lease_until = safe_until(lease, self._lease_s, t0)
        self._lease = lease
        self._renew_fault = None

    def renew_refused(self, fault: BaseException) -> None:
        """The store refused a renewal's write (the keeper's thread): why the lease may end."""
        self._renew_fault = fault

    def check_lease(self) -> None:
        """Go on only if this invocation may still act: raise :class:`Halted` if it is
        halted, or if its lease is no longer safe (then it halts with ``LeaseExpired`` and
        its other runs are cancelled). Called before every node body, every retry's next
        attempt and every flush: a read of each clock, no store call."""
        if self._halted is None:
            until = self._lease_until
            if time.monotonic() < until.monotonic and time.time() < until.wall:
                return
            self.halt(lease_expired(self.session_id, self._renew_fault))
            self._runs.cancel_all(asyncio.current_task())  # this one unwinds by the Halted below
        error = self._halted
        assert error is not None
        raise Halted(error) from error

    def mail_found(self) -> None:
        """The keeper's thread found a message in the session's inbox (see :mod:`.inbox`)."""
        self.mail_waiting = True

    def mail_arrived(self) -> None:
        """Called on the loop after :meth:`mail_found`: read the mail, unless a body start
        read it first (:meth:`read_mail`)."""
        if not self.mail_waiting:
            return
        self.mail_waiting = False
        if self._on_mail is not None and self._halted is None:
            self._on_mail(self._mail_for)

    async def read_mail(self) -> None:
        """Before a body starts, when :attr:`mail_waiting`: read the mail; a cancel stops
        this run here, at an await, as it would an async body at its first one."""
        self.mail_arrived()
        if self._runs.aborting:
            task = asyncio.current_task()
            if task is not None and not task.cancelling():  # a branch: the root's cancel reaches it later
                task.cancel()
            await asyncio.sleep(0)
