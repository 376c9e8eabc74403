"""What the ADK bridge reads from ADK's own objects: a node's kind, the input requests an
event carries (``adk_request_input``, and the calls ADK waits on: long-running tools, tool
confirmations) and the answers a message does, ADK's timeout error, and the ADK
invocation id inside a flowscope one."""

from __future__ import annotations

from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.events.event import Event as AdkEvent
from google.adk.utils._function_call_names import REQUEST_INPUT_FUNCTION_CALL_NAME
from google.adk.workflow._base_node import BaseNode
from google.adk.workflow._errors import NodeTimeoutError as AdkNodeTimeoutError
from google.adk.workflow._join_node import JoinNode

from ..fold import WorkflowState

__all__ = [
    "SEP",
    "adk_invocation",
    "root_run_of",
    "log_path",
    "kind_of",
    "requests_in",
    "answers_in",
    "timeout_error",
]

SEP = "#"  # flowscope invocation id of the k-th ADK run of one ADK invocation: "<adk id>#k"


def adk_invocation(invocation_id: str) -> str:
    """The ADK invocation id a flowscope invocation id records (ADK keeps it on resume)."""
    return invocation_id.split(SEP, 1)[0]


def root_run_of(ws: WorkflowState, root: str, adk_id: str) -> tuple[str, str | None]:
    """The root run of ADK invocation ``adk_id`` in the log, and the last flowscope
    invocation that ran it (None: the first). ADK numbers every invocation's root ``@1``;
    the log numbers a session's invocations in turn (``wf@2`` for the run a second message
    starts), so that each one's node runs are runs of their own, counted by ``audit`` and
    never overwritten by the next. A resume keeps its invocation's root, whichever
    invocation of the session ran last (ADK resumes an earlier one that an answer names)."""
    roots = [n for n in ws.nodes.values() if not n.parent_path and n.node == root]
    for n in reversed(roots):
        if adk_invocation(n.invocation_id) == adk_id:
            return n.path, n.invocation_id
    ks = [int(k) for k in (n.path.rsplit("@", 1)[-1] for n in roots) if k.isdigit()]
    return f"{root}@{max(ks, default=0) + 1}", None


def log_path(root_path: str, adk_path: str) -> str:
    """The log's path of ADK's ``node_path`` in the invocation whose root run is ``root_path``."""
    _head, sep, rest = adk_path.partition("/")
    return root_path + sep + rest if adk_path else adk_path


def kind_of(node: Any) -> str:
    """The ``NodeStarted.kind`` of an ADK node."""
    if isinstance(node, JoinNode):
        return "join"
    if isinstance(node, BaseAgent):
        return "agent"
    return "function"


def requests_in(event: AdkEvent) -> list[tuple[str, str, Any]]:
    """The input requests an event carries, as ``(interrupt_id, prompt, payload)``: its
    ``adk_request_input`` calls (a node may yield one directly), and every call ADK waits
    on, whose id is in the event's ``long_running_tool_ids`` (a long-running tool's call,
    a tool's ``adk_request_confirmation``): ADK pauses the node for each of them until a
    message carries its function response, as it does for an input request."""
    out: list[tuple[str, str, Any]] = []
    waits = set(event.long_running_tool_ids or ())
    content = event.content
    for part in (content.parts or []) if content is not None else []:
        call = part.function_call
        if call is None or not call.id:
            continue
        args = dict(call.args or {})
        if call.name == REQUEST_INPUT_FUNCTION_CALL_NAME:
            out.append((call.id, str(args.get("message") or ""), args.get("payload")))
        elif call.id in waits:
            confirmation = args.get("toolConfirmation")
            hint = confirmation.get("hint") if isinstance(confirmation, dict) else None
            out.append((call.id, str(hint or call.name or ""), args))
        waits.discard(call.id)
    out.extend((i, "", None) for i in sorted(waits))  # waited on without a call in this event
    return out


def answers_in(message: Any) -> dict[str, Any]:
    """``{call id: response}`` for the function responses a message carries: the answers
    to ``adk_request_input`` calls and to every other call ADK waits on (the caller keeps
    those that answer an open request)."""
    out: dict[str, Any] = {}
    for part in (message.parts or []) if message is not None else []:
        resp = part.function_response
        if resp is not None and resp.id:
            out[resp.id] = resp.response
    return out


def timeout_error(node: BaseNode) -> AdkNodeTimeoutError:
    """The ``NodeTimeoutError`` ADK raises for ``node`` (the same type and message)."""
    return AdkNodeTimeoutError(node_name=node.name, timeout=node.timeout or 0.0)
