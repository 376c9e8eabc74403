"""An ADK workflow recorded by flowscope: the seed scenario, sent once, then audited.

    pip install 'flowscope[adk]'
    python examples/adk_example.py            # writes adk-example.db
    flowscope audit --db adk-example.db       # attempts per node
    flowscope show SESSION --db adk-example.db

A node sends an email and returns nothing, a flaky node succeeds on its third attempt,
and a node asks for approval; the script answers and ADK resumes. Without the bridge ADK
would send the email twice (it re-runs the node that left no trace); with it, once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from google.adk.apps import App
from google.adk.events.request_input import RequestInput
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.workflow import FunctionNode, RetryConfig, Workflow
from google.adk.workflow.utils._workflow_hitl_utils import create_request_input_response
from google.genai import types

from flowscope.adapters.adk import FlowscopeADK
from flowscope.observability import MetricsPlugin, TracingPlugin
from flowscope.store import SqliteEventStore

sent: list[str] = []
calls = {"fetch": 0}


def send_email(node_input: Any) -> None:
    sent.append("report")
    print("  email sent")


def fetch(node_input: Any) -> dict[str, int]:
    calls["fetch"] += 1
    if calls["fetch"] < 3:
        raise ConnectionError("upstream busy")
    return {"rows": 42}


def approve(ctx: Any, node_input: Any) -> Any:
    if "approval" in ctx.resume_inputs:
        return {"approved": ctx.resume_inputs["approval"]["ok"], **node_input}
    return RequestInput(interrupt_id="approval", message="publish the report?")


async def main() -> None:
    store = SqliteEventStore("adk-example.db")
    bridge = FlowscopeADK(store, plugins=[TracingPlugin(), MetricsPlugin()])
    workflow = bridge.instrument(
        Workflow(
            name="report",
            edges=[
                (
                    "START",
                    FunctionNode(func=send_email, name="send_email"),
                    FunctionNode(
                        func=fetch, name="fetch", retry_config=RetryConfig(max_attempts=3, initial_delay=0.01)
                    ),
                    FunctionNode(func=approve, name="approve", rerun_on_resume=True),
                )
            ],
        )
    )
    sessions = InMemorySessionService()
    runner = Runner(
        app=App(name="example", root_agent=workflow, plugins=[bridge.plugin]), session_service=sessions
    )
    session = await sessions.create_session(app_name="example", user_id="ops")

    async def send(parts: list[Any]) -> Any:
        last = None
        async for event in runner.run_async(
            user_id="ops", session_id=session.id, new_message=types.Content(role="user", parts=parts)
        ):
            last = event
        return last

    await send([types.Part(text="go")])
    print("paused for approval; answering")
    final = await send([create_request_input_response("approval", {"ok": True})])
    print(f"output: {final.output}; emails sent: {len(sent)}")
    print(f"session {session.id}: try  flowscope show {session.id} --db adk-example.db")
    bridge.close()
    store.close()


if __name__ == "__main__":
    asyncio.run(main())
