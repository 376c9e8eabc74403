"""The event catalog: the persisted record of every workflow run.

Events are immutable (frozen dataclasses). Every event carries ``type``, ``session_id``,
``invocation_id``, ``seq`` (per session, gap-free from 1), ``ts`` (epoch seconds),
``path`` and ``node`` (empty for run-level events). ``to_dict``/``from_dict`` and
``encode``/``decode`` are the JSON codec; the JSON form carries ``schema_version``, and a
``type`` this code does not know decodes to :class:`UnknownEvent` instead of failing, so
an old reader can still open a log written by a newer writer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from .jsontext import copy_json, dumps
from .states import EventKind, RunStatus, Waiting

__all__ = [
    "SCHEMA_VERSION",
    "UNKNOWN_ERROR",
    "Event",
    "RunSubmitted",
    "RunStarted",
    "RunFinished",
    "NodeStarted",
    "NodeRetrying",
    "NodeCompleted",
    "NodeErrorEvent",
    "NodeErrorPropagated",
    "NodeCancelled",
    "NodePaused",
    "InputRequested",
    "InputReceived",
    "JobDispatched",
    "JobResultReceived",
    "StateUpdated",
    "UnknownEvent",
    "EVENT_TYPES",
    "TERMINAL_TYPES",
    "to_dict",
    "from_dict",
    "implied_fields",
    "encode",
    "decode",
    "EventDecodeError",
    "fast_init",
    "own_values",
]

SCHEMA_VERSION = 1
UNKNOWN_ERROR = "UNKNOWN_ERROR"

_EVENT = dict(frozen=True, slots=True, kw_only=True)


@dataclass(**_EVENT)
class Event:
    """Fields common to every event."""

    type: ClassVar[str] = "event"
    session_id: str = ""
    invocation_id: str = ""
    seq: int = 0
    ts: float = 0.0
    path: str = ""
    node: str = ""


@dataclass(**_EVENT)
class RunStarted(Event):
    """An invocation (a ``run`` or a ``resume``) begins."""

    type: ClassVar[EventKind] = "run_started"
    workflow: str = ""
    input: Any = None
    resumed: bool = False
    # The resume audit record, from the log at the start of a resume: completed runs
    # that will be fast-forwarded, and runs left "running" by a dead process.
    replayed: int = 0
    recovered: int = 0
    # Trace context of this invocation, filled by plugins in before_run (W3C traceparent).
    trace_context: dict[str, str] = field(default_factory=dict)
    #: Who ran this invocation and so every attempt in it: ``{"worker_id", "host", "pid"}``
    #: of the lease owner; None where nobody held a lease (and in logs written before it).
    owner: dict[str, Any] | None = None
    #: The engine that ran it when it is not flowscope's own: ``"langgraph"`` or ``"adk"``,
    #: written by a bridge (None: flowscope's engine, and logs written before it). Only
    #: that engine can answer, retry, cancel or resume the session.
    engine: str | None = None


@dataclass(**_EVENT)
class RunFinished(Event):
    """An invocation ended: ``status`` is completed, failed, paused or cancelled.

    ``replayed`` and ``recovered`` count the runs this invocation fast-forwarded from the
    log and re-executed after a crash: the resume audit record (they are only known once
    the walk is over, so they are written here as well as on ``RunStarted``).
    ``final``: an operator's cancel (``flowscope.cancel``) ended the session for good, and
    nothing resumes it; a cancellation without it (``Runner.abort``, an interrupt) may be
    resumed by ``Runner.resume``.
    """

    type: ClassVar[EventKind] = "run_finished"
    status: RunStatus = "completed"
    output: Any = None
    error_code: str | None = None
    error_path: str | None = None
    replayed: int = 0
    recovered: int = 0
    final: bool = False


@dataclass(**_EVENT)
class NodeStarted(Event):
    """A node run begins (or begins again after a pause or a crash)."""

    type: ClassVar[EventKind] = "node_started"
    attempt: int = 1
    kind: str = "function"
    parent_path: str = ""
    recovered: bool = False


@dataclass(**_EVENT)
class NodeRetrying(Event):
    """An attempt failed and another follows after ``delay_s``."""

    type: ClassVar[EventKind] = "node_retrying"
    attempt: int = 1
    error_type: str = ""
    error_code: str = UNKNOWN_ERROR
    error_message: str = ""
    delay_s: float = 0.0
    error_qualname: str = ""  # module.Qualname of the exception (a builtin's bare name): span error.type


@dataclass(**_EVENT)
class NodeCompleted(Event):
    """A node run finished. ``has_output=False`` is the completion marker."""

    type: ClassVar[EventKind] = "node_completed"
    output: Any = None
    has_output: bool = True
    route: str | int | None = None
    attempt_count: int = 1
    completed: bool = True


@dataclass(**_EVENT)
class NodeErrorEvent(Event):
    """A node run failed for good. Recorded once, at the deepest path."""

    type: ClassVar[EventKind] = "node_error"
    error_code: str = UNKNOWN_ERROR
    error_message: str = ""
    error_type: str = ""
    attempt_count: int = 1
    error_qualname: str = ""  # module.Qualname of the exception (a builtin's bare name): span error.type


@dataclass(**_EVENT)
class NodeErrorPropagated(Event):
    """An enclosing run (nested workflow, parent of a dynamic child) failed because a
    descendant did; the failure itself is the ``NodeErrorEvent`` at ``origin_path``.

    This is the enclosing run's terminal event, so that every ``NodeStarted`` has one,
    without writing the failure a second time (R5, docs/design.md).
    """

    type: ClassVar[EventKind] = "node_error_propagated"
    origin_path: str = ""
    error_code: str = UNKNOWN_ERROR
    error_type: str = ""
    attempt_count: int = 1
    error_qualname: str = ""  # module.Qualname of the exception (a builtin's bare name): span error.type


@dataclass(**_EVENT)
class NodeCancelled(Event):
    """A run stopped because a sibling failed or the invocation was aborted."""

    type: ClassVar[EventKind] = "node_cancelled"
    reason: str = "cancelled"


@dataclass(**_EVENT)
class NodePaused(Event):
    """An enclosing run stopped because a descendant is waiting for input or a job."""

    type: ClassVar[EventKind] = "node_paused"
    waiting: Waiting = "input"
    origin_path: str = ""
    interrupt_ids: tuple[str, ...] = ()


@dataclass(**_EVENT)
class InputRequested(Event):
    """A node paused for input; ``resume(inputs={interrupt_id: value})`` answers it."""

    type: ClassVar[EventKind] = "input_requested"
    interrupt_id: str = ""
    prompt: str = ""
    payload: Any = None


@dataclass(**_EVENT)
class InputReceived(Event):
    """``resume()`` supplied the value for an open input request."""

    type: ClassVar[EventKind] = "input_received"
    interrupt_id: str = ""
    value: Any = None


@dataclass(**_EVENT)
class JobDispatched(Event):
    """A long-running external job was handed to a worker; the run waits for its result."""

    type: ClassVar[EventKind] = "job_dispatched"
    job_id: str = ""
    dispatch_attempt: int = 1
    idempotency_key: str = ""
    trace_context: dict[str, str] = field(default_factory=dict)
    deadline_s: float | None = None
    expect_count: bool = False
    job_key: str = ""  # which ``await_job`` call of the node run this dispatch serves


@dataclass(**_EVENT)
class JobResultReceived(Event):
    """The external job reported. ``result`` is the guard's verdict: success, failed or empty."""

    type: ClassVar[EventKind] = "job_result"
    job_id: str = ""
    success: Any = None
    count: Any = None
    error: Any = None
    data: Any = None
    result: str = "failed"


@dataclass(**_EVENT)
class StateUpdated(Event):
    """Keys of ``ctx.state`` a node run changed; the fold merges them in order. ``values``
    holds the keys set (a value of None is one), ``deleted`` the keys removed."""

    type: ClassVar[EventKind] = "state_updated"
    values: dict[str, Any] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)


@dataclass(**_EVENT)
class RunSubmitted(Event):
    """A run was recorded to be started later by a worker (``Runner.submit``); nothing ran yet."""

    type: ClassVar[EventKind] = "run_submitted"
    workflow: str = ""
    input: Any = None
    #: Why it was submitted again (``flowscope retry``: who asked, and why); None the first time.
    reason: str | None = None


@dataclass(**_EVENT)
class UnknownEvent(Event):
    """An event whose ``type`` this version does not know. Kept verbatim, skipped by the fold."""

    type: str = "unknown"  # type: ignore[misc]  # an instance field here, not a ClassVar
    data: dict[str, Any] = field(default_factory=dict)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        RunStarted,
        RunFinished,
        NodeStarted,
        NodeRetrying,
        NodeCompleted,
        NodeErrorEvent,
        NodeErrorPropagated,
        NodeCancelled,
        NodePaused,
        InputRequested,
        InputReceived,
        JobDispatched,
        JobResultReceived,
        StateUpdated,
        RunSubmitted,
    )
}


def fast_init(cls: type[Any]) -> None:
    """Give the frozen, slotted dataclass ``cls`` an ``__init__`` that sets each slot
    through its descriptor.

    The dataclass's own (frozen) ``__init__`` sets each field with ``object.__setattr__``,
    a global and an attribute lookup and a call per field: 1.6-2 µs for a node event,
    against 1.0 µs for this one, and the engine makes two or three per node run (and a
    ``NodeOutcome`` for each when plugins have node hooks). Same signature (the same
    parameters, keyword-only or not, the same defaults and default factories), same
    instances: only how the slots are filled differs. A class this cannot build for (one
    with a ``__post_init__``, a field that is not a plain slot, keyword-only fields mixed
    with others) keeps its own.
    """
    if hasattr(cls, "__post_init__"):
        return
    scope: dict[str, Any] = {"MISSING": _MISSING}
    params: list[str] = []
    body: list[str] = []
    kw_only = {f.kw_only for f in fields(cls)}
    if len(kw_only) > 1:
        return
    for f in fields(cls):
        slot = next((k.__dict__[f.name] for k in cls.__mro__ if f.name in k.__dict__), None)
        if slot is None or type(slot).__name__ != "member_descriptor":
            return
        scope[f"set_{f.name}"] = slot.__set__
        if f.default is not _MISSING:
            scope[f"default_{f.name}"] = f.default
            params.append(f"{f.name}=default_{f.name}")
        elif f.default_factory is not _MISSING:
            scope[f"factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=MISSING")
            body.append(f"if {f.name} is MISSING: {f.name} = factory_{f.name}()")
        else:
            params.append(f.name)  # required: before the defaulted ones, as the dataclass has it
        body.append(f"set_{f.name}(self, {f.name})")
    star = "*, " if kw_only == {True} else ""
    source = f"def __init__(self, {star}{', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    exec(source, scope)  # noqa: S102 - generated from dataclass field names only, no input
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init


_MISSING: Any = MISSING
for _cls in EVENT_TYPES.values():
    fast_init(_cls)
fast_init(UnknownEvent)


#: Event types that end a node run (the run is no longer "running" after one of them).
TERMINAL_TYPES: frozenset[EventKind] = frozenset(
    {
        "node_completed",
        "node_error",
        "node_error_propagated",
        "node_cancelled",
        "node_paused",
        "input_requested",
        "job_dispatched",
    }
)

COMMON_FIELDS = ("session_id", "invocation_id", "seq", "ts", "path", "node")
_FIELDS: dict[type[Event], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in EVENT_TYPES.values()
}


class EventDecodeError(ValueError):
    """A stored event could not be decoded (corrupt JSON, missing fields)."""


def to_dict(event: Event) -> dict[str, Any]:
    """The JSON-ready form of an event, with ``type`` and ``schema_version``."""
    if isinstance(event, UnknownEvent):
        d = dict(event.data)
        d.update({name: getattr(event, name) for name in COMMON_FIELDS})
        d["type"] = event.type
        return d
    d = {name: getattr(event, name) for name in _FIELDS[type(event)]}
    if "interrupt_ids" in d:
        d["interrupt_ids"] = list(d["interrupt_ids"])
    if "error_qualname" in d and d["error_qualname"] in ("", d["error_type"]):
        del d["error_qualname"]  # a builtin's (the same as error_type): read back as "", which means that
    if "engine" in d and d["engine"] is None:
        del d["engine"]  # flowscope's own engine: read back as None
    d["type"] = event.type
    d["schema_version"] = SCHEMA_VERSION
    return d


#: The invocation ids the bridges record, which are their engines' own run ids: LangGraph's
#: run id (a UUID) and ADK's invocation id (``e-`` and a UUID, ``#k`` for its k-th root
#: run). flowscope's engine has always written 32 hex digits (``uuid4().hex``, ``new_id``).
_BRIDGE_IDS = (
    (re.compile(r"e-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}(?:#[0-9]+)?"), "adk"),
    (re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"), "langgraph"),
)


def implied_fields(cls: type[Event], d: Mapping[str, Any], invocation_id: str) -> dict[str, Any] | None:
    """What a payload written before a field existed means by its absence, where the
    field's default would misread it (None when nothing is implied):

    - a ``RunFinished`` of a cancelled run with no ``final``: written when every cancel
      was final (``flowscope resume`` refused every cancelled session), so it stays final,
      and nothing revives what an operator may have cancelled;
    - a ``RunStarted`` with no ``engine`` whose invocation id is a bridge's (LangGraph's or
      ADK's run id, never flowscope's 32 hex digits): written by a bridge before it named
      its engine, so that engine, not flowscope, continues the session.
    """
    if cls is RunFinished:
        if "final" not in d and d.get("status") == "cancelled":
            return {"final": True}
    elif cls is RunStarted and "engine" not in d and len(invocation_id) != 32:
        for shape, engine in _BRIDGE_IDS:
            if shape.fullmatch(invocation_id):
                return {"engine": engine}
    return None


def from_dict(d: dict[str, Any]) -> Event:
    """Build an event from its dict form; an unknown ``type`` gives an :class:`UnknownEvent`."""
    if not isinstance(d, dict) or not isinstance(d.get("type"), str):
        raise EventDecodeError(f"not an event: expected an object with a string 'type', got {d!r:.80}")
    cls = EVENT_TYPES.get(d["type"])
    if cls is None:
        common = {k: d[k] for k in COMMON_FIELDS if k in d}
        rest = {k: v for k, v in d.items() if k not in COMMON_FIELDS and k != "type"}
        return UnknownEvent(type=d["type"], data=rest, **common)
    names = _FIELDS[cls]
    kwargs = {k: d[k] for k in names if k in d}
    if "interrupt_ids" in kwargs:
        kwargs["interrupt_ids"] = tuple(kwargs["interrupt_ids"])
    implied = implied_fields(cls, d, str(d.get("invocation_id", "")))
    if implied is not None:
        kwargs.update(implied)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - kwargs are filtered by name
        raise EventDecodeError(f"bad {d['type']} event: {exc}") from None


def encode(event: Event) -> str:
    """One event as a compact JSON string."""
    return dumps(to_dict(event))


def decode(text: str | bytes) -> Event:
    """The inverse of :func:`encode`."""
    try:
        d = json.loads(text)
    except ValueError as exc:
        raise EventDecodeError(f"corrupt event JSON: {exc}") from None
    return from_dict(d)


_OWN: dict[type[Event], Callable[[Event], Event]] = {}


def own_values(e: Event) -> Event:
    """``e``, or a copy of it with its own lists and dicts (:func:`~flowscope.jsontext.copy_json`):
    what a record that must not change keeps of an event (the memory store's log, the live
    fold), so that no one else's change to a value reaches it, nor its change a reader
    (events are immutable, as a durable store keeps their text). An event without a list or
    dict is itself."""
    own = _OWN.get(type(e))
    if own is None:
        own = _OWN[type(e)] = _owner(type(e))
    return own(e)


def _owner(cls: type[Event]) -> Callable[[Event], Event]:
    """:func:`own_values` for the events of ``cls``, generated from its fields, as the events'
    own constructors are (flowscope.events.fast_init): the fields that may hold a list or
    dict (typed ``Any``, ``dict`` or ``list``) are checked and copied, the others passed on.
    ~1.7 us for a ``NodeCompleted`` with a small dict, against ~3.7 us through
    ``dataclasses.replace``; a ``NodeStarted`` costs one call."""
    init = [f for f in fields(cls) if f.init]
    values = [
        f.name
        for f in init
        if f.name not in COMMON_FIELDS and any(t in str(f.type) for t in ("Any", "dict", "list"))
    ]
    if not values:
        return _same
    kept = " and ".join(f"type(e.{n}) not in CONTAINERS" for n in values)
    args = ", ".join(
        f"{f.name}=copy(e.{f.name})" if f.name in values else f"{f.name}=e.{f.name}" for f in init
    )
    source = f"def own(e):\n    if {kept}:\n        return e\n    return cls({args})\n"
    scope: dict[str, Any] = {"cls": cls, "copy": copy_json, "CONTAINERS": (dict, list)}
    exec(source, scope)  # noqa: S102 - generated from dataclass field names only, no input
    own: Callable[[Event], Event] = scope["own"]
    return own


def _same(e: Event) -> Event:
    return e
