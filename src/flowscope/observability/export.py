"""Spans rebuilt from the event log, as OTLP: ``flowscope export SESSION``.

The log records every invocation and every node run with timestamps, so the spans
:class:`~flowscope.observability.TracingPlugin` produces live can be rebuilt after the
fact: for a run that had no tracing, for spans a collector dropped, or for a worker that
was killed before its batch processor flushed (its crashed runs are exported too, marked
``flowscope.export.incomplete``).

The rebuilt spans (:mod:`flowscope.observability.log_spans`) carry what the live ones
carry, from the same mapping (:mod:`flowscope.observability.spans`): names, attributes,
parentage, span events, status and links. Their ids are **deterministic**, so exporting a
session twice gives identical output, and spans sent twice deduplicate in the backend.
This module turns them into SDK spans, OTLP requests and OTLP/JSON, and sends them.

Output is OTLP/JSON, the JSON encoding of ``ExportTraceServiceRequest`` that OTLP/HTTP
receivers accept (``POST /v1/traces`` with ``Content-Type: application/json``): the
protobuf JSON mapping with lowerCamelCase names, enums as integers, and trace and span ids
as hex strings as the OTLP specification requires (the plain protobuf mapping would use
base64). :func:`load_otlp_json` reads it back into the protobuf class.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import mask_url_credentials
from ..events import Event
from ..liveness import SPAN_HANDOVER_S, owner_alive, ships_own_spans
from . import otlp
from .log_spans import span_id_for, spans_of_log, trace_id_for
from .otlp import guess_protocol
from .shipping import (
    export_counted,
    flowscope_scope,
    last_heartbeat,
    readable_span,
    record_resource,
    unshipped,
)
from .spans import INCOMPLETE

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

    from ..store.base import EventStore

__all__ = [
    "session_spans",
    "export_request",
    "export_json",
    "to_otlp_json",
    "load_otlp_json",
    "send_spans",
    "trace_id_for",
    "span_id_for",
    "guess_protocol",
    "ExportError",
    "INCOMPLETE",
    "ship_store",
    "IDLE_WAIT_FACTOR",
    "follow",
]


class ExportError(Exception):
    """The spans could not be sent to the endpoint."""


# --------------------------------------------------------------------------- OTLP


def session_spans(
    events: Iterable[Event],
    service_name: str = "flowscope",
    *,
    lost: bool = False,
    alive_at: float | None = None,
) -> list[ReadableSpan]:
    """The session's spans as SDK ``ReadableSpan`` objects (what an exporter takes): the
    records of :func:`~flowscope.observability.log_spans.spans_of_log`, converted as the live
    plugin converts them (:func:`~flowscope.observability.shipping.readable_span`).

    Each invocation's spans carry the resource its process recorded in ``RunStarted``
    (its ``service.name`` and the rest), else ``service.name=service_name``. ``lost``: the
    session's owner is gone, so a run the log does not end is an error (its worker lost),
    ending at ``alive_at`` (its last heartbeat) when that is later than its last event."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    default = Resource({SERVICE_NAME: service_name})  # no detectors: the same output everywhere
    scope = flowscope_scope()
    return [
        readable_span(r, default if r.resource is None else record_resource(r.resource), scope)
        for r in spans_of_log(events, lost, alive_at)
    ]


def export_request(
    events: Iterable[Event],
    service_name: str = "flowscope",
    *,
    lost: bool = False,
    alive_at: float | None = None,
) -> ExportTraceServiceRequest:
    """The session's spans as an OTLP ``ExportTraceServiceRequest`` (what the exporters send)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(session_spans(events, service_name, lost=lost, alive_at=alive_at))


_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _map_ids(d: dict[str, Any], fn: Callable[[str], str]) -> None:
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
    from google.protobuf import json_format  # untyped: see the mypy overrides in pyproject.toml

    d = json_format.MessageToDict(request, use_integers_for_enums=True)
    _map_ids(d, lambda b64: base64.b64decode(b64).hex())
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def export_json(
    events: Iterable[Event],
    service_name: str = "flowscope",
    *,
    lost: bool = False,
    alive_at: float | None = None,
) -> str:
    """OTLP/JSON of the session's spans; the same log always gives the same text."""
    return to_otlp_json(export_request(events, service_name, lost=lost, alive_at=alive_at))


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


def send_spans(
    spans: list[ReadableSpan], endpoint: str, protocol: str | None = None, timeout: float = 10.0
) -> None:
    """Send spans with the real OTLP exporter (HTTP/protobuf or gRPC). Raises :class:`ExportError`."""
    protocol = protocol or guess_protocol(endpoint)
    from opentelemetry.sdk.trace.export import SpanExportResult

    try:
        protocol = otlp.resolve_protocol(protocol)
    except ValueError:
        raise ExportError(f"unknown OTLP protocol {protocol!r}: use grpc or http/protobuf") from None
    target = mask_url_credentials(endpoint if protocol == otlp.GRPC else otlp.http_traces_url(endpoint))
    exporter = otlp.span_exporter(protocol, endpoint, timeout=timeout, plaintext_unless_https=True)
    quiet = [logging.getLogger(n) for n in ("opentelemetry.exporter", "opentelemetry.sdk")]
    levels = [q.level for q in quiet]
    for q in quiet:  # the exporters log retries and tracebacks; the caller reports one line
        q.setLevel(logging.CRITICAL)
    try:
        result = exporter.export(spans)
    except Exception as exc:  # pragma: no cover - exporters return FAILURE rather than raise
        raise ExportError(
            f"could not send spans to {target} ({protocol}): {type(exc).__name__}: {mask_url_credentials(str(exc))}"
        ) from None
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


# --------------------------------------------------------------------------- following a store


#: A span follower sends the spans of many sessions in one export request, up to about
#: this many (the SDK's ``BatchSpanProcessor`` default batch), and advances their
#: watermarks in one store transaction per request.
FOLLOW_BATCH_SPANS = 512
#: After a pass that sent nothing, a follower waits at least this many times as long as
#: the pass took (and at least its interval): at most a tenth of its time goes to scans.
IDLE_WAIT_FACTOR = 9.0


def ship_store(
    store: EventStore,
    exporter: SpanExporter,
    service_name: str = "flowscope",
    sessions: Iterable[str] | None = None,
    *,
    handover_s: float = SPAN_HANDOVER_S,
    shipped: dict[str, int] | None = None,
) -> int:
    """One pass of ``flowscope export --follow``: for every session (or ``sessions``) whose
    log has moved past its shipping watermark, send the spans the log ended since then (a
    session whose owner is gone also its cut-off run, as incomplete) and advance the
    watermark once the exporter returned SUCCESS. Returns how many spans were sent.

    Spans of many sessions go out together, in requests of about
    :data:`FOLLOW_BATCH_SPANS`, and the watermarks of a request's sessions are written in
    one store call once the endpoint accepted it. A refused request raises
    :class:`ExportError` (how many spans it refused; they are sent again next pass).

    A session whose live owner ships its own spans is left to it (and for ``handover_s``
    after it lets the session go, while its exporter may still hold the last batch):
    :func:`~flowscope.liveness.ships_own_spans`. Sending them here too would send them twice.

    ``shipped`` (kept by the caller across passes): the seq each session's spans were sent
    up to whose watermark the store has not recorded yet (it refused the write: a role
    that may not, a server away). Those spans are not sent again by this process; the
    watermark is written again each pass, and the entry dropped once it is on record.
    """
    import time

    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace.export import SpanExportResult

    default = Resource({SERVICE_NAME: service_name})  # for invocations that recorded no resource
    scope = flowscope_scope()
    todo = store.unexported()  # the sessions whose log moved past their watermark, and it
    if sessions is not None:
        wanted = set(sessions)
        todo = [(info, mark) for info, mark in todo if info.session_id in wanted]
    sent = 0
    batch: list[Any] = []  # spans of several sessions, sent in one request
    waiting: dict[str, int] = {}  # the sessions in ``batch``, and the seq each watermark moves to

    def send() -> None:
        nonlocal sent
        # a refused request is counted at every pass: the counter says spans are not getting out
        if batch and export_counted(exporter, batch) is not SpanExportResult.SUCCESS:
            raise ExportError(
                f"the endpoint refused {len(batch)} spans of {len(waiting)} sessions; they are sent again next time"
            )
        if waiting:  # on record before the next request: a kill resends one request's spans at most
            if shipped is not None:  # sent: not again from this process, whatever the store says
                shipped.update(waiting)
            store.set_exported_seqs(waiting)
            if shipped is not None:
                for sid in waiting:
                    shipped.pop(sid, None)
        sent += len(batch)
        batch.clear()
        waiting.clear()

    for info, mark in todo:
        sid = info.session_id
        now = time.time()
        if ships_own_spans(info.owner, info.lease_expires_at, info.updated_at, now, grace_s=handover_s):
            continue
        held = shipped.get(sid, 0) if shipped else 0
        if held > mark:  # sent before, its watermark not on record
            mark = held
            if info.last_seq <= held:  # nothing new: its watermark to write again
                waiting[sid] = held
                continue
        ended = not owner_alive(info.owner, info.lease_expires_at, now)
        if info.last_seq <= mark and not ended:  # a live owner's open runs: nothing new yet
            continue
        events = store.read(sid)
        if not events:
            continue
        records, _ = unshipped(events, mark, ended, last_heartbeat(store, sid) if ended else None)
        # Every span the log ended up to its last event goes out; the ones still open end later.
        batch.extend(
            readable_span(r, default if r.resource is None else record_resource(r.resource), scope)
            for r in records
            if r.sampled
        )
        # past the spans a dead owner left open, which end after its last event: sent once
        waiting[sid] = max(events[-1].seq, max((r.end_seq for r in records), default=0))
        if len(batch) >= FOLLOW_BATCH_SPANS:
            send()
    send()
    return sent


def follow(
    store: EventStore,
    exporter: SpanExporter,
    *,
    service_name: str = "flowscope",
    interval: float = 1.0,
    rounds: int | None = None,
    on_sent: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
    handover_s: float = SPAN_HANDOVER_S,
    shipped: dict[str, int] | None = None,
) -> None:
    """Tail the store and ship spans as they are appended (``rounds`` passes, or forever,
    or until ``stop`` is set), a pass every ``interval`` seconds; ``shipped`` as
    :func:`ship_store` keeps it (a caller that follows again after an error passes its own).

    A pass that sends nothing still reads every session's watermark (a million sessions:
    about 0.4 s on SQLite), so after one the follower waits at least
    :data:`IDLE_WAIT_FACTOR` times as long as it took: idle, it never spends more than a
    tenth of its time on the store, however many sessions the store keeps."""
    import time

    stop = stop if stop is not None else threading.Event()
    n = 0
    while (rounds is None or n < rounds) and not stop.is_set():
        started = time.monotonic()
        sent = ship_store(store, exporter, service_name, handover_s=handover_s, shipped=shipped)
        took = time.monotonic() - started
        if sent and on_sent is not None:
            on_sent(sent)
        n += 1
        if rounds is None or n < rounds:
            stop.wait(interval if sent else max(interval, IDLE_WAIT_FACTOR * took))
