"""What a running node sees (``NodeContext``) and what plugins are handed.

These are the engine's records (``RunInfo``, ``NodeOutcome``, ``RunResult``) and the
context's view of the invocation that runs it (:class:`RunServices`), so that the hook
port and the invocation both depend on this module and it depends on neither.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import Redactor, WorkflowError, redact_message
from ..events import fast_init
from ..states import OutcomeStatus, ResultStatus, Waiting
from .graph import Node, check_depth, is_number

if TYPE_CHECKING:  # pragma: no cover
    from ..events import Event, InputRequested, JobDispatched
    from ..store.base import EventStore

__all__ = [
    "NodeContext",
    "RunInfo",
    "NodeOutcome",
    "RunResult",
    "PauseSignal",
    "RunServices",
    "CHILDREN_CLOSED",
]

#: ``NodeContext.running_children`` once the attempt's body has ended: a dynamic child
#: whose task the body started and left, and that had not begun yet, is refused.
CHILDREN_CLOSED: frozenset[Any] = frozenset()


class PauseSignal(BaseException):
    """Unwinds a run that waits for input or a job.

    A ``BaseException`` so that ``except Exception`` in user code cannot swallow a pause.
    ``origin`` is the path of the run that asked; ``waiting`` is "input" or "job";
    ``event`` is the ``JobDispatched`` that paused it, then the run's terminal event, or
    None (a request for input, recorded from the context's held requests; a job that keeps
    waiting).
    """

    def __init__(self, origin: str, waiting: Waiting, ids: list[str], event: Event | None = None) -> None:
        super().__init__(f"{origin} is waiting for {waiting}")
        self.origin = origin
        self.waiting = waiting
        self.ids = ids
        self.event = event


@dataclass(slots=True)
class RunInfo:
    """One invocation, as plugins see it in ``before_run``/``after_run``.

    Plugins may add W3C trace context to ``trace_context`` (it is stored on
    ``RunStarted``); ``previous_trace_context`` is what the invocation this one resumes
    stored, so a tracing plugin can link to it.
    """

    session_id: str
    invocation_id: str
    workflow: str
    input: Any
    resumed: bool
    started_at: float
    trace_context: dict[str, str] = field(default_factory=dict)
    previous_trace_context: dict[str, str] = field(default_factory=dict)
    plugin_state: dict[str, Any] = field(default_factory=dict)
    replayed: int = 0
    recovered: int = 0
    #: A failed invocation's message as recorded (redacted, R13, docs/design.md): what a
    #: plugin may show; the exception ``after_run`` gets is the raw one.
    error_message: str | None = None
    #: Names of the plugins of this runner, so a metrics plugin can start their error
    #: counters at zero (a series that exists before the first error makes alerts work).
    plugins: tuple[str, ...] = ()
    #: The session's store, for plugins that keep something of their own there (the
    #: tracing plugin's span-shipping watermark).
    store: EventStore | None = None
    #: The runner's redaction of messages (R13, docs/design.md), for a plugin that shows an
    #: exception's text the runner did not record (a stack trace's).
    redact: Redactor = redact_message


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """How a node run ended, for ``after_node``.

    ``status`` uses the span vocabulary: success, failure, timeout, cancellation, waiting.
    ``event`` is the run's terminal event; ``error`` the exception for a failure.
    """

    status: OutcomeStatus
    event: Event
    attempt_count: int
    recovered: bool = False
    error: BaseException | None = None
    #: The failure's message as recorded (redacted, R13): what may leave the process.
    error_message: str | None = None
    origin_path: str | None = None
    duration_s: float = 0.0


fast_init(NodeOutcome)  # one per node run when plugins have node hooks: 0.6 µs instead of 1.4


@dataclass(slots=True)
class RunResult:
    """How an invocation ended without an exception: ``completed`` or ``paused``."""

    status: ResultStatus
    output: Any
    session_id: str
    invocation_id: str
    #: What a paused invocation waits on: its open input requests and jobs (``interrupt_id``
    #: and ``job_id`` respectively), in log order.
    pending: list[InputRequested | JobDispatched] = field(default_factory=list)
    replayed: int = 0
    recovered: int = 0


class RunServices(Protocol):
    """What a :class:`NodeContext` asks of the invocation running it (the engine's
    ``Invocation`` provides it; this port keeps the context from importing it)."""

    @property
    def session_id(self) -> str: ...

    @property
    def invocation_id(self) -> str: ...

    @property
    def run(self) -> RunInfo: ...

    @property
    def state(self) -> dict[str, Any]: ...

    async def request_input(self, ctx: NodeContext, interrupt_id: str, prompt: str, payload: Any) -> Any: ...

    async def run_child(self, parent: NodeContext, node: Node, input: Any) -> Any: ...

    async def await_job(
        self,
        ctx: NodeContext,
        n: int,
        dispatch: Callable[[Any], Any],
        payload: Any,
        expect_count: bool,
        deadline_s: float | None,
    ) -> Any: ...

    def heartbeat(self, paths: list[str]) -> None: ...


class NodeContext:
    """Handed to a node's function as ``ctx``: identity, attempt, state and the engine's services."""

    __slots__ = (
        "_inv",
        "session_id",
        "invocation_id",
        "path",
        "node_name",
        "node",
        "kind",
        "attempt",
        "recovered",
        "parent",
        "input",
        "trace_context",
        "plugin_state",
        "cancel_reason",
        "started_at",
        "_children",
        "running_children",
        "_requests",
        "_asked",
        "_held",
        "_jobs",
    )

    def __init__(
        self,
        inv: RunServices,
        node: Node,
        path: str,
        attempt: int,
        parent: NodeContext | None,
        input: Any,
        recovered: bool,
    ) -> None:
        self._inv = inv
        self.session_id: str = inv.session_id
        self.invocation_id: str = inv.invocation_id
        self.path = path
        self.node = node
        self.node_name: str = node.name
        self.kind: str = node.kind
        self.attempt = attempt
        self.recovered = recovered
        self.parent = parent
        self.input = input  # for plugins' redaction hooks; never persisted by flowscope
        #: W3C trace context of this run (``traceparent``), filled by a tracing plugin.
        self.trace_context: dict[str, str] = {}
        #: Scratch space for plugins (e.g. the span of this run), keyed by plugin.
        self.plugin_state: dict[str, Any] = {}
        self.cancel_reason: str | None = None
        self.started_at = 0.0
        self._children: dict[str, int] = {}
        #: The tasks running a dynamic child of this run now (``run_node``), made on first
        #: use; :data:`CHILDREN_CLOSED` once the attempt's body has ended.
        self.running_children: set[asyncio.Task[Any]] | frozenset[Any] | None = None
        self._requests = 0
        self._asked: set[str] | None = None  # the interrupt ids this attempt asked for
        self._held: list[dict[str, Any]] | None = None  # its requests, recorded if it pauses
        self._jobs = 0

    @property
    def run(self) -> RunInfo:
        """The invocation this run belongs to (workflow name, session, trace context)."""
        return self._inv.run

    @property
    def parent_path(self) -> str:
        return self.parent.path if self.parent is not None else ""

    @property
    def state(self) -> dict[str, Any]:
        """A dict persisted with the session (``StateUpdated`` events); JSON values only."""
        return self._inv.state

    @property
    def idempotency_key(self) -> str:
        """Stable for this node run across attempts, resumes and crashes."""
        return hashlib.sha256(f"{self.session_id}\x00{self.path}".encode()).hexdigest()[:32]

    def next_attempt(self) -> None:
        """Begin the run's next attempt: its children, input requests and jobs are counted
        again from the first, so it walks the same paths and ids (the ones that completed
        are fast-forwarded, not re-run; R8, docs/design.md)."""
        self.attempt += 1
        self._children.clear()
        self._requests = self._jobs = 0
        self._asked = self._held = None
        self.running_children = None

    def hold_request(self, interrupt_id: str, prompt: str, payload: Any) -> None:
        """Keep an ``InputRequested``'s fields until the attempt ends: recorded only if the
        run pauses (:meth:`held_requests`). A request whose attempt then fails, completes
        or is cancelled (a sibling in ``asyncio.gather`` raised first) was never put to
        anyone, and would leave its run's span ended as waiting and a request open in the
        fold of a run that failed."""
        if self._held is None:
            self._held = []
        self._held.append({"interrupt_id": interrupt_id, "prompt": prompt, "payload": payload})

    def held_requests(self) -> list[dict[str, Any]]:
        """The requests this attempt made, in order, taken once (the run pauses now)."""
        held, self._held = self._held, None
        return held or []

    def child_path(self, name: str) -> str:
        """The next ``name@k`` path under this run (k counts runs of that name here)."""
        k = self._children.get(name, 0) + 1
        self._children[name] = k
        return f"{self.path}/{name}@{k}"

    async def request_input(self, prompt: str, payload: Any = None, interrupt_id: str | None = None) -> Any:
        """Pause the run until ``resume(inputs={interrupt_id: value})``; then return ``value``.

        The node runs again from its start on resume, and this call returns the supplied
        value. Code before it therefore runs twice; put a side effect that must not repeat
        in a dynamic child (``ctx.run_node``), which resume never re-runs once completed.
        The default ``interrupt_id`` is the run's path (``path#2`` for its second request).
        """
        self._requests += 1
        if interrupt_id is None:
            interrupt_id = self.path if self._requests == 1 else f"{self.path}#{self._requests}"
        elif type(interrupt_id) is not str or not interrupt_id:
            raise TypeError(f"interrupt_id is a non-empty str (an operator types it), not {interrupt_id!r}")
        asked = self._asked
        if asked is None:
            asked = self._asked = set()
        elif interrupt_id in asked:  # its answer would answer both: the second question never shown
            raise WorkflowError(
                f"node {self.node_name!r} asked for input {interrupt_id!r} twice in one attempt: "
                "give each request_input its own interrupt_id"
            )
        asked.add(interrupt_id)
        return await self._inv.request_input(self, interrupt_id, prompt, payload)

    async def run_node(self, node: Node, input: Any = None) -> Any:
        """Run ``node`` as a dynamic child of this run and return its output.

        Once the child has completed, resume returns its recorded output without running it.
        Children may run concurrently (``asyncio.gather``); those still running when this
        run's attempt ends (a sibling failed, or paused) are cancelled (``parent_ended``)
        and waited for first, so that each has its terminal event. A child that would
        run past :data:`~flowscope.engine.graph.MAX_DEPTH` is refused (``WorkflowError``).
        """
        if not isinstance(node, Node):
            raise TypeError(f"ctx.run_node takes a node, not a {type(node).__name__}: decorate it with @node")
        check_depth(self.path, node)
        task = asyncio.current_task()
        running = self.running_children
        if running is None:
            running = self.running_children = set()
        elif not isinstance(running, set):  # closed: the body that left this task has ended
            raise asyncio.CancelledError("parent_ended")
        if task is not None:
            running.add(task)
        try:
            return await self._inv.run_child(self, node, input)
        finally:
            running.discard(task)

    async def await_job(
        self,
        dispatch: Callable[[Any], Any],
        payload: Any = None,
        expect_count: bool = False,
        deadline_s: float | None = None,
    ) -> Any:
        """Hand work to an external worker and pause until it reports (see :mod:`flowscope.jobs`).

        Returns the job's ``data`` once a result passes the guard. A failed or empty
        result, or a ``dispatch`` that raises, becomes an actionable pause instead.
        """
        if not callable(dispatch):  # a URL or a job id given for the function that starts the job
            raise TypeError(
                f"await_job's dispatch is a function of the job that starts it, not {type(dispatch).__name__}"
            )
        if deadline_s is not None and not (is_number(deadline_s) and deadline_s >= 0):
            raise ValueError(f"deadline_s is a number of seconds, 0 or more (or None), not {deadline_s!r}")
        self._jobs += 1
        return await self._inv.await_job(self, self._jobs, dispatch, payload, expect_count, deadline_s)

    def heartbeat(self) -> None:
        """Tell the store this run is alive now (the runner also does it every few seconds)."""
        self._inv.heartbeat([self.path])

    def __repr__(self) -> str:
        return f"<NodeContext {self.path} attempt={self.attempt}>"
