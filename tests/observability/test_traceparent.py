"""One traceparent parser: what W3C Trace Context accepts reads as ids, anything else as None."""

from __future__ import annotations

import pytest

from flowscope.observability.backends import resolve_exemplar
from flowscope.observability.log_spans import invocation_context, trace_id_for
from flowscope.observability.traceparent import TraceParent, format_traceparent, parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def test_a_valid_header_reads_as_its_ids_and_flag() -> None:
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01") == TraceParent(int(TRACE, 16), int(SPAN, 16), True)
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-00") == TraceParent(int(TRACE, 16), int(SPAN, 16), False)
    # only the lowest flag bit is "sampled"
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-03").sampled  # type: ignore[union-attr]
    assert not parse_traceparent(f"00-{TRACE}-{SPAN}-02").sampled  # type: ignore[union-attr]


def test_a_later_version_may_carry_more_fields() -> None:
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-01-extra") == TraceParent(
        int(TRACE, 16), int(SPAN, 16), True
    )


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        f"00-{TRACE}-{SPAN}",  # three fields
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
        f"00-{TRACE[:-1]}-{SPAN}-01",  # short trace id
        f"00-{TRACE}-{SPAN}0-01",  # long span id
        f"00-{TRACE.upper()}-{SPAN}-01",  # uppercase hex
        f"00-{TRACE}-{SPAN}-1",  # one-digit flags
        f"00-{TRACE}-{SPAN[:-1]}g-01",  # not hex
        f"0x-{TRACE}-{SPAN}-01",  # version not hex
    ],
)
def test_an_invalid_header_reads_as_none(header: str | None) -> None:
    assert parse_traceparent(header) is None


def test_format_and_parse_round_trip() -> None:
    header = format_traceparent(int(TRACE, 16), 0xABC, False)
    assert header == f"00-{TRACE}-0000000000000abc-00"
    assert parse_traceparent(header) == TraceParent(int(TRACE, 16), 0xABC, False)


def test_every_reader_uses_the_one_parser() -> None:
    # the span walk keeps an invalid header's derived trace id and samples it
    derived = trace_id_for("s", "i")
    assert invocation_context("s", "i", {"traceparent": f"00-{'0' * 32}-{SPAN}-00"})[:3] == (
        derived,
        None,
        True,
    )
    assert invocation_context("s", "i", {"traceparent": f"00-{TRACE}-{SPAN}-00"})[:3] == (
        int(TRACE, 16),
        None,
        False,
    )
    # the metrics exemplar: only a valid, sampled header is one
    assert resolve_exemplar(f"00-{TRACE}-{SPAN}-01") == {"trace_id": TRACE, "span_id": SPAN}
    assert resolve_exemplar(f"00-{TRACE}-{SPAN}-00") is None
    assert resolve_exemplar(f"00-{TRACE.upper()}-{SPAN}-01") is None
