"""Bridge for the Agent Development Kit (google-adk 2.13): flowscope's log for ADK workflows.

``FlowscopeADK(store, plugins=())`` records flowscope's event catalog for the runs of an
ADK ``Workflow`` without patching ADK, through the two extension points ADK has:

- ``.plugin``, an ADK plugin for ``App(plugins=[...])``: ``on_user_message`` (the answers
  a resume carries), ``before_run`` (``RunStarted``), ``on_event`` (the outputs of
  enclosing workflows, ADK's error events of timed-out attempts and workflows),
  ``after_run`` and ``on_run_error`` (``RunFinished``);
- ``instrument(workflow)``, which returns a copy of the workflow in which every node, of
  any kind (function nodes, ``BaseNode``/``Node`` subclasses, joins, tools, agents,
  parallel workers and their items), is an instance of an observing subclass of its own
  class: its ``run``, the one method ADK's scheduler calls, sees each attempt from inside
  (``ctx.node_path``, ``ctx.attempt_count``, the session and invocation) and records
  ``NodeStarted``, ``NodeRetrying`` (ADK's own retry predicate tells a retried failure
  from a final one; a timeout is ADK's ``NodeTimeoutError``), ``NodeCompleted`` (with the
  completion marker for a run that returns nothing), ``NodeErrorEvent``,
  ``NodeCancelled``, ``InputRequested`` and ``NodePaused``. What it cannot observe it
  refuses (:class:`UnobservableNodeError`); a node it never met that ADK runs anyway (a
  dynamic node built at run time) is warned about.

Two things the log adds to ADK: attempt numbers continue across ADK resumes (ADK restarts
its counter at 1), and a node the log shows completed is not run again when ADK resumes
the invocation (ADK re-runs a node that returned nothing: the seed's double email).
Nested ``Workflow`` nodes are instrumented, not wrapped (ADK checks their type); their
runs come from their children. See docs/bridges.md for what is exact and what is
approximated.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Iterable
from typing import Any

from google.adk.events.event import Event as AdkEvent
from google.adk.events.request_input import RequestInput
from google.adk.workflow import FunctionNode, Workflow
from google.adk.workflow._base_node import START, BaseNode
from google.adk.workflow._errors import DynamicNodeFailError, NodeInterruptedError
from google.adk.workflow._errors import NodeTimeoutError as AdkNodeTimeoutError
from google.adk.workflow._graph import Edge
from google.adk.workflow._node_state import NodeState as AdkNodeState
from google.adk.workflow._parallel_worker import _ParallelWorker
from google.adk.workflow.utils._retry_utils import _get_retry_delay, _should_retry_node
from pydantic import PrivateAttr

from ..events import InputRequested
from ..liveness import DEFAULT_HEARTBEAT_INTERVAL_S
from ..plugins import Plugin
from ..states import RunStatus
from ..store.base import EventStore
from ._adk_parts import (
    SEP,
    adk_invocation,
    answers_in,
    kind_of,
    log_path,
    requests_in,
    root_run_of,
    timeout_error,
)
from ._adk_plugin import FlowscopeADKPlugin
from ._adk_workflows import WorkflowRetries
from ._recorder import BridgeInvocation, BridgeNodeContext, BridgeRecorder, name_of
from ._runs import route_of

__all__ = ["FlowscopeADK", "ObservedFunctionNode", "FlowscopeADKPlugin", "UnobservableNodeError"]

log = logging.getLogger("flowscope.adapters.adk")

#: The error code of an ADK node ``timeout``: flowscope's own timeout code.
_TIMEOUT_CODE = "NODE_TIMEOUT"


class UnobservableNodeError(TypeError):
    """``FlowscopeADK.instrument`` met a node whose runs the bridge cannot record."""


class _Run:
    """One ADK node run in flight: its flowscope context and ADK's attempt offset."""

    __slots__ = ("ctx", "offset", "cancelled")

    def __init__(self, ctx: BridgeNodeContext, offset: int) -> None:
        self.ctx = ctx
        self.offset = offset  # flowscope attempt = offset + ADK's ctx.attempt_count
        # (node, ADK context) of an attempt cancelled while its node has a timeout: a
        # timeout or a plain cancellation, not known yet
        self.cancelled: tuple[BaseNode, Any] | None = None


class _Observing(BaseNode):
    """Records each attempt of the node it is mixed into (before the node's own class in
    the MRO): it wraps ``run``, the one method ADK's scheduler calls for a node run, and
    so sees every kind of node whatever it overrides (``_run_impl``, ``run_node_impl``,
    or ``run`` itself, as ADK's own test nodes do)."""

    _flowscope: Any = PrivateAttr(default=None)

    async def run(self, *, ctx: Any, node_input: Any) -> AsyncGenerator[Any, None]:  # type: ignore[misc]  # BaseNode.run is @final: the one place every node kind passes
        bridge: FlowscopeADK | None = self._flowscope
        inner = super().run(ctx=ctx, node_input=node_input)
        if bridge is None:  # pragma: no cover - only if built by hand without instrument()
            async for item in inner:
                yield item
            return
        run = bridge._attempt(self, ctx, node_input)
        if run is None:  # the log shows this run completed: ADK's resume must not repeat it
            await inner.aclose()
            ns = bridge.recorder.node_state(ctx.session.id, bridge._path(ctx, ctx.node_path))
            if ns is not None and ns.has_output:
                yield AdkEvent(output=ns.output)
            return
        requests: list[tuple[str, str, Any]] = []
        output: Any = None
        has_output = False
        route: Any = None
        try:
            async for item in inner:
                if isinstance(item, RequestInput):
                    requests.append((item.interrupt_id, item.message or "", item.payload))
                elif isinstance(item, AdkEvent):
                    if item.output is not None:
                        output, has_output = item.output, True
                    if item.actions is not None and item.actions.route is not None:
                        route = item.actions.route
                    requests.extend(requests_in(item))
                yield item
        except asyncio.CancelledError:
            bridge._cancelled(run, ctx, self if self.timeout else None)
            raise
        except GeneratorExit:
            bridge._cancelled(run, ctx)
            raise
        except NodeInterruptedError:
            # a dynamic child (a parallel worker's item) waits for input: this run pauses
            bridge._paused(run, ctx)
            raise
        except Exception as exc:
            bridge._failed(self, run, ctx, exc)
            raise
        if requests:
            bridge._requested(run, ctx, requests)
        else:
            bridge._completed(run, ctx, output, has_output, route_of(route))


class ObservedFunctionNode(_Observing, FunctionNode):
    """A ``FunctionNode`` that records each of its attempts in the flowscope log."""


_OBSERVED: dict[type, type] = {FunctionNode: ObservedFunctionNode}
_OBSERVED_LOCK = threading.Lock()


def _observed_class(cls: type) -> type:
    """The observing subclass of a node class (made once per class): isinstance checks
    ADK makes on the node (``BaseAgent``, ``FunctionNode``) still hold."""
    with _OBSERVED_LOCK:
        out = _OBSERVED.get(cls)
        if out is None:
            out = _OBSERVED[cls] = type(
                f"Observed{cls.__name__}", (_Observing, cls), {"__module__": __name__, "__doc__": cls.__doc__}
            )
        return out


class FlowscopeADK:
    """Records an ADK workflow's runs in a flowscope store (see the module docstring).

    ``store``: any :class:`~flowscope.store.EventStore` (SQLite for the CLI).
    ``plugins``: flowscope plugins (``TracingPlugin``, ``MetricsPlugin``), called with the
    same hooks the flowscope engine calls. One bridge per root workflow.
    """

    def __init__(
        self,
        store: EventStore,
        plugins: Iterable[Plugin] = (),
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S,
    ) -> None:
        self.recorder = BridgeRecorder(
            store,
            plugins,
            heartbeat_interval,
            error_codes={AdkNodeTimeoutError: _TIMEOUT_CODE},
            timeouts=(AdkNodeTimeoutError, TimeoutError),
            engine="adk",
        )
        self.plugin = FlowscopeADKPlugin(self)
        self.workflow: Workflow | None = None
        self._invs: dict[str, BridgeInvocation] = {}  # ADK invocation id -> the one being recorded
        self._runs: dict[tuple[str, str], _Run] = {}  # (ADK invocation id, path) -> run in flight
        self._outputs: dict[str, Any] = {}  # ADK invocation id -> the root workflow's output
        self._errors: dict[str, str] = {}  # ADK invocation id -> path of the failure
        #: ADK invocation id -> the log paths of runs ADK cancelled (no timeout)
        self._stopped: dict[str, set[str]] = {}
        #: failures on their way up, retries of nested workflows
        self._retries = WorkflowRetries(self.recorder, self._node_at, self._errors, self._runs)
        self._messages: dict[str, Any] = {}  # ADK invocation id -> the user message
        #: (ADK invocation id, path) -> a nested workflow's output
        self._wf_outputs: dict[tuple[str, str], Any] = {}
        self._warned: set[str] = set()  # names of unobserved nodes already warned about

    # -- instrumenting -----------------------------------------------------------------

    def instrument(self, workflow: Workflow) -> Workflow:
        """A copy of ``workflow`` whose function nodes (nested workflows included) are
        :class:`ObservedFunctionNode`\\ s; give it to ADK's ``Runner(node=...)``."""
        if not isinstance(workflow, Workflow):  # an agent (Sequential, Parallel, Loop...) as the root
            raise UnobservableNodeError(
                f"{type(workflow).__name__} {getattr(workflow, 'name', '')!r} is not an ADK Workflow: the bridge "
                "records a Workflow's node runs; make it a node of one, "
                "Workflow(name=..., edges=[(START, agent)]), and instrument that"
            )
        observed = self._instrument(workflow)
        self.workflow = observed
        return observed

    def _instrument(self, workflow: Workflow) -> Workflow:
        graph = workflow.graph
        if graph is None:
            return workflow
        copies: dict[int, Any] = {}

        def observed(node: Any) -> Any:
            done = copies.get(id(node))
            if done is None:
                done = copies[id(node)] = self._observed(node, workflow.name)
            return done

        edges = [
            Edge(from_node=observed(e.from_node), to_node=observed(e.to_node), route=e.route)
            for e in graph.edges
        ]
        out = workflow.model_copy(update={"edges": edges, "graph": None})
        out.graph = out._build_graph()
        return out

    def _observed(self, node: Any, where: str) -> Any:
        """``node`` as an observed copy: any ``BaseNode`` (function nodes, ``Node`` and
        ``BaseNode`` subclasses, joins, tools, agents) gets the observing subclass of its
        own class; a parallel worker's item node and a ``Node(parallel_worker=True)``'s
        clone too, so each item is a run under the worker's path; a nested ``Workflow``
        is instrumented in turn (ADK checks its type: its runs come from its children).
        What cannot be observed is refused here, with what to do."""
        if node is START or isinstance(node, _Observing):
            return node
        if isinstance(node, Workflow):
            cls = type(node)
            if cls.run is not BaseNode.run or cls._run_impl is not Workflow._run_impl:
                raise UnobservableNodeError(
                    f"{where}: node {node.name!r} is a {cls.__name__}, a Workflow subclass that overrides how it runs: "
                    "the bridge records a nested workflow from its children and cannot see what the override does; "
                    "move that work into a node of the workflow"
                )
            return self._instrument(node)
        if not isinstance(node, BaseNode):
            raise UnobservableNodeError(
                f"{where}: {type(node).__name__} {getattr(node, 'name', '')!r} is not an ADK BaseNode; build the workflow from nodes"
            )
        try:
            observing = _observed_class(type(node))
        except TypeError as exc:  # a class that cannot be subclassed
            raise UnobservableNodeError(
                f"{where}: node {node.name!r} ({type(node).__name__}) cannot be observed: {exc}"
            ) from None
        new: Any = node.model_copy()
        object.__setattr__(new, "__class__", observing)  # same fields, run() observed
        if new.__pydantic_private__ is None:
            object.__setattr__(new, "__pydantic_private__", {})
        new._flowscope = self
        if isinstance(node, _ParallelWorker):  # its items run node._node through ctx.run_node
            new._node = self._observed(node._node, where)
        inner = getattr(node, "_inner_node", None)
        if isinstance(inner, _ParallelWorker):
            # Node(parallel_worker=True): the inner worker runs in this node's own run (the
            # same path); its items are the runs to observe.
            copy = inner.model_copy()
            copy._node = self._observed(inner._node, where)
            new._inner_node = copy
        return new

    def _node_at(self, path: str) -> Any:
        """The instrumented node a path names (by the names of its segments), or None."""
        node: Any = self.workflow
        for segment in path.split("/")[1:]:
            graph = getattr(node, "graph", None)
            worker = node if isinstance(node, _ParallelWorker) else getattr(node, "_inner_node", None)
            if graph is not None:
                name = segment.rsplit("@", 1)[0]
                node = next((n for n in graph.nodes if n.name == name), None)
            elif isinstance(worker, _ParallelWorker):  # an item of a parallel worker runs its node
                node = worker._node
            else:
                return None
        return node

    # -- invocations -------------------------------------------------------------------

    def _begin(self, ic: Any) -> BridgeInvocation:
        adk_id = ic.invocation_id
        sid = ic.session.id
        ws = self.recorder.session(sid)
        root = (
            self.workflow.name
            if self.workflow is not None
            else getattr(getattr(ic, "agent", None), "name", "workflow")
        )
        root_path, previous = root_run_of(ws, root, adk_id)
        if previous is None and ws.invocation_id and adk_invocation(ws.invocation_id) == adk_id:
            previous = ws.invocation_id  # it ended before its root run started
        resumed = previous is not None
        if previous is not None:
            k = previous.split(SEP, 1)
            invocation_id = f"{adk_id}{SEP}{int(k[1]) + 1 if len(k) == 2 else 2}"
        else:
            invocation_id = adk_id
        message = self._messages.pop(adk_id, None)
        answers = answers_in(message)
        text = (
            " ".join(p.text for p in (message.parts or []) if p.text) or None if message is not None else None
        )
        inv = self.recorder.begin_run(sid, invocation_id, root, text, resumed, root_path, answers)
        self._invs[adk_id] = inv
        # A node that asked for input and does not re-run on resume takes the answer as its
        # output (ADK does this without running it): record that run here.
        for req in [e for e in ws.nodes.values() if e.status == "waiting_input"] if answers else []:
            ids = [i for i in req.inputs if i in answers]
            node = self._node_at(req.path)
            if ids and node is not None and not getattr(node, "rerun_on_resume", True):
                ctx = self.recorder.start_node(inv, req.path, "function", max(req.attempt, 1), False)
                self.recorder.complete(inv, ctx, answers[ids[-1]], True)
        return inv

    def _inv(self, ctx: Any) -> BridgeInvocation:
        inv = self._invs.get(ctx.invocation_id)
        if inv is None:  # the plugin is not in Runner(plugins=...): record what we can
            log.warning(
                "FlowscopeADK.plugin is not registered with the ADK Runner; run boundaries are not recorded"
            )
            inv = self._begin(ctx._invocation_context)
        return inv

    def _path(self, ctx: Any, adk_path: str) -> str:
        """The log's path of an ADK node path in ``ctx``'s invocation (:func:`log_path`)."""
        return log_path(self._inv(ctx).root_path, adk_path)

    def _on_event(self, ic: Any, event: Any) -> None:
        info = event.node_info
        inv = self._invs.get(ic.invocation_id)
        if inv is None or info is None:
            return
        own = log_path(inv.root_path, info.path or "")
        if own and own not in inv.open and self.recorder.node_state(inv.run.session_id, own) is None:
            self._unobserved(own)
        if event.error_code is not None and info.path:
            timed_out = event.error_code == AdkNodeTimeoutError.__name__
            self._settle_cancelled(ic.invocation_id, info.path, timed_out)
            node = self._node_at(own) if timed_out and own != inv.root_path else None
            if isinstance(node, Workflow) and node.timeout:
                self._workflow_timed_out(inv, ic.invocation_id, own, node)
        if not info.output_for:
            return
        for path in (log_path(inv.root_path, p) for p in info.output_for):
            if path == own:
                continue  # the node's own output: recorded by its ObservedFunctionNode
            if path == inv.root_path:
                self._outputs[ic.invocation_id] = event.output
                continue
            ctx = inv.open.get(path)
            if ctx is not None and ctx.kind == "workflow":  # a nested workflow's output
                # ADK names it while the child that produced it is still ending: the
                # workflow completes once its last child has
                self._wf_outputs[(ic.invocation_id, path)] = event.output
        self._settle(ic.invocation_id, inv)

    def _unobserved(self, path: str) -> None:
        """A node run ADK reports that the bridge did not see start: a dynamic node
        (``ctx.run_node``) built at run time, which ``instrument`` never met. Said once
        per node name, loudly: its runs are missing from the log."""
        name = name_of(path)
        if name in self._warned:
            return
        self._warned.add(name)
        log.warning(
            "ADK ran node %r (%s), which FlowscopeADK.instrument did not see: its runs are not recorded; "
            "put it in the workflow's graph, or instrument the workflow it belongs to",
            name,
            path,
        )

    def _settle(self, adk_id: str, inv: BridgeInvocation) -> None:
        """Complete the nested workflows whose output ADK named and whose children ended."""
        for key in [k for k in self._wf_outputs if k[0] == adk_id]:
            if any(p.startswith(key[1] + "/") for p in inv.open):
                continue
            output = self._wf_outputs.pop(key)
            ctx = inv.open.get(key[1])
            if ctx is not None:
                self.recorder.complete(inv, ctx, output, output is not None)

    def _end(self, ic: Any, error: BaseException | None) -> None:
        adk_id = ic.invocation_id
        if adk_id in self._invs:  # attempts cancelled under a timeout that ADK said nothing more about
            for key in [k for k, r in self._runs.items() if k[0] == adk_id and r.cancelled is not None]:
                timed_out = isinstance(error, AdkNodeTimeoutError) and error.node_name == name_of(key[1])
                self._settle_cancelled(adk_id, key[1], timed_out)
        inv, output = self._invs.pop(adk_id, None), self._outputs.pop(adk_id, None)
        error_path, cancelled = self._errors.pop(adk_id, None), self._stopped.pop(adk_id, ())
        failed = error is not None and not isinstance(error, asyncio.CancelledError)
        self._retries.end(inv, adk_id, failed, error_path or (inv.root_path if inv else None))
        for key in [k for k in self._runs if k[0] == adk_id]:
            del self._runs[key]
        if inv is None:
            return
        self._settle(adk_id, inv)
        for key in [k for k in self._wf_outputs if k[0] == adk_id]:
            del self._wf_outputs[key]
        if error is not None:
            status: RunStatus = "cancelled" if isinstance(error, asyncio.CancelledError) else "failed"
            self.recorder.finish_run(inv, status, error=error, error_path=error_path or inv.root_path)
        elif any(
            e.invocation_id == inv.run.invocation_id
            for e in self.recorder.session(inv.run.session_id).pending
        ):
            self.recorder.finish_run(inv, "paused")
        elif output is None and (
            any(c.kind != "workflow" for c in inv.open.values()) or self._left_cancelled(inv, cancelled)
        ):
            # The caller stopped reading run_async(): ADK cancelled what ran (a node in its
            # retry backoff has no body to cancel: still open) and ends as if done.
            self.recorder.finish_run(inv, "cancelled")
        else:
            self.recorder.finish_run(inv, "completed", output)

    # -- attempts (called from ObservedFunctionNode._run_impl) -------------------------

    def _attempt(self, node: BaseNode, ctx: Any, node_input: Any) -> _Run | None:
        """Begin an ADK attempt; None when the log shows this run already completed."""
        inv = self._inv(ctx)
        path = log_path(inv.root_path, ctx.node_path)
        self._retries.starting(inv, ctx.invocation_id, path)
        key = (ctx.invocation_id, ctx.node_path)
        run = self._runs.get(key)
        if run is not None:  # ADK's next attempt of a run we follow
            if run.cancelled is not None:  # the cancelled attempt timed out, and ADK retries it
                timed_out, _ = run.cancelled
                run.cancelled = None
                self.recorder.retrying(run.ctx, run.ctx.attempt, timeout_error(timed_out), 0.0)
            run.ctx.attempt = run.offset + ctx.attempt_count
            return run
        ns = self.recorder.node_state(inv.run.session_id, path)
        attempt, recovered = 1, False
        if ns is not None and adk_invocation(ns.invocation_id) == ctx.invocation_id:
            if ns.status == "completed":
                return None
            if ns.status == "waiting_input":
                attempt = ns.attempt  # re-executing after an input pause continues the attempt
            else:  # failed, cancelled, or running when its process died
                attempt, recovered = ns.attempt + 1, ns.status == "running"
        offset = attempt - ctx.attempt_count
        bctx = self.recorder.start_node(inv, path, kind_of(node), attempt, recovered, node_input)
        run = self._runs[key] = _Run(bctx, offset)
        return run

    def _failed(self, node: BaseNode, run: _Run, ctx: Any, exc: Exception) -> None:
        inv = self._inv(ctx)
        error: BaseException = exc.error if isinstance(exc, DynamicNodeFailError) else exc
        if _should_retry_node(error, node.retry_config, AdkNodeState(attempt_count=ctx.attempt_count)):
            config = (
                node.retry_config.model_copy(update={"jitter": 0.0})
                if node.retry_config is not None
                else None
            )
            delay = _get_retry_delay(config, AdkNodeState(attempt_count=ctx.attempt_count))
            self.recorder.retrying(run.ctx, run.ctx.attempt, error, delay)
            return
        self._runs.pop((ctx.invocation_id, ctx.node_path), None)
        child = log_path(inv.root_path, exc.error_node_path) if isinstance(exc, DynamicNodeFailError) else ""
        if child and self.recorder.node_state(inv.run.session_id, child) is not None:  # it holds the error
            info = self.recorder.classify(error)
            self.recorder.propagate(inv, run.ctx, child, info.code, info.type, info.qualname)
        else:
            child = run.ctx.path
            self.recorder.fail(inv, run.ctx, error, run.ctx.attempt)
        self._errors.setdefault(ctx.invocation_id, child)
        self._retries.after_failure(inv, ctx.invocation_id, run.ctx.path, error, child)

    def _workflow_timed_out(self, inv: BridgeInvocation, adk_id: str, path: str, node: Workflow) -> None:
        """Nested workflow ``path`` overran its ``timeout``: ADK cancelled what ran in it,
        then raised NodeTimeoutError outside it. Its open runs end cancelled; the timeout
        is its own attempt's, retried or final, as a node's, propagated from there."""
        prefix = path + "/"
        for key in [k for k, r in self._runs.items() if k[0] == adk_id and r.ctx.path.startswith(prefix)]:
            del self._runs[key]
        for p in sorted((p for p in inv.open if p.startswith(prefix)), key=lambda p: -p.count("/")):
            self.recorder.cancel(inv, inv.open[p])
        stopped = self._stopped.get(adk_id, set())  # ADK's timeout stopped these, not the caller
        stopped.difference_update([p for p in stopped if p.startswith(prefix)])
        if path not in inv.open:  # it timed out before any node of it started
            self.recorder.start_node(
                inv, path, "workflow", self.recorder.next_attempt(inv.run.session_id, path), False
            )
        error = timeout_error(node)
        if not self._retries.retried(inv, adk_id, path, error):
            wctx = inv.open[path]
            self.recorder.fail(inv, wctx, error, wctx.attempt)
            self._errors.setdefault(adk_id, path)
            self._retries.after_failure(inv, adk_id, path, error, path)

    def _settle_cancelled(self, adk_id: str, path: str, timed_out: bool) -> None:
        """An attempt cancelled under a timeout, now told apart: ADK's error event says
        it timed out (retried or final, by ADK's predicate), else it was cancelled."""
        run = self._runs.get((adk_id, path))
        if run is None or run.cancelled is None:
            return
        node, ctx = run.cancelled
        run.cancelled = None
        if timed_out:
            self._failed(node, run, ctx, timeout_error(node))
        else:
            self._cancelled(run, ctx)

    def _cancelled(self, run: _Run, ctx: Any, timed: BaseNode | None = None) -> None:
        """ADK cancelled an attempt (``timed``: of that node, which has a timeout)."""
        inv = self._inv(ctx)
        reason = self._retries.cancelling(inv, ctx.invocation_id, run.ctx.path)
        if timed is not None and reason == "cancelled":
            # ADK cancels an attempt that overruns its timeout, then raises its
            # NodeTimeoutError outside it: decided by ADK's error event or next attempt
            run.cancelled = (timed, ctx)
            return
        self._runs.pop((ctx.invocation_id, ctx.node_path), None)
        if reason == "cancelled":  # not a sibling's failure: the caller may have stopped reading
            self._stopped.setdefault(ctx.invocation_id, set()).add(run.ctx.path)
        self.recorder.cancel(inv, run.ctx, reason)

    def _left_cancelled(self, inv: BridgeInvocation, paths: Iterable[str]) -> bool:
        """A run ADK cancelled stayed so (the caller stopped reading; not a sibling run again)."""
        states = (self.recorder.node_state(inv.run.session_id, p) for p in paths)
        return any(ns is not None and ns.status == "cancelled" for ns in states)

    def _paused(self, run: _Run, ctx: Any) -> None:
        """A dynamic child of this run waits for input: the run pauses, as a workflow does."""
        self._runs.pop((ctx.invocation_id, ctx.node_path), None)
        inv = self._inv(ctx)
        prefix = run.ctx.path + "/"
        below = [
            e
            for e in self.recorder.session(inv.run.session_id).pending
            if isinstance(e, InputRequested) and e.path.startswith(prefix)
        ]
        self.recorder.pause(
            inv, run.ctx, below[0].path if below else "", tuple(dict.fromkeys(e.interrupt_id for e in below))
        )

    def _requested(self, run: _Run, ctx: Any, requests: list[tuple[str, str, Any]]) -> None:
        self._runs.pop((ctx.invocation_id, ctx.node_path), None)
        self.recorder.request_input(self._inv(ctx), run.ctx, requests)

    def _completed(
        self, run: _Run, ctx: Any, output: Any, has_output: bool, route: str | int | None = None
    ) -> None:
        self._runs.pop((ctx.invocation_id, ctx.node_path), None)
        inv = self._inv(ctx)
        self.recorder.complete(inv, run.ctx, output, has_output, route=route)
        self._retries.completed(ctx.invocation_id, run.ctx.path)
        if self._wf_outputs:
            self._settle(ctx.invocation_id, inv)

    def close(self) -> None:
        """Stop the heartbeat thread (the store is the caller's to close)."""
        self.recorder.close()
