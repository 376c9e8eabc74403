"""The LangGraph bridge (issue 17) against the real langgraph: function nodes, no model, no network."""

from __future__ import annotations

import json
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
from langgraph.types import Command, RetryPolicy, interrupt
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.events import InputReceived, InputRequested, NodeCompleted, NodeErrorEvent, NodeRetrying, NodeStarted, RunFinished, RunStarted
from flowscope.export import session_spans
from flowscope.fold import rebuild
from flowscope.observability import TracingPlugin
from flowscope.store import SqliteEventStore

# imports take seconds (tests/conftest.py: SLOW_TO_IMPORT): the whole module is in the slow set
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
CLI = str(Path(sys.executable).with_name("flowscope"))


class State(TypedDict, total=False):
    n: int
    answer: Any


def policy(attempts: int, on: type[BaseException]) -> RetryPolicy:
    return RetryPolicy(max_attempts=attempts, initial_interval=0.001, jitter=False, retry_on=on)


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteEventStore(str(tmp_path / "lg.db"))
    yield s
    s.close()


def config(handler: FlowscopeCallbackHandler, thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "callbacks": [handler]}


def of(log: list, path: str) -> list:
    return [e for e in log if e.path == path]


def retry_graph(calls: dict[str, int]) -> Any:
    def flaky(state: State) -> State:
        calls["flaky"] = calls.get("flaky", 0) + 1
        if calls["flaky"] < 3:
            raise ConnectionError(f"upstream down ({calls['flaky']})")
        return {"n": calls["flaky"]}

    def doomed(state: State) -> State:
        calls["doomed"] = calls.get("doomed", 0) + 1
        raise PermissionError("token revoked")

    g = StateGraph(State)
    g.add_node("flaky", flaky, retry_policy=policy(3, ConnectionError))
    g.add_node("doomed", doomed, retry_policy=policy(3, PermissionError))
    g.add_edge(START, "flaky")
    g.add_edge("flaky", "doomed")
    g.add_edge("doomed", END)
    return g.compile(name="sync")


def test_retries_under_a_retry_policy_and_a_final_failure(store):
    calls: dict[str, int] = {}
    handler = FlowscopeCallbackHandler(store)
    with pytest.raises(PermissionError):
        retry_graph(calls).invoke({"n": 0}, config(handler, "t-retry"))
    assert calls == {"flaky": 3, "doomed": 3}
    log = store.read("t-retry")
    flaky = of(log, "sync@1/flaky@1")
    assert [type(e).__name__ for e in flaky] == ["NodeStarted", "NodeRetrying", "NodeRetrying", "NodeCompleted"]
    assert [e.attempt for e in flaky if isinstance(e, NodeRetrying)] == [1, 2]
    assert {e.error_type for e in flaky if isinstance(e, NodeRetrying)} == {"ConnectionError"}
    assert flaky[-1].attempt_count == 3 and flaky[-1].output == {"n": 3}

    errors = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert len(errors) == 1
    assert (errors[0].path, errors[0].error_type, errors[0].error_code, errors[0].attempt_count) == ("sync@1/doomed@1", "PermissionError", "UNKNOWN_ERROR", 3)
    assert len([e for e in of(log, "sync@1/doomed@1") if isinstance(e, NodeRetrying)]) == 2
    assert (log[-1].status, log[-1].error_path) == ("failed", "sync@1/doomed@1")
    assert rebuild(log).nodes["sync@1"].status == "failed"


def approval_graph(seen: list[str]) -> Any:
    def prepare(state: State) -> None:
        seen.append("prepare")  # returns nothing: the completion marker

    def ask(state: State) -> State:
        seen.append("ask")
        return {"answer": interrupt({"prompt": "ship it?", "n": 1})}

    g = StateGraph(State)
    g.add_node("prepare", prepare)
    g.add_node("ask", ask)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=InMemorySaver(), name="release")


def test_an_interrupt_is_a_pause_and_command_resume_its_answer(store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handler = FlowscopeCallbackHandler(store, plugins=[TracingPlugin(tracer_provider=provider)])
    seen: list[str] = []
    graph = approval_graph(seen)
    cfg = config(handler, "t-ask")
    first = graph.invoke({"n": 0}, cfg)
    (intr,) = first["__interrupt__"]
    log = store.read("t-ask")
    assert not [e for e in log if isinstance(e, NodeErrorEvent)]  # a pause, not an error
    req = next(e for e in log if isinstance(e, InputRequested))
    assert (req.path, req.interrupt_id, req.prompt, req.payload) == ("release@1/ask@1", intr.id, "ship it?", {"prompt": "ship it?", "n": 1})
    assert log[-1].status == "paused" and rebuild(log).pending == [req]
    ask_span = next(s for s in exporter.get_finished_spans() if s.attributes.get("flowscope.node.path") == "release@1/ask@1")
    assert ask_span.attributes["flowscope.node.outcome"] == "waiting" and ask_span.status.status_code is StatusCode.UNSET
    assert ask_span.attributes["flowscope.interrupt.id"] == intr.id

    assert graph.invoke(Command(resume="yes"), cfg) == {"n": 0, "answer": "yes"}
    assert seen == ["prepare", "ask", "ask"]  # LangGraph re-runs the interrupted node, and only it
    log = store.read("t-ask")
    runs = [e for e in log if isinstance(e, RunStarted)]
    assert [r.resumed for r in runs] == [False, True]
    got = next(e for e in log if isinstance(e, InputReceived))
    assert (got.path, got.interrupt_id, got.value) == ("release@1/ask@1", intr.id, "yes")
    assert [e.attempt for e in of(log, "release@1/ask@1") if isinstance(e, NodeStarted)] == [1, 1]
    done = [e for e in of(log, "release@1/ask@1") if isinstance(e, NodeCompleted)]
    assert len(done) == 1 and done[0].output == {"answer": "yes"}
    marker = [e for e in of(log, "release@1/prepare@1") if isinstance(e, NodeCompleted)]
    assert len(marker) == 1 and marker[0].has_output is False
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["paused", "completed"]
    assert rebuild(log).status == "completed"


def test_attempt_numbers_continue_across_a_resume(store):
    tries: list[int] = []

    def gate(state: State) -> State:
        tries.append(1)
        if len(tries) in (1, 3):
            raise TimeoutError("slow approver")
        return {"answer": interrupt("approve?")}

    g = StateGraph(State)
    g.add_node("gate", gate, retry_policy=policy(3, TimeoutError))
    g.add_edge(START, "gate")
    g.add_edge("gate", END)
    graph = g.compile(checkpointer=InMemorySaver(), name="gated")
    handler = FlowscopeCallbackHandler(store)
    cfg = config(handler, "t-gate")
    graph.invoke({"n": 0}, cfg)
    assert graph.invoke(Command(resume="ok"), cfg) == {"n": 0, "answer": "ok"}
    log = of(store.read("t-gate"), "gated@1/gate@1")
    assert [(type(e).__name__, getattr(e, "attempt", getattr(e, "attempt_count", None))) for e in log] == [
        ("NodeStarted", 1),
        ("NodeRetrying", 1),
        ("InputRequested", None),
        ("InputReceived", None),
        ("NodeStarted", 2),
        ("NodeRetrying", 2),
        ("NodeCompleted", 3),
    ]


async def test_spans_nest_by_path_live_and_from_the_log_with_ainvoke(store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    inner = StateGraph(State)
    inner.add_node("step", lambda s: {"n": s.get("n", 0) + 1})
    inner.add_edge(START, "step")
    inner.add_edge("step", END)
    g = StateGraph(State)
    g.add_node("first", lambda s: {"n": 1})
    g.add_node("sub", inner.compile())
    g.add_edge(START, "first")
    g.add_edge("first", "sub")
    g.add_edge("sub", END)
    graph = g.compile(name="pipeline")
    handler = FlowscopeCallbackHandler(store, plugins=[TracingPlugin(tracer_provider=provider)])
    assert await graph.ainvoke({"n": 0}, config(handler, "t-spans")) == {"n": 2}

    spans = exporter.get_finished_spans()
    by_path = {s.attributes["flowscope.node.path"]: s for s in spans if "flowscope.node.path" in s.attributes}
    assert set(by_path) == {"pipeline@1", "pipeline@1/first@1", "pipeline@1/sub@1", "pipeline@1/sub@1/step@1"}
    # one span for the invocation and its top workflow's run (issue 15)
    (inv,) = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "invoke_workflow" and s.parent is None]
    assert by_path["pipeline@1"] is inv
    for path in ("pipeline@1/first@1", "pipeline@1/sub@1"):
        assert by_path[path].parent.span_id == by_path["pipeline@1"].context.span_id
    assert by_path["pipeline@1/sub@1/step@1"].parent.span_id == by_path["pipeline@1/sub@1"].context.span_id

    exported = {s.attributes.get("flowscope.node.path"): s for s in session_spans(store.read("t-spans"))}
    assert set(exported) == set(by_path)
    for path in by_path:
        if "/" not in path:
            assert exported[path].parent is None and exported[path].context == inv.context
            continue
        parent = exported[path.rsplit("/", 1)[0]]
        assert exported[path].parent.span_id == parent.context.span_id


@pytest.mark.slow
def test_flowscope_cli_audits_a_langgraph_session(store, tmp_path):
    handler = FlowscopeCallbackHandler(store)
    with pytest.raises(PermissionError):
        retry_graph({}).invoke({"n": 0}, config(handler, "t-audit"))
    approval_graph([]).invoke({"n": 0}, config(handler, "t-waiting"))
    db = str(tmp_path / "lg.db")
    audit = json.loads(subprocess.run([CLI, "audit", "--db", db, "--format", "json"], capture_output=True, text=True, check=True).stdout)
    rows = {(r["workflow"], r["node"]): r for r in audit}
    assert (rows[("sync", "flaky")]["attempts"], rows[("sync", "flaky")]["retries"]) == (3, 2)
    assert (rows[("sync", "doomed")]["attempts"], rows[("sync", "doomed")]["errors"]) == (3, 1)
    assert rows[("release", "release")]["kind"] == "workflow"
    stuck = json.loads(subprocess.run([CLI, "stuck", "--db", db, "--format", "json", "--older-than", "0s"], capture_output=True, text=True, check=True).stdout)
    assert [(r["session_id"], r["path"], r["state"]) for r in stuck] == [("t-waiting", "release@1/ask@1", "waiting_input")]
    for cmd in (["runs"], ["show", "t-audit"], ["export", "t-audit"]):
        subprocess.run([CLI, *cmd, "--db", db], capture_output=True, text=True, check=True)


@pytest.mark.slow
def test_a_process_killed_mid_node_leaves_an_open_run_that_stuck_finds(tmp_path):
    db = str(tmp_path / "killed.db")
    proc = subprocess.Popen([sys.executable, str(HERE / "langgraph_kill_worker.py"), db, "t-kill"], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(db):
                with SqliteEventStore(db) as s:
                    if any(isinstance(e, NodeStarted) and e.path == "etl@1/enrich@1" for e in s.read("t-kill")):
                        break
            assert proc.poll() is None, "the worker exited before the node started"
            time.sleep(0.05)
        else:
            pytest.fail("the worker never started the sleeping node")
        time.sleep(0.5)  # a few heartbeats
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    with SqliteEventStore(db) as s:
        log = s.read("t-kill")
        (row,) = [r for r in s.open_runs() if r.kind != "workflow"]
    assert not [e for e in log if isinstance(e, RunFinished)]
    assert (row.path, row.status) == ("etl@1/enrich@1", "running")
    assert row.heartbeat_at is not None and row.heartbeat_at > row.started_at  # the heartbeat thread beat

    out = subprocess.run([CLI, "stuck", "--db", db, "--format", "json", "--older-than", "0s"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    assert [(r["session_id"], r["path"]) for r in rows] == [("t-kill", "etl@1/enrich@1")]
    time.sleep(1.2)
    out = subprocess.run([CLI, "stuck", "--db", db, "--format", "json", "--older-than", "0s", "--stale-after", "1s"], capture_output=True, text=True, check=True)
    assert [(r["path"], r["state"]) for r in json.loads(out.stdout)] == [("etl@1/enrich@1", "orphaned")]
