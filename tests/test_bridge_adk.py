"""The ADK bridge (issue 17) against the real google-adk: function nodes only, no model, no network."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.adk.events.request_input import RequestInput
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.workflow import FunctionNode, RetryConfig, Workflow
from google.adk.workflow.utils._workflow_hitl_utils import create_request_input_response
from google.genai import types
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowscope.adapters.adk import FlowscopeADK
from flowscope.events import InputReceived, InputRequested, NodeCompleted, NodeErrorEvent, NodeRetrying, NodeStarted, RunFinished, RunStarted
from flowscope.export import session_spans
from flowscope.fold import rebuild
from flowscope.observability import MetricsPlugin, TracingPlugin
from flowscope.store import SqliteEventStore

# imports take seconds (tests/conftest.py: SLOW_TO_IMPORT): the whole module is in the slow set
pytestmark = pytest.mark.slow

APP, USER = "bridge", "u"
RETRY = RetryConfig(max_attempts=3, initial_delay=0.0, jitter=0.0)


class Driver:
    """An ADK Runner over an in-memory session service, with or without the bridge."""

    def __init__(self, workflow: Workflow, bridge: FlowscopeADK | None) -> None:
        self.sessions = InMemorySessionService()
        node = bridge.instrument(workflow) if bridge is not None else workflow
        plugins = [bridge.plugin] if bridge is not None else []
        self.runner = Runner(app_name=APP, node=node, session_service=self.sessions, plugins=plugins)
        self.session_id = ""

    async def start(self, text: str = "go") -> list[Any]:
        self.session_id = (await self.sessions.create_session(app_name=APP, user_id=USER)).id
        return await self._send(types.Content(role="user", parts=[types.Part(text=text)]))

    async def answer(self, interrupt_id: str, response: dict[str, Any]) -> list[Any]:
        return await self._send(types.Content(role="user", parts=[create_request_input_response(interrupt_id, response)]))

    async def _send(self, message: Any) -> list[Any]:
        return [e async for e in self.runner.run_async(user_id=USER, session_id=self.session_id, new_message=message)]


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteEventStore(str(tmp_path / "adk.db"))
    yield s
    s.close()


def seed_workflow(emails: list[str]) -> Workflow:
    """The seed scenario: a node that sends an email and returns nothing, then a node that asks."""

    def send_email(node_input: Any) -> None:
        emails.append("sent")

    def ask(ctx: Any, node_input: Any) -> Any:
        if "approval" in ctx.resume_inputs:
            return {"approved": ctx.resume_inputs["approval"]["ok"]}
        return RequestInput(interrupt_id="approval", message="send the report?", payload={"to": "ops"})

    return Workflow(
        name="report",
        edges=[("START", FunctionNode(func=send_email, name="send_email"), FunctionNode(func=ask, name="ask", rerun_on_resume=True))],
    )


async def test_seed_scenario_sends_one_email_with_the_bridge_and_two_without(store):
    without: list[str] = []
    plain = Driver(seed_workflow(without), None)
    await plain.start()
    await plain.answer("approval", {"ok": True})
    assert without == ["sent", "sent"]  # ADK 2.13 alone re-runs the node that returned nothing

    emails: list[str] = []
    bridge = FlowscopeADK(store)
    d = Driver(seed_workflow(emails), bridge)
    events = await d.start()
    assert events[-1].long_running_tool_ids == {"approval"}  # ADK paused
    final = await d.answer("approval", {"ok": True})
    assert final[-1].output == {"approved": True}
    assert emails == ["sent"]

    log = store.read(d.session_id)
    marker = [e for e in log if isinstance(e, NodeCompleted) and e.path == "report@1/send_email@1"]
    assert len(marker) == 1 and marker[0].has_output is False and marker[0].completed is True
    started = [e.path for e in log if isinstance(e, NodeStarted)]
    assert started.count("report@1/send_email@1") == 1  # not started again by the resume
    runs = [e for e in log if isinstance(e, RunStarted)]
    assert [r.resumed for r in runs] == [False, True] and runs[0].invocation_id != runs[1].invocation_id
    req = next(e for e in log if isinstance(e, InputRequested))
    assert (req.path, req.interrupt_id, req.prompt, req.payload) == ("report@1/ask@1", "approval", "send the report?", {"to": "ops"})
    got = next(e for e in log if isinstance(e, InputReceived))
    assert (got.path, got.value) == ("report@1/ask@1", {"ok": True})
    assert [e.status for e in log if isinstance(e, RunFinished)] == ["paused", "completed"]
    ws = rebuild(log)
    assert ws.status == "completed" and ws.output == {"approved": True}
    assert {p: n.status for p, n in ws.nodes.items()} == {
        "report@1": "completed",
        "report@1/send_email@1": "completed",
        "report@1/ask@1": "completed",
    }


def retry_workflow(calls: dict[str, int]) -> Workflow:
    def flaky(node_input: Any) -> int:
        calls["flaky"] = calls.get("flaky", 0) + 1
        if calls["flaky"] < 3:
            raise ConnectionError(f"upstream down ({calls['flaky']})")
        return calls["flaky"]

    def doomed(node_input: Any) -> None:
        calls["doomed"] = calls.get("doomed", 0) + 1
        raise PermissionError("token revoked")

    return Workflow(
        name="sync",
        edges=[("START", FunctionNode(func=flaky, name="flaky", retry_config=RETRY), FunctionNode(func=doomed, name="doomed", retry_config=RETRY))],
    )


async def test_retries_and_a_final_failure(store):
    calls: dict[str, int] = {}
    d = Driver(retry_workflow(calls), FlowscopeADK(store))
    with pytest.raises(PermissionError):
        await d.start()
    assert calls == {"flaky": 3, "doomed": 3}
    log = store.read(d.session_id)
    flaky = [e for e in log if e.path == "sync@1/flaky@1"]
    assert [type(e).__name__ for e in flaky] == ["NodeStarted", "NodeRetrying", "NodeRetrying", "NodeCompleted"]
    assert [e.attempt for e in flaky if isinstance(e, NodeRetrying)] == [1, 2]
    assert all(e.error_type == "ConnectionError" and e.error_code == "UNKNOWN_ERROR" for e in flaky if isinstance(e, NodeRetrying))
    assert flaky[-1].attempt_count == 3 and flaky[-1].output == 3

    errors = [e for e in log if isinstance(e, NodeErrorEvent)]
    assert len(errors) == 1  # one record, at the deepest path, not one per attempt or per level
    err = errors[0]
    assert (err.path, err.error_type, err.error_code, err.error_message, err.attempt_count) == (
        "sync@1/doomed@1", "PermissionError", "UNKNOWN_ERROR", "token revoked", 3
    )
    assert len([e for e in log if isinstance(e, NodeRetrying) and e.path == "sync@1/doomed@1"]) == 2
    finished = log[-1]
    assert isinstance(finished, RunFinished)
    assert (finished.status, finished.error_code, finished.error_path) == ("failed", "UNKNOWN_ERROR", "sync@1/doomed@1")
    ws = rebuild(log)
    assert ws.nodes["sync@1"].status == "failed" and ws.nodes["sync@1"].origin_path == "sync@1/doomed@1"


async def test_attempt_numbers_continue_across_an_adk_resume(store):
    seen: list[int] = []  # ADK's own attempt counter, as the node sees it

    def approve(ctx: Any, node_input: Any) -> Any:
        seen.append(ctx.attempt_count)
        if len(seen) in (1, 3):
            raise TimeoutError("slow approver")
        if "ok" not in ctx.resume_inputs:
            return RequestInput(interrupt_id="ok", message="approve?")
        return {"approved": ctx.resume_inputs["ok"]["yes"]}

    wf = Workflow(name="gate", edges=[("START", FunctionNode(func=approve, name="approve", retry_config=RETRY, rerun_on_resume=True))])
    d = Driver(wf, FlowscopeADK(store))
    await d.start()
    await d.answer("ok", {"yes": True})
    assert seen == [1, 2, 1, 2]  # ADK restarts its counter at 1 after the resume

    log = [e for e in store.read(d.session_id) if e.path == "gate@1/approve@1"]
    assert [(type(e).__name__, getattr(e, "attempt", getattr(e, "attempt_count", None))) for e in log] == [
        ("NodeStarted", 1),
        ("NodeRetrying", 1),
        ("InputRequested", None),
        ("InputReceived", None),
        ("NodeStarted", 2),  # re-executing after the pause continues attempt 2
        ("NodeRetrying", 2),
        ("NodeCompleted", 3),  # and the audit counts every attempt ever made
    ]
    assert rebuild(store.read(d.session_id)).nodes["gate@1/approve@1"].attempt == 3


async def test_a_fresh_adk_invocation_in_the_same_session_runs_the_nodes_again(store):
    emails: list[str] = []
    d = Driver(seed_workflow(emails), FlowscopeADK(store))
    await d.start()
    await d.answer("approval", {"ok": False})
    await d._send(types.Content(role="user", parts=[types.Part(text="again")]))  # a new run, not a resume
    assert emails == ["sent", "sent"]
    runs = [e for e in store.read(d.session_id) if isinstance(e, RunStarted)]
    assert [r.resumed for r in runs] == [False, True, False]


async def test_spans_nest_by_path_live_and_from_the_log(store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    calls: dict[str, int] = {}

    def flaky(node_input: Any) -> int:
        calls["n"] = calls.get("n", 0) + 1
        if calls["n"] < 3:
            raise ConnectionError("again")
        return 1

    inner = Workflow(name="inner", edges=[("START", FunctionNode(func=flaky, name="flaky", retry_config=RETRY))])
    wf = Workflow(name="outer", edges=[("START", inner, FunctionNode(func=lambda node_input: None, name="tail"))])
    metrics = MetricsPlugin()
    d = Driver(wf, FlowscopeADK(store, plugins=[TracingPlugin(tracer_provider=provider), metrics]))
    await d.start()

    mine = [s for s in exporter.get_finished_spans() if s.instrumentation_scope.name == "flowscope"]
    by_path = {s.attributes["flowscope.node.path"]: s for s in mine if "flowscope.node.path" in s.attributes}
    assert set(by_path) == {"outer@1", "outer@1/inner@1", "outer@1/inner@1/flaky@1", "outer@1/tail@1"}
    # one span for the invocation and its top workflow's run (issue 15)
    (inv,) = [s for s in mine if s.attributes.get("gen_ai.operation.name") == "invoke_workflow" and s.parent is None]
    assert inv.name == "invoke_workflow outer" and inv.attributes["flowscope.run.outcome"] == "completed"

    def parent(path: str) -> int:
        return by_path[path].parent.span_id

    assert by_path["outer@1"] is inv
    assert parent("outer@1/inner@1") == parent("outer@1/tail@1") == by_path["outer@1"].context.span_id
    assert parent("outer@1/inner@1/flaky@1") == by_path["outer@1/inner@1"].context.span_id
    flaky_span = by_path["outer@1/inner@1/flaky@1"]
    assert flaky_span.name == "invoke_node flaky" and flaky_span.attributes["flowscope.node.attempt_count"] == 3
    assert [e.name for e in flaky_span.events] == ["node.retry", "node.retry"]
    tail = by_path["outer@1/tail@1"].attributes
    assert tail["flowscope.node.completed"] is True and tail["flowscope.node.has_output"] is False

    exported = {s.attributes.get("flowscope.node.path"): s for s in session_spans(store.read(d.session_id))}
    for path in by_path:
        if "/" not in path:
            assert exported[path].parent is None and exported[path].context == inv.context
            continue
        assert exported[path].parent.span_id == exported[path.rsplit("/", 1)[0]].context.span_id
    assert exported["outer@1/inner@1/flaky@1"].attributes["flowscope.node.attempt_count"] == 3

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics.registry.collect() for s in m.samples}
    assert samples[("flowscope_node_retries_total", (("error_type", "ConnectionError"), ("node", "flaky"), ("workflow", "outer")))] == 2
    assert samples[("flowscope_node_runs_total", (("node", "tail"), ("outcome", "success"), ("workflow", "outer")))] == 1


@pytest.mark.slow
async def test_flowscope_cli_audits_an_adk_session(store, tmp_path):
    calls: dict[str, int] = {}
    d = Driver(retry_workflow(calls), FlowscopeADK(store))
    with pytest.raises(PermissionError):
        await d.start()
    emails: list[str] = []
    d2 = Driver(seed_workflow(emails), FlowscopeADK(store))
    await d2.start()  # left waiting for input
    db = str(tmp_path / "adk.db")
    cli = str(Path(sys.executable).with_name("flowscope"))

    audit = json.loads(subprocess.run([cli, "audit", "--db", db, "--format", "json"], capture_output=True, text=True, check=True).stdout)
    rows = {(r["workflow"], r["node"]): r for r in audit}
    assert rows[("sync", "flaky")]["attempts"] == 3 and rows[("sync", "flaky")]["retries"] == 2
    assert rows[("sync", "doomed")]["attempts"] == 3 and rows[("sync", "doomed")]["errors"] == 1
    assert rows[("sync", "sync")]["kind"] == "workflow"
    assert rows[("report", "send_email")]["completed"] == 1

    stuck = json.loads(subprocess.run([cli, "stuck", "--db", db, "--format", "json", "--older-than", "0s"], capture_output=True, text=True, check=True).stdout)
    assert [(r["session_id"], r["path"], r["state"]) for r in stuck] == [(d2.session_id, "report@1/ask@1", "waiting_input")]
    for cmd in (["runs"], ["show", d.session_id], ["export", d.session_id]):
        subprocess.run([cli, *cmd, "--db", db], capture_output=True, text=True, check=True)
