"""The W3C Trace Context ``traceparent`` header, written and read in one place.

The tracing plugin writes one into ``ctx.trace_context`` for every run; the span walk
reads the invocation's to continue its trace, the shipper reads the previous invocation's
to link to it, and the metrics plugin reads a run's to make an exemplar. A header that is
not valid by https://www.w3.org/TR/trace-context/#traceparent-header reads as ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TraceParent", "format_traceparent", "parse_traceparent"]

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed ``traceparent``: ids as integers (never zero) and the sampled flag."""

    trace_id: int
    span_id: int
    sampled: bool


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    """The ``traceparent`` header (version 00) of a span context."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def _hex(text: str, size: int) -> bool:
    return len(text) == size and set(text) <= _HEX


def parse_traceparent(header: str | None) -> TraceParent | None:
    """``header`` as a :class:`TraceParent`, or ``None`` unless it is valid: two-digit
    lowercase-hex version other than ``ff`` (version 00 has exactly four fields, a later
    version at least four), a 32-digit trace id and a 16-digit span id that are not all
    zeros, and two-digit flags whose lowest bit is "sampled"."""
    if not header:
        return None
    parts = header.strip().split("-")
    if len(parts) < 4:
        return None
    version, trace, span, flags = parts[:4]
    if not _hex(version, 2) or version == "ff" or (version == "00" and len(parts) != 4):
        return None
    if not (_hex(trace, 32) and _hex(span, 16) and _hex(flags, 2)):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, bool(int(flags, 16) & 1))
