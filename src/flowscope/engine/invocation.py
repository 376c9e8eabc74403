"""One ``run``/``resume`` call: the scheduler, composed of its parts.

:class:`Invocation` walks a workflow's graph in steps: all nodes activated together run
in parallel, and the next step is computed from their results in declaration order. That
makes paths deterministic (``check@2`` is always the same run), which is what lets resume
match recorded runs to new ones: :meth:`Invocation.prepare` looks a path up in the live
fold and fast-forwards a completed run, keeps a waiting one waiting, recovers a crashed
one or starts a new one.

The parts, each with its own state: :class:`~.record.Recorder` (the live fold, emit and
flush under the lease, the failures recorded), :class:`~.tasks.RunTasks` (the runs in
flight, their tasks, the abort), :class:`ResumeAudit` (what the runs the log left open are
to this invocation, the resume audit's counts), :class:`~.attempts.Attempts` (a node run's
attempts and terminal event) and :class:`~.pauses.Pauses` (input requests, jobs). The
runner and a node's context talk to the invocation through its public methods only.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, cast

from ..errors import ErrorInfo, Redactor, WorkflowError
from ..events import Event, InputRequested, NodeCancelled, NodeStarted, RunStarted
from ..fold import OPEN_STATES, NodeState, WorkflowState, containers, from_descendant
from ..jobs import Job
from ..jsontext import copy_json
from ..ownership import Lease, owner_record
from ..states import RunStatus
from ..store.base import EventStore
from .attempts import Attempts
from .commit import GroupCommit
from .context import NodeContext, PauseSignal, RunInfo
from .graph import Node, Workflow
from .handoff import Activation, JoinBuffers, first_activations, next_activations
from .hooks import PluginDispatcher
from .ids import new_id
from .pauses import Answer, Pauses
from .record import NodeResult, Recorder, Reported, TrackedState
from .tasks import RunTasks

__all__ = ["Invocation", "ResumeAudit", "Activation"]


_new = tuple.__new__  # a NamedTuple from a tuple, one C call
_NONE: frozenset[str] = frozenset()


def _too_many_steps(wf: Workflow) -> WorkflowError:
    return WorkflowError(
        f"workflow {wf.name!r} ran more than max_steps={wf.max_steps} steps: a loop that does not end?"
    )


class ResumeAudit:
    """What the runs the log left open are to this invocation, read from the log at its
    start, and the counts of the resume audit record (``RunStarted``/``RunFinished``
    ``replayed`` and ``recovered``).

    A waiting run goes on only if it has what it waited for (*answered*: by this resume,
    or by an earlier one whose process died before the run went on); the others keep
    waiting without a new event. A run left running is a recovery unless it contains
    another open run (a *container*, counted once at the deepest path, docs/design.md) or
    was cut off by this process's own halted invocation (a store fault, not a crash).
    """

    def __init__(self, ws: WorkflowState, cut_off: frozenset[str]) -> None:
        self._answered: set[str] | None = None  # made by the first mark_answered
        completed = running = 0
        for ns in ws.nodes.values():
            status = ns.status
            if status == "completed":
                completed += 1
            elif status == "running":
                running += 1
            if status != "waiting_input" and status != "waiting_job":
                continue
            if ns.origin_path not in (None, ns.path):
                continue  # an enclosing run: ready when a descendant is
            if (status == "waiting_input" and not ns.requests) or (
                status == "waiting_job" and ns.jobs and not ns.open_jobs
            ):
                self.mark_answered(ns.path)
        open_paths = [p for p, ns in ws.nodes.items() if ns.status in OPEN_STATES]
        self._containers = containers(open_paths) if len(open_paths) > 1 else _NONE
        #: Completed runs in the log at the start (``RunStarted.replayed``).
        self.completed_at_start = completed
        #: Runs left running at the deepest path (``RunStarted.recovered``).
        self.running_at_start = running - sum(1 for p in self._containers if ws.nodes[p].status == "running")
        #: The ids of this session's last invocations in this process that halted on a
        #: store error: the runs they left open were cut off by the halt, cancelled though
        #: it could not be recorded, not by a crash.
        self.cut_off = cut_off
        self._replayed = 0
        self._recovered = 0

    @property
    def replayed(self) -> int:
        """Completed runs this invocation fast-forwarded."""
        return self._replayed

    @property
    def recovered(self) -> int:
        """Runs this invocation re-executed after a crash."""
        return self._recovered

    def mark_answered(self, path: str) -> None:
        """A waiting run at ``path`` (and so each of its ancestors) may go on."""
        answered = self._answered
        if answered is None:
            answered = self._answered = set()
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            answered.add("/".join(parts[:i]))

    def is_answered(self, path: str) -> bool:
        return self._answered is not None and path in self._answered

    def replay(self) -> None:
        """A completed run is fast-forwarded."""
        self._replayed += 1

    def recovers(self, ns: NodeState) -> bool:
        """Is re-running ``ns``, left running by the log, a recovery? Counted if so."""
        recovered = ns.invocation_id not in self.cut_off and ns.path not in self._containers
        self._recovered += recovered
        return recovered


class Invocation:
    """The state and logic of one ``run``/``resume`` call (the :class:`~flowscope.engine.context.RunServices`
    a :class:`NodeContext` talks to)."""

    def __init__(
        self,
        *,
        store: EventStore,
        plugins: PluginDispatcher,
        error_codes: Mapping[type, str],
        redact: Redactor,
        max_recoveries: int,
        rng: random.Random,
        session_id: str,
        ws: WorkflowState,
        workflow: str,
        input: Any,
        resumed: bool,
        lease: Lease,
        lease_s: float,
        commits: GroupCommit,
        on_event: Callable[[Event], None] | None = None,
        on_mail: Callable[[Invocation], None] | None = None,
        cut_off: frozenset[str] = frozenset(),
    ) -> None:
        self.session_id = session_id
        self.invocation_id = new_id()
        #: Is the runner's lease keeper keeping its lease (set by the runner)?
        self.kept = False
        self._workflow = workflow
        self._input = input
        self._resumed = resumed
        self._runs = RunTasks()
        self._rec = Recorder(
            store=store,
            commits=commits,
            plugins=plugins,
            error_codes=error_codes,
            redact=redact,
            session_id=session_id,
            invocation_id=self.invocation_id,
            ws=ws,
            runs=self._runs,
            lease=lease,
            lease_s=lease_s,
            on_event=on_event,
            on_mail=on_mail,
            mail_for=self,
        )
        self._audit = ResumeAudit(ws, cut_off)
        self._attempts = Attempts(
            self._rec, self._runs, plugins, max_recoveries=max_recoveries, rng=rng, graphs=self
        )
        self._nodes = ws.nodes  # the live fold's node states (the same dict for the whole invocation)
        self._in_flight = self._runs.in_flight
        self._pauses = Pauses(self._rec)
        #: The invocation as plugins see it (``before_run``, ``after_run``).
        self.run = RunInfo(
            session_id=session_id,
            invocation_id=self.invocation_id,
            workflow=workflow,
            input=input,
            resumed=resumed,
            started_at=time.time(),
            previous_trace_context=dict(ws.trace_context),
            replayed=self._audit.completed_at_start,
            recovered=self._audit.running_at_start,
            plugins=plugins.names,
            store=store,
            redact=redact,
        )

    # -- what the runner reads ---------------------------------------------------------------

    @property
    def record(self) -> Recorder:
        """The invocation's record: what the lease keeper keeps (its lease, its runs in flight)."""
        return self._rec

    @property
    def ws(self) -> WorkflowState:
        """The session's live fold, at the last emitted event (read it, never change it)."""
        return self._rec.ws

    @property
    def state(self) -> TrackedState:
        return self._rec.state

    @property
    def lease(self) -> Lease:
        return self._rec.lease

    @property
    def halted(self) -> BaseException | None:
        """Why the invocation can record no more (a failed append, a lost lease), or None."""
        return self._rec.halted

    @property
    def snapshot_seq(self) -> int:
        return self._rec.snapshot_seq

    @property
    def replayed(self) -> int:
        return self._audit.replayed

    @property
    def recovered(self) -> int:
        return self._audit.recovered

    @property
    def cut_off(self) -> frozenset[str]:
        return self._audit.cut_off

    @property
    def aborting(self) -> bool:
        return self._runs.aborting

    @property
    def abort_reason(self) -> str:
        return self._runs.abort_reason

    @property
    def cancelled_by_request(self) -> bool:
        """Was it aborted for a cancel message (``flowscope.cancel``)?"""
        return self._runs.by_request

    def in_sync(self) -> bool:
        """Is the live fold exactly what the log holds (not halted, everything flushed)?"""
        return self._rec.in_sync()

    def failure_of(self, exc: BaseException) -> Reported | None:
        """Where this invocation recorded ``exc`` as a failure, or None."""
        return self._rec.failure_of(exc)

    def classify(self, exc: BaseException) -> ErrorInfo:
        return self._rec.classify(exc)

    # -- what the runner does ----------------------------------------------------------------

    def begin(self, answers: Iterable[Answer]) -> None:
        """Emit ``RunStarted`` and the answers given to ``resume()`` (the waiting runs they
        answer may go on)."""
        run = self.run
        rec = self._rec
        rec.emit(
            RunStarted,
            "",
            "",
            workflow=self._workflow,
            input=self._input,
            resumed=self._resumed,
            replayed=run.replayed,
            recovered=run.recovered,
            trace_context=dict(run.trace_context),
            owner=owner_record(rec.lease.owner),
        )
        for a in answers:
            rec.emit(a.cls, a.path, a.node, **a.fields)
            self._audit.mark_answered(a.path)

    def enter_walk(self, task: asyncio.Task[Any], root: Workflow, input: Any) -> NodeContext | NodeResult:
        """Prepare the root workflow's run (:meth:`prepare`: a recorded result, or the
        context of a run to :meth:`run_root`) in the caller's own ``task``, which
        :meth:`abort` and a lost lease cancel while it runs, until :meth:`leave_walk`."""
        self._runs.enter(task)
        return self.prepare(root, input, None, f"{root.name}@1")

    def run_root(self, ctx: NodeContext, input: Any) -> Coroutine[Any, Any, NodeResult]:
        """The root workflow's run prepared by :meth:`enter_walk` (its body is its graph,
        whose nodes flush before they run)."""
        return self._attempts.run_prepared(ctx, input)

    def leave_walk(self) -> int:
        """The root run is over (:meth:`enter_walk`): how many times its task was cancelled
        for it meanwhile, which the caller takes back (``Task.uncancel``)."""
        return self._runs.leave()

    def finish(
        self,
        status: RunStatus,
        output: Any = None,
        error_code: str | None = None,
        error_path: str | None = None,
    ) -> None:
        """Emit the invocation's ``RunFinished`` (the caller flushes it); a cancel an
        operator asked for ends the session for good (``final``)."""
        audit = self._audit
        self._rec.finish(
            status,
            replayed=audit.replayed,
            recovered=audit.recovered,
            output=output,
            error_code=error_code,
            error_path=error_path,
            final=status == "cancelled" and self.cancelled_by_request,
        )

    async def flush(self, release: bool = False) -> None:
        await self._rec.flush(release)

    @property
    def released(self) -> bool:
        """Did the last flush end the lease (``flush(release=True)``)?"""
        return self._rec.released

    def abort(self, reason: str, *, by_request: bool = False) -> bool:
        """Cancel the runs (``NodeCancelled`` with ``reason``); False if the root is not running."""
        return self._runs.abort(reason, by_request=by_request)

    def expire_if_unsafe(self) -> bool:
        """Stop now if the lease is no longer safe by this process's clocks; True if it did."""
        return self._rec.expire_if_unsafe()

    # -- what a node's context asks (RunServices) --------------------------------------------

    async def request_input(self, ctx: NodeContext, interrupt_id: str, prompt: str, payload: Any) -> Any:
        return await self._pauses.request_input(ctx, interrupt_id, prompt, payload)

    async def await_job(
        self,
        ctx: NodeContext,
        n: int,
        dispatch: Callable[[Job], Any],
        payload: Any,
        expect_count: bool,
        deadline_s: float | None,
    ) -> Any:
        return await self._pauses.await_job(ctx, n, dispatch, payload, expect_count, deadline_s)

    async def run_child(self, parent: NodeContext, node: Node, input: Any) -> Any:
        """``ctx.run_node``: a dynamic child of ``parent``, run inline. Its completion is
        committed before its parent gets the output: the parent may go on for a long time
        with nothing else to flush, and a child that completed never runs again (R8)."""
        r = await self.execute(node, input, parent, parent.child_path(node.name))
        await self._rec.flush()
        return r.output

    def heartbeat(self, paths: list[str]) -> None:
        self._rec.heartbeat(paths)

    # -- one activation ----------------------------------------------------------------------

    def prepare(
        self, node: Node, input: Any, parent: NodeContext | None, path: str
    ) -> NodeContext | NodeResult:
        """Decide what a node activation is: a recorded result to fast-forward, a run still
        waiting (raises the pause), or a run to execute (returns its context, NodeStarted
        emitted)."""
        ns = self._nodes.get(path)
        recovered = False
        if ns is None:
            attempt = 1
        else:
            status = ns.status
            if status == "completed":
                return self.replay(ns)
            if status == "waiting_input" or status == "waiting_job":
                if not self._audit.is_answered(path):  # nothing new for it: it keeps waiting, silently
                    raise PauseSignal(
                        ns.origin_path or path,
                        "job" if status == "waiting_job" else "input",
                        self._still_waiting_on(ns),
                    )
                attempt = ns.attempt or 1  # continuing after a pause is the same attempt (R9, docs/design.md)
            elif status == "running":  # its process died mid-run: a new attempt (R9, docs/design.md)
                attempt = ns.attempt + 1
                # unless this process's halted invocation cut it off (a store fault): a cancellation
                # it could not record, not a recovery (docs/workers.md); and a container of a cut-off
                # run is re-entered: the recovery is the run's inside it, once at the deepest path.
                recovered = self._audit.recovers(ns)
            else:  # failed or cancelled: run again, numbering continues
                attempt = ns.attempt + 1
        ctx = NodeContext(self, node, path, attempt, parent, input, recovered)
        self._rec.emit(
            NodeStarted,
            path,
            node.name,
            attempt=attempt,
            kind=node.kind,
            parent_path=parent.path if parent is not None else "",
            recovered=recovered,
        )
        self._in_flight[path] = ctx  # RunTasks.started
        return ctx

    def _still_waiting_on(self, ns: NodeState) -> list[str]:
        """The interrupt and job ids a run that keeps waiting waits on, for the ``NodePaused``
        of the runs around it (as its first pause named them): its own open requests, or,
        for a container whose pause came from inside it, those of the runs inside it."""
        inside = ns.path + "/"
        asks = (
            sorted(
                (e for p, n in self._nodes.items() if p.startswith(inside) for e in n.waiting_on),
                key=lambda e: e.seq,
            )
            if from_descendant(ns.path, ns.origin_path)
            else ns.waiting_on
        )
        return [e.interrupt_id if isinstance(e, InputRequested) else e.job_id for e in asks]

    def replay(self, ns: NodeState) -> NodeResult:
        """A completed run's recorded result: resume fast-forwards it, never runs it (R8, docs/design.md)."""
        self._audit.replay()
        # the caller's own copy: a node that changes its input must not change the fold
        return _new(NodeResult, (copy_json(ns.output), ns.route, ns.has_output))

    async def execute(self, node: Node, input: Any, parent: NodeContext | None, path: str) -> NodeResult:
        """Prepare and run one node activation inline."""
        r = self.prepare(node, input, parent, path)
        if isinstance(r, NodeResult):
            return r
        if node.kind != "workflow":  # a workflow's body is its children, which flush before they run
            await self._rec.flush()
        return await self._attempts.run_prepared(r, input)

    # -- graphs -------------------------------------------------------------------------------

    async def run_graph(self, wf: Workflow, ctx: NodeContext, input: Any) -> NodeResult:
        """One pass through a workflow's graph, a step at a time."""
        successors = wf.successors
        nodes = self._nodes
        rec = self._rec
        run_prepared = self._attempts.run_prepared
        acts = first_activations(wf, input)
        joins = JoinBuffers(wf.predecessors)
        terminals: list[tuple[str, Any]] = []
        steps = 0
        while acts:
            steps += 1  # a step, however wide: max_steps bounds loops, not fan-outs
            if steps > wf.max_steps:
                raise _too_many_steps(wf)
            results: tuple[NodeResult, ...] | list[NodeResult]
            if len(acts) == 1:  # a chain: no step machinery (the common case, and the replay path)
                n, inp = acts[0]
                child_path, replay = ctx.child_path, self.replay
                while True:
                    path = child_path(n.name)
                    ns = nodes.get(path)
                    if ns is not None and ns.status == "completed":
                        r = replay(ns)  # no coroutine for a recorded run
                    else:  # execute(), inline
                        prepared = self.prepare(n, inp, ctx, path)
                        if isinstance(prepared, NodeContext):
                            # a workflow's body is its children, which flush before they run
                            if n.kind != "workflow":  # rec.flush(), without a coroutine
                                fut = rec.flush_start()
                                if fut is not None:
                                    await fut
                                    rec.flush_end()
                            r = await run_prepared(prepared, inp)
                        else:
                            r = prepared
                    nexts = successors[n]
                    # one plain edge on: the next step is that node alone, with this output
                    if len(nexts) != 1 or nexts[0][1] is not None or nexts[0][0].kind == "join":
                        break
                    steps += 1
                    if steps > wf.max_steps:
                        raise _too_many_steps(wf)
                    n, inp = nexts[0][0], r.output
                acts = [_new(Activation, (n, inp))]
                results = (r,)
            else:
                results = await self._step(acts, ctx)
            acts = next_activations(wf, acts, results, joins, terminals)
        if len(terminals) > 1:
            names = ", ".join(name for name, _ in terminals)
            raise WorkflowError(
                f"workflow {wf.name!r} finished with {len(terminals)} terminal outputs (from {names}); "
                "a workflow has one output: join the branches with a JoinNode"
            )
        if terminals:
            _name, out = terminals[0]
            return NodeResult(out, None, out is not None)
        return NodeResult(None, None, False)

    async def _step(self, acts: list[Activation], parent: NodeContext) -> list[NodeResult]:
        """Run the activations of one step in parallel.

        The first failure cancels the branches still running (``sibling_failed``, R1 and
        R3, docs/design.md) and is raised once they have stopped; pauses are gathered into
        one pause of the whole step.
        """
        rec, runs = self._rec, self._runs
        prepared: list[NodeContext | NodeResult | PauseSignal] = []
        for act in acts:
            try:
                prepared.append(self.prepare(act.node, act.input, parent, parent.child_path(act.node.name)))
            except PauseSignal as p:
                prepared.append(p)
        await rec.flush()  # every NodeStarted of the step in one transaction
        results: list[Any] = list(prepared)
        tasks: dict[asyncio.Task[NodeResult], int] = {}  # a task runs the context prepared[i]
        for i, r in enumerate(prepared):
            if isinstance(r, NodeContext):
                tasks[asyncio.ensure_future(self._attempts.run_prepared(r, acts[i].input))] = i
        pending: set[asyncio.Task[NodeResult]] = set(tasks)
        runs.add_branches(pending)  # a lost lease cancels them directly (Recorder.lose_lease)
        failure: BaseException | None = None
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    i = tasks[t]
                    if t.cancelled():
                        if failure is None:  # not by us (its body raised it): the step is
                            failure = asyncio.CancelledError()  # cancelled, as in a chain (R3)
                            for other in pending:
                                other.cancel()
                        continue
                    exc = t.exception()
                    if exc is None:
                        results[i] = t.result()
                    elif isinstance(exc, PauseSignal):
                        results[i] = exc
                    elif failure is None:
                        failure = exc
                        reason = runs.abort_reason if runs.aborting else "sibling_failed"
                        for other in pending:
                            cast(NodeContext, prepared[tasks[other]]).cancel_reason = reason
                            other.cancel()
                if pending:
                    await rec.flush()  # finished branches are on record while the others run
        finally:
            if pending:  # we are being cancelled: take the branches down with us
                for other in pending:
                    other.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            runs.drop_branches(tasks)
            for t, i in tasks.items():
                ctx = cast(NodeContext, prepared[i])
                if t.cancelled() and runs.ended(ctx.path):
                    # cancelled before its first step: its body never ran, but its
                    # NodeStarted is on record and needs its terminal event
                    rec.emit(NodeCancelled, ctx.path, ctx.node_name, reason=self._attempts.cancel_reason(ctx))
        if failure is not None:
            raise failure
        pauses = [r for r in results if isinstance(r, PauseSignal)]
        if pauses:
            first = pauses[0]
            raise PauseSignal(first.origin, first.waiting, [i for p in pauses for i in p.ids])
        return results
