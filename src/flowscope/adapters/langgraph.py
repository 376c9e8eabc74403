"""Bridge for LangGraph (1.2): flowscope's log for the runs of a compiled graph.

``FlowscopeCallbackHandler(store, plugins=(), workflow=None)`` is a LangChain callback
handler; pass it in ``config={"callbacks": [handler], "configurable": {"thread_id": ...}}``.
LangGraph calls ``on_chain_start/end/error`` for the graph run and for every attempt of
every task (a new LangChain run id per attempt, the task id in the metadata's
``langgraph_checkpoint_ns``). From those the handler records:

- the thread id as the session; each ``invoke``/``stream`` as an invocation (``RunStarted``
  .. ``RunFinished``); the graph as the root workflow run ``graph@1``;
- a task as a node run ``graph@1/node@k`` (k counts the runs of that node in the thread;
  LangGraph's internal ``__start__`` task is none), its attempts under a ``RetryPolicy``
  and a ``TimeoutPolicy`` (a failed or abandoned attempt followed by another start of the
  same task is a ``NodeRetrying``, as is one the run ended in its backoff (then cancelled):
  one its policy retries, by LangGraph's rule; any other failed attempt is final, the one
  ``NodeErrorEvent`` at the deepest path with every attempt counted; a final timeout is
  LangGraph's ``NodeTimeoutError``, outcome timeout);
- a node's error handler as a run beside the node (``graph@1/__error_handler__node@1``):
  its start is the node's final failure;
- an interrupt (``GraphInterrupt``) as one ``InputRequested`` at the task that raised it:
  a pause, not an error; the subgraph nodes it passes through, and the graph, pause
  (``NodePaused``); a breakpoint pauses the same way with no request; a
  ``Command(resume=...)`` is the ``InputReceived`` of the open requests;
- a resume (``Command`` or ``None`` input) continues the runs LangGraph runs again (an
  interrupted, failed or cancelled task, or one whose process died) at their paths, the
  attempts continued;
- a heartbeat for every task in flight, so a process killed mid-node leaves an open run
  that ``flowscope stuck`` lists and the ``StoreCollector`` counts.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langgraph.errors import GraphBubbleUp, GraphInterrupt, NodeTimeoutError, ParentCommand
from langgraph.types import Command
from xxhash import xxh3_128_hexdigest  # LangGraph's own dependency: its interrupts' ids

from ..errors import ErrorInfo
from ..events import InputRequested
from ..fold import WorkflowState
from ..liveness import DEFAULT_HEARTBEAT_INTERVAL_S
from ..plugins import Plugin
from ..states import RunStatus
from ..store.base import EventStore
from ._langgraph_retries import retried, retry_policy_of
from ._recorder import BridgeInvocation, BridgeNodeContext, BridgeRecorder
from ._runs import path_segment, route_of

try:  # langgraph >= 1.2's graph lifecycle callbacks: the one signal of a breakpoint of the root graph
    from langgraph.callbacks import GraphCallbackHandler as _Handler
except ImportError:  # pragma: no cover - an older 1.2: breakpoints of the root graph look completed
    _Handler = BaseCallbackHandler  # type: ignore[misc, assignment]

__all__ = ["FlowscopeCallbackHandler"]


#: LangGraph's internal tasks: ``__start__`` runs a conditional edge from START. Not node
#: runs of the user's graph, so not recorded (their chains belong to the enclosing run).
_INTERNAL = frozenset({"__start__", "__end__"})

#: The error code of a LangGraph ``TimeoutPolicy`` timeout: flowscope's own timeout code.
_TIMEOUT_CODE = "NODE_TIMEOUT"


class _Task:
    """One LangGraph task (one node run) in this invocation."""

    __slots__ = ("ctx", "ns", "run_id", "depth", "error", "done", "started", "policy", "tries", "kids")

    def __init__(self, ctx: BridgeNodeContext, ns: str, run_id: UUID, depth: int) -> None:
        self.ctx = ctx
        self.ns = ns  # LangGraph's checkpoint namespace of the task (its task id, last)
        self.run_id = run_id  # LangChain run id of the current attempt
        self.depth = depth  # segments of the checkpoint namespace (1 for a top-level task)
        self.error: tuple[BaseException, float] | None = None  # failed attempt, retry not yet known
        self.done = False
        self.started = time.monotonic()  # when the current attempt started
        self.policy = retry_policy_of(ns.rsplit(":", 1)[-1])  # the RetryPolicy LangGraph runs it under
        self.tries = 1  # its attempts in this invocation (LangGraph counts anew on a resume)
        self.kids = 0  # tasks started under it (a subgraph it ran)


class _Graph:
    """One graph invocation being recorded."""

    __slots__ = ("inv", "tasks", "interrupted", "continues", "claimed", "latest")

    def __init__(self, inv: BridgeInvocation, continues: bool, latest: str | None = None) -> None:
        self.inv = inv
        self.tasks: dict[str, _Task] = {}  # checkpoint namespace -> task
        self.interrupted = False
        self.continues = continues  # a resume (Command or None input): earlier runs continue
        self.claimed: set[str] = set()  # paths of earlier runs continued by this invocation
        #: The invocation that last started a task of the thread (a resume continues its runs).
        self.latest = latest


def _latest_invocation(ws: WorkflowState, root_path: str) -> str | None:
    """The invocation that started the thread's latest task run (by its last start or
    heartbeat), or None before any: the runs a resume continues are that invocation's."""
    runs = [n for p, n in ws.nodes.items() if p != root_path]
    return max(runs, key=lambda n: n.heartbeat_at or n.started_at or 0.0).invocation_id if runs else None


#: States of an earlier run that a resume of the thread continues (LangGraph runs its task again).
_UNFINISHED = frozenset({"waiting_input", "running", "failed", "cancelled"})

#: Unfinished tasks whose path the handler remembers by task id (the rest match by order).
_MAX_PATHS = 10_000


def _prompt(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("prompt", "question", "message"):
            if isinstance(value.get(key), str):
                return value[key]
    return ""


class FlowscopeCallbackHandler(_Handler):
    """Records a LangGraph graph's runs in a flowscope store (see the module docstring).

    ``workflow``: the workflow name to record (a string, or a graph whose ``name`` is
    used); by default the name LangGraph gives the graph run. ``plugins``: flowscope
    plugins (``TracingPlugin``, ``MetricsPlugin``). One handler may serve many threads.
    """

    run_inline = True  # called in the order LangGraph reports, never from an executor
    raise_error = False

    def __init__(
        self,
        store: EventStore,
        plugins: Iterable[Plugin] = (),
        workflow: Any = None,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S,
    ) -> None:
        super().__init__()
        self.recorder = BridgeRecorder(
            store,
            plugins,
            heartbeat_interval,
            error_codes={NodeTimeoutError: _TIMEOUT_CODE},
            timeouts=(NodeTimeoutError, TimeoutError),
            engine="langgraph",
        )
        self.workflow: str | None = (
            workflow
            if workflow is None or isinstance(workflow, str)
            else str(getattr(workflow, "name", "") or "") or None
        )
        self._lock = threading.RLock()
        self._graphs: dict[UUID, _Graph] = {}  # root run id -> invocation
        # Every chain run we saw under a graph -> (root run id, the task it runs in or None).
        self._runs: dict[UUID, tuple[UUID, _Task | None]] = {}
        # (thread, checkpoint namespace) -> path: LangGraph keeps a task's id when it runs
        # the task again on resume, so this maps the re-run onto its run exactly.
        self._paths: dict[tuple[str, str], str] = {}
        self._owners: dict[tuple[str, str], str] = {}  # (thread, path) -> the task id it belongs to
        self._counts: dict[str, dict[tuple[str, str], int]] = {}  # thread -> (parent path, node) -> runs

    # -- LangChain callbacks -----------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        md = metadata or {}
        with self._lock:
            if parent_run_id is None:
                self._begin(run_id, inputs, md, kwargs.get("name"))
                return
            seen = self._runs.get(parent_run_id)
            if seen is None:
                return  # not under a graph run we record
            root, task = seen
            g = self._graphs.get(root)
            if g is None:
                return
            ns = md.get("langgraph_checkpoint_ns") or ""
            node = md.get("langgraph_node")
            depth = _depth(ns)
            parent_depth = task.depth if task is not None else 0
            # An error handler's task (``add_node(..., error_handler=...)``) nests under the
            # namespace of the task that failed, one level deeper than its graph's tasks: it
            # is a run of its own beside the failed node, which failed for good.
            handler = _is_error_handler(node) and depth == parent_depth + 2
            is_task = (
                bool(node)
                and kwargs.get("name") == node
                and (depth == parent_depth + 1 or handler)
                and ns.rsplit("|", 1)[-1].startswith(f"{node}:")
            )
            if not is_task or node in _INTERNAL:
                self._runs[run_id] = seen
                return
            if handler:
                failed = g.tasks.get(ns.rsplit("|", 1)[0])
                if failed is not None and not failed.done and failed.error is not None:
                    self._forget(g.inv.run.session_id, failed.ns)
                    self._end_failed(g, failed, failed.error[0], {})
            self._runs[run_id] = (root, self._task_start(g, task, ns, str(node), depth, run_id, inputs))

    def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        with self._lock:
            g = self._graphs.get(run_id)
            if g is not None:
                self._finish(run_id, g, outputs, None)
                return
            task = self._task_of(run_id)
            if task is not None:
                task.done = True
                g = self._graph_of(run_id)
                if g is not None:
                    self._forget(g.inv.run.session_id, task.ns)  # never run again
                    self._complete(g, task, outputs)

    def on_chain_error(
        self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        with self._lock:
            g = self._graphs.get(run_id)
            if g is not None:
                self._finish(run_id, g, None, error)
                return
            task = self._task_of(run_id)
            g = self._graph_of(run_id)
            if task is None or g is None:
                return
            if isinstance(error, GraphInterrupt):
                task.done = True
                g.interrupted = True
                self._interrupted(g, task, error)
            elif isinstance(error, GraphBubbleUp):  # a Command for the parent graph: the task is done
                task.done = True
                command = error.args[0] if isinstance(error, ParentCommand) and error.args else None
                self._complete(g, task, command)
            else:
                # Retried or final? Only the next start of the same task tells: LangGraph's
                # retry policy decides, and we record what it decided.
                task.error = (error, time.time())

    def _complete(self, g: _Graph, task: _Task, outputs: Any) -> None:
        """A task's ``NodeCompleted``: a ``Command`` it returned is its ``update`` (the
        output) and its ``goto`` (the route). The tasks of a subgraph it ran end first, which
        no callback ends: one whose failure it caught failed, one LangGraph cancelled cancelled."""
        if task.kids:
            self._close_tasks(g, task.ns + "|", cancel_rest=True)
        if isinstance(outputs, Command):
            update = outputs.update
            self.recorder.complete(g.inv, task.ctx, update, update is not None, route=route_of(outputs.goto))
        else:
            self.recorder.complete(g.inv, task.ctx, outputs, outputs is not None)

    def on_interrupt(self, event: Any) -> None:
        """LangGraph paused a graph (``interrupt()`` or a breakpoint): the root run is
        paused, not completed, even when no task raised (``interrupt_before/after``)."""
        with self._lock:
            g = self._graphs.get(event.run_id) if event.run_id is not None else None
            if g is not None:
                g.interrupted = True

    # -- graph runs --------------------------------------------------------------------

    def _interrupted(self, g: _Graph, task: _Task, error: GraphInterrupt) -> None:
        """An interrupt reaches a task: ``InputRequested`` at the task that raised it; a task
        it passes through on its way up (a subgraph's node) is paused, as the root is."""
        interrupts = error.args[0] if error.args else ()
        sid = g.inv.run.session_id
        pending = {
            e.interrupt_id: e.path
            for e in self.recorder.session(sid).pending
            if isinstance(e, InputRequested)
        }
        ids = list(dict.fromkeys(str(i.id) for i in interrupts))
        new = [(str(i.id), _prompt(i.value), i.value) for i in interrupts if str(i.id) not in pending]
        new = list({i: (i, p, v) for i, p, v in new}.values())
        if new:
            self.recorder.request_input(g.inv, task.ctx, new)
            return
        # Raised below (its requests are recorded at their paths), or a breakpoint of a
        # subgraph (interrupt_before/after: no request at all).
        below = [i for i in ids if pending.get(i, "").startswith(task.ctx.path + "/")]
        origin = pending[below[0]] if below else ""
        self.recorder.pause(g.inv, task.ctx, origin, tuple(below))

    def _begin(self, run_id: UUID, inputs: Any, md: dict[str, Any], name: Any) -> None:
        session_id = str(md.get("thread_id") or run_id)
        workflow = self.workflow or str(name or "graph")
        root_path = f"{path_segment(workflow)}@1"
        ws = self.recorder.session(session_id)
        # A resume continues the thread: Command(resume=...)/Command(goto=...), or None
        # (after a failure, a crash or a breakpoint). Other input starts the graph anew.
        continues = inputs is None or isinstance(inputs, Command)
        resumed = ws.invocations > 0 and (
            continues or ws.status in ("paused", "running", "failed", "cancelled")
        )
        answers: dict[str, Any] = {}
        latest = _latest_invocation(ws, root_path) if continues else None
        if isinstance(inputs, Command) and inputs.resume is not None:
            open_ids = [e.interrupt_id for e in ws.pending if isinstance(e, InputRequested)]
            value = inputs.resume
            answers = _resume_answers(value, open_ids)
            recorded_input: Any = {"resume": value}
        else:
            recorded_input = inputs
        inv = self.recorder.begin_run(
            session_id,
            str(run_id),
            workflow,
            recorded_input,
            resumed,
            root_path,
            answers,
            # new input over an unanswered interrupt: LangGraph drops it and runs anew
            supersede=resumed and not continues,
        )
        self._graphs[run_id] = _Graph(inv, continues and ws.invocations > 0, latest)
        self._runs[run_id] = (run_id, None)

    def _finish(self, run_id: UUID, g: _Graph, outputs: Any, error: BaseException | None) -> None:
        del self._graphs[run_id]
        for key in [k for k, (root, _) in self._runs.items() if root == run_id]:
            del self._runs[key]
        if error is None:
            # A task whose failure the graph survived (a node caught what a subgraph it
            # called raised) ends failed, never completed with the graph.
            self._close_tasks(g, "", cancel_rest=False)
            status: RunStatus = "paused" if g.interrupted else "completed"
            if status == "completed":
                # Nothing is pending in the thread now: a run an earlier invocation left open
                # (a question answered by update_state, dropped by a time travel) is over.
                self.recorder.supersede_earlier(g.inv)
            self.recorder.finish_run(g.inv, status, outputs if status == "completed" else None)
            return
        if isinstance(error, GraphInterrupt):
            self.recorder.finish_run(g.inv, "paused")
            return
        error_path = None
        # A TimeoutPolicy timeout reaches only the graph: the timed-out attempt's own chain
        # ends in a CancelledError (LangGraph cancels it), or has not ended yet.
        timed_out = error.node if isinstance(error, NodeTimeoutError) else None
        failed: dict[int, str] = {}  # id of an exception -> the deepest path it failed at
        for task in sorted(g.tasks.values(), key=lambda t: -t.depth):
            if task.done or self._cancelled_in_backoff(g, task):
                continue
            exc = task.error[0] if task.error is not None else None
            cancelled = exc is not None and _stopped(exc)
            if timed_out is not None and task.ctx.node_name == timed_out and (exc is None or cancelled):
                timed_out = None  # one task timed out: the first one open under that name
                exc, cancelled = error, False
            if exc is not None and not cancelled:  # the attempt the graph gave up on
                if self._end_failed(g, task, exc, failed) and (error_path is None or exc is error):
                    error_path = task.ctx.path
            elif cancelled:  # LangGraph cancelled it (another task failed)
                task.done = True
                self.recorder.cancel(g.inv, task.ctx)
        if _stopped(error):
            self.recorder.finish_run(g.inv, "cancelled", error=error)
        else:
            self.recorder.finish_run(g.inv, "failed", error=error, error_path=error_path or g.inv.root_path)

    # -- tasks -------------------------------------------------------------------------

    def _close_tasks(self, g: _Graph, prefix: str, cancel_rest: bool) -> None:
        """End the open tasks whose namespace starts with ``prefix``, deepest first: one
        that failed with its failure (a container failing with what a task inside it
        raised propagates it: one ``NodeErrorEvent``, at the deepest path); with
        ``cancel_rest`` the others cancelled."""
        failed: dict[int, str] = {}  # id of an exception -> the deepest path it failed at
        open_tasks = [t for t in g.tasks.values() if not t.done and t.ns.startswith(prefix)]
        for task in sorted(open_tasks, key=lambda t: -t.depth):
            if self._cancelled_in_backoff(g, task):
                continue
            exc = task.error[0] if task.error is not None else None
            if exc is None or _stopped(exc):
                if cancel_rest:
                    task.done = True
                    self.recorder.cancel(g.inv, task.ctx)
                continue
            self._end_failed(g, task, exc, failed)

    def _cancelled_in_backoff(self, g: _Graph, task: _Task) -> bool:
        """A failed attempt LangGraph retries, whose retry never started: the run ended in its
        backoff (on the event loop LangGraph cancels it there, and no callback says so), a
        ``NodeRetrying`` then a ``NodeCancelled``. Any other failed attempt is final."""
        if task.error is None or _stopped(task.error[0]):
            return False
        exc, failed_at = task.error
        if not retried(task.policy, exc, task.tries):
            return False
        self.recorder.retrying(task.ctx, task.ctx.attempt, exc, max(0.0, time.time() - failed_at))
        task.done = True
        self.recorder.cancel(g.inv, task.ctx)
        return True

    def _end_failed(self, g: _Graph, task: _Task, exc: BaseException, failed: dict[int, str]) -> bool:
        """End ``task`` failed with ``exc``; True if it holds the failure. A subgraph's node
        failing with what a task inside it raised (``failed``: each exception's deepest
        path so far) propagates it: one ``NodeErrorEvent``, at the deepest path."""
        task.done = True
        origin = failed.get(id(exc))
        if origin is not None and origin.startswith(task.ctx.path + "/"):
            info = self.recorder.classify(exc)
            self.recorder.propagate(g.inv, task.ctx, origin, info.code, info.type, info.qualname)
            return False
        self.recorder.fail(g.inv, task.ctx, exc, task.ctx.attempt)
        failed[id(exc)] = task.ctx.path
        return True

    def _task_start(
        self, g: _Graph, parent: _Task | None, ns: str, node: str, depth: int, run_id: UUID, inputs: Any
    ) -> _Task:
        task = g.tasks.get(ns)
        if task is not None:  # another attempt of a task we follow
            if not task.done:
                # The attempt's own tasks ended with it (a subgraph node's: its graph ran
                # again from the start, and its tasks start anew at new paths).
                self._close_tasks(g, task.ns + "|", cancel_rest=True)
                if task.error is not None and not isinstance(task.error[0], asyncio.CancelledError):
                    exc, failed_at = task.error
                    self.recorder.retrying(task.ctx, task.ctx.attempt, exc, max(0.0, time.time() - failed_at))
                else:
                    # The attempt did not end, or ended cancelled: LangGraph gave up on it
                    # for its TimeoutPolicy (it starts the next attempt before the timed-out
                    # one's chain reports its cancellation, which is then ignored).
                    elapsed = time.monotonic() - task.started
                    message = f"Node '{node}' exceeded its timeout (attempt abandoned after {elapsed:.3f}s)."
                    self.recorder.retrying(
                        task.ctx,
                        task.ctx.attempt,
                        ErrorInfo(_TIMEOUT_CODE, NodeTimeoutError.__name__, message),
                        0.0,
                    )
            task.error = None
            task.tries += 1
            task.run_id = run_id
            task.started = time.monotonic()
            return task
        inv = g.inv
        sid = inv.run.session_id
        parent_path = parent.ctx.path if parent is not None else inv.root_path
        ws = self.recorder.session(sid)
        earlier = None
        if g.continues:
            # The unfinished run of this task from an earlier invocation of the thread (it
            # paused, failed, was cancelled, or its process died) is the one LangGraph runs
            # again: the same path, the attempts continued. The task id names it exactly
            # (this process saw it); else the first such run of the node, by order, among
            # the runs of the invocation that last ran a task: LangGraph runs again the
            # tasks of its last checkpoint, which that invocation started, and an older
            # unfinished run is one it dropped (a failed run before new input started the
            # thread anew), continued by nobody.
            known = self._paths.get((sid, ns))
            if known not in ws.nodes:  # another handler or process saw it: its interrupt's id
                known = _asked_by(ws, ns)
            candidates = [ws.nodes[known]] if known in ws.nodes else []
            candidates += sorted(
                (
                    n
                    for n in ws.nodes.values()
                    if n.node == node and n.parent_path == parent_path and n.invocation_id == g.latest
                ),
                key=lambda n: n.started_at or 0.0,
            )
            earlier = next(
                (
                    n
                    for n in candidates
                    if n.status in _UNFINISHED
                    and n.invocation_id != inv.run.invocation_id
                    and n.path not in g.claimed
                    and self._owners.get((sid, n.path), ns) == ns  # not another task's, by its id
                ),
                None,
            )
        if earlier is not None:
            path = earlier.path
            g.claimed.add(path)
            crashed = earlier.status == "running"
            attempt = max(earlier.attempt, 1) if earlier.status == "waiting_input" else earlier.attempt + 1
        else:
            path = self._next_path(sid, ws.nodes, parent_path, node)
            crashed, attempt = False, 1
        self._remember(sid, ns, path)
        ctx = self.recorder.start_node(inv, path, "function", attempt, crashed, inputs)
        task = g.tasks[ns] = _Task(ctx, ns, run_id, depth)
        if parent is not None:
            parent.kids += 1
        return task

    def _remember(self, sid: str, ns: str, path: str) -> None:
        """Map the task id to its path, and back (bounded: the oldest unfinished tasks fall
        back to order)."""
        self._paths[(sid, ns)] = path
        self._owners[(sid, path)] = ns
        if len(self._paths) > _MAX_PATHS:
            self._forget(*next(iter(self._paths)))

    def _forget(self, sid: str, ns: str) -> None:
        path = self._paths.pop((sid, ns), None)
        if path is not None and self._owners.get((sid, path)) == ns:
            del self._owners[(sid, path)]

    def _next_path(self, sid: str, nodes: dict[str, Any], parent_path: str, node: str) -> str:
        """``parent/node@k`` for the next run of ``node`` under ``parent`` in the thread: k
        counted once from the log, then kept (a path the log already holds is skipped)."""
        counts = self._counts.get(sid)
        if counts is None:
            counts = self._counts[sid] = {}
            for n in nodes.values():
                key = (n.parent_path, n.node)
                counts[key] = counts.get(key, 0) + 1
            if len(self._counts) > _MAX_PATHS:  # bounded: an evicted thread is counted again
                del self._counts[next(iter(self._counts))]
        k = counts.get((parent_path, node), 0) + 1
        segment = path_segment(node)
        while f"{parent_path}/{segment}@{k}" in nodes:  # another process recorded this thread too
            k += 1
        counts[(parent_path, node)] = k
        return f"{parent_path}/{segment}@{k}"

    def _task_of(self, run_id: UUID) -> _Task | None:
        seen = self._runs.get(run_id)
        if seen is None or seen[1] is None or seen[1].run_id != run_id:
            return None
        return seen[1]

    def _graph_of(self, run_id: UUID) -> _Graph | None:
        seen = self._runs.get(run_id)
        return self._graphs.get(seen[0]) if seen is not None else None

    def close(self) -> None:
        """Stop the heartbeat thread (the store is the caller's to close)."""
        self.recorder.close()


def _depth(ns: str) -> int:
    """The tasks a checkpoint namespace nests: its ``node:task_id`` segments. LangGraph
    puts a call counter between them (``outer:id|1|step:id``) when a node calls a
    subgraph again, or a retried subgraph node runs its graph again."""
    return sum(1 for part in ns.split("|") if ":" in part) if ns else 0


def _asked_by(ws: WorkflowState, ns: str) -> str | None:
    """The run that asked the task ``ns``'s first interrupt, which LangGraph names by the
    hash of the namespace it keeps on a re-run (``types._interrupt_id``): exact, where order
    cannot tell a ``Send`` fan-out's runs of one node apart."""
    iid = xxh3_128_hexdigest(ns.encode())
    for n in ws.nodes.values():
        if iid in n.requests or iid in n.inputs:
            return n.path
    return None


def _is_error_handler(node: Any) -> bool:
    """Whether ``node`` is a node's error handler task: its own, or the graph's default."""
    return isinstance(node, str) and node.startswith(("__error_handler__", "__default_error_handler__"))


def _stopped(error: BaseException) -> bool:
    """Whether ``error`` ended the graph's run without a failure: a cancelled task, Ctrl-C,
    or a ``stream()``/``astream()`` the caller stopped reading (its generator is closed:
    ``GeneratorExit``). Cancellation is not failure; LangGraph's checkpoint is intact."""
    return isinstance(error, (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit)) or (
        type(error).__name__ == "CancelledError"
    )


def _resume_answers(value: Any, open_ids: list[str]) -> dict[str, Any]:
    """The answers a ``Command(resume=value)`` gives, by LangGraph's own rule (its
    ``pregel/_loop.py``): a dict whose keys all look like interrupt ids is a map of answers
    (those of open requests are taken); any other value answers the one open request, and
    with more than one open LangGraph refuses it (``RuntimeError``), so it answers none."""
    if isinstance(value, dict) and all(isinstance(k, str) and _INTERRUPT_ID.fullmatch(k) for k in value):
        return {k: v for k, v in value.items() if k in open_ids}
    return {open_ids[0]: value} if len(open_ids) == 1 else {}


#: An interrupt id as LangGraph makes them (``is_xxh3_128_hexdigest``): 32 hex digits.
_INTERRUPT_ID = re.compile(r"[0-9a-f]{32}")
