"""The LangGraph bridge on a thread whose history a handler did not see (another process,
or one handler per request, as a web server makes them): a resume continues the runs
LangGraph runs again, never one that new input dropped; and when the graph completes,
nothing an earlier invocation left open stays open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from langgraph_testing import lg_store  # noqa: F401 (the store fixture)

from commands import cli_ok, run_cli
from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.events import InputReceived, NodeErrorEvent, NodeStarted, RunStarted
from flowscope.fold import rebuild
from flowscope.store import MemoryEventStore, SqliteEventStore

# imports take seconds (langgraph): the whole module is in the slow set
pytestmark = pytest.mark.slow


class State(TypedDict, total=False):
    n: int
    answer: Any


def fresh(store: SqliteEventStore, thread: str) -> dict[str, Any]:
    """A config with a new handler: what a process that never saw the thread passes."""
    return {"configurable": {"thread_id": thread}, "callbacks": [FlowscopeCallbackHandler(store)]}


def asking_graph() -> Any:
    def ask(s: State) -> State:
        return {"answer": interrupt(f"approve {s['n']}?")}

    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    return g.compile(name="ab", checkpointer=InMemorySaver())


def test_a_resume_by_a_new_handler_answers_the_question_langgraph_asks_not_the_one_it_dropped(
    store, tmp_path
):
    graph = asking_graph()
    graph.invoke({"n": 1}, fresh(store, "t"))
    graph.invoke({"n": 2}, fresh(store, "t"))  # new input: LangGraph drops the first question
    assert graph.invoke(Command(resume="yes"), fresh(store, "t")) == {"n": 2, "answer": "yes"}
    log = store.read("t")
    [received] = [e for e in log if isinstance(e, InputReceived)]
    assert (received.path, received.value) == ("ab@1/ask@2", "yes")
    state = rebuild(log)
    assert {p: n.status for p, n in state.nodes.items()} == {
        "ab@1": "completed",
        "ab@1/ask@1": "cancelled",  # superseded by the new input
        "ab@1/ask@2": "completed",
    }
    assert state.nodes["ab@1/ask@2"].attempt == 1  # continued after its pause: the same attempt
    assert store.open_runs() == []
    assert "nothing stuck" in cli_ok("--db", str(tmp_path / "lg.db"), "stuck", "--older-than", "0s")


def test_a_resume_by_a_new_handler_continues_the_failed_run_of_the_last_input_not_an_older_one(store):
    fails = {"left": 2}

    def enrich(s: State) -> State:
        if fails["left"]:
            fails["left"] -= 1
            raise ValueError("upstream down")
        return {"n": s["n"] * 10}

    g = StateGraph(State)
    g.add_node("enrich", enrich)
    g.add_edge(START, "enrich")
    graph = g.compile(name="etl", checkpointer=InMemorySaver())
    for n in (1, 2):  # each input fails for good; the second starts the thread anew
        with pytest.raises(ValueError):
            graph.invoke({"n": n}, fresh(store, "t"))
    assert graph.invoke(None, fresh(store, "t")) == {"n": 20}  # LangGraph retries the second input's task
    state = rebuild(store.read("t"))
    first, second = state.nodes["etl@1/enrich@1"], state.nodes["etl@1/enrich@2"]
    assert (first.status, first.attempt) == ("failed", 1)  # dropped: it stays as it ended
    assert (second.status, second.attempt) == ("completed", 2)
    assert [e.path for e in store.read("t") if isinstance(e, NodeErrorEvent)] == [
        "etl@1/enrich@1",
        "etl@1/enrich@2",
    ]
    assert store.open_runs() == []


def test_a_question_answered_with_update_state_is_not_left_open_when_the_graph_completes(store, tmp_path):
    def post(s: State) -> State:
        return {"n": s["n"] + 1}

    g = StateGraph(State)
    g.add_node("ask", lambda s: {"answer": interrupt("approve?")})
    g.add_node("post", post)
    g.add_edge(START, "ask")
    g.add_edge("ask", "post")
    graph = g.compile(name="us", checkpointer=InMemorySaver())
    cfg = fresh(store, "t")
    graph.invoke({"n": 1}, cfg)
    graph.update_state(cfg, {"answer": "yes"}, as_node="ask")  # an operator answers in LangGraph's own way
    assert graph.invoke(None, cfg) == {"n": 2, "answer": "yes"}
    state = rebuild(store.read("t"))
    assert state.status == "completed" and state.pending == []
    assert state.nodes["us@1/ask@1"].status == "cancelled"  # superseded: LangGraph never ran it again
    assert store.open_runs() == []
    assert "nothing stuck" in cli_ok("--db", str(tmp_path / "lg.db"), "stuck", "--older-than", "0s")


def test_flowscopes_own_actions_refuse_a_langgraph_session_and_change_nothing(store, tmp_path):
    from flowscope import START as FS_START
    from flowscope import Runner, Workflow, answer, cancel, node, retry
    from flowscope.errors import OtherEngineError

    graph = asking_graph()
    cfg = fresh(store, "t")
    graph.invoke({"n": 1}, cfg)
    state = rebuild(store.read("t"))
    assert state.engine == "langgraph" and state.status == "paused"
    [asked] = state.pending
    before = store.last_seq("t")

    @node
    async def ask(ctx, x):
        return x

    same_name = Workflow("ab", edges=[(FS_START, ask)])  # flowscope's own workflow of that name
    attempts = [
        lambda: answer(store, "t", inputs={asked.interrupt_id: "yes"}),
        lambda: retry(store, "t"),
        lambda: cancel(store, "t"),
        lambda: Runner(same_name, store=store).resume_sync("t", inputs={asked.interrupt_id: "yes"}),
    ]
    for act in attempts:
        with pytest.raises(OtherEngineError, match="run by langgraph.*graph.invoke"):
            act()
    db = str(tmp_path / "lg.db")
    shown = cli_ok("--db", db, "show", "t")  # what it waits on, and who answers it: LangGraph
    assert f"waiting on input {asked.interrupt_id!r}: LangGraph continues it" in shown
    assert "flowscope" not in shown.split("waiting on", 1)[1]
    for args in (
        ("resume", "t", "--input", f'{asked.interrupt_id}="yes"'),
        ("cancel", "t"),
        ("cancel", "t", "--force"),
        ("retry", "t"),
    ):
        done = run_cli("--db", db, *args)
        assert done.returncode == 2 and done.stdout == "", (args, done)
        assert "run by langgraph" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    from starlette.testclient import TestClient

    from flowscope.console.app import ConsoleConfig, create_app

    cfg = ConsoleConfig(store=SqliteEventStore(db), db_shown=db, port=8765)
    page = TestClient(create_app(cfg), base_url="http://127.0.0.1:8765")
    page.headers.update({"x-flowscope-token": cfg.token, "origin": "http://127.0.0.1:8765"})
    for action, body in (("answer", {"inputs": {asked.interrupt_id: "yes"}}), ("retry", {}), ("cancel", {})):
        r = page.post(f"/api/sessions/t/{action}", json=body)
        assert r.status_code == 409 and "run by langgraph" in r.json()["error"], (action, r.text)
    assert store.last_seq("t") == before and store.inbox("t") == []
    assert graph.invoke(Command(resume="yes"), fresh(store, "t")) == {
        "n": 1,
        "answer": "yes",
    }  # LangGraph's own
    assert rebuild(store.read("t")).status == "completed"


def test_a_thread_a_killed_process_left_ships_its_unsent_spans_from_the_next_process(store, tmp_path):
    """The crash-proof shipping under the bridge: the next process that records the thread
    ships, once, the spans of the run a SIGKILLed process left open (as WorkerLost)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from flowscope.events import NodeStarted
    from flowscope.observability import TracingPlugin
    from flowscope.observability.shipping import WatermarkExporter

    db = str(tmp_path / "lg.db")
    worker = Path(__file__).resolve().parents[1] / "langgraph_kill_worker.py"
    proc = subprocess.Popen([sys.executable, str(worker), db, "t"], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 30
        while not any(isinstance(e, NodeStarted) and e.path == "etl@1/enrich@1" for e in store.read("t")):
            assert time.monotonic() < deadline and proc.poll() is None, "the worker never started enrich"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()

    class Rows(TypedDict):
        rows: int

    g = StateGraph(Rows)
    g.add_node("load", lambda s: {"rows": 10})
    g.add_node("enrich", lambda s: {"rows": s["rows"] * 2})
    g.add_edge(START, "load")
    g.add_edge("load", "enrich")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(WatermarkExporter(exporter)))
    tracing = TracingPlugin(tracer_provider=provider)
    handler = FlowscopeCallbackHandler(store, plugins=[tracing])
    config = {"configurable": {"thread_id": "t"}, "callbacks": [handler]}
    assert g.compile(name="etl", checkpointer=InMemorySaver()).invoke({"rows": 0}, config) == {"rows": 20}
    spans = {s.attributes["flowscope.node.path"]: s for s in exporter.get_finished_spans()}
    lost = spans["etl@1/enrich@1"]  # the killed run, shipped by this process
    assert (
        lost.attributes["error.type"] == "flowscope.WorkerLost"
        and lost.attributes["flowscope.export.incomplete"]
    )
    assert {"etl@1/load@2", "etl@1/enrich@2"} <= set(spans)  # the new input's own runs
    tracing.force_flush()  # the watermark's write, at once
    assert store.exported_seq("t") == store.last_seq("t")  # every span marked shipped: sent once
    provider.shutdown()


def test_a_node_run_again_after_a_resume_is_a_new_run_not_its_completed_one_continued(store):
    def review(s: State) -> State:
        return {"answer": interrupt("fetch again?")}

    g = StateGraph(State)
    g.add_node("fetch", lambda s: {"n": s["n"] + 1})
    g.add_node("review", review)
    g.add_edge(START, "fetch")
    g.add_edge("fetch", "review")
    g.add_conditional_edges("review", lambda s: "fetch" if s["answer"] == "again" else END)
    graph = g.compile(name="loop", checkpointer=InMemorySaver())
    graph.invoke({"n": 0}, fresh(store, "t"))
    assert graph.invoke(Command(resume="again"), fresh(store, "t"))["n"] == 2  # fetch ran twice
    log = store.read("t")
    fetched = [(e.path, e.attempt) for e in log if isinstance(e, NodeStarted) and e.node == "fetch"]
    assert fetched == [("loop@1/fetch@1", 1), ("loop@1/fetch@2", 1)]  # the completed run is not continued
    state = rebuild(log)
    assert [state.nodes[p].status for p in ("loop@1/fetch@1", "loop@1/fetch@2")] == ["completed", "completed"]


def test_a_run_whose_process_died_is_continued_flagged_recovered_at_its_next_attempt(store):
    left: list[list[Any]] = []  # the log as the process that died mid-node left it

    def enrich(s: State) -> State:
        if not left:
            left.append(store.read("t"))
            raise ValueError("the process dies here")  # LangGraph keeps no write of the task
        return {"n": s["n"] * 10}

    g = StateGraph(State)
    g.add_node("enrich", enrich)
    g.add_edge(START, "enrich")
    graph = g.compile(name="etl", checkpointer=InMemorySaver())
    with pytest.raises(ValueError):
        graph.invoke({"n": 1}, fresh(store, "t"))
    after = MemoryEventStore()
    after.append("t", left[0], expected_last_seq=0)
    assert [r.path for r in after.open_runs() if r.kind != "workflow"] == ["etl@1/enrich@1"]
    assert graph.invoke(None, fresh(after, "t")) == {"n": 10}
    log = after.read("t")
    [resumed] = [e for e in log if isinstance(e, RunStarted) and e.resumed]
    assert resumed.recovered == 1
    [again] = [e for e in log if isinstance(e, NodeStarted) and e.path == "etl@1/enrich@1"][1:]
    assert (again.attempt, again.recovered) == (2, True)
    assert rebuild(log).nodes["etl@1/enrich@1"].status == "completed" and after.open_runs() == []
