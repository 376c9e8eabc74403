"""Bounded metric labels (``observability/labels.py``, R13): an ``error_code`` label is the
event's code only if the whole code looks like one (``[A-Z][A-Z0-9_]*``, at most 64
characters); a code that only begins like one is ``INVALID_ERROR_CODE``."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from flowscope import START, Runner, Workflow, node
from flowscope.observability import MetricsPlugin
from flowscope.observability.labels import code_label
from flowscope.store import MemoryEventStore


@pytest.mark.parametrize(
    "code", ["E-42", "CARD.DECLINED", "Card_declined", "PAYMENT:DECLINED", "CARD_DECLINED\n"]
)
def test_a_code_that_only_begins_like_a_code_is_no_label(code):
    assert code_label(code) == "INVALID_ERROR_CODE"


@pytest.mark.parametrize("code", ["E", "CARD_DECLINED", "E42", "A" * 64])
def test_a_code_that_looks_like_one_is_its_own_label(code):
    assert code_label(code) == code


async def test_an_identifier_the_event_keeps_is_invalid_error_code_as_a_metric_label():
    class Declined(Exception):
        error_code = "Payments.CardDeclined"

    @node
    def charge(x):
        raise Declined("card declined")

    store = MemoryEventStore()
    registry = CollectorRegistry()
    runner = Runner(
        Workflow("orders", edges=[(START, charge)]), store=store, plugins=[MetricsPlugin(registry)]
    )
    with pytest.raises(Declined):
        await runner.run(1, session_id="s")
    [error] = [e for e in store.read("s") if e.type == "node_error"]
    assert error.error_code == "Payments.CardDeclined"  # the event keeps an identifier as written
    codes = [
        s.labels["error_code"]
        for f in registry.collect()
        for s in f.samples
        if s.name == "flowscope_node_errors_total"
    ]
    assert codes == ["INVALID_ERROR_CODE"]
