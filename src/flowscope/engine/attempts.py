"""Attempts: running one prepared node run to its end, and recording how it ended.

:meth:`Attempts.run_prepared` runs the body (within its timeout) as often as its retry
budget allows, then appends exactly one terminal event: ``NodeCompleted``, a pause's
event, ``NodeCancelled``, ``NodeErrorEvent`` at the deepest failing path, or
``NodeErrorPropagated`` above it. Each ``except`` branch hands the terminal event to a
small method that builds the :class:`~flowscope.engine.context.NodeOutcome` for
``after_node``. A part of the invocation (``invocation.py``): it records through the
invocation's :class:`~flowscope.engine.record.Recorder` and runs a nested workflow's
graph through the scheduler it is given.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import random
import time
from collections.abc import Awaitable
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from ..errors import (
    InvocationAbortedError,
    LeaseLost,
    NodeExitError,
    NodeTimeoutError,
    OutputNotSerializableError,
    RecoveryLimitError,
    RouteNotFoundError,
    StateNotSerializableError,
    error_qualname,
)
from ..events import (
    InputRequested,
    NodeCancelled,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodePaused,
    NodeRetrying,
    StateUpdated,
)
from ..jsontext import copy_json
from ..threads import start_thread
from .context import CHILDREN_CLOSED, NodeContext, NodeOutcome, PauseSignal
from .graph import Node, Route, Workflow, label_matches
from .hooks import PluginDispatcher
from .record import Halted, NodeResult, Recorder
from .tasks import RunTasks
from .values import is_native, json_value

__all__ = ["Attempts", "GraphRunner"]

log = logging.getLogger("flowscope.engine")

_new = tuple.__new__  # a NamedTuple from a tuple, one C call

#: A node whose class keeps this ``execute`` runs its body through ``Node.begin`` directly.
_NODE_EXECUTE = Node.execute


class GraphRunner(Protocol):
    """What runs a nested workflow's body, its graph: the scheduler (``Invocation``)."""

    def run_graph(self, wf: Workflow, ctx: NodeContext, input: Any) -> Awaitable[NodeResult]: ...


class Attempts:
    """The part of an invocation that runs node bodies: attempts, retries, timeouts."""

    def __init__(
        self,
        rec: Recorder,
        runs: RunTasks,
        plugins: PluginDispatcher,
        *,
        max_recoveries: int,
        rng: random.Random,
        graphs: GraphRunner,
    ) -> None:
        self._rec = rec
        self._runs = runs
        self._plugins = plugins
        self._hooks = plugins.has_node_hooks
        self._max_recoveries = max_recoveries
        self._rng = rng
        self._graphs = graphs  # not its bound run_graph: one object less per invocation
        # read once per node run: the recorder's live fold, ctx.state and the runs in flight
        # (each the same object for the whole invocation)
        self._nodes = rec.ws.nodes
        self._state = rec.state
        self._in_flight = runs.in_flight

    async def run_prepared(self, ctx: NodeContext, input: Any) -> NodeResult:
        """Run a prepared node run through its attempts and record how it ended."""
        node = ctx.node
        path = ctx.path
        rec = self._rec
        plugins = self._plugins
        hooks = self._hooks
        if hooks:
            pending = plugins.start("before_node", ctx)  # plain-function hooks: no coroutine
            if pending is not None:
                await pending
        ctx.started_at = t0 = time.perf_counter()
        ns = self._nodes[path]
        failures = ns.failures  # failed attempts already spent from this run's budget (R9, docs/design.md)
        outcome: NodeOutcome | None = None
        state = self._state
        # a plain body (no timeout, not a graph, Node's own execute): started here, and
        # awaited only if it returns an awaitable; no coroutine of its own
        plain = (
            node.timeout is None and type(node).execute is _NODE_EXECUTE and not isinstance(node, Workflow)
        )
        try:
            if ctx.recovered and ns.recoveries > self._max_recoveries:
                raise RecoveryLimitError(
                    f"{path} was recovered {ns.recoveries} times after its process died "
                    f"(max_recoveries={self._max_recoveries}); it may be killing its worker"
                )
            # a retried attempt gets the input as it came, not as the failed attempt left it
            retry = node.retry
            kept = (
                copy_json(input)
                if retry is not None
                and retry.max_attempts > 1
                and (type(input) is dict or type(input) is list)
                else None
            )
            while True:
                # No body starts, and no retry goes on after its backoff, once the lease
                # may have expired by this process's clocks (check_lease raises Halted).
                rec.check_lease()
                if rec.mail_waiting:  # found while a sync body held the loop: a cancel stops us here
                    await rec.read_mail()
                try:
                    try:
                        if plain:
                            out, awaiting = node.begin(ctx, input)
                            if awaiting:
                                out = await out
                        else:  # a timeout, a nested graph, an execute of its own
                            out = await self._attempt(node, ctx, input)
                    finally:  # the body ended: so do its dynamic children, and none starts
                        running = ctx.running_children
                        ctx.running_children = CHILDREN_CLOSED
                        if running:
                            await self._stop_children(ctx, running)
                    if hooks:  # plugins hear of a success only under a safe lease (else the flush stops it)
                        rec.check_lease()
                    result = self._result(ctx, out)
                    if state.pending:  # a key set, or a value lent that may have changed in place
                        state.check_changes()
                    break
                except Exception as exc:
                    failures += 1
                    delay = self._retry_delay(ctx, exc, failures)
                    if delay is None:
                        raise
                    await rec.flush()  # the failed attempt is on record before the next one begins
                    await asyncio.sleep(delay)
                    ctx.next_attempt()
                    if kept is not None:
                        input = ctx.input = copy_json(kept)
        except PauseSignal as p:
            outcome = self._paused(ctx, p, t0)
            raise
        except asyncio.CancelledError:
            outcome = self._cancelled(ctx, self.cancel_reason(ctx), t0)
            raise
        except InvocationAbortedError:
            self._runs.aborted_inside()
            outcome = self._cancelled(ctx, self._runs.abort_reason, t0)
            raise
        except Halted:
            # the invocation can record no more: its runs stop, as cancellations
            outcome = self._cancelled(ctx, self.cancel_reason(ctx), t0)
            raise
        except KeyboardInterrupt:
            # the process is going down: record that the run stopped, not that it failed
            outcome = self._cancelled(ctx, "interrupted", t0)
            raise
        except Exception as exc:
            if (
                self._runs.aborting
            ):  # e.g. a timeout that fired only because the run is being aborted (R3, docs/design.md)
                outcome = self._cancelled(ctx, self._runs.abort_reason, t0)
            elif self._recorded_below(exc, path):
                outcome = self._propagated(ctx, exc, t0)
            else:
                outcome = self._failed(ctx, exc, t0)
                await rec.flush()  # the failure is on record before it propagates (R1, docs/design.md)
                if hooks:
                    await plugins.call("on_node_error", ctx, outcome.event)
            raise
        except BaseException as exc:  # sys.exit() in a body, a library's own: its failure
            outcome = self._failed(ctx, exc, t0)
            err = NodeExitError(f"{type(exc).__name__} raised in node {ctx.node_name!r}")
            self._rec.note_failure(err, ctx.path, self._rec.classify(exc))  # recorded: once
            await rec.flush()
            if hooks:
                await plugins.call("on_node_error", ctx, outcome.event)
            raise err from exc
        else:
            ev = rec.emit(
                NodeCompleted,
                path,
                node.name,
                output=result.output,
                has_output=result.has_output,
                route=result.route,
                attempt_count=ctx.attempt,
            )
            if hooks:
                outcome = NodeOutcome(
                    status="success",
                    event=ev,
                    attempt_count=ctx.attempt,
                    recovered=ctx.recovered,
                    duration_s=time.perf_counter() - t0,
                )
            return result
        finally:
            self._in_flight.pop(path, None)  # the run ended (RunTasks.ended)
            if state.pending:
                self._emit_state(ctx)
            if hooks and outcome is not None:
                pending = plugins.start("after_node", ctx, outcome)
                if pending is not None:
                    await pending

    # -- one attempt ---------------------------------------------------------------------

    async def _attempt(self, node: Node, ctx: NodeContext, input: Any) -> Any:
        """One attempt at the node's body (a nested workflow's body is its graph),
        within the node's timeout.

        A sync body with a ``timeout`` runs in a thread of its own (with a copy of the
        context), since a timeout cannot interrupt code that holds the event loop. When
        the timeout fires the thread is abandoned, not stopped: it runs on, and whatever
        it returns or raises is discarded. Make such bodies idempotent, or async.
        Sync bodies without a timeout run inline on the loop.
        """
        timeout = node.timeout
        if timeout is None:
            if isinstance(node, Workflow):
                return await self._graphs.run_graph(node, ctx, input)
            return await node.execute(ctx, input)
        if isinstance(node, Workflow):
            body = self._graphs.run_graph(node, ctx, input)
        elif node.is_sync:
            body = _in_thread(node, ctx, input)
        else:
            body = node.execute(ctx, input)
        cm = asyncio.timeout(timeout)
        try:
            async with cm:
                out = await body
        except TimeoutError:
            if cm.expired() and not self._runs.aborting:
                raise NodeTimeoutError(f"{node.name} timed out after {timeout:g}s") from None
            raise
        deadline = cm.when()
        over = asyncio.get_running_loop().time() - deadline if deadline is not None else 0.0
        if over > 0.0:
            # The deadline passed and the timeout never ran: the loop was held (a blocking
            # call, work without an await, in this body or another), and a body that does
            # not await cannot be cancelled. It ended on its own and its result counts;
            # said, since the node's timeout did not hold.
            log.warning(
                "node %s (%s) ended %.3gs past its timeout of %gs, which could not stop it: the event "
                "loop was held (a blocking call or work without an await); its result counts. Make the "
                "blocking work async, or the node sync (a sync node with a timeout runs in a thread)",
                node.name,
                ctx.path,
                over,
                timeout,
            )
        return out

    @staticmethod
    def _result(ctx: NodeContext, out: Any) -> NodeResult:
        """What the attempt returned, as the store keeps it (R12, docs/design.md)."""
        if type(out) is NodeResult:  # a nested workflow's own result
            return out
        route = None
        if isinstance(out, Route):
            route = out.label
            out = out.output
            _check_route(ctx, route)
        else:
            wf = ctx.parent.node if ctx.parent is not None else None
            if isinstance(wf, Workflow) and ctx.node in wf.routed_only:
                _no_route(ctx, wf)
        if not is_native(out):  # (the common case, JSON values already: no message to build)
            out = json_value(out, f"the output of node {ctx.node_name!r} ({ctx.path})")
        return _new(NodeResult, (out, route, out is not None))

    def _retry_delay(self, ctx: NodeContext, exc: Exception, failures: int) -> float | None:
        """If the attempt that raised ``exc`` is retried, record ``NodeRetrying`` and return
        the delay before the next attempt; None if the failure is final (R4, docs/design.md)."""
        if self._runs.aborting or isinstance(exc, _NOT_RETRIED):
            return None
        retry = ctx.node.retry
        if retry is None or failures >= retry.max_attempts or not retry.retries(type(exc).__name__):
            return None
        info = self._rec.classify(exc)
        delay = retry.delay(failures, self._rng)
        self._rec.emit(
            NodeRetrying,
            ctx.path,
            ctx.node_name,
            attempt=ctx.attempt,
            error_type=info.type,
            error_code=info.code,
            error_message=info.message,
            delay_s=delay,
            error_qualname=info.qualname,
        )
        return delay

    # -- how a run ended: each builds the outcome for after_node -------------------------

    def _paused(self, ctx: NodeContext, p: PauseSignal, t0: float) -> NodeOutcome:
        """The run waits: its requests are recorded now (held until the run paused, not
        failed); its terminal event is the request or the job dispatch that paused it, or
        ``NodePaused`` for a run whose descendant asked (or whose job is still out)."""
        asked = [
            self._rec.emit(InputRequested, ctx.path, ctx.node_name, **fields)
            for fields in ctx.held_requests()
        ]
        mine = p.origin == ctx.path
        if mine and p.event is not None:
            ev = p.event
        elif mine and asked:
            ev = next((e for e in asked if e.interrupt_id in p.ids), asked[-1])
        else:
            ev = self._rec.emit(
                NodePaused,
                ctx.path,
                ctx.node_name,
                waiting=p.waiting,
                origin_path=p.origin,
                interrupt_ids=tuple(p.ids),
            )
        return NodeOutcome(
            status="waiting",
            event=ev,
            attempt_count=ctx.attempt,
            recovered=ctx.recovered,
            origin_path=p.origin,
            duration_s=time.perf_counter() - t0,
        )

    def _cancelled(self, ctx: NodeContext, reason: str, t0: float) -> NodeOutcome:
        """The run stopped without failing (cancellation is not failure, R3, docs/design.md)."""
        ev = self._rec.emit(NodeCancelled, ctx.path, ctx.node_name, reason=reason)
        return NodeOutcome(
            status="cancellation",
            event=ev,
            attempt_count=ctx.attempt,
            recovered=ctx.recovered,
            duration_s=time.perf_counter() - t0,
        )

    def _recorded_below(self, exc: BaseException, path: str) -> bool:
        """Was ``exc`` already recorded by a descendant of ``path`` in this invocation?"""
        prior = self._rec.failure_of(exc)
        return prior is not None and prior.path.startswith(path + "/")

    def _propagated(self, ctx: NodeContext, exc: Exception, t0: float) -> NodeOutcome:
        """A descendant's failure ends this run too: recorded at the deepest path already,
        it is propagated without a second record (R5, docs/design.md)."""
        prior = self._rec.failure_of(exc)
        assert prior is not None  # _recorded_below said so
        origin = prior.path
        ev = self._rec.emit(
            NodeErrorPropagated,
            ctx.path,
            ctx.node_name,
            origin_path=origin,
            error_code=prior.code,
            error_type=type(exc).__name__,
            attempt_count=ctx.attempt,
            error_qualname=error_qualname(exc),
        )
        return NodeOutcome(
            status="timeout" if isinstance(exc, NodeTimeoutError) else "failure",
            event=ev,
            attempt_count=ctx.attempt,
            recovered=ctx.recovered,
            error=exc,
            error_message=prior.message,
            origin_path=origin,
            duration_s=time.perf_counter() - t0,
        )

    def _failed(self, ctx: NodeContext, exc: BaseException, t0: float) -> NodeOutcome:
        """The run failed here: record the failure (the caller flushes it, so it is on record
        before it propagates, R1 in docs/design.md)."""
        info = self._rec.classify(exc)
        ev = self._rec.emit(
            NodeErrorEvent,
            ctx.path,
            ctx.node_name,
            error_code=info.code,
            error_message=info.message,
            error_type=info.type,
            attempt_count=ctx.attempt,
            error_qualname=info.qualname,
        )
        self._rec.note_failure(exc, ctx.path, info)
        outcome = NodeOutcome(
            status="timeout" if isinstance(exc, NodeTimeoutError) else "failure",
            event=ev,
            attempt_count=ctx.attempt,
            recovered=ctx.recovered,
            error=exc,
            error_message=info.message,
            origin_path=ctx.path,
            duration_s=time.perf_counter() - t0,
        )
        return outcome

    # -- after every run -----------------------------------------------------------------

    def _emit_state(self, ctx: NodeContext) -> None:
        """Record the keys of ``ctx.state`` changed since the last record: set through the
        dict, or a value changed in place (by this run or one running beside it,
        ``state.py``). A value JSON cannot hold has failed the run already
        (``STATE_NOT_SERIALIZABLE``); only that key is dropped, the valid changes are kept."""
        state = self._state
        changes, bad, deleted = state.take_changes(self._oldest_body() if state.lent else math.inf)
        if bad:
            log.error(
                "ctx.state keys %s changed by %s are not JSON-serialisable; not persisted", bad, ctx.path
            )
        if changes or deleted:
            self._rec.emit(StateUpdated, ctx.path, ctx.node_name, values=changes, deleted=deleted)

    def _oldest_body(self) -> float:
        """When the earliest node body still running started (``perf_counter``; inf if none
        runs). A nested workflow's run is not a body: its graph runs no code of the user's."""
        oldest = math.inf
        for c in self._in_flight.values():
            if c.started_at < oldest and not isinstance(c.node, Workflow):
                oldest = c.started_at
        return oldest

    @staticmethod
    async def _stop_children(ctx: NodeContext, running: AbstractSet[asyncio.Task[Any]]) -> None:
        """Cancel the dynamic children still running in tasks of their own (a body that
        gathered them ended first: a sibling failed, or paused) and wait for each to record
        its end (``parent_ended``) before its parent's."""
        me = asyncio.current_task()
        tasks = [t for t in running if t is not me and not t.done()]
        if not tasks:
            return
        reason, ctx.cancel_reason = ctx.cancel_reason, ctx.cancel_reason or "parent_ended"
        try:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            ctx.cancel_reason = reason

    def cancel_reason(self, ctx: NodeContext) -> str:
        """Why a cancelled run stopped: the abort, a lost lease or store fault, or the
        first reason set on it or an ancestor."""
        if self._runs.aborting:
            return self._runs.abort_reason
        halted = self._rec.halted
        if halted is not None:
            return "lease_lost" if isinstance(halted, LeaseLost) else "store_error"
        c: NodeContext | None = ctx
        while c is not None:
            if c.cancel_reason:
                return c.cancel_reason
            c = c.parent
        return "cancelled"


#: Failures that would fail the same way again: never retried.
_NOT_RETRIED = (OutputNotSerializableError, StateNotSerializableError, RouteNotFoundError, RecoveryLimitError)


def _check_route(ctx: NodeContext, route: str | int) -> None:
    """Raise ``RouteNotFoundError`` if no outgoing edge of this graph node fires for
    ``route``. A dynamic child (``ctx.run_node``) or the root has no edges: its route is
    only recorded."""
    parent = ctx.parent
    if parent is None or not isinstance(parent.node, Workflow):
        return
    wf = parent.node
    edges = wf.successors.get(ctx.node, ())
    if any(label_matches(label, route) for _target, label in edges):
        return
    labels = sorted({repr(label) for _target, label in edges if label is not None}) or ["none"]
    raise RouteNotFoundError(
        f"node {ctx.node_name!r} ({ctx.path}) returned Route({route!r}), but no edge from it in "
        f"workflow {wf.name!r} has that label (its labels: {', '.join(labels)})"
    )


def _no_route(ctx: NodeContext, wf: Workflow) -> None:
    """A node whose every edge is labelled returned no ``Route``: none would fire, and the
    workflow would end as if its branch were done (``RouteNotFoundError``, not retried)."""
    labels = sorted({repr(label) for _target, label in wf.successors.get(ctx.node, ()) if label is not None})
    raise RouteNotFoundError(
        f"node {ctx.node_name!r} ({ctx.path}) returned no Route, but every edge from it in workflow "
        f"{wf.name!r} is labelled ({', '.join(labels)}): return Route(label, output)"
    )


async def _in_thread(node: Node, ctx: NodeContext, input: Any) -> Any:
    """Call a sync node body in a daemon thread of its own and await its result.

    Not the loop's default executor: an abandoned body would hold one of its few
    threads for good, and its threads are joined at exit. A daemon thread does neither.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    run = contextvars.copy_context().run

    def settle(ok: bool, value: Any) -> None:
        if fut.done():  # timed out and abandoned: the result is discarded
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def work() -> None:
        try:
            outcome = (True, run(node.call, ctx, input))
        except BaseException as exc:  # handed to the loop, raised there
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has closed since: nobody waits for it
            pass

    start_thread(work, f"flowscope-node-{node.name}")
    result = await fut
    if asyncio.iscoroutine(result):  # a sync function that returned a coroutine
        result = await result
    return result
