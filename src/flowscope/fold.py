"""The fold: events in, node state out.

``rebuild(events)`` is the one function that turns a session's log into state. Resume
uses it to decide what to fast-forward, re-run or recover; the CLI and audit use it to
show runs; the SQLite store applies the same :meth:`NodeState.apply` to keep its
``node_runs`` projection, so there is exactly one definition of what an event means.
"""

from __future__ import annotations

import gc
import json
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Iterator

from .events import (
    Event,
    from_dict,
    to_dict,
    InputRequested,
    JobDispatched,
    JobResultReceived,
    UnknownEvent,
)

__all__ = [
    "NodeState",
    "WorkflowState",
    "rebuild",
    "snapshot_state",
    "restore_state",
    "OPEN_STATES",
    "NODE_STATUSES",
    "SNAPSHOT_FORMAT",
    "gc_paused",
]

NODE_STATUSES = ("running", "completed", "failed", "cancelled", "waiting_input", "waiting_job")
OPEN_STATES = ("running", "waiting_input", "waiting_job")
#: Events that ``answer()`` appends outside an invocation (``invocation_id`` ``answer-...``).
_ANSWER_TYPES = ("input_received", "job_result")


@dataclass(slots=True)
class NodeState:
    """What the log says about one node run (one path).

    The fold's accumulator, so it is mutable; treat the states ``rebuild`` returns as
    read-only. ``failures`` counts failed attempts in the current retry budget;
    ``recoveries`` counts re-executions after a crash.
    """

    path: str
    node: str = ""
    kind: str = "function"
    parent_path: str = ""
    status: str = "running"
    attempt: int = 0
    failures: int = 0
    retries: int = 0
    recoveries: int = 0
    output: Any = None
    has_output: bool = False
    route: str | None = None
    error_code: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    origin_path: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    heartbeat_at: float | None = None
    job_deadline_at: float | None = None
    invocation_id: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    requests: dict[str, InputRequested] = field(default_factory=dict)
    jobs: dict[str, JobDispatched] = field(default_factory=dict)
    job_results: dict[str, JobResultReceived] = field(default_factory=dict)

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATES

    @property
    def attempt_count(self) -> int:
        return self.attempt

    def apply(self, e: Event) -> None:
        """Advance this state by one event of its path."""
        t = e.type
        if t == "node_started":
            self.node = e.node
            self.kind = e.kind  # type: ignore[attr-defined]
            self.parent_path = e.parent_path  # type: ignore[attr-defined]
            if self.status == "failed":
                self.failures = 0  # an explicit resume of a failed run grants a fresh budget
            self.status = "running"
            self.attempt = e.attempt  # type: ignore[attr-defined]
            if e.recovered:  # type: ignore[attr-defined]
                self.recoveries += 1
            if self.started_at is None:
                self.started_at = e.ts
            self.heartbeat_at = e.ts
            self.ended_at = None
            self.invocation_id = e.invocation_id
            self.requests.clear()  # a re-executed run asks again for what it still needs
            self.error_code = self.error_type = self.error_message = self.origin_path = None
        elif t == "node_completed":
            self.status = "completed"
            self.output = e.output  # type: ignore[attr-defined]
            self.has_output = e.has_output  # type: ignore[attr-defined]
            self.route = e.route  # type: ignore[attr-defined]
            self.attempt = max(self.attempt, e.attempt_count)  # type: ignore[attr-defined]
            self.ended_at = e.ts
            self.job_deadline_at = None
        elif t == "node_retrying":
            self.failures += 1
            self.retries += 1
            self.attempt = e.attempt + 1  # type: ignore[attr-defined]
            self.heartbeat_at = e.ts
        elif t == "node_error" or t == "node_error_propagated":
            self.status = "failed"
            self.failures += 1
            self.error_code = e.error_code  # type: ignore[attr-defined]
            self.error_type = e.error_type  # type: ignore[attr-defined]
            self.error_message = getattr(e, "error_message", None)
            self.origin_path = getattr(e, "origin_path", None) or e.path
            self.attempt = max(self.attempt, e.attempt_count)  # type: ignore[attr-defined]
            self.ended_at = e.ts
            self.job_deadline_at = None
        elif t == "node_cancelled":
            self.status = "cancelled"
            self.ended_at = e.ts
            self.job_deadline_at = None
        elif t == "node_paused":
            self.status = "waiting_job" if e.waiting == "job" else "waiting_input"  # type: ignore[attr-defined]
            self.origin_path = e.origin_path  # type: ignore[attr-defined]
            self.ended_at = e.ts
        elif t == "input_requested":
            self.status = "waiting_input"
            self.requests[e.interrupt_id] = e  # type: ignore[attr-defined]
            self.ended_at = e.ts
        elif t == "input_received":
            self.inputs[e.interrupt_id] = e.value  # type: ignore[attr-defined]
            self.requests.pop(e.interrupt_id, None)  # type: ignore[attr-defined]
        elif t == "job_dispatched":
            self.status = "waiting_job"
            self.jobs[e.job_id] = e  # type: ignore[attr-defined]
            deadline = e.deadline_s  # type: ignore[attr-defined]
            self.job_deadline_at = e.ts + deadline if deadline is not None else None
            self.ended_at = e.ts
        elif t == "job_result":
            self.job_results[e.job_id] = e  # type: ignore[attr-defined]
            self.job_deadline_at = None

    @property
    def open_jobs(self) -> list[JobDispatched]:
        """Dispatched jobs that have not reported yet."""
        return [j for jid, j in self.jobs.items() if jid not in self.job_results]


@dataclass(slots=True)
class WorkflowState:
    """A session as the log tells it: run-level facts plus one :class:`NodeState` per path."""

    session_id: str = ""
    workflow: str = ""
    input: Any = None
    status: str = "new"  # new, queued, running, completed, failed, paused, answered, cancelled
    output: Any = None
    error_code: str | None = None
    error_path: str | None = None
    nodes: dict[str, NodeState] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    trace_context: dict[str, str] = field(default_factory=dict)
    invocations: int = 0
    invocation_id: str = ""
    last_seq: int = 0
    started_at: float | None = None
    updated_at: float | None = None
    unknown_events: int = 0
    #: The seq of the snapshot this state was restored from (0: folded from the log alone).
    snapshot_seq: int = field(default=0, compare=False)

    @property
    def pending(self) -> list[Event]:
        """The open ``InputRequested`` and ``JobDispatched`` events the session waits on."""
        out: list[Event] = []
        for ns in self.nodes.values():
            if ns.status == "waiting_input":
                out.extend(ns.requests.values())
            elif ns.status == "waiting_job":
                out.extend(ns.open_jobs)
        out.sort(key=lambda e: e.seq)
        return out

    def apply(self, e: Event) -> None:
        """Advance the session by one event."""
        self.last_seq = e.seq or self.last_seq + 1
        self.updated_at = e.ts
        if not self.session_id:
            self.session_id = e.session_id
        if type(e) is UnknownEvent:
            self.unknown_events += 1  # kept in the log, skipped by the fold
            return
        if e.path:
            ns = self.nodes.get(e.path)
            if ns is None:
                ns = self.nodes[e.path] = NodeState(path=e.path, node=e.node)
            ns.apply(e)
            if e.type == "state_updated":
                self.state.update(e.values)  # type: ignore[attr-defined]
            elif self.status == "paused" and e.invocation_id.startswith("answer-") and e.type in _ANSWER_TYPES:
                self.status = "answered"  # recorded by answer(), for the next invocation to consume
            return
        t = e.type
        if t == "run_started":
            if self.invocations == 0:
                self.workflow = e.workflow  # type: ignore[attr-defined]
                self.input = e.input  # type: ignore[attr-defined]
                self.started_at = e.ts
            self.invocations += 1
            self.invocation_id = e.invocation_id
            self.status = "running"
            self.trace_context = dict(e.trace_context)  # type: ignore[attr-defined]
        elif t == "run_submitted":
            self.workflow = e.workflow  # type: ignore[attr-defined]
            self.input = e.input  # type: ignore[attr-defined]
            self.status = "queued"
        elif t == "run_finished":
            self.status = e.status  # type: ignore[attr-defined]
            self.output = e.output  # type: ignore[attr-defined]
            self.error_code = e.error_code  # type: ignore[attr-defined]
            self.error_path = e.error_path  # type: ignore[attr-defined]
        elif t == "state_updated":
            self.state.update(e.values)  # type: ignore[attr-defined]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building a session's state.

    Reading, folding or restoring a long session makes a few objects per event or node run,
    none of them in a cycle; the generational collections their allocation triggers would
    otherwise cost up to a third of the time.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def rebuild(events: Iterable[Event]) -> WorkflowState:
    """Fold a session's events (in ``seq`` order) into its :class:`WorkflowState`."""
    state = WorkflowState()
    apply = state.apply
    with gc_paused():
        for e in events:
            apply(e)
    return state


# -- snapshots ---------------------------------------------------------------------------------
#
# A snapshot is the fold of a session's first ``last_seq`` events, so that resuming a long
# session reads the snapshot and the events after it instead of the whole log. It is only
# ever a cache: ``restore_state(snapshot_state(rebuild(events)))`` equals
# ``rebuild(events)``, and a snapshot that cannot be used is ignored.

SNAPSHOT_FORMAT = 2
_NODE_FIELDS = tuple(f.name for f in fields(NodeState))
_NODE_SCALARS = _NODE_FIELDS[: _NODE_FIELDS.index("inputs")]  # positional, in field order
_INVOCATION = _NODE_SCALARS.index("invocation_id")
_RUN_FIELDS = tuple(f.name for f in fields(WorkflowState) if f.name not in ("nodes", "snapshot_seq"))


def snapshot_state(ws: WorkflowState) -> dict[str, Any]:
    """A JSON-ready form of a session's state (nodes as compact rows)."""
    rows = []
    # Each invocation id once, rows refer to it by index: a third of a large snapshot's
    # bytes otherwise, and JSON decoding time follows the bytes.
    invocations: dict[str, int] = {}
    for ns in ws.nodes.values():
        row: list[Any] = [getattr(ns, f) for f in _NODE_SCALARS]
        row[_INVOCATION] = invocations.setdefault(ns.invocation_id, len(invocations))
        if ns.inputs or ns.requests or ns.jobs or ns.job_results:
            row.append(
                [
                    ns.inputs,
                    [to_dict(e) for e in ns.requests.values()],
                    [to_dict(e) for e in ns.jobs.values()],
                    [to_dict(e) for e in ns.job_results.values()],
                ]
            )
        rows.append(row)
    d = {f: getattr(ws, f) for f in _RUN_FIELDS}
    d["format"] = SNAPSHOT_FORMAT
    d["invocation_ids"] = list(invocations)
    d["nodes"] = rows
    return d


def restore_state(text: str | bytes) -> WorkflowState:
    """The inverse of :func:`snapshot_state` from its JSON text; raises ``ValueError`` (or
    ``TypeError``/``KeyError``) on a snapshot it cannot read."""
    with gc_paused():
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format") != SNAPSHOT_FORMAT:
            raise ValueError("unknown snapshot format")
        ws = WorkflowState(**{f: d[f] for f in _RUN_FIELDS})
        ws.snapshot_seq = ws.last_seq
        nodes = ws.nodes
        n = len(_NODE_SCALARS)
        ids = d["invocation_ids"]
        for row in d["nodes"]:
            row[_INVOCATION] = ids[row[_INVOCATION]]
            ns = NodeState(*row) if len(row) == n else NodeState(*row[:n])
            if len(row) > n:
                inputs, requests, jobs, results = row[n]
                ns.inputs = inputs
                ns.requests = {e.interrupt_id: e for e in map(from_dict, requests)}  # type: ignore[attr-defined]
                ns.jobs = {e.job_id: e for e in map(from_dict, jobs)}  # type: ignore[attr-defined]
                ns.job_results = {e.job_id: e for e in map(from_dict, results)}  # type: ignore[attr-defined]
            nodes[ns.path] = ns
    return ws
