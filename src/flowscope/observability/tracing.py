"""OpenTelemetry spans for workflow runs, as live spans (the catalog: ``docs/design.md``, "Spans").

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

What goes on each span (names, attributes, status, span events) comes from
:mod:`flowscope.observability.spans`, the mapping ``flowscope export`` uses too; this module
only applies it to SDK spans at the right moments. The node span's context is attached while the node body runs, so spans a user creates in
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
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ..errors import InvocationAbortedError, classify
from ..events import NodeCompleted, NodeErrorPropagated, NodeRetrying, RunFinished
from ..plugins import Plugin
from . import spans as sp

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.context import NodeContext, NodeOutcome, RunInfo
    from ..engine.runner import RunResult
    from contextvars import Token

    from ..events import Event

__all__ = ["TracingPlugin", "Redactor"]

log = logging.getLogger("flowscope.observability.tracing")

#: ``redact(kind, value)``: kind is "input" or "output"; return the string to record as
#: ``flowscope.node.input``/``flowscope.node.output``, or None to record nothing.
Redactor = Callable[[str, Any], "str | None"]

_KEY = "tracing"  # our slot in ctx.plugin_state / run.plugin_state
_INTERNAL = SpanKind.INTERNAL
_propagator = TraceContextTextMapPropagator()


class _RunSpan:
    """The invocation span and what we learn about the invocation while it runs."""

    __slots__ = ("span", "context", "open", "error_code", "error_path")

    def __init__(self, span: Span, context: Context) -> None:
        self.span = span
        self.context = context  # parent context of the root workflow run's span
        self.open: dict[str, Span] = {}  # path -> node span still open (for on_event)
        self.error_code: str | None = None
        self.error_path: str | None = None


class _NodeSpan:
    __slots__ = ("span", "context", "token", "run")

    def __init__(self, span: Span, context: Context, token: Token[Context], run: _RunSpan | None) -> None:
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
        tracer_provider: TracerProvider | None = None,
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
        if prev:  # a resume links to the invocation it resumes
            sc = trace.get_current_span(_propagator.extract(prev)).get_span_context()
            if sc.is_valid:
                links = [Link(sc)]
        parent = otel_context.get_current()
        span = self._tracer.start_span(
            sp.invocation_span_name(run.workflow),
            context=parent,
            kind=_INTERNAL,
            attributes=sp.invocation_attributes(run.workflow, run.session_id, run.invocation_id, run.resumed),
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
                    leftover.set_attributes(sp.unfinished_node_end(invocation_finished=True).attributes)
                    leftover.end()
                finally:
                    state.open.pop(path, None)
            failure = None
            if error is None:
                outcome = result.status if result is not None else "completed"
            elif isinstance(error, (InvocationAbortedError, asyncio.CancelledError)):
                outcome = "cancelled"
            else:
                outcome = "failed"
                info = classify(error)
                failure = sp.RunError(info.type, state.error_code or info.code, info.message, state.error_path)
            _apply(span, sp.invocation_end(outcome, failure))
        finally:
            span.end()

    # -- node runs ----------------------------------------------------------------------

    def before_node(self, ctx: NodeContext) -> None:
        parent = ctx.parent
        pst: _NodeSpan | None = parent.plugin_state.get(_KEY) if parent is not None else None
        state: _RunSpan | None
        if pst is not None:
            state = pst.run
            parent_ctx = pst.context
        else:  # the root workflow run (or a parent we have no span for): under the invocation
            state = ctx.run.plugin_state.get(_KEY)
            parent_ctx = state.context if state is not None else otel_context.get_current()
        kind = ctx.kind
        name = ctx.node_name
        path = ctx.path
        attrs = sp.node_attributes(name, path, kind)
        if self.redact is not None:
            text = self._redacted("input", ctx.input)
            if text is not None:
                attrs[sp.NODE_INPUT] = text
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
        span_name = sp.node_span_name(kind, name)
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

    def _finish(self, span: Span, outcome: NodeOutcome) -> None:
        ev = outcome.event
        error = outcome.error
        origin_message = None
        if error is not None and type(ev) is NodeErrorPropagated:  # the message of the failure it carries
            origin_message = classify(error).message
        end = sp.node_end(ev, outcome.attempt_count, outcome.recovered, origin_message)
        if end.events or end.error is not None:
            stack = None
            if self.record_stacktrace and error is not None and end.events:
                stack = "".join(traceback.format_exception(error))
            _apply(span, end, stack)
        else:  # most node runs: attributes only
            span.set_attributes(end.attributes)
        if self.redact is not None and isinstance(ev, NodeCompleted):
            text = self._redacted("output", ev.output)
            if text is not None:
                span.set_attribute(sp.NODE_OUTPUT, text)

    def _redacted(self, kind: str, value: Any) -> str | None:
        redact = self.redact
        if redact is None:
            return None
        try:
            text = redact(kind, value)
        except Exception as exc:  # a broken redactor records nothing rather than leak or break the span
            log.warning("redact(%r, ...) raised %s; nothing recorded", kind, type(exc).__name__)
            return None
        if text is None:
            return None
        return text if isinstance(text, str) else str(text)

    # -- events -------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if type(event) is NodeRetrying:
            state = self._runs.get(event.invocation_id)
            span = state.open.get(event.path) if state is not None else None
            if span is not None:
                se = sp.retry_event(event)
                span.add_event(se.name, se.attributes, timestamp=se.time_ns)
        elif type(event) is RunFinished:
            state = self._runs.get(event.invocation_id)
            if state is not None:
                state.error_code = event.error_code
                state.error_path = event.error_path


def _apply(span: Span, end: sp.SpanEnd, stacktrace: str | None = None) -> None:
    """Put a :class:`~flowscope.observability.spans.SpanEnd` on a live span (``stacktrace``,
    when given, goes on its ``exception`` event)."""
    span.set_attributes(end.attributes)
    for se in end.events:
        attrs = se.attributes
        if stacktrace is not None and se.name == sp.EXCEPTION_EVENT:
            attrs = {**attrs, sp.EXCEPTION_STACKTRACE: stacktrace}
        span.add_event(se.name, attrs, timestamp=se.time_ns)
    if end.error is not None:
        span.set_status(Status(StatusCode.ERROR, end.error))
