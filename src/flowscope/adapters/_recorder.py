"""The recorder both bridges share: flowscope's event catalog written for another engine's runs.

A bridge tells the :class:`BridgeRecorder` what an engine (ADK, LangGraph) did: an
invocation began, a node run started, an attempt failed and another follows, a run ended
(completed, failed, cancelled, paused for input), the invocation ended. The recorder
appends the events to the store, keeps the fold of each session it is recording (let go
when its invocations end) so a bridge can ask what the log says about a path, calls the
plugins (tracing, metrics) with the engine's hooks, and refreshes the heartbeat of the
runs in flight from a thread, so a node that blocks the loop or runs in a thread is alive.

Recording never fails the workflow it observes: a store or plugin error is logged and the
engine carries on (the log then misses those events, which ``flowscope stuck`` shows).

The plugins' node hooks of a run run in a context of that run's own, whatever thread or
task the engine reports its end from: what a hook sets at the start (the
``TracingPlugin``'s current span) is reset where it was set, and nothing logs "Failed to
detach context". It is also made current in the engine's context, as a span valid only
while the run is open: spans the body starts are its children, and a context the engine
hands back to its caller (LangGraph's ``ainvoke``) holds no ended run's span.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from .. import NodeOutcome, RunInfo
from ..errors import ConcurrencyConflict, ErrorInfo, classify, describe_exception
from ..events import (
    Event,
    InputRequested,
    NodeCancelled,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodePaused,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from ..fold import NodeState, WorkflowState, rebuild
from ..liveness import DEFAULT_HEARTBEAT_INTERVAL_S
from ..plugins import Plugin, PluginDispatcher
from ..states import OutcomeStatus, RunStatus
from ..store.base import EventStore
from ._heartbeats import BridgeHeartbeats
from ._runs import (
    BridgeInvocation,
    BridgeNodeContext,
    BridgeResult,
    BridgeSession,
    OpenRunSpan,
    answered,
    jsonable,
    name_of,
    open_runs_below,
    parent_of,
    superseded_runs,
)

__all__ = [
    "BridgeRecorder",
    "BridgeNodeContext",
    "BridgeResult",
    "BridgeInvocation",
    "jsonable",
    "parent_of",
    "name_of",
]

log = logging.getLogger("flowscope.adapters")

#: Set in the engine's context when a run's start hooks changed it: resetting its token
#: succeeds only in that very context, which tells the end of a run whether it may reset
#: what the hooks set there (a token used in another context raises ValueError).
_RUN_HERE: contextvars.ContextVar[object] = contextvars.ContextVar("flowscope_bridge_run", default=None)


class BridgeRecorder:
    """Appends flowscope's events for an engine's runs and calls the plugins' hooks.

    Thread-safe (LangGraph calls back from worker threads): one lock guards the sessions'
    folds and the appends. ``heartbeat_interval`` (seconds, 0: none) is how often the runs
    in flight are marked alive. ``error_codes``: the engine's exception types and their
    error codes (``classify``'s mapping); ``timeouts``: those whose final failure is a
    timeout. ``engine``: ``RunStarted.engine``."""

    def __init__(
        self,
        store: EventStore,
        plugins: Iterable[Plugin] = (),
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        error_codes: Mapping[type, str] | None = None,
        timeouts: tuple[type[BaseException], ...] = (TimeoutError,),
        engine: str | None = None,
    ) -> None:
        self.store = store
        self.engine = engine  # RunStarted.engine: only that engine continues its sessions
        self.error_codes = dict(error_codes) if error_codes else None  # classify()'s mapping
        self.timeouts = timeouts  # a final failure of one of these is a timeout outcome
        self.plugins = PluginDispatcher(plugins)
        self.heartbeat_interval = heartbeat_interval
        self._lock = threading.RLock()
        self._sessions: dict[str, BridgeSession] = {}
        self._heartbeats = BridgeHeartbeats(store, heartbeat_interval)  # of the runs in flight

    # -- the log -----------------------------------------------------------------------

    def session(self, session_id: str) -> WorkflowState:
        """The session's state as the log tells it (folded once, kept up to date while recorded)."""
        with self._lock:
            return self._session(session_id).ws

    def node_state(self, session_id: str, path: str) -> NodeState | None:
        with self._lock:
            return self._session(session_id).ws.nodes.get(path)

    def _session(self, session_id: str, reload: bool = False) -> BridgeSession:
        s = self._sessions.get(session_id)
        if s is None or reload:  # folded from the log (again); its invocations in flight stay counted
            ws = rebuild(self.store.read(session_id))
            s = self._sessions[session_id] = BridgeSession(ws, ws.last_seq, s.active if s else 0)
        return s

    def _append(self, session_id: str, events: Sequence[Event]) -> list[Event]:
        with self._lock:
            s = self._session(session_id)
            try:
                try:
                    stored = self.store.append(session_id, events, expected_last_seq=s.last_seq)
                except ConcurrencyConflict:
                    # Another writer appended to this session (a second process recording
                    # the same engine session): continue after what it wrote.
                    s = self._session(session_id, reload=True)
                    stored = self.store.append(session_id, events, expected_last_seq=s.last_seq)
            except Exception as exc:  # recording never fails the observed workflow
                log.warning(
                    "could not record %d event(s) for session %s: %s",
                    len(events),
                    session_id,
                    describe_exception(exc),
                )
                return []
            for e in stored:
                s.ws.apply(e)
            if stored:
                s.last_seq = stored[-1].seq
        if self.plugins.has_on_event:
            for e in stored:
                self.plugins.call_sync("on_event", e)
        return stored

    # -- invocations -------------------------------------------------------------------

    def begin_run(
        self,
        session_id: str,
        invocation_id: str,
        workflow: str,
        input: Any,
        resumed: bool,
        root_path: str,
        answers: dict[str, Any] | None = None,
        supersede: bool = False,
    ) -> BridgeInvocation:
        """``RunStarted``, an ``InputReceived`` per answered open request, and the root
        workflow's ``NodeStarted``. ``supersede``: the graph starts anew over the session's
        open runs (new input on a thread whose graph waits), which end cancelled
        (``superseded``): the engine drops them, so no answer or worker can reach them."""
        with self._lock:
            s = self._session(session_id)
            s.active += 1  # kept while an invocation records it: finish_run lets it go
            ws = s.ws
            replayed = sum(1 for ns in ws.nodes.values() if ns.status == "completed") if resumed else 0
            recovered = (
                sum(1 for ns in ws.nodes.values() if ns.status == "running" and ns.kind != "workflow")
                if resumed
                else 0
            )
            previous = dict(ws.trace_context) if resumed else {}
            pending = [e for e in ws.pending if isinstance(e, InputRequested)]
            root_attempt = ws.nodes[root_path].attempt if root_path in ws.nodes else 1
        run = RunInfo(
            session_id=session_id,
            invocation_id=invocation_id,
            workflow=workflow,
            input=input,
            resumed=resumed,
            started_at=time.time(),
            previous_trace_context=previous,
            replayed=replayed,
            recovered=recovered,
            plugins=self.plugins.names,
            store=self.store,  # the tracing plugin ships what a dead process left unsent, and marks it
        )
        self.plugins.call_sync("before_run", run)
        self._append(
            session_id,
            [
                RunStarted(
                    session_id=session_id,
                    invocation_id=invocation_id,
                    ts=run.started_at,
                    workflow=workflow,
                    input=jsonable(input),
                    resumed=resumed,
                    replayed=replayed,
                    recovered=recovered,
                    trace_context=dict(run.trace_context),
                    engine=self.engine,
                )
            ],
        )
        inv = BridgeInvocation(run, root_path)
        received = answered(pending, answers or {}, session_id, invocation_id)
        if received:
            self._append(session_id, received)
        if supersede:
            self.supersede_earlier(inv)
        self.start_node(inv, root_path, "workflow", max(root_attempt, 1), False, input)
        return inv

    def supersede_earlier(self, inv: BridgeInvocation) -> None:
        """End ``superseded`` the runs earlier invocations left open, which the engine dropped."""
        sid = inv.run.session_id
        with self._lock:
            dropped = [n for n in open_runs_below(self.session(sid), inv.root_path) if n.path not in inv.open]
        if dropped:
            self._append(sid, superseded_runs(dropped, sid, inv.run.invocation_id))

    def finish_run(
        self,
        inv: BridgeInvocation,
        status: RunStatus,
        output: Any = None,
        error: BaseException | None = None,
        error_path: str | None = None,
    ) -> None:
        """Close the runs still open (children first) and append ``RunFinished``."""
        if inv.finished:
            return
        inv.finished = True
        sid = inv.run.session_id
        info = self.classify(error) if error is not None else None
        for path in sorted(inv.open, key=lambda p: p.count("/"), reverse=True):
            ctx = inv.open.get(path)
            if ctx is None:
                continue
            if status == "completed":
                self.complete(
                    inv,
                    ctx,
                    output if path == inv.root_path else None,
                    path == inv.root_path and output is not None,
                )
            elif status == "paused":
                ids = tuple(
                    e.interrupt_id
                    for e in self.session(sid).pending
                    if isinstance(e, InputRequested) and e.path.startswith(path + "/")
                )
                origin = next(
                    (e.path for e in self.session(sid).pending if e.path.startswith(path + "/")), ""
                )
                self.pause(inv, ctx, origin, ids)
            elif status == "failed" and info is not None and error_path and error_path.startswith(path + "/"):
                self.propagate(inv, ctx, error_path, info.code, info.type, info.qualname)
            elif status == "failed" and error is not None and path == error_path:
                self.fail(inv, ctx, error, ctx.attempt)
            else:
                self.cancel(inv, ctx, "aborted" if status == "cancelled" else "cancelled")
        finished = RunFinished(
            session_id=sid,
            invocation_id=inv.run.invocation_id,
            ts=time.time(),
            status=status,
            output=jsonable(output) if status == "completed" else None,
            error_code=info.code if info is not None and status == "failed" else None,
            error_path=error_path if status == "failed" else None,
            replayed=inv.run.replayed,
            recovered=inv.run.recovered,
        )
        self._append(sid, [finished])
        with self._lock:
            s = self._session(sid)
            pending = tuple(s.ws.pending) if status == "paused" else ()
            s.active -= 1
            if s.active <= 0:  # none of its invocations in flight: the log has it all
                del self._sessions[sid]
        iid, err = inv.run.invocation_id, error if status in ("failed", "cancelled") else None
        result = None if status == "failed" else BridgeResult(status, output, sid, iid, pending)
        self.plugins.call_sync("after_run", inv.run, result, err)

    # -- node runs ---------------------------------------------------------------------

    def start_node(
        self,
        inv: BridgeInvocation,
        path: str,
        kind: str,
        attempt: int,
        recovered: bool,
        input: Any = None,
    ) -> BridgeNodeContext:
        """``NodeStarted`` for a node run (its enclosing workflow runs first, if they have
        not started in this invocation) and the ``before_node`` hooks."""
        parent_path = parent_of(path)
        parent = inv.open.get(parent_path) if parent_path else None
        if parent_path and parent is None:
            attempt_of_parent = self.next_attempt(inv.run.session_id, parent_path)
            parent = self.start_node(inv, parent_path, "workflow", attempt_of_parent, False)
        ctx = BridgeNodeContext(self, inv, path, kind, attempt, recovered, parent, input)
        if self.plugins.wants("before_node"):
            self._start_hooks(ctx)
        inv.open[path] = ctx
        self._append(
            inv.run.session_id,
            [
                NodeStarted(
                    session_id=inv.run.session_id,
                    invocation_id=inv.run.invocation_id,
                    ts=time.time(),
                    path=path,
                    node=ctx.node_name,
                    attempt=attempt,
                    kind=kind,
                    parent_path=parent_path,
                    recovered=recovered,
                )
            ],
        )
        if kind != "workflow":
            self._heartbeats.track(inv.run.session_id, path, True)
        return ctx

    def next_attempt(self, session_id: str, path: str) -> int:
        """The attempt a run of ``path`` that starts (again) has, as the engine numbers it
        (``Invocation.prepare``): 1 for a path new to the log, the next one after a run that
        ended failed or cancelled (numbers never go back), else the attempt it holds."""
        ns = self.node_state(session_id, path)
        if ns is None:
            return 1
        return ns.attempt + 1 if ns.status in ("failed", "cancelled") else max(ns.attempt, 1)

    def _start_hooks(self, ctx: BridgeNodeContext) -> None:
        """``before_node`` in a context of the run's own; what it set there is made
        current in the engine's context too when a body of user code follows (not for a
        workflow's run), the current span as one that is valid only while the run is open."""
        hooks = ctx.hooks = contextvars.copy_context()
        hooks.run(self.plugins.call_sync, "before_node", ctx)
        if ctx.kind == "workflow":
            return
        missing = object()
        otel_now = hooks.run(otel_context.get_current)
        changed = []
        for var, value in hooks.items():
            if var.get(missing) is value:
                continue
            if value is otel_now:
                # The run's span, current for the body only while the run is open: the
                # engine may report the start in its caller's context (LangGraph's ainvoke
                # does, and ends the run elsewhere); left there, it is an invalid span.
                span = trace.get_current_span(otel_now)
                value = trace.set_span_in_context(OpenRunSpan(span.get_span_context(), ctx), otel_now)
            changed.append((var, value))
        if changed:
            marker = _RUN_HERE.set(ctx)
            ctx.body_tokens = (marker, [(var, var.set(value)) for var, value in changed])

    def _end_hooks(self, ctx: BridgeNodeContext, name: str, *args: Any) -> None:
        """A node hook, in the context its run's ``before_node`` ran in."""
        hooks = ctx.hooks
        if hooks is None:
            self.plugins.call_sync(name, ctx, *args)
            return
        try:
            hooks.run(self.plugins.call_sync, name, ctx, *args)
        except RuntimeError:  # the run's context is entered elsewhere (a hook re-entered): run here
            self.plugins.call_sync(name, ctx, *args)

    @staticmethod
    def _restore_body(ctx: BridgeNodeContext) -> None:
        """Undo, in the engine's context, what the start hooks set there: only if this is
        the context the run started in (its marker token resets there and nowhere else);
        another context (the engine ends the run from its caller) is left as it is."""
        tokens, ctx.body_tokens = ctx.body_tokens, None
        if tokens is None:
            return
        marker, sets = tokens
        try:
            _RUN_HERE.reset(marker)
        except (ValueError, RuntimeError):  # another context, or already reset
            return
        for var, token in reversed(sets):
            try:
                var.reset(token)
            except (ValueError, RuntimeError):  # set again since by someone else: theirs now
                pass

    def classify(self, error: BaseException) -> ErrorInfo:
        """How the log names ``error`` (with the engine's error codes)."""
        return classify(error, self.error_codes)

    def _event(self, ctx: BridgeNodeContext, cls: type[Event], **fields: Any) -> Event:
        return cls(
            session_id=ctx.session_id,
            invocation_id=ctx.invocation_id,
            ts=time.time(),
            path=ctx.path,
            node=ctx.node_name,
            **fields,
        )

    def retrying(
        self, ctx: BridgeNodeContext, attempt: int, error: BaseException | ErrorInfo, delay_s: float
    ) -> None:
        """``NodeRetrying``: attempt ``attempt`` failed and another follows (``error`` may be
        named by the bridge when the engine reports no exception for the attempt)."""
        info = error if isinstance(error, ErrorInfo) else self.classify(error)
        ev = self._event(
            ctx,
            NodeRetrying,
            attempt=attempt,
            error_type=info.type,
            error_code=info.code,
            error_message=info.message,
            delay_s=float(delay_s),
            error_qualname=info.qualname,
        )
        self._append(ctx.session_id, [ev])
        ctx.attempt = attempt + 1

    def complete(
        self,
        inv: BridgeInvocation,
        ctx: BridgeNodeContext,
        output: Any,
        has_output: bool,
        attempt_count: int | None = None,
        route: str | int | None = None,
    ) -> None:
        """``NodeCompleted`` (``has_output=False``: the marker; ``route``: what it routed by)."""
        count = attempt_count if attempt_count is not None else ctx.attempt
        out = jsonable(output) if has_output else None
        ev = self._event(
            ctx, NodeCompleted, output=out, has_output=has_output, route=route, attempt_count=count
        )
        self._end(
            inv,
            ctx,
            ev,
            NodeOutcome(
                status="success",
                event=ev,
                attempt_count=count,
                recovered=ctx.recovered,
                duration_s=self._elapsed(ctx),
            ),
        )

    def fail(
        self, inv: BridgeInvocation, ctx: BridgeNodeContext, error: BaseException, attempt_count: int
    ) -> None:
        """The one ``NodeErrorEvent`` of a run that failed for good (the deepest path)."""
        info = self.classify(error)
        ev = self._event(
            ctx,
            NodeErrorEvent,
            error_code=info.code,
            error_message=info.message,
            error_type=info.type,
            attempt_count=attempt_count,
            error_qualname=info.qualname,
        )
        status: OutcomeStatus = "timeout" if isinstance(error, self.timeouts) else "failure"
        self._end(
            inv,
            ctx,
            ev,
            NodeOutcome(
                status=status,
                event=ev,
                attempt_count=attempt_count,
                recovered=ctx.recovered,
                error=error,
                origin_path=ctx.path,
                duration_s=self._elapsed(ctx),
            ),
            error_event=True,
        )

    def propagate(
        self,
        inv: BridgeInvocation,
        ctx: BridgeNodeContext,
        origin_path: str,
        code: str,
        error_type: str,
        error_qualname: str = "",
    ) -> None:
        """An enclosing run failed because a descendant did (no second ``NodeErrorEvent``)."""
        ev = self._event(
            ctx,
            NodeErrorPropagated,
            origin_path=origin_path,
            error_code=code,
            error_type=error_type,
            attempt_count=ctx.attempt,
            error_qualname=error_qualname,
        )
        self._end(inv, ctx, ev, self._outcome(ctx, ev, "failure", origin_path=origin_path))

    def cancel(self, inv: BridgeInvocation, ctx: BridgeNodeContext, reason: str = "cancelled") -> None:
        ctx.cancel_reason = reason
        ev = self._event(ctx, NodeCancelled, reason=reason)
        self._end(inv, ctx, ev, self._outcome(ctx, ev, "cancellation"))

    def request_input(
        self, inv: BridgeInvocation, ctx: BridgeNodeContext, requests: Sequence[tuple[str, str, Any]]
    ) -> None:
        """One ``InputRequested`` per ``(interrupt_id, prompt, payload)``: the run pauses."""
        evs = [
            self._event(ctx, InputRequested, interrupt_id=i, prompt=p, payload=jsonable(v))
            for i, p, v in requests
        ]
        if evs:
            self._end(
                inv,
                ctx,
                evs,
                NodeOutcome(
                    status="waiting",
                    event=evs[-1],
                    attempt_count=ctx.attempt,
                    recovered=ctx.recovered,
                    origin_path=ctx.path,
                    duration_s=self._elapsed(ctx),
                ),
            )

    def pause(
        self, inv: BridgeInvocation, ctx: BridgeNodeContext, origin_path: str, interrupt_ids: tuple[str, ...]
    ) -> None:
        """An enclosing run stops because a descendant waits for input."""
        ev = self._event(
            ctx, NodePaused, waiting="input", origin_path=origin_path, interrupt_ids=interrupt_ids
        )
        self._end(inv, ctx, ev, self._outcome(ctx, ev, "waiting", origin_path=origin_path))

    def _outcome(self, ctx: BridgeNodeContext, ev: Event, status: OutcomeStatus, **more: Any) -> NodeOutcome:
        """The outcome the after-node hooks get for ``ctx``'s run ending with ``ev``."""
        return NodeOutcome(
            status=status, event=ev, attempt_count=ctx.attempt, recovered=ctx.recovered,
            duration_s=self._elapsed(ctx), **more,
        )  # fmt: skip

    @staticmethod
    def _elapsed(ctx: BridgeNodeContext) -> float:
        return time.perf_counter() - ctx.started_at

    def _end(
        self,
        inv: BridgeInvocation,
        ctx: BridgeNodeContext,
        ev: Event | list[Event],
        outcome: NodeOutcome,
        error_event: bool = False,
    ) -> None:
        inv.open.pop(ctx.path, None)
        ctx.open = False
        self._heartbeats.track(ctx.session_id, ctx.path, False)
        self._append(ctx.session_id, ev if isinstance(ev, list) else [ev])
        if error_event and self.plugins.wants("on_node_error"):
            self._end_hooks(ctx, "on_node_error", outcome.event)
        if self.plugins.wants("after_node"):
            self._end_hooks(ctx, "after_node", outcome)
        self._restore_body(ctx)

    # -- heartbeats --------------------------------------------------------------------

    def heartbeat(self, session_id: str, paths: Iterable[str]) -> None:
        self._heartbeats.beat(session_id, paths)

    def close(self) -> None:
        """Stop the heartbeat thread (the store stays open: it is the caller's)."""
        self._heartbeats.close()
