"""The runner: the public face of the engine, over an event store and plugins.

:class:`Runner` loads a session (from its last snapshot and the events after it, or the
whole log), takes its lease in the store (refused while another live owner holds it;
:mod:`flowscope.liveness`), and hands the walk to one :class:`~.invocation.Invocation`
per ``run``/``resume`` call. Every append is fenced by the lease's epoch; :mod:`.lease`
keeps the lease from a thread of its own. What an invocation does is in its parts:
``invocation.py`` (scheduling, the resume audit), ``attempts.py`` (attempts and terminal
events), ``pauses.py`` (input and jobs), ``record.py`` (emit and flush under the lease),
``tasks.py`` (the runs in flight, the abort); the runner uses their public API only.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from functools import partial
from typing import Any, ClassVar

from ..errors import (
    ConcurrencyConflict,
    InvocationAbortedError,
    LeaseHandedOff,
    LeaseLost,
    Redactor,
    ResumeError,
    SessionCancelledError,
    StoreError,
    UnknownSessionError,
    WorkflowError,
    redact_message,
)
from ..events import Event, RunFinished
from ..fold import WorkflowState, rebuild
from ..liveness import DEFAULT_HEARTBEAT_INTERVAL_S
from ..ownership import Lease, this_process
from ..store.base import EventStore
from .commit import GroupCommit
from .context import NodeContext, PauseSignal, RunResult
from .endings import let_go, read_mail, release
from .graph import Workflow
from .hooks import Plugin, PluginDispatcher
from .ids import new_id
from .inbox import take_in
from .invocation import Invocation
from .lease import LeaseKeeper
from .pauses import Answer, check_own_engine, validate_answers
from .record import Halted, NodeResult
from .snapshots import load_snapshot, save_snapshot
from .submit import (
    check_input,
    check_runner_options,
    check_session_id,
    check_store,
    check_workflow,
    no_running_loop,
    submit_run,
)
from .tasks import others_ready, settle_cancels, take_back_cancels

__all__ = ["Runner", "RunResult"]

log = logging.getLogger("flowscope.engine")

#: How many sessions a runner remembers as cut off by a store fault (Runner._cut_off).
_CUT_OFF_SESSIONS = 65536


class Runner:
    """Runs a workflow over an event store, with plugins.

    ``error_codes`` maps exception types to error codes (matched along the MRO).
    ``redact`` (str -> str) is applied to every error message before it is recorded, so
    events, spans, metrics, exports and the CLI only ever see its result; the default,
    :func:`flowscope.errors.redact_message`, masks absolute paths and credential shapes.
    ``max_recoveries`` bounds how often a run that kills its worker is re-executed.
    ``lease_s``: every invocation holds a lease on its session in the store, renewed every
    ``lease_s / 3`` by a daemon thread (so a node that blocks the loop keeps it); while
    the owner lives and its lease runs, another ``resume()`` is refused with
    ``ConcurrencyConflict`` (``force=True`` takes it anyway). ``worker_id`` names this
    runner's owner (:attr:`owner`) in the store; a new one is made if omitted.
    ``heartbeat_interval``: how often the same thread refreshes the heartbeat of the runs
    in flight (at most once per renewal; 0 turns heartbeats off).
    ``snapshot_every``: when an invocation leaves a session resumable and its log has grown
    by this many events since the last snapshot, the fold is saved so that the next resume
    reads the snapshot and the events after it, not the whole log.
    Without a ``store``, a new :attr:`default_store` is used (in-memory unless changed).
    """

    #: Makes the store of a Runner built without one. The engine knows only the ``EventStore``
    #: port: the package root (``flowscope/__init__.py``, run before any of its modules) sets
    #: this to the in-memory reference store, ``flowscope.store.MemoryEventStore``.
    default_store: ClassVar[Callable[[], EventStore] | None] = None

    def __init__(
        self,
        workflow: Workflow,
        store: EventStore | None = None,
        plugins: Iterable[Plugin] = (),
        *,
        error_codes: Mapping[type, str] | None = None,
        redact: Redactor | None = None,
        max_recoveries: int = 3,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        snapshot_every: int = 1000,
        seed: int | None = None,
        lease_s: float = 15.0,
        worker_id: str | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be a positive number of seconds")
        check_runner_options(max_recoveries, error_codes)
        check_workflow(workflow)
        self.workflow = workflow
        #: The store is the default one (in memory): a pause is said to live only here.
        self._store_in_memory = store is None
        if store is None:
            factory = type(self).default_store
            if factory is None:
                raise TypeError("Runner needs a store: pass store=..., an EventStore")
            store = factory()
        self._store: EventStore = check_store(store, "Runner(store=...)")
        self.plugins = PluginDispatcher(plugins)
        self.error_codes = dict(error_codes or {})
        self.redact: Redactor = redact_message if redact is None else redact
        self.max_recoveries = max_recoveries
        self.snapshot_every = snapshot_every
        self.heartbeat_interval = heartbeat_interval
        self.rng = random.Random(seed)
        self._active: dict[str, Invocation] = {}
        self._starting: set[str] = set()  # new sessions waiting for their leases
        #: session -> the ids of its last invocations here that halted on a store error (not
        #: a lost lease): the next one here knows the runs they left open were cut off by
        #: a halt, not a crash (ResumeAudit.cut_off). Bounded: oldest dropped first.
        self._cut_off: dict[str, frozenset[str]] = {}
        self.lease_s = lease_s
        self.owner = this_process(worker_id, ships_spans=self.plugins.ships_spans)
        self._commits = GroupCommit(store)  # appends of concurrent sessions share transactions
        self._release = partial(release, store)  # bound once, not per invocation
        self._on_mail = partial(read_mail, store)
        self._keeper = LeaseKeeper(store, lease_s, heartbeat_interval, f"flowscope-lease-{workflow.name}")

    # -- public API -------------------------------------------------------------------

    @property
    def store(self) -> EventStore:
        """The store this runner records to. Fixed when the runner is made: its group commit
        and lease keeper write to it, so recording elsewhere takes a new ``Runner``."""
        return self._store

    async def run(self, input: Any = None, *, session_id: str | None = None) -> RunResult:
        """Run the workflow in a new session. A failure raises the node's original exception."""
        input = check_input(input)
        return await self._invoke(new_id() if session_id is None else session_id, input, resume=False)

    async def resume(
        self,
        session_id: str,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
        lease: Lease | None = None,
        handed_back: bool = False,
    ) -> RunResult:
        """Continue a paused, failed or crashed session from the store alone, or start a
        queued one (:meth:`submit`).

        ``inputs`` answers open input requests by interrupt id; ``jobs`` delivers results of
        dispatched jobs by job id; answers recorded by :func:`flowscope.answer` are
        consumed as if given here. Completed runs are fast-forwarded, never re-executed.
        ``lease``: a lease already taken (a worker's ``store.claim()``) to run under,
        instead of acquiring one, and kept if the store halts the run (its taker takes the
        session back); ``force`` takes the session from a live owner. ``handed_back`` (a
        worker's ``Claim`` says so): its last owner drained, so the runs it left running were
        cut off, not crashed: they run again at their next attempt, and are no recoveries.
        """
        return await self._invoke(
            session_id,
            None,
            resume=True,
            inputs=inputs,
            jobs=jobs,
            force=force,
            lease=lease,
            handed_back=handed_back,
        )

    def submit(self, input: Any = None, session_id: str | None = None) -> str:
        """Record a run to be started later (by a worker, or :meth:`resume`), without
        running it; returns its session id. The session must be new. The checks of
        ``flowscope start`` (:func:`~.submit.submit_run`): one rule for both."""
        return submit_run(self.store, self.workflow.name, input, session_id)

    def run_sync(self, input: Any = None, *, session_id: str | None = None) -> RunResult:
        """:meth:`run` for scripts without an event loop."""
        no_running_loop("run_sync", "run")
        return asyncio.run(self.run(input, session_id=session_id))

    def resume_sync(
        self,
        session_id: str,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
    ) -> RunResult:
        """:meth:`resume` for scripts without an event loop."""
        no_running_loop("resume_sync", "resume")
        return asyncio.run(self.resume(session_id, inputs, jobs, force=force))

    async def stream(self, input: Any = None, *, session_id: str | None = None) -> AsyncIterator[Event]:
        """Run and yield every event as it is appended; a failure is raised after its
        ``NodeErrorEvent`` has been yielded (R2, docs/design.md)."""
        sid = new_id() if session_id is None else session_id
        async for e in self._stream(lambda cb: self._invoke(sid, input, resume=False, on_event=cb)):
            yield e

    async def stream_resume(
        self,
        session_id: str,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
        lease: Lease | None = None,
    ) -> AsyncIterator[Event]:
        """:meth:`resume`, yielding every event as it is appended."""
        async for e in self._stream(
            lambda cb: self._invoke(
                session_id, None, resume=True, inputs=inputs, jobs=jobs, force=force, lease=lease, on_event=cb
            )
        ):
            yield e

    def abort(self, session_id: str, reason: str = "aborted") -> bool:
        """Abort the invocation running for ``session_id`` in this process.

        Its runs are cancelled (``NodeCancelled`` with ``reason``, never an error) and
        ``run()``/``resume()`` raise :class:`InvocationAbortedError`; :meth:`resume` may
        run the session again (only an operator's cancel is ``final``). False if no
        invocation of that session is running here.
        """
        inv = self._active.get(session_id)
        return inv is not None and inv.abort(reason)

    def hand_off(self, session_id: str, reason: str) -> bool:
        """Stop the invocation running for ``session_id`` here without a call to the store,
        as a lost lease does: it records nothing more, its runs stop at their ``await``, and
        its lease expires by itself (a worker's drain while the store does not answer, where
        each call would wait out a timeout). False if no invocation of it runs here."""
        inv = self._active.get(session_id)
        if inv is None:
            return False
        inv.record.lose_lease(LeaseHandedOff(f"session {session_id!r} was let go: {reason}"))
        return True

    def check_leases(self) -> int:
        """Stop now every invocation of this runner whose lease is no longer safe by this
        process's own clocks (``engine/lease.py``): it halts with ``LeaseExpired``, its runs
        are cancelled at their ``await`` and it records nothing more. Returns how many.

        Two clock reads per invocation, no store call and no lock, so it may be called
        from a signal handler in the loop's thread: :class:`~flowscope.Worker` calls it on
        SIGCONT, which Python runs before the loop steps the tasks whose timers expired
        while the process was stopped.
        """
        stopped = 0
        for inv in list(self._active.values()):
            if inv.expire_if_unsafe():
                stopped += 1
        return stopped

    # -- internals ----------------------------------------------------------------------

    async def _stream(self, start: Callable[[Callable[[Event], None]], Any]) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        task = asyncio.ensure_future(start(queue.put_nowait))
        task.add_done_callback(lambda _t: queue.put_nowait(done))
        try:
            while True:
                item = await queue.get()
                if item is done:
                    break
                yield item
            task.result()  # the run's own exception, after every event it produced
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _load(self, session_id: str, resume: bool) -> WorkflowState:
        if not resume:
            if self.store.last_seq(session_id) > 0:
                raise _exists(session_id)
            return WorkflowState(session_id=session_id)
        ws = load_snapshot(self.store, session_id)
        if ws is None:
            events = self.store.read(session_id)
            if not events:
                raise UnknownSessionError(
                    f"no session {session_id!r} in the store: check the id (flowscope runs lists them)"
                )
            ws = rebuild(events)
        self._check(ws)
        return ws

    def _check(self, ws: WorkflowState, *, inbox_read: bool = False) -> None:
        """Refuse to resume a session of another workflow, one an operator cancelled, or
        one that has completed unless its inbox (not read yet) may retry it, or one another
        engine runs (a bridge's)."""
        check_own_engine(ws)
        if ws.workflow and ws.workflow != self.workflow.name:
            raise ResumeError(
                f"session {ws.session_id!r} ran workflow {ws.workflow!r}, not {self.workflow.name!r}: "
                "resume it with a Runner for that workflow"
            )
        if ws.status == "completed" and not inbox_read and self.store.inbox(ws.session_id):
            return  # a retry may be waiting: checked again once the inbox is taken in
        if ws.status == "completed":
            raise ResumeError(f"session {ws.session_id!r} already completed; there is nothing to resume")
        if ws.final:
            msg = f"session {ws.session_id!r} was cancelled by an operator; it is over for good"
            raise SessionCancelledError(msg + ": start a new session to run it again")

    async def _start(self, session_id: str) -> tuple[WorkflowState, Lease]:
        """A new session's state and lease: the check that it is new and the lease in one
        step, taken with the other sessions starting in this loop turn (:mod:`.commit`)."""
        self._starting.add(session_id)  # held through the await: a second run here is refused
        try:
            lease = await self._commits.acquire_new(session_id, self.owner, self.lease_s, self._release)
        finally:
            self._starting.discard(session_id)
        if lease is None:
            raise _exists(session_id)
        return WorkflowState(session_id=session_id), lease

    def _take(
        self, session_id: str, resume: bool, force: bool, lease: Lease | None
    ) -> tuple[WorkflowState, Lease]:
        """Load the session and hold its lease: the one given, or one acquired now.

        Acquiring comes after the load's checks and before anything is appended; the
        events another owner appended in between are folded in (and checked) after it,
        and then the messages in its inbox are taken in (:mod:`.inbox`).
        """
        if lease is not None and lease.session_id != session_id:
            raise ValueError(f"the lease is for session {lease.session_id!r}, not {session_id!r}")
        try:
            ws = self._load(session_id, resume)
            if lease is None:
                lease = self.store.acquire(session_id, self.owner, self.lease_s, force=force)
                if resume and self.store.last_seq(session_id) != ws.last_seq:
                    for e in self.store.read(session_id, ws.last_seq):
                        ws.apply(e)
                    self._check(ws)
            if resume:
                taken = take_in(self.store, ws, lease)  # what others sent while it was not ours
                if any(type(e) is RunFinished and e.status == "cancelled" for e in taken):
                    raise SessionCancelledError(
                        f"session {session_id!r} was cancelled by a request in its inbox"
                    )
                self._check(ws, inbox_read=True)
        except BaseException:
            if lease is not None:
                self._release(lease)
            raise
        return ws, lease

    async def _conflict(self, session_id: str) -> None:
        if self.plugins.wants("on_resume_conflict"):
            await self.plugins.call("on_resume_conflict", session_id, self.workflow.name)

    async def _invoke(
        self,
        session_id: str,
        input: Any,
        *,
        resume: bool,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        force: bool = False,
        lease: Lease | None = None,
        on_event: Callable[[Event], None] | None = None,
        handed_back: bool = False,
    ) -> RunResult:
        check_session_id(session_id)  # before anything is read or appended
        given = lease is not None  # a worker's claim: a halt by the store keeps it (endings.let_go)
        if session_id in self._active or session_id in self._starting:
            raise ConcurrencyConflict(f"session {session_id!r} is already running in this runner")
        try:
            if not resume and lease is None and not force:
                ws, lease = await self._start(session_id)
            else:
                ws, lease = self._take(session_id, resume, force, lease)
        except ConcurrencyConflict:  # refused at the start: a lost race, not a failure
            await self._conflict(session_id)
            raise
        try:
            answers = validate_answers(ws, inputs or {}, jobs or {}) if inputs or jobs else []
            if resume and ws.status == "queued":  # submitted by a tool that skipped submit()'s checks
                check_input(ws.input)
        except BaseException:
            self._release(lease)
            raise
        first = not resume or (
            ws.status == "queued" and ws.invocations == 0
        )  # a submitted run starts as a first run
        if resume:
            input = ws.input
        inv = Invocation(
            store=self.store,
            plugins=self.plugins,
            error_codes=self.error_codes,
            redact=self.redact,
            max_recoveries=self.max_recoveries,
            rng=self.rng,
            session_id=session_id,
            ws=ws,
            workflow=self.workflow.name,
            input=input,
            resumed=not first,
            on_event=on_event,
            on_mail=self._on_mail,
            lease=lease,
            lease_s=self.lease_s,
            commits=self._commits,
            # cut off by a store fault here or its last owner's hand-back: not crashed
            cut_off=self._cut_off.pop(session_id, frozenset())
            | ({ws.invocation_id} if handed_back else set()),
        )
        self._active[session_id] = inv
        self._commits.active += 1
        self._keeper.add(inv.record)
        inv.kept = True
        result: RunResult | None = None
        error: BaseException | None = None
        try:
            result = await self._drive(inv, input, answers)
        except BaseException as exc:
            error = exc
        self._active.pop(session_id, None)
        self._commits.active -= 1
        if inv.kept:  # _drive stopped before its last flush
            self._keeper.remove(inv.record)
        if not inv.released:  # else the last flush ended the lease: the session had no mail
            await let_go(store=self.store, inv=inv, keep_on_fault=given)
        if isinstance(error, InvocationAbortedError) and inv.cancelled_by_request:
            error = SessionCancelledError(f"session {session_id!r} was cancelled: {inv.abort_reason}")
        plugins = self.plugins
        halted = inv.halted
        if halted is not None:
            # A failed append or a lost lease: that is what the caller gets, whatever
            # the runs did after it (they stopped, and nothing more was recorded).
            result, error = None, halted
            if isinstance(halted, LeaseLost):
                if plugins.wants("on_lease_lost"):
                    await plugins.call("on_lease_lost", session_id, self.workflow.name)
            elif isinstance(halted, StoreError):  # a failed append, or renewals it refused: not a crash
                self._cut_off[session_id] = inv.cut_off | {inv.invocation_id}
                if len(self._cut_off) > _CUT_OFF_SESSIONS:
                    self._cut_off.pop(next(iter(self._cut_off)))
        if isinstance(error, ConcurrencyConflict):
            await self._conflict(session_id)
        if plugins.wants("after_run"):
            await plugins.call("after_run", inv.run, result, error)
        if error is not None:
            raise error
        assert result is not None
        return result

    async def _drive(self, inv: Invocation, input: Any, answers: list[Answer]) -> RunResult:
        """Record the invocation's start, walk the graph, record how it ended."""
        run = inv.run
        plugins = self.plugins
        if plugins.wants("before_run"):
            await plugins.call("before_run", run)
        inv.begin(answers)
        result: RunResult | None = None
        try:
            out = await self._walk(inv, input)
            result = RunResult(
                status="completed",
                output=out.output,
                session_id=inv.session_id,
                invocation_id=inv.invocation_id,
                replayed=inv.replayed,
                recovered=inv.recovered,
            )
            inv.finish("completed", output=out.output)
        except PauseSignal:
            result = RunResult(
                status="paused",
                output=None,
                session_id=inv.session_id,
                invocation_id=inv.invocation_id,
                replayed=inv.replayed,
                recovered=inv.recovered,
            )
            inv.finish("paused")
            if self._store_in_memory:  # once: the session's answer can reach it only here
                self._store_in_memory = False
                log.warning(
                    "session %s paused in this Runner's in-memory store (no store= given): it is lost "
                    "when the process ends; pass store=SqliteEventStore(path) to resume it anywhere",
                    inv.session_id,
                )
            result.pending = inv.ws.pending
        except Halted:
            raise
        except (asyncio.CancelledError, InvocationAbortedError, KeyboardInterrupt):
            # a KeyboardInterrupt raised in a body is the process going down, as Ctrl-C's
            # cancellation is: its runs stopped (cancelled), the invocation failed nothing
            inv.finish("cancelled")
            raise
        except BaseException as exc:
            reported = inv.failure_of(exc)
            if reported is not None:
                run.error_message = reported.message
                inv.finish("failed", error_code=reported.code, error_path=reported.path)
            else:
                info = inv.classify(exc)
                run.error_message = info.message
                inv.finish("failed", error_code=info.code)
            raise
        finally:
            # The last flush ends the lease unless the session has mail (then it is taken
            # in first, _invoke): no renewal may follow, so the keeper lets go of it first.
            self._keeper.remove(inv.record)
            inv.kept = False
            # a failure to append RunFinished halts the invocation like any other
            await inv.flush(release=True)
            if result is None or result.status != "completed":
                save_snapshot(self.store, inv, self.snapshot_every)
        return result

    async def _walk(self, inv: Invocation, input: Any) -> NodeResult:
        """Run the root workflow where :meth:`abort` can cancel it: in the caller's own task
        (no task of its own, no loop turns to start and finish one); whatever an abort
        surfaces as (a cancellation, a timeout) is raised as ``InvocationAbortedError``."""
        # RunStarted is appended with the first NodeStarted, before any node body runs
        # (a process that loses a race for the session fails there, having run nothing).
        task = asyncio.current_task()
        if task is None:  # driven outside any task: the walk runs in one of its own
            inner = asyncio.ensure_future(self._walk(inv, input))
            try:
                return await inner
            except asyncio.CancelledError:
                inner.cancel()
                await asyncio.gather(inner, return_exceptions=True)
                raise
        if others_ready(task.get_loop()):
            # Let the invocations started in the same loop turn start too (one turn), so that
            # their flushes share group commits (commit.py) instead of each running alone.
            await asyncio.sleep(0)
        cancels = 0
        delivered = False  # a CancelledError reached us
        try:
            try:
                root = inv.enter_walk(task, self.workflow, input)
                out = await inv.run_root(root, input) if isinstance(root, NodeContext) else root
            finally:
                cancels = inv.leave_walk()
        except asyncio.CancelledError:
            delivered = True
            if not take_back_cancels(task, cancels):
                raise  # our caller was cancelled (too), or a body raised it itself: it stands
            if inv.halted is not None:  # the lease was lost: the runs were cancelled for it
                raise Halted(inv.halted) from None
            if not inv.aborting:
                raise
            raise _aborted(inv) from None
        except (PauseSignal, InvocationAbortedError, Halted):
            raise
        except BaseException as exc:
            if inv.aborting:
                raise _aborted(inv) from exc
            raise
        finally:
            if cancels and not delivered:
                await settle_cancels(task, cancels)
        if cancels:  # cancelled in the very step that ended the run: it ends as the cancellation
            if inv.halted is not None:
                raise Halted(inv.halted)
            if inv.aborting:
                raise _aborted(inv)
        return out


def _exists(session_id: str) -> WorkflowError:
    return WorkflowError(
        f"session {session_id!r} already exists: resume it with resume() or run with a new session_id"
    )


def _aborted(inv: Invocation) -> InvocationAbortedError:
    return InvocationAbortedError(f"invocation {inv.invocation_id} of session {inv.session_id!r} was aborted")
