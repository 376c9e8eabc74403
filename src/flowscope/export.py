"""Spans rebuilt from the event log, as OTLP: ``flowscope export SESSION``.

The log records every invocation and every node run with timestamps, so the spans
:class:`~flowscope.observability.TracingPlugin` produces live can be rebuilt after the
fact: for a run that had no tracing, for spans a collector dropped, or for a worker that
was killed before its batch processor flushed (its crashed runs are exported too, marked
``flowscope.export.incomplete``).

The rebuilt spans mirror the live ones: the same names (``invoke_workflow {workflow}``
for an invocation, ``invoke_node {node}`` or ``invoke_workflow {name}`` for a node run),
the same ``gen_ai.*``/``flowscope.*`` attributes, the same parentage (by path, under the
invocation span), ``node.retry`` and ``exception`` span events, status ERROR for a
failure (with the error message) and UNSET for a cancellation or a pause, and a link from
a resumed invocation to the invocation it resumes. Their ids are **deterministic**:
derived with SHA-256 from the session id, the invocation id and the path, so exporting a
session twice gives identical output, and spans sent twice deduplicate in the backend.
Each invocation is one trace, as live.

Output is OTLP/JSON, the JSON encoding of ``ExportTraceServiceRequest`` that OTLP/HTTP
receivers accept (``POST /v1/traces`` with ``Content-Type: application/json``): the
protobuf JSON mapping with lowerCamelCase names, enums as integers, and trace and span ids
as hex strings as the OTLP specification requires (the plain protobuf mapping would use
base64). :func:`load_otlp_json` reads it back into the protobuf class.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable
from urllib.parse import urlsplit

from .events import TERMINAL_TYPES, Event
from .fold import WorkflowState

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = [
    "session_spans",
    "export_request",
    "export_json",
    "to_otlp_json",
    "load_otlp_json",
    "send_spans",
    "trace_id_for",
    "span_id_for",
    "ExportError",
    "INCOMPLETE",
]

log = logging.getLogger("flowscope.export")

#: Attribute on spans whose run has no end in the log (its process died).
INCOMPLETE = "flowscope.export.incomplete"

_OUTCOME = {
    "node_completed": "success",
    "node_error": "failure",
    "node_error_propagated": "failure",
    "node_cancelled": "cancellation",
    "node_paused": "waiting",
    "input_requested": "waiting",
    "job_dispatched": "waiting",
}


class ExportError(Exception):
    """The spans could not be sent to the endpoint."""


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


# --------------------------------------------------------------------------- rebuilding


@dataclass
class _Span:
    name: str
    span_id: int
    parent_id: int | None
    start: float
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    link_ctx: list[tuple[int, int]] = field(default_factory=list)  # (trace_id, span_id)
    terminal: Event | None = None
    attempt: int = 1  # the run's attempt number when its terminal event was appended
    recovered: bool = False
    end: float | None = None
    status: tuple[str, str | None] = ("UNSET", None)


@dataclass
class _Invocation:
    invocation_id: str
    trace_id: int
    span: _Span
    open: dict[str, _Span] = field(default_factory=dict)  # path -> its current run's span
    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # origin path -> (type, message)
    last_ts: float = 0.0
    finished: bool = False


def _rebuild(events: Iterable[Event]) -> list[tuple[int, _Span]]:
    """The spans of a session's log as ``(trace_id, span)``, in start order."""
    from .observability import tracing as t

    ws = WorkflowState()  # the fold: attempts and state come from the one interpretation of events
    spans: list[tuple[int, _Span]] = []
    invs: dict[str, _Invocation] = {}
    previous: tuple[int, int] | None = None
    session = ""

    def finish_node(inv: _Invocation, path: str, span: _Span) -> None:
        ev = span.terminal
        if ev is None:  # no terminal event at all
            if inv.finished:  # live: after_run ends a leftover span as a cancellation
                span.attributes[t.NODE_OUTCOME] = "cancellation"
                span.end = inv.last_ts
            else:  # the process died mid-run
                span.attributes[INCOMPLETE] = True
                span.end = inv.last_ts
            return
        typ = ev.type
        outcome = _OUTCOME[typ]
        error_type = getattr(ev, "error_type", "")
        if outcome == "failure" and error_type == "NodeTimeoutError":
            outcome = "timeout"
        completed = typ == "node_completed"
        attrs = span.attributes
        attrs[t.NODE_OUTCOME] = outcome
        attrs[t.NODE_ATTEMPT_COUNT] = span.attempt
        attrs[t.NODE_COMPLETED] = completed
        attrs[t.NODE_HAS_OUTPUT] = bool(completed and ev.has_output)  # type: ignore[attr-defined]
        attrs[t.NODE_RECOVERED] = span.recovered
        if typ == "node_error":
            attrs[t.ERROR_TYPE] = ev.error_type  # type: ignore[attr-defined]
            attrs[t.ERROR_CODE] = ev.error_code  # type: ignore[attr-defined]
            span.events.append(
                ("exception", {"exception.type": ev.error_type, "exception.message": ev.error_message}, ev.ts)  # type: ignore[attr-defined]
            )
            span.status = ("ERROR", ev.error_message)  # type: ignore[attr-defined]
        elif typ == "node_error_propagated":
            attrs[t.ERROR_TYPE] = ev.error_type  # type: ignore[attr-defined]
            attrs[t.ERROR_CODE] = ev.error_code  # type: ignore[attr-defined]
            attrs[t.ERROR_ORIGIN_PATH] = ev.origin_path  # type: ignore[attr-defined]
            origin = inv.errors.get(ev.origin_path)  # type: ignore[attr-defined]
            span.status = ("ERROR", origin[1] if origin else ev.error_type)  # type: ignore[attr-defined]
        elif typ == "input_requested":
            attrs[t.INTERRUPT_ID] = ev.interrupt_id  # type: ignore[attr-defined]
        elif typ == "job_dispatched":
            attrs[t.INTERRUPT_ID] = ev.job_id  # type: ignore[attr-defined]
        elif typ == "node_paused" and ev.interrupt_ids:  # type: ignore[attr-defined]
            attrs[t.INTERRUPT_ID] = ",".join(ev.interrupt_ids)  # type: ignore[attr-defined]
        span.end = ev.ts

    def close_invocation(inv: _Invocation, finished: Event | None) -> None:
        for path, span in list(inv.open.items()):
            finish_node(inv, path, span)
        inv.open.clear()
        span = inv.span
        if finished is None:
            span.attributes[INCOMPLETE] = True
            span.end = inv.last_ts
            return
        status = finished.status  # type: ignore[attr-defined]
        if status == "failed":
            path = finished.error_path  # type: ignore[attr-defined]
            origin = inv.errors.get(path) if path else None
            if origin is None and path and path in ws.nodes:
                ns = ws.nodes[path]
                origin = (ns.error_type or "", ns.error_message or "")
            error_type, message = origin if origin else (finished.error_code or "Exception", finished.error_code or "")  # type: ignore[attr-defined]
            span.attributes[t.ERROR_TYPE] = error_type
            span.attributes[t.ERROR_CODE] = finished.error_code or "UNKNOWN_ERROR"  # type: ignore[attr-defined]
            if path:
                span.attributes[t.ERROR_ORIGIN_PATH] = path
            span.status = ("ERROR", message)
        span.attributes[t.RUN_OUTCOME] = status
        span.end = finished.ts

    for e in events:
        ws.apply(e)
        session = session or e.session_id
        typ = e.type
        inv = invs.get(e.invocation_id)
        if inv is not None:
            inv.last_ts = max(inv.last_ts, e.ts)
        if typ == "run_started":
            trace_id = trace_id_for(session, e.invocation_id)
            span = _Span(
                name=f"invoke_workflow {e.workflow}",  # type: ignore[attr-defined]
                span_id=span_id_for(session, e.invocation_id),
                parent_id=None,
                start=e.ts,
                attributes={
                    t.GEN_AI_OPERATION: "invoke_workflow",
                    t.GEN_AI_WORKFLOW: e.workflow,  # type: ignore[attr-defined]
                    t.GEN_AI_CONVERSATION: session,
                    t.INVOCATION_ID: e.invocation_id,
                    t.RUN_RESUMED: bool(e.resumed),  # type: ignore[attr-defined]
                },
            )
            if e.resumed and previous is not None:  # type: ignore[attr-defined]
                span.link_ctx.append(previous)
            inv = invs[e.invocation_id] = _Invocation(e.invocation_id, trace_id, span, last_ts=e.ts)
            spans.append((trace_id, span))
            previous = (trace_id, span.span_id)
            continue
        if inv is None:
            continue  # an event outside any invocation we saw begin: nothing to hang it on
        if typ == "run_finished":
            inv.finished = True
            close_invocation(inv, e)
            continue
        path = e.path
        if not path:
            continue
        if typ == "node_started":
            old = inv.open.pop(path, None)
            if old is not None:  # the same path again in this invocation (a nested workflow's retry)
                finish_node(inv, path, old)
            k = inv.counts.get(path, 0) + 1
            inv.counts[path] = k
            parent = inv.open.get(e.parent_path) if e.parent_path else None  # type: ignore[attr-defined]
            kind = e.kind  # type: ignore[attr-defined]
            span = _Span(
                name=("invoke_workflow " if kind == "workflow" else "invoke_node ") + e.node,
                span_id=span_id_for(session, inv.invocation_id, path, k),
                parent_id=parent.span_id if parent is not None else inv.span.span_id,
                start=e.ts,
                attributes={t.NODE_NAME: e.node, t.NODE_PATH: path, t.NODE_KIND: kind},
                recovered=bool(e.recovered),  # type: ignore[attr-defined]
            )
            inv.open[path] = span
            spans.append((inv.trace_id, span))
            continue
        span = inv.open.get(path)
        if span is None:
            continue
        if typ == "node_retrying":
            span.events.append(
                (
                    t.RETRY_EVENT,
                    {
                        t.NODE_ATTEMPT: e.attempt,  # type: ignore[attr-defined]
                        t.ERROR_TYPE: e.error_type,  # type: ignore[attr-defined]
                        t.ERROR_CODE: e.error_code,  # type: ignore[attr-defined]
                        t.ERROR_MESSAGE: e.error_message,  # type: ignore[attr-defined]
                        t.RETRY_DELAY: float(e.delay_s),  # type: ignore[attr-defined]
                    },
                    e.ts,
                )
            )
        elif typ in TERMINAL_TYPES:
            # The last terminal event of the run in this invocation wins: a JobDispatched
            # whose dispatch failed is followed by its result and an InputRequested.
            span.terminal = e
            ns = ws.nodes.get(path)
            span.attempt = getattr(e, "attempt_count", None) or (ns.attempt if ns is not None else 1)
            if typ == "node_error":
                inv.errors[path] = (e.error_type, e.error_message)  # type: ignore[attr-defined]
    for inv in invs.values():
        if not inv.finished:
            close_invocation(inv, None)
    return spans


# --------------------------------------------------------------------------- OTLP


def _version() -> str:
    from . import __version__

    return __version__


def session_spans(events: Iterable[Event], service_name: str = "flowscope") -> list[ReadableSpan]:
    """The session's spans as SDK ``ReadableSpan`` objects (what an exporter takes)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event as SpanEvent
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    resource = Resource({"service.name": service_name})  # no detectors: the same output everywhere
    scope = InstrumentationScope("flowscope", _version())
    flags = TraceFlags(TraceFlags.SAMPLED)
    out = []
    for trace_id, s in _rebuild(events):
        ctx = SpanContext(trace_id, s.span_id, is_remote=False, trace_flags=flags)
        parent = SpanContext(trace_id, s.parent_id, is_remote=False, trace_flags=flags) if s.parent_id else None
        code, message = s.status
        status = Status(StatusCode.ERROR, message) if code == "ERROR" else Status(StatusCode.UNSET)
        out.append(
            ReadableSpan(
                name=s.name,
                context=ctx,
                parent=parent,
                resource=resource,
                attributes=dict(s.attributes),
                events=[SpanEvent(name, attrs, int(round(ts * 1e9))) for name, attrs, ts in s.events],
                links=[Link(SpanContext(tid, sid, is_remote=False, trace_flags=flags)) for tid, sid in s.link_ctx],
                kind=SpanKind.INTERNAL,
                status=status,
                start_time=int(round(s.start * 1e9)),
                end_time=int(round((s.end if s.end is not None else s.start) * 1e9)),
                instrumentation_scope=scope,
            )
        )
    return out


def export_request(events: Iterable[Event], service_name: str = "flowscope") -> ExportTraceServiceRequest:
    """The session's spans as an OTLP ``ExportTraceServiceRequest`` (what the exporters send)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(session_spans(events, service_name))


_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _map_ids(d: dict[str, Any], fn: Any) -> None:
    for rs in d.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for k in _ID_KEYS:
                    if span.get(k):
                        span[k] = fn(span[k])
                for link in span.get("links", ()):
                    for k in ("traceId", "spanId"):
                        if link.get(k):
                            link[k] = fn(link[k])


def to_otlp_json(request: ExportTraceServiceRequest) -> str:
    """OTLP/JSON text of a request: camelCase names, integer enums, hex ids (OTLP spec)."""
    from google.protobuf import json_format

    d = json_format.MessageToDict(request, use_integers_for_enums=True)
    _map_ids(d, lambda b64: base64.b64decode(b64).hex())
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def export_json(events: Iterable[Event], service_name: str = "flowscope") -> str:
    """OTLP/JSON of the session's spans; the same log always gives the same text."""
    return to_otlp_json(export_request(events, service_name))


def _hex_to_b64(value: str) -> str:
    if len(value) in (16, 32) and all(c in "0123456789abcdefABCDEF" for c in value):
        return base64.b64encode(bytes.fromhex(value)).decode()
    return value  # already base64 (the plain protobuf JSON mapping)


def load_otlp_json(text: str | bytes) -> ExportTraceServiceRequest:
    """Parse OTLP/JSON (hex ids, or base64 ids as the plain protobuf mapping has them)
    into an ``ExportTraceServiceRequest``, with ``google.protobuf.json_format``."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    d = json.loads(text)
    _map_ids(d, _hex_to_b64)
    return json_format.ParseDict(d, ExportTraceServiceRequest())


# --------------------------------------------------------------------------- sending


def guess_protocol(endpoint: str) -> str:
    """``grpc`` for port 4317 (the OTLP/gRPC port), else ``http/protobuf``."""
    try:
        port = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}").port
    except ValueError:
        port = None
    return "grpc" if port == 4317 else "http/protobuf"


def _http_traces_url(endpoint: str) -> str:
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/v1/traces")
    return parts.geturl()


def send_spans(spans: list[ReadableSpan], endpoint: str, protocol: str | None = None, timeout: float = 10.0) -> None:
    """Send spans with the real OTLP exporter (HTTP/protobuf or gRPC). Raises :class:`ExportError`."""
    protocol = protocol or guess_protocol(endpoint)
    from opentelemetry.sdk.trace.export import SpanExportResult

    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        exporter: Any = GrpcExporter(endpoint=parts.netloc or endpoint, insecure=parts.scheme != "https", timeout=timeout)
        target = endpoint
    elif protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        target = _http_traces_url(endpoint)
        exporter = HttpExporter(endpoint=target, timeout=timeout)
    else:
        raise ExportError(f"unknown OTLP protocol {protocol!r}: use grpc or http/protobuf")
    quiet = [logging.getLogger(n) for n in ("opentelemetry.exporter", "opentelemetry.sdk")]
    levels = [q.level for q in quiet]
    for q in quiet:  # the exporters log retries and tracebacks; the caller reports one line
        q.setLevel(logging.CRITICAL)
    try:
        result = exporter.export(spans)
    except Exception as exc:  # pragma: no cover - exporters return FAILURE rather than raise
        raise ExportError(f"could not send spans to {target} ({protocol}): {type(exc).__name__}: {exc}") from None
    finally:
        try:
            exporter.shutdown()
        except Exception:  # pragma: no cover
            pass
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    if result is not SpanExportResult.SUCCESS:
        raise ExportError(
            f"could not send {len(spans)} spans to {target} ({protocol}): the endpoint refused them or did not answer "
            f"within {timeout:g}s; is the collector running there?"
        )
