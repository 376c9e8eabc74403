"""One ``run``/``resume`` call: the scheduler, assembled with its attempts and pauses.

:class:`Invocation` walks a workflow's graph in steps: all nodes activated together run
in parallel, and the next step is computed from their results in declaration order. That
makes paths deterministic (``check@2`` is always the same run), which is what lets resume
match recorded runs to new ones: :meth:`Invocation.prepare` looks a path up in the live
fold and fast-forwards a completed run, keeps a waiting one waiting, recovers a crashed
one or starts a new one.

The parts, each a module of its own: ``record.py`` (state, emit, flush), ``attempts.py``
(a node run's attempts and terminal event), ``pauses.py`` (input requests, jobs and the
answers resume brings).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from ..errors import WorkflowError
from ..events import NodeCancelled, NodeStarted
from ..fold import NodeState
from .attempts import Attempts
from .context import NodeContext, PauseSignal
from .graph import START, Node, Workflow, label_matches
from .pauses import Pauses
from .record import NodeResult

__all__ = ["Invocation"]


class Invocation(Attempts, Pauses):
    """The state and logic of one ``run``/``resume`` call (the :class:`~flowscope.engine.context.RunServices`
    a :class:`NodeContext` talks to)."""

    # -- one activation ----------------------------------------------------------------------

    def prepare(self, node: Node, input: Any, parent: NodeContext | None, path: str) -> NodeContext | NodeResult:
        """Decide what a node activation is: a recorded result to fast-forward, a run still
        waiting (raises the pause), or a run to execute (returns its context, NodeStarted
        emitted)."""
        ns = self.ws.nodes.get(path)
        recovered = False
        if ns is None:
            attempt = 1
        else:
            status = ns.status
            if status == "completed":
                return self.replay(ns)
            if status == "waiting_input" or status == "waiting_job":
                if path not in self.answered:  # nothing new for it: it keeps waiting, silently
                    raise PauseSignal(ns.origin_path or path, "job" if status == "waiting_job" else "input", [])
                attempt = ns.attempt or 1  # continuing after a pause is the same attempt (R9, docs/design.md)
            elif status == "running":  # its process died mid-run: a new attempt (R9, docs/design.md)
                attempt = ns.attempt + 1
                # unless this process's own halted invocation cut it off (a store fault):
                # a cancellation it could not record, not a recovery (docs/workers.md); and a
                # container of a cut-off run is re-entered, not recovered: the recovery is the
                # run's inside it, counted once at the deepest path (docs/design.md).
                recovered = ns.invocation_id not in self.cut_off and path not in self.containers
                self.recovered += recovered
            else:  # failed or cancelled: run again, numbering continues
                attempt = ns.attempt + 1
        ctx = NodeContext(self, node, path, attempt, parent, input, recovered)
        self.emit(
            NodeStarted,
            path,
            node.name,
            attempt=attempt,
            kind=node.kind,
            parent_path=parent.path if parent is not None else "",
            recovered=recovered,
        )
        self.in_flight[path] = ctx
        return ctx

    def replay(self, ns: NodeState) -> NodeResult:
        """A completed run's recorded result: resume fast-forwards it, never runs it (R8, docs/design.md)."""
        self.replayed += 1
        return NodeResult(ns.output, ns.route, ns.has_output)

    async def execute(self, node: Node, input: Any, parent: NodeContext | None, path: str) -> NodeResult:
        """Prepare and run one node activation inline."""
        r = self.prepare(node, input, parent, path)
        if isinstance(r, NodeResult):
            return r
        if node.kind != "workflow":  # a workflow's body is its children, which flush before they run
            await self.flush()
        return await self.run_prepared(r, input)

    async def run_child(self, parent: NodeContext, node: Node, input: Any) -> Any:
        """``ctx.run_node``: a dynamic child of ``parent``, run inline."""
        return (await self.execute(node, input, parent, parent.child_path(node.name))).output

    # -- graphs -------------------------------------------------------------------------------

    async def run_graph(self, wf: Workflow, ctx: NodeContext, input: Any) -> NodeResult:
        """One pass through a workflow's graph, a step at a time."""
        successors = wf.successors
        nodes = self.ws.nodes
        acts: list[tuple[Node, Any]] = [(n, input) for n, _label in successors[START]]
        joins: dict[Node, dict[str, Any]] = {}
        terminals: list[tuple[str, Any]] = []
        steps = 0
        while acts:
            steps += 1  # a step, however wide: max_steps bounds loops, not fan-outs
            if steps > wf.max_steps:
                raise WorkflowError(
                    f"workflow {wf.name!r} ran more than max_steps={wf.max_steps} steps: a loop that does not end?"
                )
            results: tuple[NodeResult, ...] | list[NodeResult]
            if len(acts) == 1:  # a chain: no step machinery (the common case, and the replay path)
                n, inp = acts[0]
                path = ctx.child_path(n.name)
                ns = nodes.get(path)
                if ns is not None and ns.status == "completed":
                    results = (self.replay(ns),)  # no coroutine for a recorded run
                else:
                    results = (await self.execute(n, inp, ctx, path),)
            else:
                results = await self._step(acts, ctx)
            nxt: list[tuple[Node, Any]] = []
            for (n, _inp), r in zip(acts, results):
                fired = False
                for target, label in successors[n]:
                    if label is not None and not label_matches(label, r.route):
                        continue
                    fired = True
                    if target.kind == "join":
                        buf = joins.setdefault(target, {})
                        buf[n.name] = r.output
                        if len(buf) == len(wf.predecessors[target]):
                            nxt.append((target, joins.pop(target)))
                    else:
                        nxt.append((target, r.output))
                if not fired and r.has_output:
                    terminals.append((n.name, r.output))
            if not nxt and joins:
                # Routing skipped some predecessors and nothing else can run: the joins
                # fire with the inputs they have, in declaration order.
                for j in sorted(joins, key=wf.order.__getitem__):
                    nxt.append((j, joins.pop(j)))
            acts = nxt
        if len(terminals) > 1:
            names = ", ".join(name for name, _ in terminals)
            raise WorkflowError(
                f"workflow {wf.name!r} finished with {len(terminals)} terminal outputs (from {names}); "
                "a workflow has one output: join the branches with a JoinNode"
            )
        if terminals:
            out = terminals[0][1]
            return NodeResult(out, None, out is not None)
        return NodeResult(None, None, False)

    async def _step(self, acts: list[tuple[Node, Any]], parent: NodeContext) -> list[NodeResult]:
        """Run the activations of one step in parallel.

        The first failure cancels the branches still running (``sibling_failed``, R1 and
        R3, docs/design.md) and is raised once they have stopped; pauses are gathered into
        one pause of the whole step.
        """
        prepared: list[NodeContext | NodeResult | PauseSignal] = []
        for n, inp in acts:
            try:
                prepared.append(self.prepare(n, inp, parent, parent.child_path(n.name)))
            except PauseSignal as p:
                prepared.append(p)
        await self.flush()  # every NodeStarted of the step in one transaction
        results: list[Any] = list(prepared)
        tasks: dict[asyncio.Task[NodeResult], int] = {}  # a task runs the context prepared[i]
        for i, r in enumerate(prepared):
            if isinstance(r, NodeContext):
                tasks[asyncio.ensure_future(self.run_prepared(r, acts[i][1]))] = i
        pending: set[asyncio.Task[NodeResult]] = set(tasks)
        self.branches.update(pending)  # a lost lease cancels them directly (Recorder.lose_lease)
        failure: BaseException | None = None
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    i = tasks[t]
                    if t.cancelled():
                        continue
                    exc = t.exception()
                    if exc is None:
                        results[i] = t.result()
                    elif isinstance(exc, PauseSignal):
                        results[i] = exc
                    elif failure is None:
                        failure = exc
                        reason = self.abort_reason if self.aborting else "sibling_failed"
                        for other in pending:
                            cast(NodeContext, prepared[tasks[other]]).cancel_reason = reason
                            other.cancel()
                if pending:
                    await self.flush()  # finished branches are on record while the others run
        finally:
            if pending:  # we are being cancelled: take the branches down with us
                for other in pending:
                    other.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            self.branches.difference_update(tasks)
            for t, i in tasks.items():
                ctx = cast(NodeContext, prepared[i])
                if t.cancelled() and ctx.path in self.in_flight:
                    # cancelled before its first step: its body never ran, but its
                    # NodeStarted is on record and needs its terminal event
                    del self.in_flight[ctx.path]
                    self.emit(NodeCancelled, ctx.path, ctx.node_name, reason=self._cancel_reason(ctx))
        if failure is not None:
            raise failure
        pauses = [r for r in results if isinstance(r, PauseSignal)]
        if pauses:
            first = pauses[0]
            raise PauseSignal(first.origin, first.waiting, [i for p in pauses for i in p.ids])
        return results
