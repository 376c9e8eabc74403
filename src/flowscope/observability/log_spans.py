"""Spans from a session's event log, with ids derived from the log: live and after the fact.

This is the one walk from events to spans. :class:`SpanWalk` takes events in log order
and hands each span to a callback the moment the log says it ended; the live
:class:`~flowscope.observability.TracingPlugin` feeds it the events as they are appended,
and :func:`spans_of_log` feeds it a whole log (``flowscope export``, and the catch-up that
ships what a killed process did not). What goes on a span (names, attributes, status,
span events) comes from :mod:`flowscope.observability.spans`; what the walk adds is what
only the log knows: parentage by path, times from event timestamps, the link from a
resumed invocation to the one before it, and runs whose process died
(``flowscope.export.incomplete``).

Ids are deterministic (:func:`trace_id_for`, :func:`span_id_for`): SHA-256 over the
session id, the invocation id, the path and the run's attempt number (unique per run of a
path in one invocation, since attempt numbers never go back). So the span context a node
body sees live is the context of the span that is exported, by this process or, after a
crash, by the next one. An invocation started inside a caller's span records that trace
and parent in ``RunStarted.trace_context``, and the walk uses them.

The top workflow's run and its invocation are one span (``invoke_workflow W``, carrying
both sets of attributes, docs/telemetry.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from opentelemetry.util.types import AttributeValue

from ..events import (
    TERMINAL_TYPES,
    Event,
    JobResultReceived,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from . import spans as sp
from .traceparent import format_traceparent, parse_traceparent

__all__ = [
    "SpanRecord",
    "SpanWalk",
    "spans_of_log",
    "trace_id_for",
    "span_id_for",
    "span_id_head",
    "span_id_after",
    "invocation_context",
    "traceparent",
    "PARENT_KEY",
    "RESOURCE_KEY",
    "ResourceKey",
    "resource_of",
]

#: The key of ``RunStarted.trace_context`` that holds the span id (hex) of the caller's
#: span an invocation was started in; ``traceparent`` holds the invocation's own context.
PARENT_KEY = "flowscope.parent_span_id"
#: The key of ``RunStarted.trace_context`` that holds the resource attributes (a JSON
#: object) of the process that ran the invocation, so that its spans keep that resource
#: (``service.name`` and the rest) when another process ships them after it died.
RESOURCE_KEY = "flowscope.resource"

#: Resource attributes as a hashable, ordered value: ``((key, value), ...)``.
ResourceKey = tuple[tuple[str, AttributeValue], ...]


class SpanRecord(NamedTuple):
    """One span: what an exporter needs, in plain values (times in epoch seconds).

    ``error`` describes an ERROR status (None: UNSET); ``links`` are ``(trace_id, span_id)``
    pairs. ``end_seq`` is the ``seq`` of the event that ended the span, or the one after its
    invocation's last (:meth:`SpanWalk._abandon`); ``sampled`` and ``trace_state`` are the
    trace's sampling decision. Immutable, and a tuple: the live plugin makes one per span
    on the event loop, where a frozen dataclass's ``__init__`` costs four times as much.
    """

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start: float
    end: float
    attributes: Mapping[str, AttributeValue]
    error: str | None = None
    events: tuple[sp.SpanEventRecord, ...] = ()
    links: tuple[tuple[int, int], ...] = ()
    end_seq: int = 0
    sampled: bool = True
    trace_state: str = ""
    session_id: str = ""
    #: the resource of the process that ran the invocation, as its ``RunStarted`` recorded
    #: it (None: not recorded; the shipping process's own, or export's ``service.name``)
    resource: ResourceKey | None = None


# --------------------------------------------------------------------------- ids


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x00".join(parts).encode()).digest()


# Cached for what is asked twice close together: an invocation's ids (its plugin's
# before_run, then its walk's RunStarted). Export asks once per span, the live plugin
# derives node runs' ids itself (span_id_head): a bigger cache only keeps more objects
# for the garbage collector to walk.
@lru_cache(maxsize=256)
def trace_id_for(session_id: str, invocation_id: str) -> int:
    """The trace id of one invocation: 128 bits of SHA-256 over the session and invocation ids."""
    return int.from_bytes(_digest("flowscope-trace", session_id, invocation_id)[:16], "big") or 1


@lru_cache(maxsize=256)
def span_id_for(session_id: str, invocation_id: str, path: str = "", attempt: int = 1) -> int:
    """The span id of an invocation (``path=""``, which is also its top workflow's run) or of
    the run of ``path`` that started at ``attempt`` in it: 64 bits of SHA-256 over the
    session and invocation ids, the path and the attempt (:func:`span_id_after`)."""
    return span_id_after(span_id_head(session_id, invocation_id), path, attempt)


def span_id_head(session_id: str, invocation_id: str) -> Any:
    """The invocation's part of its runs' span ids, hashed once: :func:`span_id_after`
    gives ``span_id_for(session_id, invocation_id, path, attempt)`` from it (the live
    plugin derives one per node run, uncached)."""
    return hashlib.sha256(f"flowscope-span\x00{session_id}\x00{invocation_id}\x00".encode())


def span_id_after(head: Any, path: str, attempt: int) -> int:
    """:func:`span_id_for` of the run of ``path`` that started at ``attempt``, from its
    invocation's :func:`span_id_head`."""
    h = head.copy()
    h.update(f"{path}\x00{attempt}".encode())
    return int.from_bytes(h.digest()[:8], "big") or 1


#: The W3C ``traceparent`` header of a span context (one writer: ``traceparent.py``).
traceparent = format_traceparent


def invocation_context(
    session_id: str, invocation_id: str, trace_context: Mapping[str, str]
) -> tuple[int, int | None, bool, str]:
    """``(trace id, parent span id, sampled, tracestate)`` of an invocation from what its
    ``RunStarted.trace_context`` recorded; derived ids and "sampled" when it recorded nothing."""
    trace_id = trace_id_for(session_id, invocation_id)
    parent: int | None = None
    sampled = True
    recorded = parse_traceparent(trace_context.get("traceparent"))
    if recorded is not None:
        trace_id, sampled = recorded.trace_id, recorded.sampled
    raw = trace_context.get(PARENT_KEY)
    if raw:
        try:
            parent = int(raw, 16) or None
        except ValueError:
            parent = None
    return trace_id, parent, sampled, trace_context.get("tracestate", "")


def _attribute_value(v: object) -> bool:
    if isinstance(v, (str, bool, int, float)):
        return True
    return isinstance(v, list) and all(isinstance(x, (str, bool, int, float)) for x in v)


@lru_cache(maxsize=256)
def resource_of(raw: str) -> ResourceKey | None:
    """The resource attributes recorded under :data:`RESOURCE_KEY` (a JSON object), or None
    when there are none or they cannot be read."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    out = tuple(
        sorted(
            (k, tuple(v) if isinstance(v, list) else v)
            for k, v in data.items()
            if isinstance(k, str) and _attribute_value(v)
        )
    )
    return out or None


# --------------------------------------------------------------------------- the walk


class _Open:
    """A span being built: its start, and what the walk learns before it ends."""

    __slots__ = (
        "name",
        "trace_id",
        "span_id",
        "parent_id",
        "start",
        "attributes",
        "order",
        "events",
        "links",
        "terminal",
        "attempt",
        "recovered",
        "key",
    )

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_id: int | None,
        start: float,
        attributes: sp.Attributes,
        order: int,
        attempt: int = 1,
        recovered: bool = False,
        links: tuple[tuple[int, int], ...] = (),
        key: tuple[str, str, int] | None = None,
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        #: 0 until derived (:meth:`SpanWalk._span_id`): a live run's id is the one the
        #: plugin derived when its body began, which may come after its NodeStarted is walked
        self.span_id = span_id
        self.parent_id = parent_id
        self.start = start
        self.attributes = attributes  # this span's own dict: completed in place at its end
        self.order = order
        self.events: list[sp.SpanEventRecord] | None = None  # made on the first span event
        self.links = links
        self.terminal: Event | None = None  # the last terminal event of the run in this invocation
        self.attempt = attempt  # the run's current attempt (NodeStarted's, + 1 per NodeRetrying)
        self.recovered = recovered
        self.key = key  # (invocation id, path, the attempt it started at): what its id derives from

    def add_event(self, event: sp.SpanEventRecord) -> None:
        if self.events is None:
            self.events = [event]
        else:
            self.events.append(event)


@dataclass(slots=True)
class _Invocation:
    id: str
    span: _Open
    sampled: bool
    trace_state: str
    open: dict[str, _Open] = field(default_factory=dict)  # path -> its current run's span
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # origin path -> (type, message)
    root: str = ""  # the path of the top workflow's run (its span is the invocation's)
    root_start: sp.Attributes | None = None
    root_end: sp.SpanEnd | None = None
    last_ts: float = 0.0
    last_seq: int = 0
    resource: ResourceKey | None = None
    #: job results appended before the run they answer started (a resume appends them
    #: first): path -> their span events, for the span of that path's next run
    jobs: dict[str, list[JobResultReceived]] = field(default_factory=dict)


Emit = Callable[[SpanRecord], None]
_new_record = tuple.__new__


class SpanWalk:
    """Events in, spans out: ``apply(event)`` for each event of one session in log order;
    ``emit(record)`` is called for each span as soon as the log ends it. :meth:`close_all`
    ends what is still open as incomplete (its process died, or the log stops here).

    ``known``: span ids a live caller derived already, by ``(invocation id, path, attempt)``
    (the tracing plugin, as node bodies begin; path ``""``: the invocation); ``begun``: its
    :func:`invocation_context` by invocation id (what it recorded in ``RunStarted``). The
    walk takes these instead of deriving them again: the same values either way.
    """

    __slots__ = (
        "emit",
        "session",
        "invocations",
        "previous",
        "errors",
        "known",
        "begun",
        "_order",
        "closing",
    )

    def __init__(
        self,
        emit: Emit,
        session_id: str = "",
        known: dict[tuple[str, str, int], int] | None = None,
        begun: dict[str, tuple[int, int | None, bool, str]] | None = None,
    ) -> None:
        self.emit = emit
        self.session = session_id
        self.invocations: dict[str, _Invocation] = {}
        self.previous: tuple[int, int] | None = None  # (trace id, span id) of the last invocation
        self.errors: dict[str, tuple[str, str]] = {}  # path -> its last failure, session-wide
        self.known: dict[tuple[str, str, int], int] = known if known is not None else {}
        self.begun = begun if begun is not None else {}
        self._order = 0
        self.closing = 0

    def apply(self, e: Event) -> None:
        if not self.session:
            self.session = e.session_id
        inv = self.invocations.get(e.invocation_id)
        if inv is not None:
            if e.ts > inv.last_ts:
                inv.last_ts = e.ts
            inv.last_seq = e.seq
        handler = _HANDLERS.get(e.type)  # by the event's type: one lookup, not a chain of isinstance
        if handler is not None:
            handler(self, inv, e)

    # -- the handlers, by event type (_HANDLERS) -------------------------------------------

    def _on_run_started(self, inv: _Invocation | None, e: Any) -> None:
        self._start_invocation(e)

    def _on_run_finished(self, inv: _Invocation | None, e: Any) -> None:
        if inv is not None:
            self._finish_invocation(inv, e)

    def _on_retrying(self, inv: _Invocation | None, e: Any) -> None:
        span = inv.open.get(e.path) if inv is not None and e.path else None
        if span is not None:
            span.add_event(sp.retry_event(e))
            span.attempt = e.attempt + 1

    def _on_job_result(self, inv: _Invocation | None, e: Any) -> None:
        if inv is None or not e.path:
            return
        span = inv.open.get(e.path)
        if span is None or span is inv.span:  # the run it answers starts next
            inv.jobs.setdefault(e.path, []).append(e)
        else:
            span.add_event(sp.job_result_event(e, max(e.ts, span.start)))

    def _on_error(self, inv: _Invocation | None, e: Any) -> None:
        if inv is None:  # outside any invocation we saw begin: nothing to hang it on but its failure
            self.errors[e.path] = (sp.error_type_of(e), e.error_message)
        else:
            self._on_terminal(inv, e)

    def _on_terminal(self, inv: _Invocation | None, e: Any) -> None:
        if inv is None or not e.path:
            return
        path = e.path
        span = inv.open.get(path)
        if span is None:
            return
        span.terminal = e
        kind = e.type
        if kind == "node_error":
            inv.errors[path] = self.errors[path] = (sp.error_type_of(e), e.error_message)
        if path == inv.root:
            inv.root_end = self._node_end(inv, span)
        elif kind != "job_dispatched":
            # A JobDispatched whose dispatch failed is followed by the job's result and
            # an InputRequested in the same run: that span ends with the last of them.
            del inv.open[path]
            self._close(span, self._node_end(inv, span), e.ts, e.seq, inv)

    # -- invocations --------------------------------------------------------------------

    def _start_invocation(self, e: RunStarted) -> None:
        for old in list(
            self.invocations.values()
        ):  # a new invocation began: any still open ended with its process
            self._abandon(old, lost=True)
        iid = e.invocation_id
        begun = self.begun.pop(iid, None) if self.begun else None
        trace_id, parent, sampled, state = begun or invocation_context(self.session, iid, e.trace_context)
        self._order += 1
        span = _Open(
            sp.invocation_span_name(e.workflow),
            trace_id,
            self.known.pop((iid, "", 1), 0) or span_id_for(self.session, iid),
            parent,
            e.ts,
            sp.invocation_attributes(e.workflow, self.session, e.invocation_id, e.resumed),
            self._order,
            links=(self.previous,) if e.resumed and self.previous is not None else (),
        )
        raw = e.trace_context.get(RESOURCE_KEY)
        self.invocations[e.invocation_id] = _Invocation(
            e.invocation_id,
            span,
            sampled,
            state,
            last_ts=e.ts,
            last_seq=e.seq,
            resource=resource_of(raw) if raw else None,
        )
        self.previous = (trace_id, span.span_id)

    def _finish_invocation(self, inv: _Invocation, e: RunFinished) -> None:
        for span in list(inv.open.values()):
            if span is not inv.span:
                self._finish_node(inv, span, e.seq)
        error = None
        if e.status == "failed":
            path = e.error_path
            origin = (inv.errors.get(path) or self.errors.get(path)) if path else None
            code = e.error_code
            error_type, message = origin if origin else (code or "Exception", code or "")
            error = sp.RunError(error_type, code or sp.UNKNOWN_ERROR_CODE, message, path)
        self._close_invocation(inv, sp.invocation_end(e.status, error), e.ts, e.seq)

    def _abandon(self, inv: _Invocation, lost: bool = False, alive_at: float | None = None) -> None:
        """End an invocation that has no ``RunFinished``: its runs and itself are
        incomplete, at the ``seq`` after its last event (none ended them: a watermark over
        what it did end leaves them due). ``lost``: its process died, so they are errors
        (``error.type`` :data:`~.spans.WORKER_LOST`), ended at the last sign of life:
        ``alive_at`` (the store's latest heartbeat of its runs) when later than its last event."""
        at = inv.last_ts if alive_at is None or alive_at < inv.last_ts else alive_at
        seq = inv.last_seq + 1
        for span in list(inv.open.values()):
            if span is not inv.span:
                self._finish_node(inv, span, seq, finished=False, lost=lost, at=at)
        self._close_invocation(inv, sp.unfinished_invocation_end(lost), at, seq, lost)

    def _close_invocation(
        self, inv: _Invocation, end: sp.SpanEnd, at: float, seq: int, lost: bool = False
    ) -> None:
        del self.invocations[inv.id]
        span = inv.span
        if inv.root_start is not None:  # one span for the invocation and its top workflow's run
            root_end = inv.root_end
            if root_end is None:
                root_end = sp.unfinished_node_end(
                    invocation_finished=end.attributes.get(sp.INCOMPLETE) is None, lost=lost
                )
            span.attributes.update(inv.root_start)
            for ev in root_end.events:
                span.add_event(ev)
            end = sp.SpanEnd(
                {**root_end.attributes, **end.attributes},
                end.error if end.error is not None else root_end.error,
                end.events,
            )
        self._close(span, end, at, seq, inv)

    # -- node runs ----------------------------------------------------------------------

    def _start_node(self, inv: _Invocation | None, e: NodeStarted) -> None:
        if inv is None:
            return
        path = e.path
        old = inv.open.pop(path, None)
        if old is not None and old is not inv.span:  # the same path again (a nested workflow's retry)
            self._finish_node(inv, old, e.seq)
        if not e.parent_path and not inv.root:  # the top workflow's run: the invocation's span
            inv.root = path
            inv.root_start = sp.node_attributes(e.node, path, e.kind, self.session)
            inv.open[path] = inv.span
            inv.span.attempt = e.attempt
            inv.span.recovered = bool(e.recovered)
            return
        parent = (inv.open.get(e.parent_path) if e.parent_path else None) or inv.span
        key = (e.invocation_id, path, e.attempt)
        self._order += 1
        span = inv.open[path] = _Open(
            sp.node_span_name(e.kind, e.node),
            inv.span.trace_id,
            self.known.pop(key, 0),
            parent.span_id or self._span_id(parent),
            e.ts,
            sp.node_attributes(e.node, path, e.kind, self.session),
            self._order,
            e.attempt,
            bool(e.recovered),
            key=key,
        )
        if inv.jobs:
            for job in inv.jobs.pop(path, ()):
                span.add_event(sp.job_result_event(job, max(job.ts, span.start)))

    def _span_id(self, span: _Open) -> int:
        """The span's id, derived now if it was not known when it started."""
        if not span.span_id:
            key = span.key
            assert key is not None  # only a node run's span starts without its id
            span.span_id = self.known.pop(key, 0) or span_id_for(self.session, *key)
        return span.span_id

    def _node_end(self, inv: _Invocation, span: _Open) -> sp.SpanEnd:
        ev: Any = span.terminal
        assert ev is not None
        kind = ev.type
        if kind == "node_completed":
            return sp.node_end(ev, ev.attempt_count or span.attempt, span.recovered)
        origin = None
        if kind == "node_error_propagated":
            found = inv.errors.get(ev.origin_path)
            origin = found[1] if found else None
        count = ev.attempt_count if kind == "node_error" or kind == "node_error_propagated" else 0
        return sp.node_end(ev, count or span.attempt, span.recovered, origin)

    def _finish_node(
        self,
        inv: _Invocation,
        span: _Open,
        seq: int,
        finished: bool = True,
        lost: bool = False,
        at: float | None = None,
    ) -> None:
        if span.terminal is None:  # no terminal event: cancelled with its invocation, or its process died
            self._close(
                span, sp.unfinished_node_end(finished, lost), inv.last_ts if at is None else at, seq, inv
            )
        else:
            self._close(span, self._node_end(inv, span), span.terminal.ts, seq, inv)

    def _close(self, span: _Open, end: sp.SpanEnd, at: float, seq: int, inv: _Invocation) -> None:
        self.closing = span.order  # the start order of the span being emitted (spans_of_log sorts by it)
        attributes = span.attributes  # the span's own dict, done with once it is emitted
        attributes.update(end.attributes)
        events: tuple[sp.SpanEventRecord, ...] = ()
        if span.events is not None:
            events = (*span.events, *end.events)
        elif end.events:
            events = end.events
        self.emit(
            _new_record(  # SpanRecord(...), all 15 fields in order, without its __new__'s call
                SpanRecord,
                (
                    span.name,
                    span.trace_id,
                    span.span_id or self._span_id(span),
                    span.parent_id,
                    span.start,
                    at,
                    attributes,
                    end.error,
                    events,
                    span.links,
                    seq,
                    inv.sampled,
                    inv.trace_state,
                    self.session,
                    inv.resource,
                ),
            )
        )

    def close_all(self, lost: bool = False, alive_at: float | None = None) -> None:
        """End every invocation still open as incomplete; ``lost``: their process died (see
        :meth:`_abandon`; ``alive_at`` is its last sign of life in the store)."""
        for inv in list(self.invocations.values()):
            self._abandon(inv, lost, alive_at)

    def close(self, invocation_id: str) -> None:
        """End one invocation still open as incomplete (it stopped recording, in a process
        that lives: the store failed, or the lease was lost)."""
        inv = self.invocations.get(invocation_id)
        if inv is not None:
            self._abandon(inv)


_Handler = Callable[[SpanWalk, "_Invocation | None", Any], Any]
#: What the walk does with each event type (functions, not bound methods: a walk holds no
#: cycle through them). Other types (state, answers, submissions) make no span.
_HANDLERS: dict[str, _Handler] = {
    "run_started": SpanWalk._on_run_started,
    "run_finished": SpanWalk._on_run_finished,
    "node_started": SpanWalk._start_node,
    "node_retrying": SpanWalk._on_retrying,
    "job_result": SpanWalk._on_job_result,
    "node_error": SpanWalk._on_error,
    **{t: SpanWalk._on_terminal for t in TERMINAL_TYPES if t != "node_error"},
}


def spans_of_log(
    events: Iterable[Event], lost: bool = False, alive_at: float | None = None
) -> list[SpanRecord]:
    """The spans of a session's log, in start order; an invocation the log does not end is
    incomplete, and an error (its worker lost) when ``lost`` says its owner is gone, ending at
    ``alive_at`` (its last heartbeat) when that is later than its last event."""
    out: list[tuple[int, SpanRecord]] = []
    walk = SpanWalk(lambda r: out.append((walk.closing, r)))
    for e in events:
        walk.apply(e)
    walk.close_all(lost, alive_at)
    out.sort(key=lambda p: p[0])
    return [r for _, r in out]
