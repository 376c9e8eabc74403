"""Agent Development Kit peer: the benchmark workflows as ``google.adk.workflow.Workflow`` graphs.

Nodes are ``FunctionNode``s of a plain function (called inline on the event loop, as ADK
does for sync functions); the graph runs under ``google.adk.runners.Runner(node=...)``
with an ``InMemorySessionService`` (ADK's fastest session service; nothing is written to
disk). The first node receives the user message (a ``types.Content``) and starts the
count at 1, so outputs match the other frameworks'.

The pause workflow's node 100 returns a ``RequestInput`` (ADK's human-in-the-loop
interrupt); the resume is a second ``run_async`` whose message carries the function
response for that interrupt id. The node has ``rerun_on_resume=True`` and reads the
answer from ``ctx.resume_inputs``.

ADK's graph validation walks the graph recursively: a 2,000-node chain exceeds Python's
default recursion limit, so the harness raises it (``sys.setrecursionlimit``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["AdkConfig", "adk_configs", "available", "versions"]

APP = "flowscope_bench"
USER = "bench"


def available() -> str | None:
    try:
        from google.adk.runners import Runner  # noqa: F401
        from google.adk.workflow import Workflow  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        import a2a  # noqa: F401
    except Exception:
        return "a2a-sdk is not installed: every ADK node would pay for a failing import"
    return None


def _inc(node_input: Any) -> int:
    return node_input + 1 if type(node_input) is int else 1


def _count(node_input: Any) -> int:
    return len(node_input)


def _ask(ctx: Any, node_input: Any) -> Any:
    if "approval" in ctx.resume_inputs:
        return node_input + 1
    from google.adk.events.request_input import RequestInput

    return RequestInput(interrupt_id="approval", message="continue?", payload=node_input)


def _fn(func: Callable[..., Any], name: str, **kw: Any) -> Any:
    from google.adk.workflow import FunctionNode

    return FunctionNode(func=func, name=name, **kw)


def _chain(n: int, name: str = "chain", ask_at: int | None = None) -> Any:
    from google.adk.workflow import Workflow

    steps = [_fn(_inc, f"n{i}") for i in range(n)]
    if ask_at is not None:
        steps[ask_at] = _fn(_ask, "ask", rerun_on_resume=True)
    return Workflow(name=name, edges=[("START", *steps)])


def _fanout(n: int) -> Any:
    from google.adk.workflow import JoinNode, Workflow

    branches = tuple(_fn(_inc, f"b{i}") for i in range(n))
    return Workflow(name="fanout", edges=[("START", branches, JoinNode(name="join"), _fn(_count, "count"))])


def _nested(inner: int, length: int) -> Any:
    from google.adk.workflow import Workflow

    return Workflow(
        name="nested", edges=[("START", *[_chain(length, name=f"inner{j}") for j in range(inner)])]
    )


@dataclass
class AdkConfig:
    key: str
    label: str

    def make(
        self, wf_key: str, spec: Any, tmpdir: str
    ) -> tuple[Callable[[], Any] | None, str | None, Callable[[], None]]:
        """``(run, n/a reason, close)``: ``run`` is a coroutine function returning the output."""
        from google.adk.runners import Runner
        from google.adk.sessions import InMemorySessionService
        from google.genai import types

        from workflows import FAN, INNER, INNER_LEN, PAUSE_LEN

        if sys.getrecursionlimit() < 20_000:
            sys.setrecursionlimit(20_000)
        if wf_key.startswith("chain"):
            wf = _chain(int(wf_key[len("chain") :]))
        elif wf_key == "fanout50":
            wf = _fanout(FAN)
        elif wf_key == "nested":
            wf = _nested(INNER, INNER_LEN)
        elif wf_key == "pause200":
            wf = _chain(PAUSE_LEN, name="pause", ask_at=PAUSE_LEN // 2)
        else:
            raise KeyError(wf_key)
        sessions = InMemorySessionService()
        runner = Runner(app_name=APP, node=wf, session_service=sessions)
        start = types.Content(role="user", parts=[types.Part(text="0")])

        async def new_session() -> str:
            s = await sessions.create_session(app_name=APP, user_id=USER)
            return s.id

        async def drive(session_id: str, message: Any) -> Any:
            last = None
            async for event in runner.run_async(user_id=USER, session_id=session_id, new_message=message):
                if event.error_message:
                    raise RuntimeError(f"ADK run failed: {event.error_code}: {event.error_message}")
                last = event
            return last

        if wf_key == "pause200":
            from google.adk.workflow.utils._workflow_hitl_utils import create_request_input_response

            answer = types.Content(
                role="user", parts=[create_request_input_response("approval", {"value": 5})]
            )

            async def run(session_id: str) -> Any:
                first = await drive(session_id, start)
                if not first.long_running_tool_ids:
                    raise AssertionError(f"ADK did not pause: {first!r}")
                return (await drive(session_id, answer)).output

        else:

            async def run(session_id: str) -> Any:
                return (await drive(session_id, start)).output

        run.new_session = new_session  # type: ignore[attr-defined]
        return run, None, lambda: None


def adk_configs() -> list[AdkConfig]:
    return [AdkConfig("adk", "ADK Workflow (InMemorySessionService)")]


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("google-adk", "a2a-sdk", "google-genai"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "not installed"
    return out
