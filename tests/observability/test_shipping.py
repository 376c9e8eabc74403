"""The shipping ledger (``observability/shipping.py``): a session's watermark moves only
over spans an exporter accepted, never past one still waiting for its export."""

from __future__ import annotations

from flowscope.observability.log_spans import SpanRecord
from flowscope.observability.shipping import Ledger
from flowscope.store import MemoryEventStore


def _record(span_id: int, end_seq: int) -> SpanRecord:
    return SpanRecord("invoke_node n", 1, span_id, None, 0.0, 1.0, {}, end_seq=end_seq, session_id="s")


class _Exported:
    """What the ledger reads of an exported ``ReadableSpan``: its context."""

    def __init__(self, span_id: int) -> None:
        self.context = type("Context", (), {"trace_id": 1, "span_id": span_id})()


def test_the_watermark_stays_before_a_span_handed_over_and_not_exported_yet():
    store = MemoryEventStore()
    ledger = Ledger()
    ledger.register(store, [_record(1, 3), _record(2, 7)])
    # the span the log ended at seq 7 is accepted first; the one it ended at seq 3 is still
    # on its way (another batch): a kill now must leave the seq-3 span due for the next opener
    ledger.exported([_Exported(2)], ok=True)
    assert ledger.flush(5)
    assert store.exported_seq("s") == 2
    ledger.exported([_Exported(1)], ok=True)
    assert ledger.flush(5)
    assert store.exported_seq("s") == 7
