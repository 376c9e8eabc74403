"""The ADK bridge on runs that nest (a parallel worker's items, a nested workflow): a failure
is named in full on every run it passes through, and the enclosing runs of a pause end after
the run inside them, as the engine orders them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.adk.events.request_input import RequestInput
from google.adk.workflow import FunctionNode, Workflow, node
from test_bridge_adk import Driver, observed

from flowscope.events import InputRequested, NodeCompleted, NodeErrorEvent, NodeErrorPropagated, NodePaused
from flowscope.store import SqliteEventStore

# imports take seconds (google.adk): the whole module is in the slow set
pytestmark = pytest.mark.slow


@pytest.fixture(name="store")
def adk_store(tmp_path: Path) -> Iterator[SqliteEventStore]:
    s = SqliteEventStore(str(tmp_path / "adk.db"))
    yield s
    s.close()


class CardDeclined(Exception):
    error_code = "CARD_DECLINED"


async def test_a_worker_items_failure_is_named_in_full_on_the_worker_and_the_workflow(store):
    @node(parallel_worker=True)
    def charge(node_input: int) -> int:
        if node_input == 2:
            raise CardDeclined("card ending 0002 declined")
        return node_input

    items = FunctionNode(func=lambda node_input: [1, 2, 3], name="items")
    bridge, metrics = observed(store)
    d = Driver(Workflow(name="pay", edges=[("START", items, charge)]), bridge)
    with pytest.raises(CardDeclined):
        await d.start()
    log = store.read(d.session_id)
    qualname = f"{__name__}.CardDeclined"
    [error] = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert (error.path, error.error_code, error.error_qualname) == (
        "pay@1/charge@1/charge@2",
        "CARD_DECLINED",
        qualname,
    )
    propagated = [
        (e.path, e.origin_path, e.error_code, e.error_type, e.error_qualname)
        for e in log
        if isinstance(e, NodeErrorPropagated)
    ]
    assert propagated == [
        ("pay@1/charge@1", error.path, "CARD_DECLINED", "CardDeclined", qualname),
        ("pay@1", error.path, "CARD_DECLINED", "CardDeclined", qualname),
    ]
    assert (log[-1].error_code, log[-1].error_path) == ("CARD_DECLINED", error.path)


async def test_the_runs_enclosing_a_pause_end_innermost_first_and_complete_after_their_child(store):
    def ask(ctx: Any, node_input: Any) -> Any:
        if "ok" in ctx.resume_inputs:
            return {"ok": True}
        return RequestInput(interrupt_id="ok", message="ok?")

    inner = Workflow(
        name="inner", edges=[("START", FunctionNode(func=ask, name="ask", rerun_on_resume=True))]
    )
    first = FunctionNode(func=lambda node_input: 1, name="first")
    bridge, _ = observed(store)
    d = Driver(Workflow(name="outer", edges=[("START", first, inner)]), bridge)
    await d.start()
    log = store.read(d.session_id)
    [asked] = [e for e in log if isinstance(e, InputRequested)]
    assert asked.path == "outer@1/inner@1/ask@1"
    paused = [(e.path, e.origin_path, e.interrupt_ids) for e in log if isinstance(e, NodePaused)]
    assert paused == [("outer@1/inner@1", asked.path, ("ok",)), ("outer@1", asked.path, ("ok",))]
    await d.answer("ok", {"yes": True})
    log = store.read(d.session_id)
    completed = [e.path for e in log if isinstance(e, NodeCompleted)]
    assert completed[-3:] == ["outer@1/inner@1/ask@1", "outer@1/inner@1", "outer@1"]
