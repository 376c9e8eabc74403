"""OpenTelemetry spans for workflow runs, built from the event log (the catalog: ``docs/telemetry.md``).

:class:`TracingPlugin` does not hold SDK spans open while nodes run. Spans are a view of
the log: the plugin feeds every appended event to the one walk,
:class:`~flowscope.observability.log_spans.SpanWalk` (in batches, at the next turn of the
event loop at the latest: :data:`WALK_BATCH`), and each span the log ends goes to
the ``TracerProvider``'s span processors (so to its exporters: OTLP HTTP/gRPC, console),
with the provider's resource. Ids are derived from the log, so:

- while a node body runs, the current span (``trace.get_current_span()``) is a
  non-recording span with the derived context of that run's span, so a span user code
  starts (an HTTP client's instrumentation) is its child, and ``ctx.trace_context`` /
  ``job.traceparent`` carry that context;
- the span exported at the end has exactly that context, whether this process exports
  it or, after a crash, the next process that opens the session (see
  :mod:`flowscope.observability.shipping`), with this process's resource: ``RunStarted``
  records it (``trace_context["flowscope.resource"]``, without ``process.*``).

Why not the SDK's ``Tracer``: it draws span ids from its ``IdGenerator`` and cannot be
given one, and a span held open across a node body is lost with a killed process. So the
plugin builds ``ReadableSpan`` objects itself (:func:`~.shipping.readable_span`) and calls
the provider's ``_active_span_processor.on_end`` (the processors' ``on_start`` is not
called: the span has ended by the time the log says it existed). The provider's sampler
decides once per invocation, from the derived trace id, and its decision is stored in
``RunStarted.trace_context``: a sampled-out trace emits nothing, live or after a crash.
A provider that is not the SDK's (the API's no-op one) gets the contexts but no spans; with
no sampler to ask, the log records the caller's decision, else sampled (the SDK's default),
so that ``flowscope export --follow`` ships them.

Span tree of one invocation::

    invoke_workflow orders            (the invocation and its top workflow's run: one span)
      invoke_node fetch               (orders@1/fetch@1)
        invoke_node child             (a dynamic child, ctx.run_node)
      invoke_workflow billing         (a nested workflow)
        invoke_node charge

Node input and output never reach a span unless ``redact`` opts in.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TracerProvider, TraceState

from ..errors import Redactor, redacted_traceback
from ..events import NodeCompleted
from ..plugins import Plugin
from . import spans as sp
from .log_spans import (
    PARENT_KEY,
    RESOURCE_KEY,
    SpanRecord,
    SpanWalk,
    span_id_after,
    span_id_head,
    trace_id_for,
    traceparent,
)
from .sdk_spans import span_context
from .shipping import Shipper

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.context import NodeContext, NodeOutcome, RunInfo
    from ..engine.runner import RunResult
    from ..events import Event

__all__ = ["TracingPlugin", "ValueRedactor", "WALK_BATCH"]

log = logging.getLogger("flowscope.observability.tracing")

#: ``redact(kind, value)``: kind is "input" or "output"; return the string to record as
#: ``flowscope.node.input``/``flowscope.node.output``, or None to record nothing.
ValueRedactor = Callable[[str, Any], "str | None"]

_KEY = "tracing"  # our slot in ctx.plugin_state / run.plugin_state
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
#: Appended events are walked in batches: at the next turn of the event loop (so a run
#: that waits ships the spans it has ended), when this many are waiting, before a failed
#: node's ``after_node`` and at the end of the invocation. Walking a batch back to back
#: costs ~13 µs less per node than walking each event as it is appended (bench/RESULTS.md):
#: the walk's and the SDK's code stay warm. The spans and their ids are the same. (Walking
#: on a thread of its own, while the loop waits for the store, was tried: the GIL's
#: hand-overs cost the loop more than the walk, bench/RESULTS.md.)
WALK_BATCH = 256


def _context_var() -> ContextVar[Context] | None:
    """The ``ContextVar`` the OpenTelemetry API keeps the current context in, when it is
    its default runtime context (``OTEL_PYTHON_CONTEXT`` unset), else None: a node's
    context is then set and reset through that variable, as ``attach``/``detach`` do,
    without their two calls each; another runtime context is called through the API."""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime).__name__ == "ContextVarsRuntimeContext" and isinstance(var, ContextVar):
        return var
    return None


_CONTEXT = _context_var()
#: The key the API keeps the current span under (set_span_in_context's), read once.
_SPAN_KEY = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, Context())))


class _NodeSpan(NonRecordingSpan):
    """The current span while a node body runs: the API's non-recording span, its
    ``SpanContext`` made when first asked for (most bodies never ask: the metrics
    plugin's exemplar reads the run's traceparent), its fields in slots (no instance
    dict, and no context object, for the collector to walk while thousands run)."""

    __slots__ = ("_context", "_trace_id", "_span_id", "_flags", "_state")

    def __init__(self, trace_id: int, span_id: int, flags: TraceFlags, state: TraceState) -> None:
        self._context: SpanContext | None = None  # type: ignore[assignment]
        self._trace_id = trace_id
        self._span_id = span_id
        self._flags = flags
        self._state = state

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:
            context = self._context = span_context(self._trace_id, self._span_id, self._flags, self._state)
        return context

    def __repr__(self) -> str:
        return f"NonRecordingSpan({self.get_span_context()!r})"


def _detach(token: Any) -> None:
    """Reset the context a node's body ran in (``otel_context.detach``: never raises)."""
    var = _CONTEXT
    if var is not None:
        try:
            var.reset(token)
            return
        except Exception:  # a token of another context: the API logs it
            pass
    otel_context.detach(token)


class _Run:
    """One invocation: its derived context, the walk its events feed, and what only the
    live process knows about its spans (redacted input/output, stack traces)."""

    __slots__ = (
        "trace_id",
        "span_id",
        "flags",
        "state",
        "state_header",
        "store",
        "redact",
        "walk",
        "out",
        "extra",
        "held",
        "pending",
        "ids",
        "known",
        "tp_head",
        "tp_tail",
    )

    def __init__(
        self,
        ids: Any,
        trace_id: int,
        span_id: int,
        sampled: bool,
        state: TraceState,
        store: Any,
        redact: Redactor,
    ) -> None:
        self.trace_id = trace_id
        self.store = store  # where the watermark is kept (RunInfo.store)
        self.redact = redact  # the runner's, for the messages of a stack trace
        self.span_id = span_id
        self.flags = _SAMPLED if sampled else _UNSAMPLED
        self.state = state
        self.state_header = state.to_header() if state else ""
        self.walk: SpanWalk | None = None  # None: sampled out, or nowhere to send spans
        self.out: list[SpanRecord] = []  # the spans the walk ended, shipped together
        #: span id -> attributes the log does not keep (redacted input and output); made on first use
        self.extra: dict[int, dict[str, Any]] | None = None
        #: failed spans waiting for after_node to add their stack trace (record_stacktrace)
        self.held: dict[int, SpanRecord] | None = None
        #: appended events not walked yet (see WALK_BATCH)
        self.pending: list[Event] = []
        #: the span id of a node run, from (path, attempt): span_id_after(ids, path, attempt)
        self.ids = ids
        #: ids derived when a node body began, for the walk to take (SpanWalk.known)
        self.known: dict[tuple[str, str, int], int] = {}
        #: the traceparent of a node run is tp_head + its span id (hex) + tp_tail
        self.tp_head = f"00-{trace_id:032x}-"
        self.tp_tail = "-01" if sampled else "-00"


class TracingPlugin(Plugin):
    """Spans for invocations and node runs, exactly as in the telemetry catalog.

    ``tracer_provider``: the provider to use (default: the global one, resolved at the
    first run). ``record_stacktrace``: add ``exception.stacktrace`` to the ``exception``
    span event of a failed node (off by default: stack traces carry file paths and code;
    the log never holds one, so a span shipped after a crash has none). ``redact``: ``redact(kind,
    value) -> str | None`` with kind ``"input"``/``"output"``; what it returns is recorded
    as ``flowscope.node.input``/``flowscope.node.output`` on the live span (the log does
    not keep it, so a span shipped after a crash has none). Without it no node input or
    output ever goes into a span.
    """

    name = "tracing"

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        record_stacktrace: bool = False,
        redact: ValueRedactor | None = None,
    ) -> None:
        self._provider = tracer_provider
        self._shipper: Shipper | None = None
        self.record_stacktrace = record_stacktrace
        self.redact = redact
        self._runs: dict[str, _Run] = {}  # invocation id -> its run
        #: this loop turn's runs with appended events not walked yet (WALK_BATCH), and the
        #: loop (weakly: a loop closed before its callback ran is not kept); a turn of another
        #: loop (another thread) schedules its own callback
        self._turn: tuple[weakref.ref[asyncio.AbstractEventLoop], list[_Run]] | None = None

    @property
    def shipper(self) -> Shipper:
        """Where this plugin's spans go (the provider's processors), made on first use."""
        if self._shipper is None:
            self._shipper = self._new_shipper()
        return self._shipper

    def _new_shipper(self) -> Shipper:
        return Shipper(self._provider if self._provider is not None else trace.get_tracer_provider())

    @property
    def ships_spans(self) -> bool:
        """Whether this plugin's spans go out through an SDK provider whose exporter records
        what it shipped (a :class:`~flowscope.observability.shipping.WatermarkExporter`).
        A runner with such a plugin says so in its owner record, and span followers leave
        its live sessions to it rather than send their spans twice."""
        # not the lazily made one: the global provider may still be set after this
        shipper = self._shipper if self._shipper is not None else self._new_shipper()
        return shipper.enabled and shipper.ledger is not None

    # -- invocations --------------------------------------------------------------------

    def before_run(self, run: RunInfo) -> None:
        shipper = self.shipper
        sid, iid = run.session_id, run.invocation_id
        parent_sc = trace.get_current_span().get_span_context()
        tc = run.trace_context
        parent: int | None = None
        if parent_sc.is_valid:  # started inside a caller's span: join its trace
            trace_id, parent = parent_sc.trace_id, parent_sc.span_id
            tc[PARENT_KEY] = f"{parent:016x}"
        else:
            trace_id = trace_id_for(sid, iid)
        ids = span_id_head(sid, iid)  # span_id_for(sid, iid), its head kept for the node runs'
        span_id = span_id_after(ids, "", 1)
        sampled, state = shipper.sample(
            trace_id, sp.invocation_span_name(run.workflow), otel_context.get_current()
        )
        tc["traceparent"] = traceparent(trace_id, span_id, sampled)
        if state:
            tc["tracestate"] = state.to_header()
        st = self._runs[iid] = _Run(ids, trace_id, span_id, sampled, state, run.store, run.redact)
        if sampled and shipper.enabled:
            if (
                shipper.resource_record
            ):  # whoever ships these spans after a crash gives them this process's resource
                tc[RESOURCE_KEY] = shipper.resource_record
            # What RunStarted records, as the walk would read it back from the record: it
            # takes these instead of parsing the traceparent and deriving the ids again.
            st.known[(iid, "", 1)] = span_id
            begun: dict[str, tuple[int, int | None, bool, str]] = {
                iid: (trace_id, parent, sampled, st.state_header)
            }
            # emits into st.out (a bound list method: the walk holds no cycle back to st)
            st.walk = SpanWalk(st.out.append, sid, st.known, begun)
            if run.resumed:  # ship what the process before this one did not, and link to it
                st.walk.previous = shipper.catch_up(run.store, sid, run.previous_trace_context)

    def after_run(self, run: RunInfo, result: RunResult | None, error: BaseException | None) -> None:
        st = self._runs.pop(run.invocation_id, None)
        if st is None or st.walk is None:
            return
        self._walk(st)  # shipped below with what the close ends: one hand-over
        # Without RunFinished in the log (the store failed, the lease was lost) what the
        # log holds of this invocation ends here, incomplete, as an export would show it.
        st.walk.close(run.invocation_id)
        if st.held:
            st.out.extend(st.held.values())
            st.held.clear()
        self._ship((st,), hold=False)
        st.walk = None

    # -- node runs ----------------------------------------------------------------------

    def before_node(self, ctx: NodeContext) -> None:
        st = self._runs.get(ctx.invocation_id)
        if st is None:
            return
        if ctx.parent is None:  # the top workflow's run is the invocation's span
            span_id = st.span_id
        else:
            span_id = span_id_after(st.ids, ctx.path, ctx.attempt)
            if st.walk is not None:  # the walk takes it when it starts or ends the run's span
                st.known[(ctx.invocation_id, ctx.path, ctx.attempt)] = span_id
        span = _NodeSpan(st.trace_id, span_id, st.flags, st.state)
        # Current in this task until after_node: spans the body starts are children of this run's.
        var = _CONTEXT
        if var is not None:  # set_span_in_context + attach, without their calls
            token: Any = var.set(Context({**var.get(), _SPAN_KEY: span}))
        else:
            token = otel_context.attach(trace.set_span_in_context(span))
        # the span id too when after_node adds what only this process knows to its span
        keep = self.redact is not None or self.record_stacktrace
        ctx.plugin_state[_KEY] = (token, span_id) if keep else token
        tc = ctx.trace_context
        tc["traceparent"] = f"{st.tp_head}{span_id:016x}{st.tp_tail}"  # traceparent(), prefix made once
        if st.state_header:
            tc["tracestate"] = st.state_header
        if self.redact is not None and st.walk is not None:
            text = self._redacted("input", ctx.input)
            if text is not None:
                self._extra(st, span_id)[sp.NODE_INPUT] = text

    def after_node(self, ctx: NodeContext, outcome: NodeOutcome) -> None:
        mine = ctx.plugin_state.pop(_KEY, None)
        if mine is None:
            return
        if type(mine) is not tuple:  # nothing only the live process knows: the span is the log's
            _detach(mine)
            return
        token, span_id = mine
        _detach(token)
        st = self._runs.get(ctx.invocation_id)
        if st is None or st.walk is None:
            return
        if self.redact is not None and isinstance(outcome.event, NodeCompleted):
            text = self._redacted("output", outcome.event.output)
            if text is not None:  # the completion is appended after this hook: in time for its span
                self._extra(st, span_id)[sp.NODE_OUTPUT] = text
        if outcome.error is not None and self.record_stacktrace:
            self._walk_pending(st)  # the failure's span, to hold for its stack trace
        held = st.held.pop(span_id, None) if st.held else None
        if held is not None:
            stack = redacted_traceback(outcome.error, st.redact) if outcome.error is not None else None
            extra = st.extra.pop(span_id, None) if st.extra else None
            self.shipper.ship([held], st.store, {span_id: (extra, stack)})

    @staticmethod
    def _extra(st: _Run, span_id: int) -> dict[str, Any]:
        if st.extra is None:
            st.extra = {}
        return st.extra.setdefault(span_id, {})

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

    # -- events: the spans ---------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        self.on_events((event,))

    def on_events(self, events: Sequence[Event]) -> None:
        """The events of one append (one invocation's): queued for the next walk."""
        if not events:
            return
        iid = events[0].invocation_id
        if events[-1].invocation_id != iid:  # not one invocation's append: take them one by one
            for e in events:
                self.on_events((e,))
            return
        st = self._runs.get(iid)
        if st is None or st.walk is None:
            return
        pending = st.pending
        first = not pending
        pending.extend(events)
        if len(pending) >= WALK_BATCH:
            self._walk_pending(st)
        elif first:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop in this thread: walk it now
                self._walk_pending(st)
                return
            turn = self._turn
            if turn is not None and turn[0]() is loop:
                turn[1].append(st)
            else:  # one callback per loop turn for all the runs with events waiting
                waiting = [st]
                self._turn = (weakref.ref(loop), waiting)  # weak: a closed loop is not kept
                loop.call_soon(self._walk_waiting, waiting)

    def _walk_waiting(self, waiting: list[_Run]) -> None:
        """Walk every run with events waiting, then ship the spans they ended together (one
        hand-over for the loop turn: one ledger registration, not one per session)."""
        # Called by the loop, not through the plugin hooks: a failure to ship is logged here,
        # as the hooks would, and never reaches the loop or the run.
        turn = self._turn
        if turn is not None and turn[1] is waiting:
            self._turn = None
        ready: list[_Run] = []
        # a run is listed again when it walked a full batch (WALK_BATCH) meanwhile: once each
        for st in dict.fromkeys(waiting):
            try:
                self._walk(st)
            except Exception as exc:
                log.warning("tracing: shipping spans raised %s: %s", type(exc).__name__, exc)
            if st.out:
                ready.append(st)
        if not ready:
            return
        by_store: dict[int, list[_Run]] = {}  # the common case: one runner's store, one hand-over
        for st in ready:
            by_store.setdefault(id(st.store), []).append(st)
        try:
            for runs in by_store.values():
                self._ship(runs)
        except Exception as exc:
            log.warning("tracing: shipping spans raised %s: %s", type(exc).__name__, exc)

    def _walk_pending(self, st: _Run) -> None:
        """Walk the events appended since the last walk, and ship the spans they ended."""
        self._walk(st)
        if st.out:
            self._ship((st,))

    def _walk(self, st: _Run) -> None:
        """Walk the events appended since the last walk (the spans they end go to st.out)."""
        pending = st.pending
        if not pending or st.walk is None:
            return
        st.pending = []
        apply = st.walk.apply
        failed: Exception | None = None
        for e in pending:
            try:
                apply(e)
            except Exception as exc:  # one bad event costs its own span, not the rest of the batch's
                failed = failed or exc
        if failed is not None:
            log.warning("tracing: building spans from the log raised %s: %s", type(failed).__name__, failed)

    def _ship(self, runs: Sequence[_Run], hold: bool = True) -> None:
        """Ship what the walks of ``runs`` (on one store) ended, in one hand-over; their
        ``out`` lists (which the walks append to) are emptied, not replaced."""
        records: list[SpanRecord] = []
        extras: dict[int, Any] | None = None
        try:
            for st in runs:
                if st.extra or (hold and self.record_stacktrace):
                    out, extra = self._outgoing(st, hold)
                    if extra:
                        extras = {**extras, **extra} if extras else extra
                else:  # what _outgoing returns then, without its call
                    out = st.out
                records += out
            self.shipper.ship(records, runs[0].store, extras)
        finally:
            for st in runs:
                st.out.clear()

    def _outgoing(self, st: _Run, hold: bool) -> tuple[list[SpanRecord], dict[int, Any] | None]:
        """What of st.out goes out now (a failed run's span waits for its stack trace in
        after_node), and the attributes only the live process knows of it."""
        out = st.out
        if hold and self.record_stacktrace:
            out = [r for r in out if not self._hold(st, r)]
        extras = None
        if st.extra:
            extra = st.extra
            extras = {r.span_id: (extra.pop(r.span_id), None) for r in out if r.span_id in extra}
        return out, extras

    @staticmethod
    def _hold(st: _Run, record: SpanRecord) -> bool:
        """Keep a failed run's span for its stack trace, known in after_node."""
        if (
            record.error is not None
            and record.events
            and record.span_id != st.span_id
            and record.events[-1].name == sp.EXCEPTION_EVENT
        ):
            if st.held is None:
                st.held = {}
            st.held[record.span_id] = record
            return True
        return False

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the provider's processors."""
        return self.shipper.force_flush(timeout_millis)
