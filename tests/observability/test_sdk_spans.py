"""The SDK span of a record (observability/sdk_spans.py): the shortcuts give what the SDK's
own constructors give, and the live span ids are span_id_for's."""

from __future__ import annotations

import hashlib

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from flowscope.observability import sdk_spans
from flowscope.observability.log_spans import SpanRecord, span_id_after, span_id_for, span_id_head
from flowscope.observability.spans import EXCEPTION_EVENT, SpanEventRecord


def fields(span: ReadableSpan) -> dict:
    return {
        "name": span.name,
        "context": span.context,
        "parent": span.parent,
        "resource": span.resource,
        "attributes": dict(span.attributes),
        "events": [(e.name, dict(e.attributes), e.timestamp) for e in span.events],
        "links": [(link.context, dict(link.attributes or {})) for link in span.links],
        "kind": span.kind,
        "status": (span.status.status_code, span.status.description),
        "start": span.start_time,
        "end": span.end_time,
        "scope": span.instrumentation_scope,
        "dropped": (span.dropped_attributes, span.dropped_events, span.dropped_links),
    }


RECORDS = [
    SpanRecord("invoke_node a", 3, 5, 7, 1_700_000_000.25, 1_700_000_001.5, {"k": "v", "n": 1}),
    SpanRecord("invoke_workflow w", 3, 5, None, 1.0, 2.0, {"k": True}, "boom", links=((9, 11),)),
    SpanRecord(
        "invoke_node b",
        (1 << 128) - 1,
        (1 << 64) - 1,
        1,
        1.0,
        2.0,
        {},
        "failed",
        events=(SpanEventRecord(EXCEPTION_EVENT, {"exception.type": "E"}, 1.5),),
        trace_state="vendor=x",
    ),
]


@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize("extra", [None, {"flowscope.node.input": "x"}])
def test_a_span_reads_as_the_sdk_constructor_would_make_it(record, extra):
    resource, scope = Resource({"service.name": "s"}), InstrumentationScope("flowscope", "1")
    ours = sdk_spans.readable_span(record, resource, scope, extra, "trace" if record.events else None)
    context = SpanContext(
        record.trace_id,
        record.span_id,
        False,
        TraceFlags(TraceFlags.SAMPLED),
        TraceState.from_header([record.trace_state]) if record.trace_state else TraceState(),
    )
    theirs = sdk_spans._made(
        record, context, resource, scope, extra, "trace" if record.events else None, ReadableSpan
    )
    assert isinstance(ours, ReadableSpan)
    assert fields(ours) == fields(theirs)
    assert ours.to_json() == theirs.to_json()


def test_the_shortcuts_are_on_for_this_sdk():
    assert sdk_spans._FAST_CONTEXT and sdk_spans._FAST_FIELDS


def test_a_context_of_ids_out_of_range_is_made_by_the_constructor():
    assert not sdk_spans.span_context(1 << 128, 5).is_valid
    assert sdk_spans.span_context(3, 5) == SpanContext(3, 5, False, TraceFlags(1), TraceState())


def test_live_span_ids_are_the_derived_ones():
    """The id rule, written out: 64 bits of SHA-256 over the NUL-joined parts (logs written
    before keep their ids), from the head as from span_id_for."""
    head = span_id_head("sess", "inv")
    for path, attempt in [("w@1/a@1", 1), ("w@1/a@1", 3), ("w@1/x@2/y@1", 2), ("", 1)]:
        text = "\x00".join(["flowscope-span", "sess", "inv", path, str(attempt)])
        rule = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
        assert span_id_after(head, path, attempt) == rule
        assert span_id_for("sess", "inv", path, attempt) == rule
    assert span_id_after(head, "p", 1) == span_id_after(head, "p", 1)  # the head is not consumed


def test_the_walk_makes_whole_records():
    """The walk builds records positionally: every field lands where SpanRecord names it."""
    import time

    from flowscope.events import NodeCompleted, NodeStarted, RunFinished, RunStarted
    from flowscope.observability.log_spans import spans_of_log

    t, common = time.time(), {"session_id": "s", "invocation_id": "i"}
    log = [
        RunStarted(seq=1, ts=t, workflow="w", **common),
        NodeStarted(seq=2, ts=t, path="w@1", node="w", kind="workflow", **common),
        NodeStarted(seq=3, ts=t + 1, path="w@1/a@1", node="a", parent_path="w@1", **common),
        NodeCompleted(seq=4, ts=t + 2, path="w@1/a@1", node="a", attempt_count=1, **common),
        NodeCompleted(seq=5, ts=t + 3, path="w@1", node="w", attempt_count=1, **common),
        RunFinished(seq=6, ts=t + 4, status="completed", **common),
    ]
    root, a = spans_of_log(log)
    assert len(SpanRecord._fields) == 15
    assert (a.name, a.parent_id, a.start, a.end, a.end_seq, a.session_id) == (
        "invoke_node a",
        root.span_id,
        t + 1,
        t + 2,
        4,
        "s",
    )
    assert (a.error, a.events, a.links, a.sampled, a.trace_state, a.resource) == (
        None,
        (),
        (),
        True,
        "",
        None,
    )
    assert a.span_id == span_id_for("s", "i", "w@1/a@1", 1) and a.trace_id == root.trace_id
    assert (root.end_seq, root.parent_id, root.attributes["flowscope.run.outcome"]) == (6, None, "completed")
