"""The records of a bridged run: a node run's context, an invocation, the session a
bridge appends to, and the value and path helpers both bridges use."""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from opentelemetry.trace import INVALID_SPAN_CONTEXT, NonRecordingSpan, SpanContext

from .. import RunInfo
from ..events import Event, InputReceived, InputRequested, NodeCancelled
from ..fold import NodeState, WorkflowState
from ..states import OPEN_STATES

__all__ = [
    "HeartbeatSink",
    "BridgeNodeContext",
    "BridgeInvocation",
    "BridgeResult",
    "BridgeSession",
    "OpenRunSpan",
    "jsonable",
    "parent_of",
    "route_of",
    "name_of",
    "path_segment",
    "answered",
    "open_runs_below",
    "superseded_runs",
    "SUPERSEDED",
]

#: ``NodeCancelled.reason`` of a run the engine dropped when new input started its graph anew.
SUPERSEDED = "superseded"


class HeartbeatSink(Protocol):
    """What a run's context needs of its recorder: to say its run is alive."""

    def heartbeat(self, session_id: str, paths: Iterable[str]) -> None: ...


def jsonable(value: Any) -> Any:
    """``value`` as the store can keep it: itself if JSON-serialisable, a pydantic model's
    dump, else a marker naming its type (the engine's output stays untouched)."""
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        pass
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            out = dump(mode="json")
            json.dumps(out, allow_nan=False)
            return out
        except Exception:  # a model that does not dump to JSON falls through to the marker
            pass
    return {"unserializable": type(value).__name__}


def route_of(value: Any) -> str | int | None:
    """A route the other engine took, as ``NodeCompleted.route`` keeps it: a label (str,
    int, bool), the labels of a list joined by commas (a fan-out), a ``Send``'s node; None
    for none."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return None
    if isinstance(value, (str, int)):
        return value
    if isinstance(value, (list, tuple)):
        return ",".join(str(route_of(v)) for v in value)
    node = getattr(value, "node", None)  # LangGraph's Send
    return node if isinstance(node, str) else type(value).__name__


def parent_of(path: str) -> str:
    """``"wf@1/a@2"`` -> ``"wf@1"``; a top-level path has no parent (``""``)."""
    return path.rsplit("/", 1)[0] if "/" in path else ""


def name_of(path: str) -> str:
    """The node name of a path's last ``name@k`` segment (unescaped: :func:`path_segment`)."""
    name = path.rsplit("/", 1)[-1].rsplit("@", 1)[0]
    return unquote(name) if "%" in name else name


def path_segment(name: str) -> str:
    """``name`` as it goes into a path: ``%``, ``/`` and ``@`` escaped as in a URL. Another
    engine's node may be named ``search/web`` or ``notify@slack`` (flowscope's own refuses
    both), and a path is ``parent/name@k``: unescaped, such a node would read as a made-up
    workflow run above it, or a run number of its own."""
    if "%" in name or "/" in name or "@" in name:
        return name.replace("%", "%25").replace("/", "%2F").replace("@", "%40")
    return name


@dataclass(frozen=True, slots=True)
class BridgeResult:
    """What ``after_run`` hooks are handed (the fields of ``RunResult`` plugins read)."""

    status: str
    output: Any
    session_id: str
    invocation_id: str
    pending: tuple[Event, ...] = ()


class OpenRunSpan(NonRecordingSpan):
    """A run's span as the node body sees it: its context while the run is open, an
    invalid one after (so a context the engine left holding it starts no child of an
    ended run, and the next invocation does not join its trace)."""

    def __init__(self, context: SpanContext, run: BridgeNodeContext) -> None:
        super().__init__(context)
        self._run = run

    def get_span_context(self) -> SpanContext:
        return super().get_span_context() if self._run.open else INVALID_SPAN_CONTEXT

    def is_recording(self) -> bool:
        return False


class BridgeNodeContext:
    """A node run as plugins see it: the attributes of ``flowscope.NodeContext`` that
    hooks read, filled from the other engine's context instead of flowscope's runner."""

    __slots__ = (
        "session_id",
        "invocation_id",
        "path",
        "node_name",
        "kind",
        "attempt",
        "recovered",
        "parent",
        "input",
        "trace_context",
        "plugin_state",
        "cancel_reason",
        "started_at",
        "run",
        "state",
        "hooks",
        "body_tokens",
        "open",
        "_recorder",
    )

    def __init__(
        self,
        recorder: HeartbeatSink,
        inv: BridgeInvocation,
        path: str,
        kind: str,
        attempt: int,
        recovered: bool,
        parent: BridgeNodeContext | None,
        input: Any,
    ) -> None:
        self._recorder = recorder
        self.session_id = inv.run.session_id
        self.invocation_id = inv.run.invocation_id
        self.path = path
        self.node_name = name_of(path)
        self.kind = kind
        self.attempt = attempt
        self.recovered = recovered
        self.parent = parent
        self.input = input  # for plugins' redaction hooks only; never persisted
        self.trace_context: dict[str, str] = {}
        self.plugin_state: dict[str, Any] = {}
        self.cancel_reason: str | None = None
        self.started_at = time.perf_counter()
        self.run = inv.run
        self.state: dict[str, Any] = {}
        self.hooks: contextvars.Context | None = None  # where this run's node hooks run
        self.open = True  # until the run ends: its span is current for the body until then
        # (marker token, [(var, token)]) for what the start hooks set in the engine's context
        self.body_tokens: (
            tuple[contextvars.Token[object], list[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]]]]
            | None
        ) = None

    @property
    def parent_path(self) -> str:
        return self.parent.path if self.parent is not None else ""

    def heartbeat(self) -> None:
        self._recorder.heartbeat(self.session_id, [self.path])

    def __repr__(self) -> str:
        return f"<BridgeNodeContext {self.path} attempt={self.attempt}>"


@dataclass(slots=True)
class BridgeSession:
    """The recorder's view of one session: its fold and the seq to append after."""

    ws: WorkflowState
    last_seq: int
    #: Its invocations being recorded: at 0 the recorder lets the session go (the next one
    #: folds the log again), so it holds the sessions in flight, not every one it saw.
    active: int = 0


@dataclass(slots=True)
class BridgeInvocation:
    """One invocation of the other engine (a run or a resume) being recorded."""

    run: RunInfo
    root_path: str
    open: dict[str, BridgeNodeContext] = field(default_factory=dict)
    finished: bool = False


def open_runs_below(ws: WorkflowState, root_path: str) -> list[NodeState]:
    """The session's open runs (running or waiting) other than its root's, deepest first."""
    runs = (n for n in ws.nodes.values() if n.status in OPEN_STATES and n.path != root_path)
    return sorted(runs, key=lambda n: -n.path.count("/"))


def superseded_runs(runs: Iterable[NodeState], session_id: str, invocation_id: str) -> list[Event]:
    """A ``NodeCancelled`` (:data:`SUPERSEDED`) of each of ``runs``, in ``invocation_id``."""
    now = time.time()
    return [
        NodeCancelled(
            session_id=session_id,
            invocation_id=invocation_id,
            ts=now,
            path=n.path,
            node=n.node,
            reason=SUPERSEDED,
        )
        for n in runs
    ]


def answered(
    pending: Iterable[InputRequested], answers: dict[str, Any], session_id: str, invocation_id: str
) -> list[Event]:
    """An ``InputReceived`` of each of the ``pending`` requests that ``answers`` answers."""
    return [
        InputReceived(
            session_id=session_id,
            invocation_id=invocation_id,
            ts=time.time(),
            path=req.path,
            node=req.node,
            interrupt_id=req.interrupt_id,
            value=jsonable(answers[req.interrupt_id]),
        )
        for req in pending
        if req.interrupt_id in answers
    ]
