"""Spans rebuilt from a session's event log, with ids derived from the log.

The log records every invocation and every node run with timestamps, so the spans the
live :class:`~flowscope.observability.TracingPlugin` produces can be rebuilt after the
fact. :func:`rebuild` walks the log and hands each run to the mapping in
:mod:`flowscope.observability.spans` (the one the live plugin uses); what it adds is what
only the log knows: parentage by path under the invocation span, times from event
timestamps, the link from a resumed invocation to the one before it, and runs whose
process died (``flowscope.export.incomplete``).

Ids are deterministic, derived with SHA-256 from the session id, the invocation id and
the path, so rebuilding a session twice gives identical spans. Each invocation is one
trace, as live.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from opentelemetry.util.types import AttributeValue

from ..events import (
    TERMINAL_TYPES,
    Event,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from ..fold import WorkflowState
from . import spans as sp

__all__ = ["SpanRecord", "rebuild", "trace_id_for", "span_id_for"]


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One rebuilt span: what an exporter needs, in plain values (times in epoch seconds).

    ``error`` is the description of an ERROR status (None: UNSET); ``links`` are
    ``(trace_id, span_id)`` pairs.
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


# --------------------------------------------------------------------------- ids


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x00".join(parts).encode()).digest()


def trace_id_for(session_id: str, invocation_id: str) -> int:
    """The trace id of one invocation: 128 bits of SHA-256 over the session and invocation ids."""
    return int.from_bytes(_digest("flowscope-trace", session_id, invocation_id)[:16], "big") or 1


def span_id_for(session_id: str, invocation_id: str, path: str = "", occurrence: int = 1) -> int:
    """The span id of an invocation (``path=""``) or of the ``occurrence``-th run of ``path``
    in it (a nested workflow's retry runs a failed child again in the same invocation)."""
    return int.from_bytes(_digest("flowscope-span", session_id, invocation_id, path, str(occurrence))[:8], "big") or 1


# --------------------------------------------------------------------------- the walk


@dataclass
class _Open:
    """A span being built: its start, and what the walk learns before it ends."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start: float
    attributes: sp.Attributes
    events: list[sp.SpanEventRecord] = field(default_factory=list)
    links: tuple[tuple[int, int], ...] = ()
    terminal: Event | None = None  # the last terminal event of the run in this invocation
    attempt: int = 1  # the run's attempt number when its terminal event was appended
    recovered: bool = False
    record: SpanRecord | None = None  # set when the span ends

    def close(self, end: sp.SpanEnd, at: float) -> None:
        self.record = SpanRecord(
            name=self.name,
            trace_id=self.trace_id,
            span_id=self.span_id,
            parent_id=self.parent_id,
            start=self.start,
            end=at,
            attributes={**self.attributes, **end.attributes},
            error=end.error,
            events=(*self.events, *end.events),
            links=self.links,
        )


@dataclass
class _Invocation:
    span: _Open
    open: dict[str, _Open] = field(default_factory=dict)  # path -> its current run's span
    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # origin path -> (type, message)
    last_ts: float = 0.0
    finished: bool = False


class _Walk:
    """The state of one pass over a session's log."""

    def __init__(self) -> None:
        self.ws = WorkflowState()  # the fold: attempts come from the one interpretation of events
        self.session = ""
        self.invocations: dict[str, _Invocation] = {}
        self.previous: tuple[int, int] | None = None  # (trace id, span id) of the last invocation
        self.order: list[_Open] = []  # every span, in start order

    def apply(self, e: Event) -> None:
        self.ws.apply(e)
        self.session = self.session or e.session_id
        inv = self.invocations.get(e.invocation_id)
        if inv is not None:
            inv.last_ts = max(inv.last_ts, e.ts)
        if isinstance(e, RunStarted):
            self._start_invocation(e)
        elif inv is None or (not e.path and not isinstance(e, RunFinished)):
            return  # outside any invocation we saw begin, or not about a run: nothing to hang it on
        elif isinstance(e, RunFinished):
            inv.finished = True
            self._close_invocation(inv, e)
        elif isinstance(e, NodeStarted):
            self._start_node(inv, e)
        else:
            span = inv.open.get(e.path)
            if span is None:
                return
            if isinstance(e, NodeRetrying):
                span.events.append(sp.retry_event(e))
            elif e.type in TERMINAL_TYPES:
                # The last terminal event of the run in this invocation wins: a JobDispatched
                # whose dispatch failed is followed by its result and an InputRequested.
                span.terminal = e
                count = e.attempt_count if isinstance(e, (NodeCompleted, NodeErrorEvent, NodeErrorPropagated)) else None
                ns = self.ws.nodes.get(e.path)
                span.attempt = count or (ns.attempt if ns is not None else 1)
                if isinstance(e, NodeErrorEvent):
                    inv.errors[e.path] = (e.error_type, e.error_message)

    def _start_invocation(self, e: RunStarted) -> None:
        trace_id = trace_id_for(self.session, e.invocation_id)
        span = _Open(
            name=sp.invocation_span_name(e.workflow),
            trace_id=trace_id,
            span_id=span_id_for(self.session, e.invocation_id),
            parent_id=None,
            start=e.ts,
            attributes=sp.invocation_attributes(e.workflow, self.session, e.invocation_id, e.resumed),
            links=(self.previous,) if e.resumed and self.previous is not None else (),
        )
        self.invocations[e.invocation_id] = _Invocation(span, last_ts=e.ts)
        self.order.append(span)
        self.previous = (trace_id, span.span_id)

    def _start_node(self, inv: _Invocation, e: NodeStarted) -> None:
        path = e.path
        old = inv.open.pop(path, None)
        if old is not None:  # the same path again in this invocation (a nested workflow's retry)
            self._finish_node(inv, old)
        k = inv.counts[path] = inv.counts.get(path, 0) + 1
        parent = inv.open.get(e.parent_path) if e.parent_path else None
        span = _Open(
            name=sp.node_span_name(e.kind, e.node),
            trace_id=inv.span.trace_id,
            span_id=span_id_for(self.session, e.invocation_id, path, k),
            parent_id=(parent or inv.span).span_id,
            start=e.ts,
            attributes=sp.node_attributes(e.node, path, e.kind),
            recovered=bool(e.recovered),
        )
        inv.open[path] = span
        self.order.append(span)

    def _finish_node(self, inv: _Invocation, span: _Open) -> None:
        ev = span.terminal
        if ev is None:  # no terminal event at all
            span.close(sp.unfinished_node_end(inv.finished), inv.last_ts)
            return
        origin = None
        if isinstance(ev, NodeErrorPropagated):
            found = inv.errors.get(ev.origin_path)
            origin = found[1] if found else None
        end = sp.node_end(ev, span.attempt, span.recovered, origin)
        span.close(end, ev.ts)

    def _close_invocation(self, inv: _Invocation, finished: RunFinished | None) -> None:
        for span in list(inv.open.values()):
            self._finish_node(inv, span)
        inv.open.clear()
        if finished is None:  # the process died before the invocation ended
            inv.span.close(sp.unfinished_invocation_end(), inv.last_ts)
            return
        error = None
        if finished.status == "failed":
            path = finished.error_path
            origin = inv.errors.get(path) if path else None
            if origin is None and path and path in self.ws.nodes:
                ns = self.ws.nodes[path]
                origin = (ns.error_type or "", ns.error_message or "")
            code = finished.error_code
            error_type, message = origin if origin else (code or "Exception", code or "")
            error = sp.RunError(error_type, code or sp.UNKNOWN_ERROR_CODE, message, path)
        inv.span.close(sp.invocation_end(finished.status, error), finished.ts)

    def records(self) -> list[SpanRecord]:
        for inv in self.invocations.values():
            if not inv.finished:
                self._close_invocation(inv, None)
        return [span.record for span in self.order if span.record is not None]  # every one has ended


def rebuild(events: Iterable[Event]) -> list[SpanRecord]:
    """The spans of a session's log, in start order."""
    walk = _Walk()
    for e in events:
        walk.apply(e)
    return walk.records()
