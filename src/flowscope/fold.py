"""The fold: events in, node state out.

``rebuild(events)`` is the one function that turns a session's log into state. Resume
uses it to decide what to fast-forward, re-run or recover; the CLI and audit use it to
show runs; the SQLite store applies the same :meth:`NodeState.apply` to keep its
``node_runs`` projection, so there is exactly one definition of what an event means.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .events import (
    Event,
    InputReceived,
    InputRequested,
    JobDispatched,
    JobResultReceived,
    NodeCancelled,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodePaused,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
    RunSubmitted,
    StateUpdated,
    UnknownEvent,
)
from .jobs import decision_id
from .states import NODE_STATUSES, OPEN_STATES, NodeStatus, SessionStatus

E = TypeVar("E", bound=Event)

__all__ = [
    "NodeState",
    "WorkflowState",
    "rebuild",
    "OPEN_STATES",
    "NODE_STATUSES",
    "gc_paused",
    "from_descendant",
    "containers",
]

#: Events that ``answer()`` appends outside an invocation (``invocation_id`` ``answer-...``).
_ANSWER_TYPES = (InputReceived, JobResultReceived)


def from_descendant(path: str, origin_path: str | None) -> bool:
    """Whether a run's failure or pause, begun at ``origin_path``, is a descendant's.

    The rule of counting once, at the deepest path (docs/design.md, "Counting once"): a
    run whose open or failed state comes from a run below it is a *container* of that
    run, not a second open run, failure or pause. The live path (the metrics plugin)
    asks it with the ``origin_path`` of a run's outcome; :func:`containers` asks the
    same of a session's recorded runs.
    """
    return origin_path is not None and origin_path.startswith(path + "/")


def containers(paths: Iterable[str]) -> set[str]:
    """The paths among ``paths`` (one session's) that have another of ``paths`` below them.

    Given the open (or failed) runs of a session, these are the containers: their state
    comes from a descendant (:func:`from_descendant`), so the descendant is counted and
    they are not. ``flowscope stuck``, ``runs``, ``audit``, the store's open-run summary,
    the ``StoreCollector`` and the resume audit record (``RunStarted.recovered``) all take
    their containers from here; the SQL stores evaluate the same predicate (a run with an
    open run at ``path/...``), checked against this function by the store contract.
    """
    given = paths if isinstance(paths, (set, frozenset)) else set(paths)
    out: set[str] = set()
    for p in given:
        i = p.rfind("/")
        while i > 0:
            ancestor = p[:i]
            if ancestor in out:
                break  # its own ancestors were found from it already
            if ancestor in given:
                out.add(ancestor)
            i = p.rfind("/", 0, i)
    return out


class _NoEntries(dict[str, Any]):
    """The empty dict a node run starts with for its inputs, requests, jobs and job results:
    one, shared and read-only (most runs never get any), so a node state costs four dicts
    less; the fold gives a run its own dict when it first adds to one."""

    __slots__ = ()
    __hash__ = object.__hash__  # type: ignore[assignment]  # a dataclass default must be hashable

    def _read_only(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TypeError(
            "a node run's empty record is shared and read-only: the fold gives the run its own dict"
        )

    __setitem__ = __delitem__ = pop = popitem = clear = update = setdefault = __ior__ = _read_only


#: What :class:`NodeState`'s dict fields hold until the fold adds to them.
NO_ENTRIES: dict[str, Any] = _NoEntries()


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
    status: NodeStatus = "running"
    attempt: int = 0
    failures: int = 0
    retries: int = 0
    recoveries: int = 0
    output: Any = None
    has_output: bool = False
    route: str | int | None = None
    error_code: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    origin_path: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    heartbeat_at: float | None = None
    job_deadline_at: float | None = None
    invocation_id: str = ""
    # Read-only and shared while empty (NO_ENTRIES): read them, never change them.
    inputs: dict[str, Any] = NO_ENTRIES
    requests: dict[str, InputRequested] = NO_ENTRIES
    jobs: dict[str, JobDispatched] = NO_ENTRIES
    job_results: dict[str, JobResultReceived] = NO_ENTRIES
    #: The latest start of a run that started more than once (resumed after a pause or a
    #: failure, recovered after a crash); None while ``started_at`` is its only start. How
    #: long it has run is counted from this, not from its first start.
    restarted_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATES

    @property
    def attempt_count(self) -> int:
        return self.attempt

    def apply(self, e: Event) -> None:
        """Advance this state by one event of its path (events that say nothing about a
        node run, such as ``StateUpdated``, leave it as it is)."""
        handler = _NODE_HANDLERS.get(type(e))
        if handler is not None:
            handler(self, e)

    # One handler per event class, typed by it; _NODE_HANDLERS below maps class to handler.

    def _started(self, e: NodeStarted) -> None:
        self.node = e.node
        self.kind = e.kind
        self.parent_path = e.parent_path
        if self.status == "failed":
            self.failures = 0  # an explicit resume of a failed run grants a fresh budget
            # and a failed job's "abort" that failed it is spent: asked again, not
            # replayed, or the new attempt would fail at once, and every retry after it
            for job in self.jobs.values():
                iid = decision_id(job.job_key, job.dispatch_attempt)
                if self.inputs.get(iid) == "abort":
                    del self.inputs[iid]
        self.status = "running"
        self.attempt = e.attempt
        if e.recovered:
            self.recoveries += 1
        if self.started_at is None:
            self.started_at = e.ts
        else:
            self.restarted_at = e.ts
        self.heartbeat_at = e.ts
        self.ended_at = None
        self.invocation_id = e.invocation_id
        if self.requests:
            self.requests.clear()  # a re-executed run asks again for what it still needs
        self.error_code = self.error_type = self.error_message = self.origin_path = None

    def _completed(self, e: NodeCompleted) -> None:
        self.status = "completed"
        self.output = e.output
        self.has_output = e.has_output
        self.route = e.route
        self.attempt = max(self.attempt, e.attempt_count)
        self.ended_at = e.ts
        self.job_deadline_at = None

    def _retrying(self, e: NodeRetrying) -> None:
        self.failures += 1
        self.retries += 1
        self.attempt = e.attempt + 1
        self.heartbeat_at = e.ts

    def _failed(self, e: NodeErrorEvent | NodeErrorPropagated) -> None:
        self.status = "failed"
        self.failures += 1
        self.error_code = e.error_code
        self.error_type = e.error_type
        if isinstance(e, NodeErrorEvent):
            self.error_message = e.error_message
            self.origin_path = e.path
        else:
            self.error_message = None
            self.origin_path = e.origin_path or e.path
        self.attempt = max(self.attempt, e.attempt_count)
        self.ended_at = e.ts
        self.job_deadline_at = None

    def _cancelled(self, e: NodeCancelled) -> None:
        self.status = "cancelled"
        self.ended_at = e.ts
        self.job_deadline_at = None

    def _paused(self, e: NodePaused) -> None:
        self.status = "waiting_job" if e.waiting == "job" else "waiting_input"
        self.origin_path = e.origin_path
        self.ended_at = e.ts

    def _input_requested(self, e: InputRequested) -> None:
        self.status = "waiting_input"
        if self.requests is NO_ENTRIES:
            self.requests = {}
        self.requests[e.interrupt_id] = e
        self.ended_at = e.ts

    def _input_received(self, e: InputReceived) -> None:
        if self.inputs is NO_ENTRIES:
            self.inputs = {}
        self.inputs[e.interrupt_id] = e.value
        if self.requests:
            self.requests.pop(e.interrupt_id, None)

    def _job_dispatched(self, e: JobDispatched) -> None:
        self.status = "waiting_job"
        self._note_job(e)
        self.job_deadline_at = self._first_deadline()
        self.ended_at = e.ts

    def _job_result(self, e: JobResultReceived) -> None:
        self._note_job(e)
        self.job_deadline_at = self._first_deadline()

    def _note_job(self, e: JobDispatched | JobResultReceived) -> None:
        if isinstance(e, JobDispatched):
            if self.jobs is NO_ENTRIES:
                self.jobs = {}
            self.jobs[e.job_id] = e
        else:
            if self.job_results is NO_ENTRIES:
                self.job_results = {}
            self.job_results[e.job_id] = e

    @property
    def jobs_unknown(self) -> bool:
        """A deadline without the jobs it comes from: a state read from a store's projection
        row, which keeps the first deadline only (:meth:`recall_jobs` gives it the rest)."""
        return self.job_deadline_at is not None and not self.jobs

    def recall_jobs(self, events: Iterable[JobDispatched | JobResultReceived]) -> None:
        """Give a state read from its projection row the jobs and results its log holds at
        its path, so that the next job event moves its deadline as the fold of the log would
        (one job of two reporting leaves the other's deadline, not none)."""
        for e in events:
            self._note_job(e)

    def _first_deadline(self) -> float | None:
        """The earliest deadline of the jobs still open: the first one overdue is the run's
        (a run may await several jobs at once)."""
        return min((j.ts + j.deadline_s for j in self.open_jobs if j.deadline_s is not None), default=None)

    @property
    def open_jobs(self) -> list[JobDispatched]:
        """Dispatched jobs that have not reported yet."""
        return [j for jid, j in self.jobs.items() if jid not in self.job_results]

    @property
    def waiting_on(self) -> Sequence[InputRequested | JobDispatched]:
        """What this run waits on: its open input requests while it waits for input, its
        jobs that have not reported while it waits for a job, nothing otherwise."""
        if self.status == "waiting_input":
            return list(self.requests.values())
        if self.status == "waiting_job":
            return self.open_jobs
        return []


#: How each event class advances a node run. Keyed by exact class: one dict lookup per
#: event, and each handler's argument is typed by its class, so no handler guesses fields.
_NODE_HANDLERS: dict[type[Event], Callable[[NodeState, Any], None]] = {
    NodeStarted: NodeState._started,
    NodeCompleted: NodeState._completed,
    NodeRetrying: NodeState._retrying,
    NodeErrorEvent: NodeState._failed,
    NodeErrorPropagated: NodeState._failed,
    NodeCancelled: NodeState._cancelled,
    NodePaused: NodeState._paused,
    InputRequested: NodeState._input_requested,
    InputReceived: NodeState._input_received,
    JobDispatched: NodeState._job_dispatched,
    JobResultReceived: NodeState._job_result,
}


@dataclass(slots=True)
class WorkflowState:
    """A session as the log tells it: run-level facts plus one :class:`NodeState` per path."""

    session_id: str = ""
    workflow: str = ""
    input: Any = None
    status: SessionStatus = "new"
    output: Any = None
    error_code: str | None = None
    error_path: str | None = None
    nodes: dict[str, NodeState] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    trace_context: dict[str, str] = field(default_factory=dict)
    #: The latest invocation's owner as its ``RunStarted`` recorded it (None: not recorded).
    owner: dict[str, Any] | None = None
    invocations: int = 0
    invocation_id: str = ""
    last_seq: int = 0
    started_at: float | None = None
    updated_at: float | None = None
    unknown_events: int = 0
    #: An operator's cancel ended the session for good (``RunFinished.final``).
    final: bool = False
    #: The engine of its latest invocation when a bridge recorded it (``RunStarted.engine``).
    engine: str | None = None
    #: The seq of the snapshot this state was restored from (0: folded from the log alone).
    snapshot_seq: int = field(default=0, compare=False)

    @property
    def pending(self) -> list[InputRequested | JobDispatched]:
        """The open ``InputRequested`` and ``JobDispatched`` events the session waits on."""
        out: list[InputRequested | JobDispatched] = []
        for ns in self.nodes.values():
            if ns.status == "waiting_input" or ns.status == "waiting_job":
                out.extend(ns.waiting_on)
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
            handler = _NODE_HANDLERS.get(type(e))  # NodeState.apply, inlined: the replay's hot loop
            if handler is not None:
                handler(ns, e)
                if (
                    self.status == "paused"
                    and type(e) in _ANSWER_TYPES
                    and e.invocation_id.startswith("answer-")
                ):
                    self.status = "answered"  # recorded by answer(), for the next invocation to consume
            elif type(e) is StateUpdated:
                self._merge_state(e)
            return
        if isinstance(e, RunStarted):
            if self.invocations == 0:
                self.workflow = e.workflow
                self.input = e.input
                self.started_at = e.ts
            self.invocations += 1
            self.invocation_id = e.invocation_id
            self.status = "running"
            self.trace_context = dict(e.trace_context)
            self.owner = e.owner
            self.engine = e.engine
        elif isinstance(e, RunFinished):
            self.status = e.status
            self.output = e.output
            self.error_code = e.error_code
            self.error_path = e.error_path
            self.final = e.final
        elif isinstance(e, RunSubmitted):
            self.workflow = e.workflow
            self.input = e.input
            self.status = "queued"
        elif isinstance(e, StateUpdated):
            self._merge_state(e)

    def _merge_state(self, e: StateUpdated) -> None:
        self.state.update(e.values)
        for key in e.deleted:
            self.state.pop(key, None)


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
