"""The record of one invocation: its live state, and the events it emits and flushes.

:class:`Recorder` is the base every part of an invocation builds on (``attempts.py``,
``pauses.py``, ``invocation.py``). It keeps the session's
:class:`~flowscope.fold.WorkflowState` live: every event emitted is folded at once, so
the state is always at the last emitted event. Events are buffered and appended in one
transaction per flush (group commit); the scheduler flushes before a node body starts,
so a terminal event is durable before anything after it runs.

An invocation that cannot record any more (an append failed, or its lease was lost) is
*halted*: it appends nothing more, its in-memory state is never used again, and the
signal :class:`Halted` unwinds its runs as cancellations up to the runner, which raises
the original error to the caller.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, overload

from ..errors import OutputNotSerializableError
from ..events import Event, RunFinished
from ..fold import WorkflowState
from ..ownership import Lease
from ..store.base import EventStore
from .commit import GroupCommit
from .context import NodeContext, RunInfo
from .hooks import PluginDispatcher

__all__ = ["Recorder", "Halted", "TrackedState", "NodeResult", "check_json"]

log = logging.getLogger("flowscope.engine")

E = TypeVar("E", bound=Event)

_SCALARS = (type(None), str, int, float, bool)


def check_json(value: Any, what: str) -> None:
    """Refuse what JSON cannot hold, naming the culprit: the store keeps outputs as JSON
    (R12, docs/design.md)."""
    if type(value) in _SCALARS:
        return
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise OutputNotSerializableError(
            f"{what} is a {type(value).__name__} that is not JSON-serialisable ({exc}); "
            "return JSON data: dict, list, str, number, bool or None"
        ) from None


class Halted(BaseException):
    """Unwinds an invocation that can record no more; ``error`` is why (the store's own
    exception, or ``LeaseLost``). A ``BaseException`` so that ``except Exception`` in a
    node body cannot swallow it and go on running work that would not be recorded."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"the invocation stopped: {type(error).__name__}")
        self.error = error


class NodeResult:
    """What a node run hands the scheduler: its output, the route it chose, and whether
    it produced an output at all (a run without one is no workflow's terminal)."""

    __slots__ = ("output", "route", "has_output")

    def __init__(self, output: Any, route: str | None, has_output: bool) -> None:
        self.output = output
        self.route = route
        self.has_output = has_output


class TrackedState(dict[str, Any]):
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

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    @overload
    def pop(self, key: str, /) -> Any: ...

    @overload
    def pop(self, key: str, default: Any, /) -> Any: ...

    def pop(self, key: str, /, *default: Any) -> Any:
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


class Recorder:
    """The state of one ``run``/``resume`` call and its record: emit, flush, finish."""

    def __init__(
        self,
        *,
        store: EventStore,
        plugins: PluginDispatcher,
        error_codes: Mapping[type, str],
        max_recoveries: int,
        rng: random.Random,
        session_id: str,
        ws: WorkflowState,
        workflow: str,
        input: Any,
        resumed: bool,
        on_event: Callable[[Event], None] | None,
        lease: Lease,
        commits: GroupCommit | None = None,
    ) -> None:
        self.store = store
        self.commits = commits if commits is not None else GroupCommit(store)
        self.lease = lease  # renewed by the runner's lease keeper, from its thread
        self.epoch = lease.epoch  # every append is fenced by it
        self.plugins = plugins
        self.hooks = plugins.has_node_hooks
        self.error_codes = error_codes
        self.max_recoveries = max_recoveries
        self.rng = rng
        self.session_id = session_id
        self.invocation_id = uuid.uuid4().hex
        self.ws = ws
        self.snapshot_seq = ws.snapshot_seq
        self.flushed_seq = ws.last_seq
        self.submitted_seq = ws.last_seq  # the last seq handed to the committer
        self.buffer: list[Event] = []
        #: Why this invocation can record no more (a failed append, a lost lease), or None.
        self.halted: BaseException | None = None
        self.state = TrackedState(ws.state)
        # id(exc) -> (exc, path, error_code): where a failure was recorded in this
        # invocation, so enclosing runs propagate it without recording it again
        # (R5, docs/design.md). Keyed per invocation: the same exception object raised
        # in another invocation is a new failure and is recorded again.
        self.reported: dict[int, tuple[BaseException, str, str]] = {}
        self.aborting = False
        self.abort_reason = "aborted"  # the NodeCancelled reason of an abort (Runner.abort)
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
                self.mark_answered(ns.path)
        self.replayed = 0
        self.recovered = 0
        self.on_event = on_event
        self.root_task: asyncio.Future[Any] | None = None
        self.run = RunInfo(
            session_id=session_id,
            invocation_id=self.invocation_id,
            workflow=workflow,
            input=input,
            resumed=resumed,
            started_at=time.time(),
            previous_trace_context=dict(ws.trace_context),
            replayed=self.statuses["completed"],
            recovered=self.statuses["running"],
            plugins=plugins.names,
            store=store,
        )

    def mark_answered(self, path: str) -> None:
        """A waiting run at ``path`` (and so each of its ancestors) may go on."""
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            self.answered.add("/".join(parts[:i]))

    def emit(self, cls: type[E], path: str, node: str, **fields: Any) -> E:
        """Buffer a new event and fold it into the live state (a halted invocation only
        builds it: nothing more is recorded)."""
        e = cls(
            session_id=self.session_id,
            invocation_id=self.invocation_id,
            seq=self.ws.last_seq + 1,  # the live fold is always at the last emitted event
            ts=time.time(),
            path=path,
            node=node,
            **fields,
        )
        if self.halted is None:
            self.buffer.append(e)
            self.ws.apply(e)
        return e

    async def flush(self) -> None:
        """Append everything buffered in one transaction (shared with other sessions ready
        in the same loop turn, ``commit.py``) and return once it is committed.

        If the append fails, the invocation halts: the store's error is kept and
        :class:`Halted` raised, and nothing is appended after it.
        """
        batch = self.buffer
        if not batch or self.halted is not None:
            return
        self.buffer = []
        expected, self.submitted_seq = self.submitted_seq, batch[-1].seq
        fut = self.commits.submit(self, self.session_id, batch, expected, self.epoch)
        if fut is not None:
            await fut
        if self.halted is not None:
            raise Halted(self.halted) from self.halted

    def committed(self, batch: Sequence[Event], error: BaseException | None) -> None:
        """The committer settled ``batch``: halt on ``error``, else tell plugins and streams."""
        if error is not None:  # a lock, a full disk, a lost lease: all end the invocation
            self.halt(error)
            return
        self.flushed_seq = batch[-1].seq
        if self.plugins.has_on_event:
            call = self.plugins.call_sync
            for e in batch:
                call("on_event", e)
        if self.on_event is not None:
            for e in batch:
                self.on_event(e)

    def halt(self, error: BaseException) -> None:
        """Record nothing more: ``error`` is what the caller will get."""
        if self.halted is None:
            self.halted = error
        self.buffer = []

    def lose_lease(self, exc: BaseException) -> None:
        """Called on the loop when the lease keeper finds the lease taken over: halt, and
        cancel the runs (a cancellation, never a failure)."""
        if self.halted is not None:
            return
        self.halt(exc)
        task = self.root_task
        if task is not None and not task.done():
            task.cancel()

    def finish(self, status: str, output: Any = None, error_code: str | None = None, error_path: str | None = None) -> None:
        """Emit the invocation's ``RunFinished`` (the caller flushes it)."""
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
