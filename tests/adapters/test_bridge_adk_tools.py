"""The ADK bridge on agent nodes that call tools: a call ADK waits on (a long-running tool,
a tool that asks for confirmation) pauses the agent's run with an input request, as ADK
pauses the node, and the message that answers it runs the agent again: the bridge records
what ADK did and changes none of it (each test runs ADK without the bridge beside it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.long_running_tool import LongRunningFunctionTool
from google.adk.workflow import FunctionNode, Workflow
from google.genai import types

from commands import cli_ok
from flowscope.adapters.adk import FlowscopeADK
from flowscope.events import InputReceived, InputRequested
from flowscope.fold import rebuild
from flowscope.store import SqliteEventStore

# imports take seconds (google.adk): the whole module is in the slow set
pytestmark = pytest.mark.slow

APP, USER = "tools", "u"


class ScriptedModel(BaseLlm):
    """A model whose every turn is ``script(request)``: no network, ADK's own model port."""

    model: str = "scripted"
    script: Any = None

    async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
        yield self.script(llm_request)


def said(text: str) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def calls(name: str, args: dict[str, Any], call_id: str) -> LlmResponse:
    call = types.FunctionCall(name=name, args=args, id=call_id)
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))


def responses(request: Any) -> dict[str, Any]:
    """The function responses the model has seen, by name."""
    return {
        p.function_response.name: p.function_response.response
        for c in request.contents
        for p in (c.parts or [])
        if p.function_response is not None
    }


async def drive(workflow: Workflow, bridge: FlowscopeADK | None, answer: Any) -> tuple[str, list[Any]]:
    """Start a session, then send ``answer(first run's events)`` as the next message."""
    sessions = InMemorySessionService()
    root = bridge.instrument(workflow) if bridge is not None else workflow
    runner = Runner(
        app=App(name=APP, root_agent=root, plugins=[bridge.plugin] if bridge is not None else []),
        session_service=sessions,
    )
    sid = (await sessions.create_session(app_name=APP, user_id=USER)).id

    async def send(message: Any) -> list[Any]:
        return [e async for e in runner.run_async(user_id=USER, session_id=sid, new_message=message)]

    first = await send(types.Content(role="user", parts=[types.Part(text="go")]))
    second = await send(types.Content(role="user", parts=[answer(first)]))
    return sid, [*first, *second]


def waited_call(events: list[Any]) -> types.FunctionCall:
    """The one function call ADK waits on in ``events`` (its id in long_running_tool_ids)."""
    [call] = [
        p.function_call
        for e in events
        if e.content is not None and e.long_running_tool_ids
        for p in (e.content.parts or [])
        if p.function_call is not None and p.function_call.id in e.long_running_tool_ids
    ]
    return call


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteEventStore(str(tmp_path / "tools.db"))
    yield s
    s.close()


def refund_workflow(counts: dict[str, int], got: list[Any]) -> Workflow:
    def open_ticket(purpose: str) -> dict:
        """Open an approval ticket: approved later, by a person."""
        counts["ticket"] += 1
        return {"status": "pending"}

    def script(request: Any) -> LlmResponse:
        counts["model"] += 1
        seen = responses(request)
        if "open_ticket" not in seen:
            return calls("open_ticket", {"purpose": "refund"}, "lr-1")
        return said("refund approved" if seen["open_ticket"].get("status") == "approved" else "waiting")

    def after(node_input: Any) -> Any:
        got.append(node_input)
        return {"after": node_input}

    agent = LlmAgent(
        name="refunder", model=ScriptedModel(script=script), tools=[LongRunningFunctionTool(open_ticket)]
    )
    return Workflow(name="refund", edges=[("START", agent, FunctionNode(func=after, name="after"))])


async def test_a_long_running_tool_call_pauses_the_agent_and_its_response_runs_it_again(store, tmp_path):
    def approved(first: list[Any]) -> types.Part:
        call = waited_call(first)
        response = types.FunctionResponse(id=call.id, name=call.name, response={"status": "approved"})
        return types.Part(function_response=response)

    plain: tuple[dict[str, int], list[Any]] = ({"ticket": 0, "model": 0}, [])
    await drive(refund_workflow(*plain), None, approved)
    bridged: tuple[dict[str, int], list[Any]] = ({"ticket": 0, "model": 0}, [])
    sid, _ = await drive(refund_workflow(*bridged), FlowscopeADK(store), approved)

    assert bridged == plain == ({"ticket": 1, "model": 3}, ["refund approved"])  # ADK's own run, unchanged
    log = store.read(sid)
    [asked] = [e for e in log if isinstance(e, InputRequested)]
    assert (asked.path, asked.interrupt_id, asked.prompt) == ("refund@1/refunder@1", "lr-1", "open_ticket")
    [answer] = [e for e in log if isinstance(e, InputReceived)]
    assert (answer.interrupt_id, answer.value) == ("lr-1", {"status": "approved"})
    assert [e.status for e in log if e.type == "run_finished"] == ["paused", "completed"]
    state = rebuild(log)
    agent = state.nodes["refund@1/refunder@1"]
    assert (agent.status, agent.attempt, agent.kind, agent.output) == (
        "completed",
        1,
        "agent",
        "refund approved",
    )
    assert store.open_runs() == []


async def test_a_tool_that_asks_for_confirmation_pauses_until_the_confirmation_and_then_runs(store, tmp_path):
    def workflow(counts: dict[str, int], got: list[Any]) -> Workflow:
        def transfer_money(amount: int) -> dict:
            """Transfer money."""
            counts["transfer"] += 1
            return {"ok": True}

        def script(request: Any) -> LlmResponse:
            return (
                said("transferred")
                if "transfer_money" in responses(request)
                else (calls("transfer_money", {"amount": 5}, "tm-1"))
            )

        agent = LlmAgent(
            name="banker",
            model=ScriptedModel(script=script),
            tools=[FunctionTool(transfer_money, require_confirmation=True)],
        )
        return Workflow(
            name="bank",
            edges=[
                ("START", agent, FunctionNode(func=lambda node_input: got.append(node_input), name="after"))
            ],
        )

    def confirmed(first: list[Any]) -> types.Part:
        call = waited_call(first)
        response = types.FunctionResponse(id=call.id, name=call.name, response={"confirmed": True})
        return types.Part(function_response=response)

    plain: tuple[dict[str, int], list[Any]] = ({"transfer": 0}, [])
    await drive(workflow(*plain), None, confirmed)
    bridged: tuple[dict[str, int], list[Any]] = ({"transfer": 0}, [])
    db = tmp_path / "tools.db"
    sid, _ = await drive(workflow(*bridged), FlowscopeADK(store), confirmed)

    assert bridged == plain == ({"transfer": 1}, ["transferred"])  # the confirmed transfer ran, once
    log = store.read(sid)
    [asked] = [e for e in log if isinstance(e, InputRequested)]
    assert (
        asked.path == "bank@1/banker@1" and asked.payload["originalFunctionCall"]["name"] == "transfer_money"
    )
    assert [e.status for e in log if e.type == "run_finished"] == ["paused", "completed"]
    assert rebuild(log).nodes["bank@1/banker@1"].status == "completed"
    assert "nothing stuck" in cli_ok("--db", str(db), "stuck", "--older-than", "0s")
