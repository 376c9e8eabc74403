"""A span record as an OpenTelemetry SDK ``ReadableSpan``: the one conversion, live and export.

:func:`readable_span` is what :class:`~flowscope.observability.shipping.Shipper` hands to
a provider's span processors and what ``flowscope export`` encodes. The live plugin calls
it once per span on the event loop. (Making the fields later, in the exporter's thread,
was tried: with the GIL the exporter's Python work does not overlap the loop's, and the
deferral cost more in all than it moved.)

Two shortcuts keep the conversion cheap, each checked against the installed SDK when this
module is imported and left unused if the SDK does not match (its constructors are used
then, at their cost): a ``SpanContext`` of ids known to be valid is built as the tuple the
SDK's constructor builds, without validating them again; a span is a ``ReadableSpan``
subclass whose fields, the ones ``ReadableSpan.__init__`` sets, are slots set positionally
(0.25 us instead of 1.3, and one object instead of two for the garbage collector to walk
while thousands of spans wait in a batch processor's queue). Spans of one parent share its
context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from . import spans as sp

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from .log_spans import SpanRecord

__all__ = ["readable_span", "span_context", "SAMPLED", "EMPTY_STATE"]

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
EMPTY_STATE = TraceState()
_UNSET = Status(StatusCode.UNSET)
_INTERNAL = SpanKind.INTERNAL
_MAX_TRACE_ID = (1 << 128) - 1
_MAX_SPAN_ID = (1 << 64) - 1
_new_tuple = tuple.__new__


def _tuple_contexts_match() -> bool:
    """Is a ``SpanContext`` the 6-tuple (trace id, span id, remote, flags, state, valid)?"""
    try:
        made = SpanContext(3, 5, False, SAMPLED, EMPTY_STATE)
        fast = _new_tuple(SpanContext, (3, 5, False, SAMPLED, EMPTY_STATE, True))
        return (
            tuple(made) == tuple(fast)
            and (fast.trace_id, fast.span_id, fast.is_remote, fast.is_valid) == (3, 5, False, True)
            and fast.trace_flags is SAMPLED
            and fast.trace_state is EMPTY_STATE
        )
    except Exception:  # pragma: no cover - another SDK's SpanContext: use its constructor
        return False


_FAST_CONTEXT = _tuple_contexts_match()


def span_context(
    trace_id: int, span_id: int, flags: TraceFlags = SAMPLED, state: TraceState = EMPTY_STATE
) -> SpanContext:
    """``SpanContext(trace_id, span_id, False, flags, state)``, built without the
    constructor's checks when the ids are valid (nonzero, in range: derived ids are)."""
    if _FAST_CONTEXT and 0 < trace_id <= _MAX_TRACE_ID and 0 < span_id <= _MAX_SPAN_ID:
        return _new_tuple(SpanContext, (trace_id, span_id, False, flags, state, True))
    return SpanContext(trace_id, span_id, False, flags, state)


_FIELDS = (
    "_name",
    "_context",
    "_kind",
    "_instrumentation_info",
    "_instrumentation_scope",
    "_parent",
    "_start_time",
    "_end_time",
    "_attributes",
    "_events",
    "_links",
    "_resource",
    "_status",
)


class _Span(ReadableSpan):
    """A ``ReadableSpan`` whose fields (exactly those ``ReadableSpan.__init__`` sets, which
    :func:`_fields_match` checks) are slots, set positionally: no instance dict, one object
    for the collector to track while the span waits in a batch processor's queue."""

    __slots__ = _FIELDS

    def __init__(
        self,
        name: str,
        context: SpanContext,
        scope: InstrumentationScope,
        parent: SpanContext | None,
        start_time: int,
        end_time: int,
        attributes: Any,
        events: Any,
        links: Any,
        resource: Resource,
        status: Status,
    ) -> None:  # no super().__init__: the same fields, set here
        self._name = name
        self._context = context
        self._kind = _INTERNAL
        self._instrumentation_info = None
        self._instrumentation_scope = scope
        self._parent = parent
        self._start_time = start_time
        self._end_time = end_time
        self._attributes = attributes
        self._events = events
        self._links = links
        self._resource = resource
        self._status = status


#: Parent contexts by (trace id, span id): the spans of one parent share one (a chain's
#: nodes, a fan-out's branches). Small (each entry is an object the collector keeps
#: walking); a miss only makes another equal context.
_PARENTS: dict[tuple[int, int], SpanContext] = {}


def _parent(trace_id: int, span_id: int, state: TraceState) -> SpanContext:
    key = (trace_id, span_id)
    found = _PARENTS.get(key)
    if found is not None and found.trace_state is state:
        return found
    if len(_PARENTS) >= 64:
        _PARENTS.clear()
    made = _PARENTS[key] = span_context(trace_id, span_id, SAMPLED, state)
    return made


def _made(
    r: SpanRecord,
    context: SpanContext,
    resource: Resource,
    scope: InstrumentationScope,
    extra: Mapping[str, Any] | None,
    stacktrace: str | None,
    cls: Any,
) -> ReadableSpan:
    """The span of ``r`` made by ``cls``: :class:`_Span`, or ``ReadableSpan`` itself."""
    attributes = r.attributes  # the record's own dict: nothing changes it once the walk emitted it
    if extra:
        attributes = {**attributes, **extra}
    events: Any = ()  # what the SDK's span reads as tuple(events): no list for a span without any
    if r.events:
        events = []
        for e in r.events:
            attrs = dict(e.attributes)
            if stacktrace is not None and e.name == sp.EXCEPTION_EVENT:
                attrs[sp.EXCEPTION_STACKTRACE] = stacktrace
            events.append(SpanEvent(e.name, attrs, e.time_ns))
    parent = _parent(r.trace_id, r.parent_id, context.trace_state) if r.parent_id else None
    links = [Link(span_context(t, s)) for t, s in r.links] if r.links else ()
    status = _UNSET if r.error is None else Status(StatusCode.ERROR, r.error)
    start, end = round(r.start * 1e9), round(r.end * 1e9)  # round() of a float is an int
    if cls is _Span:
        return _Span(r.name, context, scope, parent, start, end, attributes, events, links, resource, status)
    return ReadableSpan(
        name=r.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=_INTERNAL,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


def _fields_match() -> bool:
    """Does ``ReadableSpan.__init__`` store each argument, as it is, in exactly
    :class:`_Span`'s slots (the field of each argument as :class:`_Span` sets it)?"""
    args = {
        "name": "_name",
        "context": "_context",
        "parent": "_parent",
        "resource": "_resource",
        "attributes": "_attributes",
        "events": "_events",
        "links": "_links",
        "kind": "_kind",
        "instrumentation_info": "_instrumentation_info",
        "status": "_status",
        "start_time": "_start_time",
        "end_time": "_end_time",
        "instrumentation_scope": "_instrumentation_scope",
    }
    try:
        given: dict[str, Any] = {arg: object() for arg in args}
        made = vars(ReadableSpan(**given))
        return set(made) == set(_FIELDS) and all(made[field] is given[arg] for arg, field in args.items())
    except Exception:  # pragma: no cover - another SDK's ReadableSpan: use its constructor
        return False


_FAST_FIELDS = _fields_match()


def readable_span(
    r: SpanRecord,
    resource: Resource,
    scope: InstrumentationScope,
    extra: Mapping[str, Any] | None = None,
    stacktrace: str | None = None,
) -> ReadableSpan:
    """The SDK span of a record. ``extra`` adds attributes the log does not hold (redacted
    input/output); ``stacktrace`` goes on the ``exception`` span event."""
    state = _trace_state(r.trace_state) if r.trace_state else EMPTY_STATE
    context = span_context(r.trace_id, r.span_id, SAMPLED, state)
    return _made(r, context, resource, scope, extra, stacktrace, _Span if _FAST_FIELDS else ReadableSpan)


def _trace_state(header: str) -> TraceState:
    state = _STATES.get(header)
    if state is None:
        state = TraceState.from_header([header])
        if len(_STATES) < 256:
            _STATES[header] = state
    return state


_STATES: dict[str, TraceState] = {}
