"""The LangGraph bridge against the real langgraph: function nodes, no model, no network."""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import NodeTimeoutError
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, Send, TimeoutPolicy, interrupt
from langgraph_testing import config, flaky_beside_broken, lg_store  # noqa: F401 (lg_store: the store fixture)
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from commands import cli_ok
from flowscope.adapters.langgraph import FlowscopeCallbackHandler
from flowscope.cli import views
from flowscope.cli.history import retry_reasons
from flowscope.events import (
    InputReceived,
    InputRequested,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodePaused,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from flowscope.export import session_spans
from flowscope.fold import rebuild
from flowscope.observability import MetricsPlugin, TracingPlugin
from flowscope.store import SqliteEventStore

# imports take seconds (tests/conftest.py: SLOW_TO_IMPORT): the whole module is in the slow set
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parents[1]


class State(TypedDict, total=False):
    n: int
    answer: Any


def policy(attempts: int, on: type[BaseException]) -> RetryPolicy:
    return RetryPolicy(max_attempts=attempts, initial_interval=0.001, jitter=False, retry_on=on)


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
    assert [type(e).__name__ for e in flaky] == [
        "NodeStarted",
        "NodeRetrying",
        "NodeRetrying",
        "NodeCompleted",
    ]
    assert [e.attempt for e in flaky if isinstance(e, NodeRetrying)] == [1, 2]
    assert {e.error_type for e in flaky if isinstance(e, NodeRetrying)} == {"ConnectionError"}
    assert flaky[-1].attempt_count == 3 and flaky[-1].output == {"n": 3}

    errors = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert len(errors) == 1
    assert (errors[0].path, errors[0].error_type, errors[0].error_code, errors[0].attempt_count) == (
        "sync@1/doomed@1",
        "PermissionError",
        "UNKNOWN_ERROR",
        3,
    )
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
    assert (req.path, req.interrupt_id, req.prompt, req.payload) == (
        "release@1/ask@1",
        intr.id,
        "ship it?",
        {"prompt": "ship it?", "n": 1},
    )
    assert log[-1].status == "paused" and rebuild(log).pending == [req]
    ask_span = next(
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get("flowscope.node.path") == "release@1/ask@1"
    )
    assert (
        ask_span.attributes["flowscope.node.outcome"] == "waiting"
        and ask_span.status.status_code is StatusCode.UNSET
    )
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
    # one span for the invocation and its top workflow's run
    (inv,) = [
        s
        for s in spans
        if s.attributes.get("gen_ai.operation.name") == "invoke_workflow" and s.parent is None
    ]
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
    audit = json.loads(cli_ok("audit", "--db", db, "--format", "json"))
    rows = {(r["workflow"], r["node"]): r for r in audit}
    assert (rows[("sync", "flaky")]["attempts"], rows[("sync", "flaky")]["retries"]) == (3, 2)
    assert (rows[("sync", "doomed")]["attempts"], rows[("sync", "doomed")]["errors"]) == (3, 1)
    assert rows[("release", "release")]["kind"] == "workflow"
    stuck = json.loads(cli_ok("stuck", "--db", db, "--format", "json", "--older-than", "0s"))
    assert [(r["session_id"], r["path"], r["state"]) for r in stuck] == [
        ("t-waiting", "release@1/ask@1", "waiting_input")
    ]
    for cmd in (["runs"], ["show", "t-audit"], ["export", "t-audit"]):
        cli_ok(*cmd, "--db", db)


@pytest.mark.slow
def test_a_process_killed_mid_node_leaves_an_open_run_that_stuck_finds(tmp_path):
    db = str(tmp_path / "killed.db")
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "langgraph_kill_worker.py"), db, "t-kill"], env=os.environ.copy()
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(db):
                with SqliteEventStore(db) as s:
                    if any(
                        isinstance(e, NodeStarted) and e.path == "etl@1/enrich@1" for e in s.read("t-kill")
                    ):
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

    rows = json.loads(cli_ok("stuck", "--db", db, "--format", "json", "--older-than", "0s"))
    assert [(r["session_id"], r["path"]) for r in rows] == [("t-kill", "etl@1/enrich@1")]
    time.sleep(1.2)
    out = cli_ok("stuck", "--db", db, "--format", "json", "--older-than", "0s", "--stale-after", "1s")
    assert [(r["path"], r["state"]) for r in json.loads(out)] == [("etl@1/enrich@1", "orphaned")]


# -- graphs from LangGraph's own tests ---------------------------------------------------
# langchain-ai/langgraph libs/langgraph/tests/test_pregel.py at f09cfe8 (the issue's run:
# test_pending_writes_resume, test_interrupt_subgraph, Send fan-out, nested-graph
# breakpoints) and test_pregel_async.py (the functional API with TimeoutPolicy), trimmed to
# function nodes; run on the installed langgraph (1.2.24).


@pytest.fixture
def otel_errors(caplog):
    """The ERROR lines OpenTelemetry logs during a test (a context detached in another context)."""
    caplog.set_level(logging.ERROR, logger="opentelemetry")
    yield lambda: [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("opentelemetry") and r.levelno >= logging.ERROR
    ]


def traced(store, **kw: Any) -> tuple[FlowscopeCallbackHandler, MetricsPlugin]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    metrics = MetricsPlugin(registry=CollectorRegistry())  # this test's counts only
    return FlowscopeCallbackHandler(
        store, plugins=[TracingPlugin(tracer_provider=provider), metrics], **kw
    ), metrics


def samples(metrics: MetricsPlugin, name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == name
    }


def audit(store, sid: str) -> dict[str, dict[str, Any]]:
    runs = store.node_runs(sid)
    return {
        r["node"]: r for r in views.audit_rows(runs, retry_reasons(store, runs)) if r["kind"] != "workflow"
    }


def test_a_resume_after_a_failure_continues_the_failed_run_with_exact_attempts(store, otel_errors):
    # test_pending_writes_resume: "one" succeeds while "two" fails under RetryPolicy(max_attempts=2);
    # invoke(None) resumes with one's pending writes kept. Here "two" fails its first four attempts.
    calls = {"one": 0, "two": 0}

    def one(state: State) -> State:
        calls["one"] += 1
        return {"n": 2}

    def two(state: State) -> State:
        calls["two"] += 1
        if calls["two"] <= 4:
            time.sleep(0.05)  # as in LangGraph's test: "one" finishes (its writes saved) first
            raise ConnectionError("I'm not good")
        return {"answer": "ok"}

    b = StateGraph(State)
    b.add_node("one", one)
    b.add_node("two", two, retry_policy=policy(2, ConnectionError))
    b.add_edge(START, "one")
    b.add_edge(START, "two")
    graph = b.compile(checkpointer=InMemorySaver(), name="pending")
    handler, metrics = traced(store)
    cfg = config(handler, "t-pending")
    for _ in range(2):
        with pytest.raises(ConnectionError):
            graph.invoke({"n": 0}, cfg) if not store.read("t-pending") else graph.invoke(None, cfg)
    assert graph.invoke(None, cfg) == {"n": 2, "answer": "ok"}
    assert calls == {"one": 1, "two": 5}  # LangGraph kept one's writes: it ran once

    log = store.read("t-pending")
    assert sorted({e.path for e in log if isinstance(e, NodeStarted)}) == [
        "pending@1",
        "pending@1/one@1",
        "pending@1/two@1",
    ]
    two_log = of(log, "pending@1/two@1")
    assert [e.attempt for e in two_log if isinstance(e, NodeStarted)] == [1, 3, 5]
    assert [e.attempt for e in two_log if isinstance(e, NodeRetrying)] == [1, 3]
    assert [e.attempt_count for e in two_log if isinstance(e, NodeErrorEvent)] == [2, 4]
    assert [e.attempt_count for e in two_log if isinstance(e, NodeCompleted)] == [5]
    assert [r.resumed for r in log if isinstance(r, RunStarted)] == [False, True, True]
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["failed", "failed", "completed"]
    ws = rebuild(log)
    assert (ws.status, ws.nodes["pending@1/two@1"].status, ws.nodes["pending@1/two@1"].attempt) == (
        "completed",
        "completed",
        5,
    )

    rows = audit(store, "t-pending")
    # one run of five attempts, completed in the end (ERRORS counts runs that ended failed)
    assert (
        rows["two"]["runs"],
        rows["two"]["completed"],
        rows["two"]["attempts"],
        rows["two"]["retries"],
        rows["two"]["errors"],
    ) == (1, 1, 5, 2, 0)
    assert (rows["one"]["runs"], rows["one"]["attempts"]) == (1, 1)
    assert (
        samples(metrics, "flowscope_node_errors_total")[
            (
                ("error_code", "UNKNOWN_ERROR"),
                ("error_type", "ConnectionError"),
                ("node", "two"),
                ("workflow", "pending"),
            )
        ]
        == 2
    )
    assert (
        samples(metrics, "flowscope_node_retries_total")[
            (("error_type", "ConnectionError"), ("node", "two"), ("workflow", "pending"))
        ]
        == 2
    )
    runs = samples(metrics, "flowscope_node_runs_total")
    assert runs[(("node", "two"), ("outcome", "failure"), ("workflow", "pending"))] == 2
    assert runs[(("node", "two"), ("outcome", "success"), ("workflow", "pending"))] == 1
    assert otel_errors() == []


def three_levels(asked: list[str]) -> Any:
    """test_interrupt_subgraph, one level deeper: root -> bar (subgraph) -> mid (subgraph) -> ask."""

    def ask(state: State) -> State:
        asked.append("ask")
        return {"answer": interrupt("Please provide baz value:")}

    leaf = StateGraph(State)
    leaf.add_node("ask", ask)
    leaf.add_edge(START, "ask")
    mid = StateGraph(State)
    mid.add_node("mid", leaf.compile())
    mid.add_edge(START, "mid")
    root = StateGraph(State)
    root.add_node("foo", lambda s: {"n": 1})
    root.add_node("bar", mid.compile())
    root.add_edge(START, "foo")
    root.add_edge("foo", "bar")
    return root.compile(checkpointer=InMemorySaver(), name="nested")


def test_an_interrupt_in_a_subgraph_is_recorded_once_and_the_enclosing_runs_pause(store, otel_errors):
    asked: list[str] = []
    graph = three_levels(asked)
    handler, metrics = traced(store)
    cfg = config(handler, "t-sub")
    (intr,) = graph.invoke({"n": 0}, cfg)["__interrupt__"]
    log = store.read("t-sub")
    leaf, mid, bar = "nested@1/bar@1/mid@1/ask@1", "nested@1/bar@1/mid@1", "nested@1/bar@1"
    requests = [e for e in log if isinstance(e, InputRequested)]
    assert [(e.path, e.interrupt_id) for e in requests] == [(leaf, intr.id)]
    paused = {e.path: e for e in log if isinstance(e, NodePaused)}
    assert set(paused) == {mid, bar, "nested@1"}
    assert all(p.interrupt_ids == (intr.id,) and p.origin_path == leaf for p in paused.values())
    assert rebuild(log).pending == requests
    waiting = {
        dict(k)["node"]: v
        for k, v in samples(metrics, "flowscope_node_runs_total").items()
        if ("outcome", "waiting") in k
    }
    assert waiting == {"ask": 1}  # paused once, at the deepest path: the enclosing runs are containers

    assert graph.invoke(Command(resume="baz"), cfg) == {"n": 1, "answer": "baz"}
    log = store.read("t-sub")
    assert [(e.path, e.interrupt_id, e.value) for e in log if isinstance(e, InputReceived)] == [
        (leaf, intr.id, "baz")
    ]
    for path in (leaf, mid, bar):  # each run continued at its path, attempt 1, and completed once
        assert [e.attempt for e in of(log, path) if isinstance(e, NodeStarted)] == [1, 1]
        assert len([e for e in of(log, path) if isinstance(e, NodeCompleted)]) == 1
    ws = rebuild(log)
    assert ws.status == "completed" and ws.pending == []
    assert asked == ["ask", "ask"]
    assert otel_errors() == []


def test_an_interrupt_in_a_send_branch_is_recorded_at_that_branch(store, otel_errors):
    # Send fan-out to one node (test_pregel.py's Send tests), one branch interrupts.
    class FanState(TypedDict, total=False):
        items: list[int]
        done: Annotated[list[int], operator.add]

    def work(arg: dict[str, int]) -> dict[str, list[int]]:
        if arg["i"] == 2:
            interrupt(f"approve {arg['i']}?")
        return {"done": [arg["i"]]}

    b = StateGraph(FanState)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in s["items"]], ["work"])
    graph = b.compile(checkpointer=InMemorySaver(), name="fan")
    handler, _ = traced(store)
    cfg = config(handler, "t-send")
    (intr,) = graph.invoke({"items": [1, 2, 3]}, cfg)["__interrupt__"]
    out = graph.invoke(Command(resume=True), cfg)
    assert sorted(out["done"]) == [1, 2, 3]
    log = store.read("t-send")
    started = [e.path for e in log if isinstance(e, NodeStarted) and e.path != "fan@1"]
    assert "fan@1/__start__@1" not in started  # LangGraph's internal task for a conditional edge from START
    (req,) = [e for e in log if isinstance(e, InputRequested)]
    assert req.interrupt_id == intr.id and started.count(req.path) == 2  # paused, then run again at its path
    assert len(set(started)) == 3 and len(started) == 4
    (got,) = [e for e in log if isinstance(e, InputReceived)]
    assert got.path == req.path
    ws = rebuild(log)
    assert ws.status == "completed" and all(n.status == "completed" for n in ws.nodes.values())
    assert otel_errors() == []


def test_a_resume_langgraph_refuses_records_no_answer(store):
    """One plain value for two open interrupts: LangGraph refuses it (RuntimeError) and uses
    no answer, so the log records none; each real answer is then recorded once."""

    class Two(TypedDict, total=False):
        who: str
        ok: Annotated[list[str], operator.add]

    def approve(arg: dict[str, str]) -> dict[str, list[str]]:
        return {"ok": [f"{arg['who']}={interrupt('approve ' + arg['who'] + '?')}"]}

    b = StateGraph(Two)
    b.add_node("approve", approve)
    b.add_conditional_edges(
        START, lambda s: [Send("approve", {"who": w}) for w in ("ana", "bo")], ["approve"]
    )
    graph = b.compile(checkpointer=InMemorySaver(), name="approvals")
    cfg = config(FlowscopeCallbackHandler(store), "t-two")
    ids = [i.id for i in graph.invoke({"ok": []}, cfg)["__interrupt__"]]
    with pytest.raises(RuntimeError, match="multiple pending interrupts"):
        graph.invoke(Command(resume="yes"), cfg)
    assert [e for e in store.read("t-two") if isinstance(e, InputReceived)] == []
    assert {e.interrupt_id for e in rebuild(store.read("t-two")).pending} == set(ids)  # still waiting on both
    graph.invoke(Command(resume={ids[0]: "yes"}), cfg)
    out = graph.invoke(Command(resume={ids[1]: "no"}), cfg)
    assert len(out["ok"]) == 2 and {x.split("=")[1] for x in out["ok"]} == {"yes", "no"}
    log = store.read("t-two")
    assert [e.interrupt_id for e in log if isinstance(e, InputReceived)] == ids
    # (LangGraph runs the task still waiting again on the first answer: it asks again, as recorded)
    assert {e.interrupt_id for e in log if isinstance(e, InputRequested)} == set(ids)
    assert rebuild(log).status == "completed"


def test_stopping_a_stream_early_is_a_cancellation_not_a_failure(store):
    """``break`` out of ``stream()``: LangGraph closes its generator (GeneratorExit) and
    stops, its checkpoint intact; no error is recorded or counted, and the thread goes on."""
    ran: list[str] = []

    def step(name: str) -> Any:
        def fn(s: State) -> State:
            ran.append(name)
            return {"n": s.get("n", 0) + 1}

        return fn

    b = StateGraph(State)
    for name in ("a", "b", "c"):
        b.add_node(name, step(name))
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    graph = b.compile(checkpointer=InMemorySaver(), name="chain")
    handler, metrics = traced(store)
    cfg = config(handler, "t-stream")
    for _chunk in graph.stream({"n": 0}, cfg, stream_mode="updates"):
        break
    assert ran == ["a"]
    log = store.read("t-stream")
    assert not [e for e in log if isinstance(e, (NodeErrorEvent, NodeErrorPropagated))]
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["cancelled"]
    assert samples(metrics, "flowscope_node_errors_total") == {}
    assert graph.invoke(None, cfg)["n"] == 3 and ran == ["a", "b", "c"]
    assert rebuild(store.read("t-stream")).status == "completed"


def test_a_command_is_recorded_as_its_update_and_its_goto(store):
    """A node returning ``Command(update=..., goto=...)`` (to its own graph or to the parent)
    completes with the update as its output and the goto as its route."""

    class Log(TypedDict, total=False):
        log: Annotated[list[str], operator.add]

    def handoff(s: Log) -> Command:
        return Command(graph=Command.PARENT, goto="billing", update={"log": ["handoff"]})

    def router(s: Log) -> Command:
        return Command(update={"log": ["routed"]}, goto="handoff")

    inner = StateGraph(Log)
    inner.add_node("router", router)
    inner.add_node("handoff", handoff)
    inner.add_edge(START, "router")
    agent = inner.compile()

    def billing(s: Log) -> Log:
        return {"log": ["billing"]}

    outer = StateGraph(Log)
    outer.add_node("agent", agent)
    outer.add_node("billing", billing)
    outer.add_edge(START, "agent")
    graph = outer.compile(checkpointer=InMemorySaver(), name="support")
    out = graph.invoke({"log": []}, config(FlowscopeCallbackHandler(store), "t-cmd"))
    assert out == graph.invoke({"log": []}, {"configurable": {"thread_id": "plain"}})  # the same without us
    done = {
        e.path: (e.output, e.has_output, e.route) for e in store.read("t-cmd") if isinstance(e, NodeCompleted)
    }
    assert done["support@1/agent@1/router@1"] == ({"log": ["routed"]}, True, "handoff")
    assert done["support@1/agent@1/handoff@1"] == ({"log": ["handoff"]}, True, "billing")


def test_a_conditional_edge_from_start_records_no_start_task(store):
    b = StateGraph(State)
    b.add_node("a", lambda s: {"n": 1})
    b.add_node("b", lambda s: {"n": 2})
    b.add_conditional_edges(START, lambda s: "a" if s.get("n") == 0 else "b", ["a", "b"])
    b.add_edge("a", END)
    b.add_edge("b", END)
    assert b.compile(name="route").invoke({"n": 0}, config(FlowscopeCallbackHandler(store), "t-route")) == {
        "n": 1
    }
    assert [e.path for e in store.read("t-route") if isinstance(e, NodeStarted)] == ["route@1", "route@1/a@1"]


async def test_timeout_policy_retries_are_node_retrying_and_a_final_timeout_is_a_timeout(store, otel_errors):
    # The functional API with TimeoutPolicy (test_pregel_async.py: a @task that hangs past
    # its run_timeout, retried by its RetryPolicy).
    tries = {"slow": 0, "hung": 0}

    @task(
        timeout=TimeoutPolicy(run_timeout=0.05),
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=False),
    )
    async def slow(x: int) -> int:
        tries["slow"] += 1
        if tries["slow"] < 3:
            await asyncio.sleep(5)
        return x + 1

    @task(
        timeout=TimeoutPolicy(idle_timeout=0.05),
        retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.0, jitter=False),
    )
    async def hung(x: int) -> int:
        tries["hung"] += 1
        await asyncio.sleep(5)
        return x

    @entrypoint(checkpointer=InMemorySaver())
    async def flow(x: int) -> int:
        y = await slow(x)
        return await hung(y)

    handler, metrics = traced(store, workflow="flow")
    with pytest.raises(NodeTimeoutError) as raised:
        await flow.ainvoke(1, config(handler, "t-timeout"))
    await asyncio.sleep(0.05)  # the cancelled attempts' chains report late; nothing may change
    assert tries == {"slow": 3, "hung": 2}
    log = store.read("t-timeout")
    (slow_path,) = {e.path for e in log if isinstance(e, NodeStarted) and e.node == "slow"}
    (hung_path,) = {e.path for e in log if isinstance(e, NodeStarted) and e.node == "hung"}
    # the entrypoint is the graph and its one task (LangGraph runs the function as a node)
    assert (slow_path, hung_path) == ("flow@1/flow@1/slow@1", "flow@1/flow@1/hung@1")
    retries = [e for e in of(log, slow_path) if isinstance(e, NodeRetrying)]
    assert [(e.attempt, e.error_type, e.error_code) for e in retries] == [
        (1, "NodeTimeoutError", "NODE_TIMEOUT"),
        (2, "NodeTimeoutError", "NODE_TIMEOUT"),
    ]
    assert [e.attempt_count for e in of(log, slow_path) if isinstance(e, NodeCompleted)] == [3]
    assert [e.attempt for e in of(log, hung_path) if isinstance(e, NodeRetrying)] == [1]
    (err,) = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert (err.path, err.error_type, err.error_code, err.attempt_count) == (
        hung_path,
        "NodeTimeoutError",
        "NODE_TIMEOUT",
        2,
    )
    assert err.error_message == str(raised.value) and "idle timeout" in err.error_message
    assert not [e for e in log if type(e).__name__ == "NodeCancelled"]
    assert (log[-1].status, log[-1].error_path, log[-1].error_code) == ("failed", hung_path, "NODE_TIMEOUT")
    runs = samples(metrics, "flowscope_node_runs_total")
    assert runs[(("node", "hung"), ("outcome", "timeout"), ("workflow", "flow"))] == 1
    assert runs[(("node", "slow"), ("outcome", "success"), ("workflow", "flow"))] == 1
    assert (
        samples(metrics, "flowscope_node_retries_total")[
            (("error_type", "NodeTimeoutError"), ("node", "slow"), ("workflow", "flow"))
        ]
        == 2
    )
    rows = audit(store, "t-timeout")
    assert (
        rows["slow"]["attempts"],
        rows["slow"]["retries"],
        rows["hung"]["attempts"],
        rows["hung"]["errors"],
    ) == (3, 2, 2, 1)
    assert otel_errors() == []


def test_a_subgraph_breakpoint_pauses_its_node_without_an_error_log(store, otel_errors):
    # Breakpoints of a subgraph (interrupt_before), test_pregel.py's nested-graph breakpoint tests.
    inner = StateGraph(State)
    inner.add_node("x", lambda s: {"n": 1})
    inner.add_node("y", lambda s: {"n": 2})
    inner.add_edge(START, "x")
    inner.add_edge("x", "y")
    outer = StateGraph(State)
    outer.add_node("sub", inner.compile(interrupt_before=["y"]))
    outer.add_edge(START, "sub")
    graph = outer.compile(checkpointer=InMemorySaver(), name="bp")
    handler, _ = traced(store)
    cfg = config(handler, "t-bp")
    graph.invoke({"n": 0}, cfg)
    log = store.read("t-bp")
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["paused"]
    (p,) = [e for e in log if isinstance(e, NodePaused) and e.path == "bp@1/sub@1"]
    assert p.interrupt_ids == () and not [e for e in log if isinstance(e, (InputRequested, NodeErrorEvent))]
    assert graph.invoke(None, cfg) == {"n": 2}
    log = store.read("t-bp")
    assert [e.attempt for e in of(log, "bp@1/sub@1") if isinstance(e, NodeStarted)] == [1, 1]
    assert rebuild(log).status == "completed"
    assert otel_errors() == []


async def test_spans_end_in_their_own_context_so_opentelemetry_logs_no_error(store, otel_errors):
    # A failed, a timed-out and a breakpoint-paused graph under ainvoke: LangGraph ends
    # those runs from the graph's context (or the next attempt's), not the task's own.
    def broken(state: State) -> State:
        raise PermissionError("token revoked")

    async def hangs(state: State) -> State:
        await asyncio.sleep(5)
        return state

    inner = StateGraph(State)
    inner.add_node("x", lambda s: {"n": 1})
    inner.add_node("y", lambda s: {"n": 2})
    inner.add_edge(START, "x")
    inner.add_edge("x", "y")
    graphs = {}
    for name, node, kw in (
        ("failed", broken, {}),
        ("timed", hangs, {"timeout": TimeoutPolicy(run_timeout=0.05)}),
        ("bp", inner.compile(interrupt_before=["y"]), {}),
    ):
        b = StateGraph(State)
        b.add_node("ok", lambda s: {"n": 1})
        b.add_node("step", node, **kw)
        b.add_edge(START, "ok")
        b.add_edge(START, "step")
        graphs[name] = b.compile(checkpointer=InMemorySaver(), name=name)
    handler, _ = traced(store)
    with pytest.raises(PermissionError):
        await graphs["failed"].ainvoke({"n": 0}, config(handler, "t-ctx-failed"))
    with pytest.raises(NodeTimeoutError):
        await graphs["timed"].ainvoke({"n": 0}, config(handler, "t-ctx-timed"))
    await graphs["bp"].ainvoke({"n": 0}, config(handler, "t-ctx-bp"))
    await asyncio.sleep(0.05)
    statuses = {sid: rebuild(store.read(sid)).status for sid in ("t-ctx-failed", "t-ctx-timed", "t-ctx-bp")}
    assert statuses == {"t-ctx-failed": "failed", "t-ctx-timed": "failed", "t-ctx-bp": "paused"}
    assert otel_errors() == []


def test_a_failure_inside_a_subgraph_is_one_error_at_the_deepest_path(store):
    def broken(state: State) -> State:
        raise PermissionError("token revoked")

    inner = StateGraph(State)
    inner.add_node("broken", broken)
    inner.add_edge(START, "broken")
    outer = StateGraph(State)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    with pytest.raises(PermissionError):
        outer.compile(name="deep").invoke({"n": 0}, config(FlowscopeCallbackHandler(store), "t-deep"))
    log = store.read("t-deep")
    (err,) = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert (err.path, err.error_type) == ("deep@1/sub@1/broken@1", "PermissionError")
    assert {e.path: e.origin_path for e in log if isinstance(e, NodeErrorPropagated)} == {
        "deep@1/sub@1": err.path,
        "deep@1": err.path,
    }
    assert (log[-1].status, log[-1].error_path) == ("failed", err.path)


def test_a_breakpoint_of_the_root_graph_pauses_the_run_and_none_resumes_it(store, otel_errors):
    b = StateGraph(State)
    b.add_node("a", lambda s: {"n": 1})
    b.add_node("b", lambda s: {"n": 2})
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    graph = b.compile(checkpointer=InMemorySaver(), interrupt_before=["b"], name="brk")
    handler, _ = traced(store)
    cfg = config(handler, "t-brk")
    graph.invoke({"n": 0}, cfg)
    assert rebuild(store.read("t-brk")).status == "paused"
    assert graph.invoke(None, cfg) == {"n": 2}
    log = store.read("t-brk")
    assert [(r.resumed, r.input) for r in log if isinstance(r, RunStarted)] == [
        (False, {"n": 0}),
        (True, None),
    ]
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["paused", "completed"]
    assert sorted({e.path for e in log if isinstance(e, NodeStarted)}) == ["brk@1", "brk@1/a@1", "brk@1/b@1"]
    assert otel_errors() == []


def test_failed_send_branches_resume_each_at_its_own_path(store):
    # Send fan-out where two of three branches fail; invoke(None) re-runs just those two,
    # and each continues the run of its own task (LangGraph keeps the task ids).
    class FanState(TypedDict, total=False):
        items: list[int]
        done: Annotated[list[int], operator.add]

    failing = {1, 3}

    def work(arg: dict[str, int]) -> dict[str, list[int]]:
        if arg["i"] in failing:
            # fail after the good branch's writes are saved: a branch still running when the
            # step fails loses them, and LangGraph runs it again (a second run, recorded so)
            time.sleep(0.2)
            raise ConnectionError(f"item {arg['i']} failed")
        return {"done": [arg["i"]]}

    b = StateGraph(FanState)
    b.add_node("work", work)
    b.add_conditional_edges(START, lambda s: [Send("work", {"i": i}) for i in s["items"]], ["work"])
    graph = b.compile(checkpointer=InMemorySaver(), name="fan")
    handler = FlowscopeCallbackHandler(store)
    cfg = config(handler, "t-fanfail")
    with pytest.raises(ConnectionError):
        graph.invoke({"items": [1, 2, 3]}, cfg)
    failing.clear()
    assert sorted(graph.invoke(None, cfg)["done"]) == [1, 2, 3]
    log = store.read("t-fanfail")
    assert (
        len({e.path for e in log if isinstance(e, NodeStarted) and e.node == "work"}) == 3
    )  # three runs, no more
    for err in [e for e in log if isinstance(e, NodeErrorEvent)]:
        item = int(err.error_message.split()[1])
        (done,) = [e for e in of(log, err.path) if isinstance(e, NodeCompleted)]
        assert done.output == {"done": [item]} and done.attempt_count == 2


def test_a_resume_in_another_process_continues_the_failed_run_by_order(store):
    # A second handler knows nothing of the first one's task ids (another process).
    fails = [True]

    def flaky(state: State) -> State:
        if fails[0]:
            raise ConnectionError("down")
        return {"n": 1}

    b = StateGraph(State)
    b.add_node("prep", lambda s: {"n": 0})
    b.add_node("flaky", flaky)
    b.add_edge(START, "prep")
    b.add_edge("prep", "flaky")
    graph = b.compile(checkpointer=InMemorySaver(), name="handoff")
    with pytest.raises(ConnectionError):
        graph.invoke({"n": 0}, config(FlowscopeCallbackHandler(store), "t-handoff"))
    fails[0] = False
    assert graph.invoke(None, config(FlowscopeCallbackHandler(store), "t-handoff")) == {"n": 1}
    log = store.read("t-handoff")
    assert [(e.path, e.attempt) for e in log if isinstance(e, NodeStarted) and e.path != "handoff@1"] == [
        ("handoff@1/prep@1", 1),
        ("handoff@1/flaky@1", 1),
        ("handoff@1/flaky@1", 2),
    ]
    assert rebuild(log).nodes["handoff@1/flaky@1"].status == "completed"


async def test_the_callers_context_holds_no_span_after_ainvoke_and_a_node_bodys_span_is_the_nodes_child(
    store,
):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    user = provider.get_tracer("user-code")

    def body(state: State) -> State:
        with user.start_as_current_span("user-span"):
            return {"n": 1}

    b = StateGraph(State)
    b.add_node("a", body)
    b.add_edge(START, "a")
    graph = b.compile(name="ctx")
    handler = FlowscopeCallbackHandler(store, plugins=[TracingPlugin(tracer_provider=provider)])
    await graph.ainvoke({"n": 0}, config(handler, "t-ctx-1"))
    assert not trace.get_current_span().get_span_context().is_valid  # nothing left current in the caller
    await graph.ainvoke({"n": 0}, config(handler, "t-ctx-2"))
    traces = {
        rebuild(store.read(sid)).trace_context["traceparent"].split("-")[1] for sid in ("t-ctx-1", "t-ctx-2")
    }
    assert len(traces) == 2  # the second invocation did not join the first one's trace

    exporter.clear()
    graph.invoke({"n": 0}, config(handler, "t-ctx-3"))
    spans = exporter.get_finished_spans()
    (mine,) = [s for s in spans if s.name == "user-span"]
    (node,) = [s for s in spans if s.attributes.get("flowscope.node.path") == "ctx@1/a@1"]
    assert mine.parent.span_id == node.context.span_id


def test_the_recorder_holds_only_the_threads_being_recorded(store):
    """A thread's fold is kept while an invocation of it is recorded and let go when it
    ends (the next one folds the log again), so a process serving thousands of threads
    holds none of those done; a paused one, let go, resumes exactly."""
    handler = FlowscopeCallbackHandler(store)
    during: list[set[str]] = []

    def look(state: State) -> State:
        during.append(set(handler.recorder._sessions))
        return {"answer": interrupt("go on?")}

    g = StateGraph(State)
    g.add_node("look", look)
    g.add_edge(START, "look")
    g.add_edge("look", END)
    graph = g.compile(checkpointer=InMemorySaver(), name="looks")
    for i in range(10):
        graph.invoke({"n": i}, config(handler, f"t{i}"))  # pauses at "look"
    assert during == [{f"t{i}"} for i in range(10)]  # kept while recorded
    assert handler.recorder._sessions == {}
    assert graph.invoke(Command(resume="yes"), config(handler, "t3")) == {"n": 3, "answer": "yes"}
    assert handler.recorder._sessions == {}
    log = store.read("t3")
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["paused", "completed"]
    assert [r.resumed for r in log if isinstance(r, RunStarted)] == [False, True]
    assert [e.attempt for e in of(log, "looks@1/look@1") if isinstance(e, NodeStarted)] == [1, 1]


# --------------------------------------------------------------------------- subgraphs run again


def _counting_subgraph(fail_first: int, ran: dict[str, int]) -> Any:
    """pre -> step, where step raises ConnectionError on its first ``fail_first`` runs."""

    def pre(s: State) -> State:
        ran["pre"] += 1
        return {"n": 1}

    def step(s: State) -> State:
        ran["step"] += 1
        if ran["step"] <= fail_first:
            raise ConnectionError(f"upstream down ({ran['step']})")
        return {"n": s["n"] + 1}

    sub = StateGraph(State)
    sub.add_node("pre", pre)
    sub.add_node("step", step)
    sub.add_edge(START, "pre")
    sub.add_edge("pre", "step")
    return sub.compile()


def test_a_subgraph_a_node_calls_twice_records_both_calls_runs(store):
    ran = {"pre": 0, "step": 0}
    sub = _counting_subgraph(0, ran)

    def outer(s: State) -> State:  # the same sub-pipeline for two documents
        first = sub.invoke({"n": s["n"]})
        return sub.invoke({"n": first["n"] * 10})

    g = StateGraph(State)
    g.add_node("outer", outer)
    g.add_edge(START, "outer")
    g.add_edge("outer", END)
    handler = FlowscopeCallbackHandler(store)
    assert g.compile(name="host").invoke({"n": 1}, config(handler, "t1")) == {"n": 2}
    assert ran == {"pre": 2, "step": 2}
    log = store.read("t1")
    completed = [e.path for e in log if isinstance(e, NodeCompleted)]
    for path in (
        "host@1/outer@1/pre@1",
        "host@1/outer@1/step@1",
        "host@1/outer@1/pre@2",
        "host@1/outer@1/step@2",
    ):
        assert path in completed
    assert {e.path for e in log if isinstance(e, NodeStarted)} == set(completed)


def test_a_retried_subgraph_nodes_failed_runs_end_failed_before_its_retry(store):
    ran = {"pre": 0, "step": 0}
    g = StateGraph(State)
    g.add_node("sub", _counting_subgraph(2, ran), retry_policy=policy(3, ConnectionError))
    g.add_edge(START, "sub")
    handler = FlowscopeCallbackHandler(store)
    assert g.compile(name="outer").invoke({"n": 0}, config(handler, "t1")) == {"n": 2}
    assert ran == {"pre": 3, "step": 3}
    log = store.read("t1")
    ends = [
        (type(e).__name__, e.path)
        for e in log
        if isinstance(e, (NodeCompleted, NodeErrorEvent, NodeRetrying))
        and (e.path == "outer@1/sub@1" or "/step@" in e.path)
    ]
    assert ends == [
        ("NodeErrorEvent", "outer@1/sub@1/step@1"),
        ("NodeRetrying", "outer@1/sub@1"),
        ("NodeErrorEvent", "outer@1/sub@1/step@2"),
        ("NodeRetrying", "outer@1/sub@1"),
        ("NodeCompleted", "outer@1/sub@1/step@3"),
        ("NodeCompleted", "outer@1/sub@1"),
    ]
    assert {e.error_type for e in log if isinstance(e, NodeErrorEvent)} == {"ConnectionError"}
    state = rebuild(log)
    assert state.nodes["outer@1/sub@1"].attempt == 3
    assert [state.nodes[f"outer@1/sub@1/pre@{k}"].status for k in (1, 2, 3)] == ["completed"] * 3


def test_a_subgraph_failure_a_node_catches_ends_the_subgraphs_run_failed(store):
    ran = {"pre": 0, "step": 0}
    sub = _counting_subgraph(1, ran)

    def careful(s: State) -> State:
        try:
            return sub.invoke({"n": 0})
        except ConnectionError:
            return {"n": -1}

    g = StateGraph(State)
    g.add_node("careful", careful)
    g.add_edge(START, "careful")
    handler = FlowscopeCallbackHandler(store)
    assert g.compile(name="host").invoke({"n": 0}, config(handler, "t1")) == {"n": -1}
    state = rebuild(store.read("t1"))
    assert state.nodes["host@1/careful@1/step@1"].status == "failed"
    assert state.nodes["host@1/careful@1"].status == "completed"
    assert state.status == "completed"


def test_new_input_over_an_unanswered_interrupt_supersedes_it_and_the_answer_reaches_the_new_one(
    store, tmp_path
):
    def ask(s: State) -> State:
        return {"answer": interrupt(f"approve {s['n']}?")}

    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    graph = g.compile(name="ab", checkpointer=InMemorySaver())
    cfg = config(FlowscopeCallbackHandler(store), "t1")
    graph.invoke({"n": 1}, cfg)
    graph.invoke({"n": 2}, cfg)  # the user asks something new: LangGraph drops the first question
    assert [i.value for i in graph.get_state(cfg).interrupts] == ["approve 2?"]
    assert graph.invoke(Command(resume="yes"), cfg) == {"n": 2, "answer": "yes"}
    log = store.read("t1")
    [dropped] = [e for e in log if e.type == "node_cancelled"]
    assert (dropped.path, dropped.reason) == ("ab@1/ask@1", "superseded")
    [received] = [e for e in log if isinstance(e, InputReceived)]
    assert (received.path, received.value) == ("ab@1/ask@2", "yes")
    state = rebuild(log)
    assert state.status == "completed" and state.pending == []
    assert store.open_runs() == []
    db = str(tmp_path / "lg.db")
    assert "nothing stuck" in cli_ok("--db", db, "stuck", "--older-than", "0s")


def test_a_node_named_with_a_slash_or_an_at_sign_is_one_run_at_one_path(store):
    g = StateGraph(State)
    g.add_node("search/web", lambda s: {"n": 1})
    g.add_node("notify@slack", lambda s: {"n": 2})
    g.add_node("100%", lambda s: {"n": 3})
    g.add_edge(START, "search/web")
    g.add_edge("search/web", "notify@slack")
    g.add_edge("notify@slack", "100%")
    graph = g.compile(checkpointer=InMemorySaver())
    handler = FlowscopeCallbackHandler(store, workflow="team/names")
    graph.invoke({"n": 0}, config(handler, "t1"))
    handler.close()
    ws = rebuild(store.read("t1"))
    # a path is parent/name@k: the names are escaped in it, never split into made-up runs
    assert {p: (n.node, n.kind, n.parent_path, n.status) for p, n in ws.nodes.items()} == {
        "team%2Fnames@1": ("team/names", "workflow", "", "completed"),
        "team%2Fnames@1/search%2Fweb@1": ("search/web", "function", "team%2Fnames@1", "completed"),
        "team%2Fnames@1/notify%40slack@1": ("notify@slack", "function", "team%2Fnames@1", "completed"),
        "team%2Fnames@1/100%25@1": ("100%", "function", "team%2Fnames@1", "completed"),
    }
    assert ws.workflow == "team/names"


@pytest.mark.parametrize("handler_fails", [False, True])
@pytest.mark.parametrize("default", [False, True])
def test_a_nodes_error_handler_is_a_run_beside_the_node_that_failed_for_good(store, handler_fails, default):
    def fetch(state: State) -> State:
        raise ConnectionError("upstream down")

    def fallback(state: State) -> State:
        if handler_fails:
            raise KeyError("fallback cache missing")
        return {"n": 7}

    g = StateGraph(State)
    if default:  # the graph's default handler: LangGraph's __default_error_handler__ task
        g.set_node_defaults(error_handler=fallback)
        g.add_node("fetch", fetch, retry_policy=policy(2, ConnectionError))
    else:
        g.add_node("fetch", fetch, retry_policy=policy(2, ConnectionError), error_handler=fallback)
    g.add_edge(START, "fetch")
    g.add_edge("fetch", END)
    graph = g.compile(checkpointer=InMemorySaver())
    handler = FlowscopeCallbackHandler(store, workflow="eh")
    if handler_fails:
        with pytest.raises(KeyError):
            graph.invoke({"n": 0}, config(handler, "t1"))
    else:
        assert graph.invoke({"n": 0}, config(handler, "t1")) == {"n": 7}
    handler.close()
    log = store.read("t1")
    ws = rebuild(log)
    name = "__default_error_handler__" if default else "__error_handler__fetch"
    assert {p: n.status for p, n in ws.nodes.items()} == {
        "eh@1": "failed" if handler_fails else "completed",
        "eh@1/fetch@1": "failed",  # both attempts, then the graph handed its failure on
        f"eh@1/{name}@1": "failed" if handler_fails else "completed",
    }
    [fetch_error] = [e for e in of(log, "eh@1/fetch@1") if isinstance(e, NodeErrorEvent)]
    assert (fetch_error.error_type, fetch_error.attempt_count) == ("ConnectionError", 2)
    # the fetch failed for good before its handler started, not when the graph ended
    starts = [e.path for e in log if isinstance(e, NodeStarted)]
    assert log.index(fetch_error) < log.index(next(e for e in of(log, f"eh@1/{name}@1")))
    assert starts == ["eh@1", "eh@1/fetch@1", f"eh@1/{name}@1"]
    if handler_fails:  # the failure is the handler's, at its own path
        assert ws.error_path == f"eh@1/{name}@1"
        [handler_error] = [e for e in of(log, f"eh@1/{name}@1") if isinstance(e, NodeErrorEvent)]
        assert handler_error.error_type == "KeyError"
    else:
        assert ws.status == "completed"


def test_send_branches_that_interrupt_are_resumed_at_their_own_runs_by_any_handler(store):
    class Items(TypedDict, total=False):
        items: list
        out: Annotated[list, operator.add]

    def review(state: dict) -> dict:
        answer = interrupt({"question": f"approve item {state['x']}?"})
        return {"out": [f"item{state['x']}={answer}"]}

    g = StateGraph(Items)
    g.add_node("review", review)
    g.add_conditional_edges(START, lambda s: [Send("review", {"x": i}) for i in s["items"]], ["review"])
    graph = g.compile(checkpointer=InMemorySaver())

    def invoke(value: Any) -> Any:  # a handler per request, as a web server makes them
        handler = FlowscopeCallbackHandler(store, workflow="rv")
        try:
            return graph.invoke(value, config(handler, "t1"))
        finally:
            handler.close()

    ids = {i.value["question"]: i.id for i in invoke({"items": list(range(1, 7))})["__interrupt__"]}
    invoke(Command(resume={ids["approve item 2?"]: "yes2"}))
    rest = {iid: f"yes{q.split()[2].rstrip('?')}" for q, iid in ids.items() if q != "approve item 2?"}
    assert sorted(invoke(Command(resume=rest))["out"]) == [f"item{i}=yes{i}" for i in range(1, 7)]
    log = store.read("t1")
    asked = {e.path: e.prompt for e in log if isinstance(e, InputRequested)}
    answered = {e.path: e.value for e in log if isinstance(e, InputReceived)}
    completed = {e.path: e.output["out"] for e in log if isinstance(e, NodeCompleted) and e.path != "rv@1"}
    assert len(asked) == len(answered) == len(completed) == 6
    for path, question in asked.items():  # each run: the question it asked, its answer, its output
        x = question.split()[2].rstrip("?")
        assert (answered[path], completed[path]) == (f"yes{x}", [f"item{x}=yes{x}"]), path


async def test_a_task_waiting_out_its_backoff_when_a_sibling_fails_is_cancelled_not_failed(store):
    calls: dict[str, int] = {}

    async def flaky(state: State) -> State:
        calls["flaky"] = calls.get("flaky", 0) + 1
        if calls["flaky"] == 1:
            raise ConnectionError("transient")
        return {}

    async def broken(state: State) -> State:
        calls["broken"] = calls.get("broken", 0) + 1
        if calls["broken"] == 1:
            await asyncio.sleep(0.05)  # flaky has failed once and waits out its backoff
            raise ValueError("hard failure")
        return {}

    graph = flaky_beside_broken(State, flaky, broken, 3, 5.0).compile(checkpointer=InMemorySaver())
    handler = FlowscopeCallbackHandler(store, workflow="par")
    with pytest.raises(ValueError):
        await graph.ainvoke({"n": 0}, config(handler, "t1"))
    log = store.read("t1")
    # one fault, one failure: LangGraph cancelled flaky's retry, which never ran
    assert [e.path for e in log if isinstance(e, NodeErrorEvent)] == ["par@1/broken@1"]
    flaky_events = [type(e).__name__ for e in of(log, "par@1/flaky@1")]
    assert flaky_events == ["NodeStarted", "NodeRetrying", "NodeCancelled"]
    assert rebuild(log).error_path == "par@1/broken@1"
    # a resume runs both again at their runs, the numbering continued as the engine's own
    # does for a run cancelled in its backoff: attempt 2 was announced, then cancelled
    await graph.ainvoke(None, config(handler, "t1"))
    handler.close()
    ws = rebuild(store.read("t1"))
    assert {p: (n.status, n.attempt) for p, n in ws.nodes.items() if p != "par@1"} == {
        "par@1/flaky@1": ("completed", 3),
        "par@1/broken@1": ("completed", 2),
    }
