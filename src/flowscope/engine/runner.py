"""The runner: walks a workflow, records every node run, resumes from the record.

One :class:`_Invocation` per ``run``/``resume`` call does the work. It keeps the
session's :class:`~flowscope.fold.WorkflowState` live (every event it emits
is folded at once), so deciding whether a path is completed, waiting, crashed or new is
a dict lookup, the same way on the first run and on a resume from another process.

Scheduling is in steps: all nodes activated together run in parallel, and the next step
is computed from their results in declaration order. That makes paths deterministic
(``check@2`` is always the same run), which is what lets resume match recorded runs to
new ones. Events are buffered and appended in one transaction per step boundary (group
commit), and always before a node body starts, so a terminal event is durable before
anything after it runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

from ..errors import (
    ConcurrencyConflict,
    InvocationAbortedError,
    JobFailedError,
    NodeTimeoutError,
    OutputNotSerializableError,
    RecoveryLimitError,
    ResumeError,
    WorkflowError,
    classify,
)
from ..events import (
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
    StateUpdated,
)
from ..jobs import Job, check_result, dispatch_failure, job_failed_payload, job_ids
from ..plugins import Plugin, PluginDispatcher
from ..store.base import EventStore
from ..store.memory import MemoryEventStore
from ..liveness import DEFAULT_HEARTBEAT_INTERVAL_S, resume_lease_s
from ..fold import NodeState, WorkflowState, rebuild, restore_state, snapshot_state
from .context import NodeContext, NodeOutcome, PauseSignal, RunInfo
from .graph import START, Node, Route, Workflow

__all__ = ["Runner", "RunResult"]

log = logging.getLogger("flowscope.engine")

_SCALARS = (type(None), str, int, float, bool)


@dataclass(slots=True)
class RunResult:
    """How an invocation ended without an exception: ``completed`` or ``paused``."""

    status: str
    output: Any
    session_id: str
    invocation_id: str
    pending: list[Event] = field(default_factory=list)
    replayed: int = 0
    recovered: int = 0


class _NodeResult:
    __slots__ = ("output", "route", "has_output")

    def __init__(self, output: Any, route: str | None, has_output: bool) -> None:
        self.output = output
        self.route = route
        self.has_output = has_output


class _TrackedState(dict):  # type: ignore[type-arg]
    """``ctx.state``: a dict that remembers which keys changed since the last event."""

    def __init__(self, initial: Mapping[str, Any]) -> None:
        super().__init__(initial)
        self.dirty: set[str] = set()

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.dirty.add(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.dirty.add(key)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: str, *default: Any) -> Any:  # type: ignore[override]
        if key in self:
            self.dirty.add(key)
        return super().pop(key, *default)

    def clear(self) -> None:
        self.dirty.update(self.keys())
        super().clear()

    def take_changes(self) -> dict[str, Any]:
        changes = {k: self.get(k) for k in self.dirty}
        self.dirty.clear()
        return changes


def _check_json(value: Any, what: str) -> None:
    """R12: the store keeps outputs as JSON, so refuse what JSON cannot hold, naming the culprit."""
    if type(value) in _SCALARS:
        return
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise OutputNotSerializableError(
            f"{what} is a {type(value).__name__} that is not JSON-serialisable ({exc}); "
            "return JSON data: dict, list, str, number, bool or None"
        ) from None


class Runner:
    """Runs a workflow over an event store, with plugins.

    ``error_codes`` maps exception types to error codes (matched along the MRO).
    ``max_recoveries`` bounds how often a run that kills its worker is re-executed.
    ``heartbeat_interval`` is how often in-flight runs refresh their heartbeat; a session
    whose running invocation has a heartbeat younger than three intervals is considered
    live and ``resume()`` refuses it (pass ``force=True`` to override).
    ``snapshot_every``: when an invocation leaves a session resumable and its log has grown
    by this many events since the last snapshot, the fold is saved so that the next resume
    reads the snapshot and the events after it, not the whole log.
    """

    def __init__(
        self,
        workflow: Workflow,
        store: EventStore | None = None,
        plugins: Iterable[Plugin] = (),
        *,
        error_codes: Mapping[type, str] | None = None,
        max_recoveries: int = 3,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL_S,
        snapshot_every: int = 1000,
        seed: int | None = None,
    ) -> None:
        if not isinstance(workflow, Workflow):
            raise TypeError("Runner needs a Workflow")
        self.workflow = workflow
        self.store: EventStore = store if store is not None else MemoryEventStore()
        self.plugins = PluginDispatcher(plugins)
        self.error_codes = dict(error_codes or {})
        self.max_recoveries = max_recoveries
        self.snapshot_every = snapshot_every
        self.heartbeat_interval = heartbeat_interval
        self.rng = random.Random(seed)
        self._active: dict[str, _Invocation] = {}

    # -- public API -------------------------------------------------------------------

    async def run(self, input: Any = None, *, session_id: str | None = None) -> RunResult:
        """Run the workflow in a new session. A failure raises the node's original exception."""
        _check_json(input, "the run input")
        return await self._invoke(session_id or uuid.uuid4().hex, input, resume=False)

    async def resume(
        self,
        session_id: str,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
    ) -> RunResult:
        """Continue a paused, failed or crashed session from the store alone.

        ``inputs`` answers open input requests by interrupt id; ``jobs`` delivers results of
        dispatched jobs by job id. Completed runs are fast-forwarded, never re-executed.
        """
        return await self._invoke(session_id, None, resume=True, inputs=inputs, jobs=jobs, force=force)

    def run_sync(self, input: Any = None, *, session_id: str | None = None) -> RunResult:
        """:meth:`run` for scripts without an event loop."""
        return asyncio.run(self.run(input, session_id=session_id))

    def resume_sync(
        self,
        session_id: str,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
    ) -> RunResult:
        """:meth:`resume` for scripts without an event loop."""
        return asyncio.run(self.resume(session_id, inputs, jobs, force=force))

    async def stream(self, input: Any = None, *, session_id: str | None = None) -> AsyncIterator[Event]:
        """Run and yield every event as it is appended; a failure is raised after its
        ``NodeErrorEvent`` has been yielded (R2)."""
        sid = session_id or uuid.uuid4().hex
        async for e in self._stream(lambda cb: self._invoke(sid, input, resume=False, on_event=cb)):
            yield e

    async def stream_resume(
        self,
        session_id: str,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        *,
        force: bool = False,
    ) -> AsyncIterator[Event]:
        """:meth:`resume`, yielding every event as it is appended."""
        async for e in self._stream(
            lambda cb: self._invoke(session_id, None, resume=True, inputs=inputs, jobs=jobs, force=force, on_event=cb)
        ):
            yield e

    def abort(self, session_id: str) -> bool:
        """Abort the invocation running for ``session_id`` in this process.

        Its runs are cancelled (``NodeCancelled``, reason ``aborted``, never an error) and
        ``run()``/``resume()`` raise :class:`InvocationAbortedError`. Returns False if no
        invocation of that session is running here.
        """
        inv = self._active.get(session_id)
        if inv is None or inv.root_task is None or inv.root_task.done():
            return False
        inv.aborting = True
        inv.root_task.cancel()
        return True

    # -- internals ----------------------------------------------------------------------

    async def _stream(self, start: Callable[[Callable[[Event], None]], Any]) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        task = asyncio.ensure_future(start(queue.put_nowait))
        task.add_done_callback(lambda _t: queue.put_nowait(done))
        try:
            while True:
                item = await queue.get()
                if item is done:
                    break
                yield item
            task.result()  # the run's own exception, after every event it produced
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _load(self, session_id: str, resume: bool, force: bool) -> WorkflowState:
        if not resume:
            if self.store.last_seq(session_id) > 0:
                raise WorkflowError(
                    f"session {session_id!r} already exists: resume it with resume() or run with a new session_id"
                )
            return WorkflowState(session_id=session_id)
        ws = self._load_snapshot(session_id)
        if ws is None:
            events = self.store.read(session_id)
            if not events:
                from ..errors import UnknownSessionError

                raise UnknownSessionError(
                    f"no session {session_id!r} in the store: check the id (flowscope runs lists them)"
                )
            ws = rebuild(events)
        if ws.workflow and ws.workflow != self.workflow.name:
            raise ResumeError(
                f"session {session_id!r} ran workflow {ws.workflow!r}, not {self.workflow.name!r}: "
                "resume it with a Runner for that workflow"
            )
        if ws.status == "completed":
            raise ResumeError(f"session {session_id!r} already completed; there is nothing to resume")
        if ws.status == "running" and not force:
            # Another invocation has started and not finished: alive if it wrote or
            # heartbeated recently. Taking over a live run would run its nodes twice.
            lease = resume_lease_s(self.heartbeat_interval)
            now = time.time()
            beats = [r.heartbeat_at for r in self.store.node_runs(session_id) if r.status == "running" and r.heartbeat_at]
            last = max([ws.updated_at or 0.0, *beats])
            if now - last < lease:
                raise ConcurrencyConflict(
                    f"session {session_id!r} is being run by another process (last sign of life "
                    f"{now - last:.1f}s ago); wait for it, or pass force=True if that process is dead"
                )
        return ws

    def _load_snapshot(self, session_id: str) -> WorkflowState | None:
        """The session's state from its last snapshot plus the events after it, or None.

        A snapshot is only a cache of the fold: one that cannot be read is ignored (and the
        whole log folded instead), never trusted half-way.
        """
        snap = self.store.load_snapshot(session_id)
        if snap is None:
            return None
        seq, data = snap
        try:
            ws = restore_state(data)
            if ws.last_seq != seq:
                raise ValueError(f"it claims seq {ws.last_seq}, stored as {seq}")
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring the snapshot of session %s (%s); folding the whole log", session_id, exc)
            return None
        apply = ws.apply
        for e in self.store.read(session_id, seq):
            apply(e)
        return ws

    def _save_snapshot(self, inv: _Invocation) -> None:
        """After an invocation that left the session resumable, keep its fold if the log has
        grown by ``snapshot_every`` events since the last snapshot."""
        ws = inv.ws
        if inv.lost or inv.buffer or inv.flushed_seq != ws.last_seq:
            return  # the live state is not exactly what the log holds
        if ws.last_seq - inv.snapshot_seq < self.snapshot_every:
            return
        try:
            self.store.save_snapshot(inv.session_id, ws.last_seq, json.dumps(snapshot_state(ws), separators=(",", ":")))
        except Exception:  # a snapshot is an optimisation: never fail the run for it
            log.warning("could not save a snapshot of session %s", inv.session_id, exc_info=True)

    async def _invoke(
        self,
        session_id: str,
        input: Any,
        *,
        resume: bool,
        inputs: Mapping[str, Any] | None = None,
        jobs: Mapping[str, Any] | None = None,
        force: bool = False,
        on_event: Callable[[Event], None] | None = None,
    ) -> RunResult:
        if session_id in self._active:
            raise ConcurrencyConflict(f"session {session_id!r} is already running in this runner")
        ws = self._load(session_id, resume, force)
        inv = _Invocation(self, session_id, ws, on_event)
        answers = inv.validate_answers(inputs or {}, jobs or {}) if resume else []
        if resume:
            input = ws.input
        statuses = inv.statuses
        run = RunInfo(
            session_id=session_id,
            invocation_id=inv.invocation_id,
            workflow=self.workflow.name,
            input=input,
            resumed=resume,
            started_at=time.time(),
            previous_trace_context=dict(ws.trace_context),
            replayed=statuses["completed"],
            recovered=statuses["running"],
            plugins=self.plugins.names,
        )
        inv.run = run
        plugins = self.plugins
        if plugins.wants("before_run"):
            await plugins.call("before_run", run)
        inv.emit(
            RunStarted,
            "",
            "",
            workflow=self.workflow.name,
            input=input,
            resumed=resume,
            replayed=run.replayed,
            recovered=run.recovered,
            trace_context=dict(run.trace_context),
        )
        for cls, path, node, fields in answers:
            inv.emit(cls, path, node, **fields)
        self._active[session_id] = inv
        heartbeats = _Heartbeats(inv, self.heartbeat_interval) if self.heartbeat_interval > 0 else None
        result: RunResult | None = None
        error: BaseException | None = None
        try:
            # RunStarted is appended with the first NodeStarted, before any node body runs
            # (a process that loses a race for the session fails there, having run nothing).
            root = self.workflow
            inv.root_task = asyncio.ensure_future(inv.execute(root, input, None, f"{root.name}@1"))
            try:
                out = await asyncio.shield(inv.root_task)
            except asyncio.CancelledError:
                if not inv.root_task.done():  # our caller was cancelled: cancel the run with it
                    inv.root_task.cancel()
                    await asyncio.gather(inv.root_task, return_exceptions=True)
                    raise
                if not inv.aborting:
                    raise
                raise InvocationAbortedError(f"invocation {inv.invocation_id} of session {session_id!r} was aborted") from None
            except (PauseSignal, InvocationAbortedError):
                raise
            except BaseException as exc:
                if inv.aborting:  # whatever the abort surfaced as (a timeout, say), it is an abort
                    raise InvocationAbortedError(
                        f"invocation {inv.invocation_id} of session {session_id!r} was aborted"
                    ) from exc
                raise
            result = RunResult("completed", out.output, session_id, inv.invocation_id, [], inv.replayed, inv.recovered)
            inv.finish("completed", output=out.output)
        except PauseSignal:
            result = RunResult("paused", None, session_id, inv.invocation_id, [], inv.replayed, inv.recovered)
            inv.finish("paused")
            result.pending = inv.ws.pending
        except (asyncio.CancelledError, InvocationAbortedError) as exc:
            error = exc
            inv.finish("cancelled")
            raise
        except BaseException as exc:
            error = exc
            reported = inv.reported.get(id(exc))
            if reported is not None and reported[0] is exc:
                inv.finish("failed", error_code=reported[2], error_path=reported[1])
            else:
                inv.finish("failed", error_code=classify(exc, self.error_codes).code)
            raise
        finally:
            self._active.pop(session_id, None)
            if heartbeats is not None:
                heartbeats.cancel()
            try:
                inv.flush()
                if result is None or result.status != "completed":
                    self._save_snapshot(inv)
            finally:
                if plugins.wants("after_run"):
                    await plugins.call("after_run", run, result, error)
        return result


class _Heartbeats:
    """Refreshes the heartbeat of the runs in flight every ``interval`` seconds.

    A timer on the loop rather than a task: a task costs two trips through the event
    loop to start and to cancel, a visible share of a short run's fixed cost.
    """

    __slots__ = ("inv", "interval", "loop", "handle")

    def __init__(self, inv: "_Invocation", interval: float) -> None:
        self.inv = inv
        self.interval = interval
        self.loop = asyncio.get_running_loop()
        self.handle = self.loop.call_later(interval, self._beat)

    def _beat(self) -> None:
        running = list(self.inv.in_flight)
        if running:
            try:
                self.inv.heartbeat(running)
            except Exception:  # a missed heartbeat must not kill the run
                log.warning("heartbeat failed for session %s", self.inv.session_id, exc_info=True)
        self.handle = self.loop.call_later(self.interval, self._beat)

    def cancel(self) -> None:
        self.handle.cancel()


class _Invocation:
    """The state and logic of one ``run``/``resume`` call."""

    def __init__(self, runner: Runner, session_id: str, ws: WorkflowState, on_event: Callable[[Event], None] | None):
        self.runner = runner
        self.store = runner.store
        self.plugins = runner.plugins
        self.hooks = runner.plugins.has_node_hooks
        self.session_id = session_id
        self.invocation_id = uuid.uuid4().hex
        self.ws = ws
        self.snapshot_seq = ws.snapshot_seq
        self.flushed_seq = ws.last_seq
        self.buffer: list[Event] = []
        self.lost = False  # set when another writer appended first (R10)
        self.state = _TrackedState(ws.state)
        # id(exc) -> (exc, path, error_code): where a failure was recorded in this
        # invocation, so enclosing runs propagate it without recording it again (R5).
        # Keyed per invocation: the same exception object raised in another invocation
        # is a new failure and is recorded again.
        self.reported: dict[int, tuple[BaseException, str, str]] = {}
        self.aborting = False
        self.in_flight: dict[str, NodeContext] = {}
        # Paths (and their ancestors) of waiting runs that now have what they waited for:
        # answered by this resume, or by an earlier one whose process died before the run
        # went on. Only these are re-executed; the others keep waiting without a new event.
        self.answered: set[str] = set()
        #: How many runs the log has in each status (the resume audit record counts them).
        self.statuses: Counter[str] = Counter()
        for ns in ws.nodes.values():
            status = ns.status
            self.statuses[status] += 1
            if status != "waiting_input" and status != "waiting_job":
                continue
            if ns.origin_path not in (None, ns.path):
                continue  # an enclosing run: ready when a descendant is
            if (status == "waiting_input" and not ns.requests) or (status == "waiting_job" and ns.jobs and not ns.open_jobs):
                self._mark_answered(ns.path)
        self.replayed = 0
        self.recovered = 0
        self.on_event = on_event
        self.root_task: asyncio.Future[Any] | None = None
        self.run: RunInfo | None = None

    # -- the record -----------------------------------------------------------------------

    def emit(self, cls: type[Event], path: str, node: str, **fields: Any) -> Event:
        e = cls(
            session_id=self.session_id,
            invocation_id=self.invocation_id,
            seq=self.ws.last_seq + 1,  # the live fold is always at the last emitted event
            ts=time.time(),
            path=path,
            node=node,
            **fields,
        )
        self.buffer.append(e)
        self.ws.apply(e)
        return e

    def flush(self) -> None:
        """Append everything buffered in one transaction, then tell plugins and streams."""
        if not self.buffer:
            return
        batch, self.buffer = self.buffer, []
        if self.lost:
            return  # another writer owns the session now: write nothing more
        try:
            self.store.append(self.session_id, batch, self.flushed_seq)
        except ConcurrencyConflict:
            self.lost = True
            raise
        self.flushed_seq = batch[-1].seq
        if self.plugins.has_on_event:
            call = self.plugins.call_sync
            for e in batch:
                call("on_event", e)
        if self.on_event is not None:
            for e in batch:
                self.on_event(e)

    def finish(self, status: str, output: Any = None, error_code: str | None = None, error_path: str | None = None) -> None:
        self.emit(
            RunFinished,
            "",
            "",
            status=status,
            output=output,
            error_code=error_code,
            error_path=error_path,
            replayed=self.replayed,
            recovered=self.recovered,
        )

    def heartbeat(self, paths: Iterable[str]) -> None:
        self.store.heartbeat(self.session_id, list(paths))

    # -- answers supplied to resume() -----------------------------------------------------------

    def validate_answers(self, inputs: Mapping[str, Any], jobs: Mapping[str, Any]) -> list[tuple[type[Event], str, str, dict[str, Any]]]:
        """Check every supplied input and job result before anything is appended."""
        out: list[tuple[type[Event], str, str, dict[str, Any]]] = []
        nodes = self.ws.nodes
        for iid, value in inputs.items():
            targets = [ns for ns in nodes.values() if ns.status == "waiting_input" and iid in ns.requests]
            if not targets:
                open_ids = sorted({i for ns in nodes.values() if ns.status == "waiting_input" for i in ns.requests})
                raise ResumeError(
                    f"session {self.session_id!r} has no open input request {iid!r} (open: {', '.join(open_ids) or 'none'})"
                )
            _check_json(value, f"the input for {iid!r}")
            for ns in targets:
                payload = ns.requests[iid].payload
                if isinstance(payload, dict) and payload.get("kind") == "job_failed" and value not in payload.get("actions", ()):
                    raise ResumeError(f"input {iid!r} answers a failed job: give one of {payload.get('actions')}, not {value!r}")
                out.append((InputReceived, ns.path, ns.node, {"interrupt_id": iid, "value": value}))
                self._mark_answered(ns.path)
        for job_id, result in jobs.items():
            owner = next((ns for ns in nodes.values() if job_id in ns.jobs), None)
            if owner is None:
                raise ResumeError(f"session {self.session_id!r} has no dispatched job {job_id!r}: check the job id")
            if job_id in owner.job_results:
                log.info("job %s of session %s already reported; ignoring the duplicate result", job_id, self.session_id)
                continue
            _check_json(result, f"the result of job {job_id!r}")
            verdict = check_result(result, owner.jobs[job_id].expect_count)
            r = result if isinstance(result, Mapping) else {}
            out.append(
                (
                    JobResultReceived,
                    owner.path,
                    owner.node,
                    {
                        "job_id": job_id,
                        "success": r.get("success"),
                        "count": r.get("count"),
                        "error": r.get("error"),
                        "data": r.get("data"),
                        "result": verdict.result,
                    },
                )
            )
            self._mark_answered(owner.path)
        return out

    def _mark_answered(self, path: str) -> None:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            self.answered.add("/".join(parts[:i]))

    # -- running nodes ------------------------------------------------------------------------

    def prepare(self, node: Node, input: Any, parent: NodeContext | None, path: str) -> NodeContext | _NodeResult:
        """Decide what a node activation is: a recorded result to fast-forward, a run still
        waiting (raises the pause), or a run to execute (returns its context, NodeStarted
        emitted)."""
        ns = self.ws.nodes.get(path)
        recovered = False
        if ns is None:
            attempt = 1
        else:
            status = ns.status
            if status == "completed":
                return self.replay(ns)
            if status == "waiting_input" or status == "waiting_job":
                if path not in self.answered:  # nothing new for it: it keeps waiting, silently
                    raise PauseSignal(ns.origin_path or path, "job" if status == "waiting_job" else "input", [])
                attempt = ns.attempt or 1  # continuing after a pause is the same attempt (R9)
            elif status == "running":  # its process died mid-run: a new attempt (R9)
                attempt = ns.attempt + 1
                recovered = True
                self.recovered += 1
            else:  # failed or cancelled: run again, numbering continues
                attempt = ns.attempt + 1
        ctx = NodeContext(self, node, path, attempt, parent, input, recovered)
        self.emit(
            NodeStarted,
            path,
            node.name,
            attempt=attempt,
            kind=node.kind,
            parent_path=parent.path if parent is not None else "",
            recovered=recovered,
        )
        self.in_flight[path] = ctx
        return ctx

    def replay(self, ns: NodeState) -> _NodeResult:
        """A completed run's recorded result: resume fast-forwards it, never runs it (R8)."""
        self.replayed += 1
        return _NodeResult(ns.output, ns.route, ns.has_output)

    async def execute(self, node: Node, input: Any, parent: NodeContext | None, path: str) -> _NodeResult:
        """Prepare and run one node activation inline."""
        r = self.prepare(node, input, parent, path)
        if isinstance(r, _NodeResult):
            return r
        if node.kind != "workflow":  # a workflow's body is its children, which flush before they run
            self.flush()
        return await self.run_prepared(r, input)

    async def run_child(self, parent: NodeContext, node: Node, input: Any) -> Any:
        return (await self.execute(node, input, parent, parent.child_path(node.name))).output

    async def run_prepared(self, ctx: NodeContext, input: Any) -> _NodeResult:
        """Run a prepared node run through its attempts and record how it ended."""
        node = ctx.node
        path = ctx.path
        plugins = self.plugins
        hooks = self.hooks
        if hooks:
            await plugins.call("before_node", ctx)
        ctx.started_at = t0 = time.perf_counter()
        ns = self.ws.nodes[path]
        failures = ns.failures  # failed attempts already spent from this run's budget (R9)
        retry = node.retry
        timeout = node.timeout
        outcome: NodeOutcome | None = None
        try:
            if ctx.recovered and ns.recoveries > self.runner.max_recoveries:
                raise RecoveryLimitError(
                    f"{path} was recovered {ns.recoveries} times after its process died "
                    f"(max_recoveries={self.runner.max_recoveries}); it may be killing its worker"
                )
            while True:
                try:
                    if timeout is None:
                        out = await self._body(node, ctx, input)
                    else:
                        cm = asyncio.timeout(timeout)
                        try:
                            async with cm:
                                out = await self._body(node, ctx, input)
                        except TimeoutError:
                            if cm.expired() and not self.aborting:
                                raise NodeTimeoutError(f"{node.name} timed out after {timeout:g}s") from None
                            raise
                    result = self._result(node, path, out)
                    break
                except Exception as exc:
                    if self.aborting or isinstance(exc, (OutputNotSerializableError, RecoveryLimitError)):
                        raise
                    failures += 1
                    if retry is None or failures >= retry.max_attempts or not retry.retries(type(exc).__name__):
                        raise
                    info = classify(exc, self.runner.error_codes)
                    delay = retry.delay(failures, self.runner.rng)
                    self.emit(
                        NodeRetrying,
                        path,
                        node.name,
                        attempt=ctx.attempt,
                        error_type=info.type,
                        error_code=info.code,
                        error_message=info.message,
                        delay_s=delay,
                    )
                    self.flush()  # the failed attempt is on record before the next one begins
                    await asyncio.sleep(delay)
                    ctx.attempt += 1
                    # A new attempt walks its children again from the first: the same paths,
                    # so the ones that completed are fast-forwarded, not re-run (R8).
                    ctx._children.clear()
                    ctx._requests = ctx._jobs = 0
        except PauseSignal as p:
            if p.origin == path and getattr(p, "event", None) is not None:
                ev = p.event  # type: ignore[attr-defined]
            else:
                ev = self.emit(
                    NodePaused, path, node.name, waiting=p.waiting, origin_path=p.origin, interrupt_ids=tuple(p.ids)
                )
            outcome = NodeOutcome("waiting", ev, ctx.attempt, ctx.recovered, None, p.origin, time.perf_counter() - t0)
            raise
        except asyncio.CancelledError:
            outcome = self._cancelled(ctx, self._cancel_reason(ctx), t0)
            raise
        except InvocationAbortedError:
            self.aborting = True
            outcome = self._cancelled(ctx, "aborted", t0)
            raise
        except (KeyboardInterrupt, SystemExit):
            # the process is going down: record that the run stopped, not that it failed
            outcome = self._cancelled(ctx, "interrupted", t0)
            raise
        except Exception as exc:
            if self.aborting:  # e.g. a timeout that fired only because the run is being aborted (R3)
                outcome = self._cancelled(ctx, "aborted", t0)
                raise
            status = "timeout" if isinstance(exc, NodeTimeoutError) else "failure"
            prior = self.reported.get(id(exc))
            if prior is not None and prior[0] is exc and prior[1].startswith(path + "/"):
                # Recorded at the deepest path already: propagate it without a second record (R5).
                ev = self.emit(
                    NodeErrorPropagated,
                    path,
                    node.name,
                    origin_path=prior[1],
                    error_code=prior[2],
                    error_type=type(exc).__name__,
                    attempt_count=ctx.attempt,
                )
                outcome = NodeOutcome(status, ev, ctx.attempt, ctx.recovered, exc, prior[1], time.perf_counter() - t0)
            else:
                info = classify(exc, self.runner.error_codes)
                ev = self.emit(
                    NodeErrorEvent,
                    path,
                    node.name,
                    error_code=info.code,
                    error_message=info.message,
                    error_type=info.type,
                    attempt_count=ctx.attempt,
                )
                self.reported[id(exc)] = (exc, path, info.code)
                outcome = NodeOutcome(status, ev, ctx.attempt, ctx.recovered, exc, path, time.perf_counter() - t0)
                self.flush()  # R1: the failure is on record before it propagates
                if hooks:
                    await plugins.call("on_node_error", ctx, ev)
            raise
        else:
            ev = self.emit(
                NodeCompleted,
                path,
                node.name,
                output=result.output,
                has_output=result.has_output,
                route=result.route,
                attempt_count=ctx.attempt,
            )
            if hooks:
                outcome = NodeOutcome("success", ev, ctx.attempt, ctx.recovered, None, None, time.perf_counter() - t0)
            return result
        finally:
            del self.in_flight[path]
            if self.state.dirty:
                self._emit_state(ctx)
            if hooks and outcome is not None:
                await plugins.call("after_node", ctx, outcome)

    def _cancelled(self, ctx: NodeContext, reason: str, t0: float) -> NodeOutcome:
        """Record that a run stopped without failing (cancellation is not failure, R3)."""
        ev = self.emit(NodeCancelled, ctx.path, ctx.node_name, reason=reason)
        return NodeOutcome("cancellation", ev, ctx.attempt, ctx.recovered, None, None, time.perf_counter() - t0)

    def _emit_state(self, ctx: NodeContext) -> None:
        changes = self.state.take_changes()
        try:
            _check_json(changes, f"ctx.state changed by {ctx.path}")
        except OutputNotSerializableError as exc:
            log.error("%s; the change is not persisted", exc)
            return
        self.emit(StateUpdated, ctx.path, ctx.node_name, values=changes)

    def _cancel_reason(self, ctx: NodeContext) -> str:
        if self.aborting:
            return "aborted"
        c: NodeContext | None = ctx
        while c is not None:
            if c.cancel_reason:
                return c.cancel_reason
            c = c.parent
        return "cancelled"

    async def _body(self, node: Node, ctx: NodeContext, input: Any) -> Any:
        if isinstance(node, Workflow):
            return await self.run_graph(node, ctx, input)
        return await node.execute(ctx, input)

    @staticmethod
    def _result(node: Node, path: str, out: Any) -> _NodeResult:
        if type(out) is _NodeResult:  # a nested workflow's own result
            return out
        route = None
        if isinstance(out, Route):
            route = out.label
            out = out.output
        _check_json(out, f"the output of node {node.name!r} ({path})")
        return _NodeResult(out, route, out is not None)

    # -- graphs -------------------------------------------------------------------------------

    async def run_graph(self, wf: Workflow, ctx: NodeContext, input: Any) -> _NodeResult:
        """One pass through a workflow's graph, a step at a time."""
        successors = wf.successors
        nodes = self.ws.nodes
        acts: list[tuple[Node, Any]] = [(n, input) for n, _label in successors[START]]
        joins: dict[Node, dict[str, Any]] = {}
        terminals: list[tuple[str, Any]] = []
        steps = 0
        while acts:
            steps += len(acts)
            if steps > wf.max_steps:
                raise WorkflowError(
                    f"workflow {wf.name!r} ran more than max_steps={wf.max_steps} node runs: a loop that does not end?"
                )
            if len(acts) == 1:  # a chain: no step machinery (the common case, and the replay path)
                n, inp = acts[0]
                path = ctx.child_path(n.name)
                ns = nodes.get(path)
                if ns is not None and ns.status == "completed":
                    results: Any = (self.replay(ns),)  # no coroutine for a recorded run
                else:
                    results = (await self.execute(n, inp, ctx, path),)
            else:
                results = await self._step(acts, ctx)
            nxt: list[tuple[Node, Any]] = []
            for (n, _inp), r in zip(acts, results):
                fired = False
                for target, label in successors[n]:
                    if label is not None and label != r.route:
                        continue
                    fired = True
                    if target.kind == "join":
                        buf = joins.setdefault(target, {})
                        buf[n.name] = r.output
                        if len(buf) == len(wf.predecessors[target]):
                            nxt.append((target, joins.pop(target)))
                    else:
                        nxt.append((target, r.output))
                if not fired and r.has_output:
                    terminals.append((n.name, r.output))
            if not nxt and joins:
                # Routing skipped some predecessors and nothing else can run: the joins
                # fire with the inputs they have, in declaration order.
                for j in sorted(joins, key=wf.order.__getitem__):
                    nxt.append((j, joins.pop(j)))
            acts = nxt
        if len(terminals) > 1:
            names = ", ".join(name for name, _ in terminals)
            raise WorkflowError(
                f"workflow {wf.name!r} finished with {len(terminals)} terminal outputs (from {names}); "
                "a workflow has one output: join the branches with a JoinNode"
            )
        if terminals:
            out = terminals[0][1]
            return _NodeResult(out, None, out is not None)
        return _NodeResult(None, None, False)

    async def _step(self, acts: list[tuple[Node, Any]], parent: NodeContext) -> list[_NodeResult]:
        """Run the activations of one step in parallel."""
        prepared: list[Any] = []
        for n, inp in acts:
            try:
                prepared.append(self.prepare(n, inp, parent, parent.child_path(n.name)))
            except PauseSignal as p:
                prepared.append(p)
        self.flush()  # every NodeStarted of the step in one transaction
        results: list[Any] = list(prepared)
        tasks: dict[asyncio.Task[Any], int] = {}
        for i, r in enumerate(prepared):
            if isinstance(r, NodeContext):
                tasks[asyncio.ensure_future(self.run_prepared(r, acts[i][1]))] = i
        pending: set[asyncio.Task[Any]] = set(tasks)
        failure: BaseException | None = None
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    i = tasks[t]
                    if t.cancelled():
                        continue
                    exc = t.exception()
                    if exc is None:
                        results[i] = t.result()
                    elif isinstance(exc, PauseSignal):
                        results[i] = exc
                    elif failure is None:
                        failure = exc
                        reason = "aborted" if self.aborting else "sibling_failed"
                        for other in pending:
                            prepared[tasks[other]].cancel_reason = reason
                            other.cancel()
                if pending:
                    self.flush()  # finished branches are on record while the others run
        finally:
            if pending:  # we are being cancelled: take the branches down with us
                for other in pending:
                    other.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            for t, i in tasks.items():
                ctx = prepared[i]
                if t.cancelled() and ctx.path in self.in_flight:
                    # cancelled before its first step: its body never ran, but its
                    # NodeStarted is on record and needs its terminal event
                    del self.in_flight[ctx.path]
                    self.emit(NodeCancelled, ctx.path, ctx.node_name, reason=self._cancel_reason(ctx))
        if failure is not None:
            raise failure
        pauses = [r for r in results if isinstance(r, PauseSignal)]
        if pauses:
            first = pauses[0]
            raise PauseSignal(first.origin, first.waiting, [i for p in pauses for i in p.ids])
        return results

    # -- pauses: input requests and jobs ------------------------------------------------------

    async def request_input(self, ctx: NodeContext, interrupt_id: str, prompt: str, payload: Any) -> Any:
        ns = self.ws.nodes[ctx.path]
        if interrupt_id in ns.inputs:
            return ns.inputs[interrupt_id]
        _check_json(payload, f"the payload of input request {interrupt_id!r}")
        ev = self.emit(InputRequested, ctx.path, ctx.node_name, interrupt_id=interrupt_id, prompt=str(prompt), payload=payload)
        signal = PauseSignal(ctx.path, "input", [interrupt_id])
        signal.event = ev  # type: ignore[attr-defined]
        raise signal

    async def await_job(
        self,
        ctx: NodeContext,
        n: int,
        dispatch: Callable[[Job], Any],
        payload: Any,
        expect_count: bool,
        deadline_s: float | None,
    ) -> Any:
        """Replay this ``await_job`` call's history from the log, then take the next step:
        dispatch, keep waiting, return the data, or pause on a failed result."""
        path = ctx.path
        key = f"{path}#job{n}"
        ns = self.ws.nodes[path]
        history = [j for j in ns.jobs.values() if j.job_key == key]
        i = 0
        while True:
            if i == len(history):
                history.append(await self._dispatch(ctx, key, i + 1, dispatch, payload, expect_count, deadline_s))
            job = history[i]
            res = ns.job_results.get(job.job_id)
            if res is None:  # in flight: never dispatch the same attempt twice
                raise PauseSignal(path, "job", [job.job_id])
            if res.result == "success":
                return res.data
            verdict = check_result({"success": res.success, "count": res.count, "error": res.error}, job.expect_count)
            iid = f"{key}.{job.dispatch_attempt}"
            decision = ns.inputs.get(iid)
            if decision is None:
                ev = self.emit(
                    InputRequested,
                    path,
                    ctx.node_name,
                    interrupt_id=iid,
                    prompt=f"job {job.job_id} {verdict.result}: {verdict.problem}",
                    payload=job_failed_payload(verdict, job.job_id, job.dispatch_attempt),
                )
                signal = PauseSignal(path, "input", [iid])
                signal.event = ev  # type: ignore[attr-defined]
                raise signal
            if decision == "abort":
                raise JobFailedError(f"job {job.job_id} {verdict.result}: {verdict.problem}; aborted by the operator")
            i += 1  # "retry": the next dispatch attempt (a new job, a new idempotency key)

    async def _dispatch(
        self,
        ctx: NodeContext,
        key: str,
        attempt: int,
        dispatch: Callable[[Job], Any],
        payload: Any,
        expect_count: bool,
        deadline_s: float | None,
    ) -> JobDispatched:
        job_id, idem = job_ids(self.session_id, key, attempt)
        job = Job(job_id, idem, attempt, payload, ctx.trace_context.get("traceparent"), deadline_s, self.session_id, ctx.path)
        failed: dict[str, Any] | None = None
        try:
            r = dispatch(job)
            if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future):
                await r
        except Exception as exc:  # an HTTP 401/5xx, a refused connection: a failed result, not a crash
            info = classify(exc, self.runner.error_codes)
            failed = dispatch_failure(info.type, info.message)
        ev = self.emit(
            JobDispatched,
            ctx.path,
            ctx.node_name,
            job_id=job_id,
            dispatch_attempt=attempt,
            idempotency_key=idem,
            trace_context=dict(ctx.trace_context),
            deadline_s=deadline_s,
            expect_count=expect_count,
            job_key=key,
        )
        if failed is not None:
            self.emit(JobResultReceived, ctx.path, ctx.node_name, job_id=job_id, success=False, error=failed["error"], result="failed")
            return ev  # type: ignore[return-value]
        signal = PauseSignal(ctx.path, "job", [job_id])
        signal.event = ev  # type: ignore[attr-defined]
        raise signal
