"""OpenTelemetry spans for workflow runs (DESIGN.md section 7, "Spans").

:class:`TracingPlugin` turns every invocation and every node run into a span, using only
the OpenTelemetry *API*: give it a ``tracer_provider`` (an SDK ``TracerProvider``, see
:func:`flowscope.observability.configure_tracing`) or let it use the global one.

Span tree of one invocation::

    invoke_workflow orders                    (the invocation: run() or resume())
      invoke_workflow orders                  (the root workflow run, path orders@1)
        invoke_node fetch                     (orders@1/fetch@1)
          invoke_node child                   (a dynamic child, ctx.run_node)
        invoke_workflow billing               (a nested workflow)
          invoke_node charge

The node span's context is attached while the node body runs, so spans a user creates in
a node nest under it, and its W3C ``traceparent`` is handed to long-running jobs.
Node input and output never reach a span unless ``redact`` opts in.

This module is on the hot path (two hooks per node run): it does the least work it can,
keeps no per-event state beyond a dict entry per open span, and never raises into the
engine half-way through a span (a span that was started is always ended).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from typing import TYPE_CHECKING, Any, Callable

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ..errors import ConcurrencyConflict, InvocationAbortedError, classify
from ..events import (
    InputRequested,
    JobDispatched,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodePaused,
    NodeRetrying,
    RunFinished,
)
from ..plugins import Plugin

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.context import NodeContext, NodeOutcome, RunInfo
    from ..engine.runner import RunResult
    from ..events import Event

__all__ = ["TracingPlugin", "Redactor"]

log = logging.getLogger("flowscope.observability.tracing")

#: ``redact(kind, value)``: kind is "input" or "output"; return the string to record as
#: ``flowscope.node.input``/``flowscope.node.output``, or None to record nothing.
Redactor = Callable[[str, Any], "str | None"]

_KEY = "tracing"  # our slot in ctx.plugin_state / run.plugin_state
_INTERNAL = SpanKind.INTERNAL
_propagator = TraceContextTextMapPropagator()

# -- attribute names (the telemetry catalog; tests and dashboards depend on the spelling) --
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_WORKFLOW = "gen_ai.workflow.name"
GEN_AI_CONVERSATION = "gen_ai.conversation.id"
INVOCATION_ID = "flowscope.invocation.id"
RUN_RESUMED = "flowscope.run.resumed"
RUN_OUTCOME = "flowscope.run.outcome"
NODE_NAME = "flowscope.node.name"
NODE_PATH = "flowscope.node.path"
NODE_KIND = "flowscope.node.kind"
NODE_OUTCOME = "flowscope.node.outcome"
NODE_ATTEMPT_COUNT = "flowscope.node.attempt_count"
NODE_COMPLETED = "flowscope.node.completed"
NODE_HAS_OUTPUT = "flowscope.node.has_output"
NODE_RECOVERED = "flowscope.node.recovered"
NODE_ATTEMPT = "flowscope.node.attempt"
NODE_INPUT = "flowscope.node.input"
NODE_OUTPUT = "flowscope.node.output"
INTERRUPT_ID = "flowscope.interrupt.id"
ERROR_TYPE = "error.type"
ERROR_CODE = "flowscope.error.code"
ERROR_MESSAGE = "flowscope.error.message"
ERROR_ORIGIN_PATH = "flowscope.error.origin_path"
RETRY_DELAY = "flowscope.retry.delay_s"
RETRY_EVENT = "node.retry"


class _RunSpan:
    """The invocation span and what we learn about the invocation while it runs."""

    __slots__ = ("span", "context", "open", "error_code", "error_path")

    def __init__(self, span: Any, context: Any) -> None:
        self.span = span
        self.context = context  # parent context of the root workflow run's span
        self.open: dict[str, Any] = {}  # path -> node span still open (for on_event)
        self.error_code: str | None = None
        self.error_path: str | None = None


class _NodeSpan:
    __slots__ = ("span", "context", "token", "run")

    def __init__(self, span: Any, context: Any, token: Any, run: _RunSpan | None) -> None:
        self.span = span
        self.context = context  # what the node's children are parented on
        self.token = token  # to detach in after_node
        self.run = run


class TracingPlugin(Plugin):
    """Spans for invocations and node runs, exactly as in the telemetry catalog.

    ``tracer_provider``: the provider to use (default: the global one, resolved lazily).
    ``record_stacktrace``: add ``exception.stacktrace`` to the ``exception`` span event of
    a failed node (off by default: stack traces carry file paths and code).
    ``redact``: ``redact(kind, value) -> str | None`` with kind ``"input"``/``"output"``;
    what it returns is recorded as ``flowscope.node.input``/``flowscope.node.output``.
    Without it no node input or output ever goes into a span.
    """

    name = "tracing"

    def __init__(
        self,
        tracer_provider: Any = None,
        record_stacktrace: bool = False,
        redact: Redactor | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("flowscope", __version__, tracer_provider=tracer_provider)
        self.record_stacktrace = record_stacktrace
        self.redact = redact
        #: invocation_id -> _RunSpan, so on_event can find open spans by (invocation, path)
        self._runs: dict[str, _RunSpan] = {}
        self._names: dict[tuple[str, str], str] = {}  # (kind, node name) -> span name

    # -- invocations --------------------------------------------------------------------

    def before_run(self, run: RunInfo) -> None:
        links = None
        prev = run.previous_trace_context
        if prev:
            sc = trace.get_current_span(_propagator.extract(prev)).get_span_context()
            if sc.is_valid:
                links = [Link(sc)]
        parent = otel_context.get_current()
        span = self._tracer.start_span(
            f"invoke_workflow {run.workflow}",
            context=parent,
            kind=_INTERNAL,
            attributes={
                GEN_AI_OPERATION: "invoke_workflow",
                GEN_AI_WORKFLOW: run.workflow,
                GEN_AI_CONVERSATION: run.session_id,
                INVOCATION_ID: run.invocation_id,
                RUN_RESUMED: bool(run.resumed),
            },
            links=links,
        )
        ctx = trace.set_span_in_context(span, parent)
        state = _RunSpan(span, ctx)
        run.plugin_state[_KEY] = state
        self._runs[run.invocation_id] = state
        _propagator.inject(run.trace_context, context=ctx)  # stored on RunStarted: a resume links to it

    def after_run(self, run: RunInfo, result: RunResult | None, error: BaseException | None) -> None:
        state: _RunSpan | None = run.plugin_state.pop(_KEY, None)
        self._runs.pop(run.invocation_id, None)
        if state is None:
            return
        span = state.span
        try:
            for path, leftover in list(state.open.items()):  # only if a node run never got after_node
                try:
                    leftover.set_attribute(NODE_OUTCOME, "cancellation")
                    leftover.end()
                finally:
                    state.open.pop(path, None)
            if error is None:
                outcome = result.status if result is not None else "completed"
            elif isinstance(error, (InvocationAbortedError, asyncio.CancelledError, ConcurrencyConflict)):
                outcome = "cancelled"  # a lost race recorded nothing: no failure (issue 14)
            else:
                outcome = "failed"
                info = classify(error)  # the message shown is the one recorded (redacted, R13)
                attrs: dict[str, Any] = {ERROR_TYPE: info.type, ERROR_CODE: state.error_code or info.code}
                if state.error_path:
                    attrs[ERROR_ORIGIN_PATH] = state.error_path
                span.set_attributes(attrs)
                span.set_status(Status(StatusCode.ERROR, run.error_message or info.type))
            span.set_attribute(RUN_OUTCOME, outcome)
        finally:
            span.end()

    # -- node runs ----------------------------------------------------------------------

    def before_node(self, ctx: NodeContext) -> None:
        parent = ctx.parent
        pst = parent.plugin_state.get(_KEY) if parent is not None else None
        if pst is not None:
            state = pst.run
            parent_ctx = pst.context
        else:  # the root workflow run (or a parent we have no span for): under the invocation
            state = ctx.run.plugin_state.get(_KEY)
            parent_ctx = state.context if state is not None else otel_context.get_current()
        kind = ctx.kind
        name = ctx.node_name
        path = ctx.path
        attrs = {NODE_NAME: name, NODE_PATH: path, NODE_KIND: kind}
        if self.redact is not None:
            text = self._redacted("input", ctx.input)
            if text is not None:
                attrs[NODE_INPUT] = text
        span_name = self._names.get((kind, name))
        if span_name is None:
            span_name = self._span_name(kind, name)
        span = self._tracer.start_span(span_name, parent_ctx, _INTERNAL, attrs)
        sctx = trace.set_span_in_context(span, parent_ctx)
        # Attached in this task until after_node: user spans in the body nest under the node span.
        ctx.plugin_state[_KEY] = _NodeSpan(span, sctx, otel_context.attach(sctx), state)
        if state is not None:
            state.open[path] = span
        sc = span.get_span_context()
        if sc.is_valid:
            tc = ctx.trace_context
            tc["traceparent"] = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"
            if sc.trace_state:
                tc["tracestate"] = sc.trace_state.to_header()

    def _span_name(self, kind: str, name: str) -> str:
        span_name = ("invoke_workflow " if kind == "workflow" else "invoke_node ") + name
        if len(self._names) < 10_000:  # node names are bounded; stay bounded if they are not
            self._names[(kind, name)] = span_name
        return span_name

    def after_node(self, ctx: NodeContext, outcome: NodeOutcome) -> None:
        st: _NodeSpan | None = ctx.plugin_state.pop(_KEY, None)
        if st is None:
            return
        span = st.span
        try:
            if st.run is not None:
                st.run.open.pop(ctx.path, None)
            if span.is_recording():
                self._finish(span, outcome)
        finally:
            span.end()
            otel_context.detach(st.token)  # logs (never raises) if the token is foreign

    def _finish(self, span: Any, outcome: NodeOutcome) -> None:
        ev = outcome.event
        t = type(ev)
        completed = t is NodeCompleted
        attrs: dict[str, Any] = {
            NODE_OUTCOME: outcome.status,
            NODE_ATTEMPT_COUNT: outcome.attempt_count,
            NODE_COMPLETED: completed,
            NODE_HAS_OUTPUT: completed and ev.has_output,
            NODE_RECOVERED: bool(outcome.recovered),
        }
        if completed:
            if self.redact is not None:
                text = self._redacted("output", ev.output)
                if text is not None:
                    attrs[NODE_OUTPUT] = text
            span.set_attributes(attrs)
        elif t is NodeErrorEvent:
            attrs[ERROR_TYPE] = ev.error_type
            attrs[ERROR_CODE] = ev.error_code
            span.set_attributes(attrs)
            exc_attrs = {"exception.type": ev.error_type, "exception.message": ev.error_message}
            if self.record_stacktrace and outcome.error is not None:
                exc_attrs["exception.stacktrace"] = "".join(traceback.format_exception(outcome.error))
            span.add_event("exception", exc_attrs)
            span.set_status(Status(StatusCode.ERROR, ev.error_message))
        elif t is NodeErrorPropagated:
            attrs[ERROR_TYPE] = ev.error_type
            attrs[ERROR_CODE] = ev.error_code
            attrs[ERROR_ORIGIN_PATH] = ev.origin_path
            span.set_attributes(attrs)
            message = outcome.error_message or ev.error_type  # as recorded: redacted (R13)
            span.set_status(Status(StatusCode.ERROR, message))
        else:
            interrupt = None
            if t is InputRequested:
                interrupt = ev.interrupt_id
            elif t is JobDispatched:
                interrupt = ev.job_id
            elif t is NodePaused:
                interrupt = ",".join(ev.interrupt_ids)
            if interrupt:
                attrs[INTERRUPT_ID] = interrupt
            span.set_attributes(attrs)  # cancellation (and waiting) leave the status UNSET

    def _redacted(self, kind: str, value: Any) -> str | None:
        try:
            text = self.redact(kind, value)  # type: ignore[misc]
        except Exception as exc:  # a broken redactor records nothing rather than leak or break the span
            log.warning("redact(%r, ...) raised %s; nothing recorded", kind, type(exc).__name__)
            return None
        if text is None:
            return None
        return text if isinstance(text, str) else str(text)

    # -- events -------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        t = type(event)
        if t is NodeRetrying:
            state = self._runs.get(event.invocation_id)
            span = state.open.get(event.path) if state is not None else None
            if span is not None:
                span.add_event(
                    RETRY_EVENT,
                    {
                        NODE_ATTEMPT: event.attempt,
                        ERROR_TYPE: event.error_type,
                        ERROR_CODE: event.error_code,
                        ERROR_MESSAGE: event.error_message,
                        RETRY_DELAY: float(event.delay_s),
                    },
                    timestamp=int(event.ts * 1e9),
                )
        elif t is RunFinished:
            state = self._runs.get(event.invocation_id)
            if state is not None:
                state.error_code = event.error_code
                state.error_path = event.error_path
