"""``flowscope.export``: the import path of :mod:`flowscope.observability.export`, kept for
callers written before the module moved (the CLI, user scripts)."""

from __future__ import annotations

from .observability.export import (
    INCOMPLETE,
    ExportError,
    export_json,
    export_request,
    guess_protocol,
    load_otlp_json,
    send_spans,
    session_spans,
    span_id_for,
    to_otlp_json,
    trace_id_for,
)

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
]
