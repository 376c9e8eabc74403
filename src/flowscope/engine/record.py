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

An invocation acts only while its lease is safe by its own clocks (``lease.py``,
:func:`~flowscope.engine.lease.safe_until`): :meth:`Recorder.check_lease` runs before a
node body starts, before a retry's next attempt and before every flush, a read of each
clock and no store call. A lease found unsafe there, by the lease keeper (its thread, or its
timer on the loop at the lease's safe end) or by :meth:`Runner.check_leases
<flowscope.engine.runner.Runner.check_leases>` halts the invocation with
:class:`~flowscope.errors.LeaseExpired` and cancels its runs in flight.
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

from ..errors import ErrorInfo, OutputNotSerializableError, Redactor, StateNotSerializableError, classify
from ..events import Event, RunFinished
from ..fold import OPEN_STATES, WorkflowState, containers
from ..jsontext import depth_over, dumps_finite, too_deep
from ..ownership import Lease
from ..store.base import EventStore
from .commit import GroupCommit
from .context import NodeContext, RunInfo
from .hooks import PluginDispatcher
from .lease import lease_expired, safe_until

__all__ = ["Recorder", "Halted", "TrackedState", "NodeResult", "json_value"]

log = logging.getLogger("flowscope.engine")

E = TypeVar("E", bound=Event)

_dumps = dumps_finite  # built once (flowscope.jsontext)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # {1: a, "1": b}: both keys are "1" in JSON, and one value would vanish
        dup = next(k for i, (k, _v) in enumerate(pairs) if any(k == k2 for k2, _ in pairs[:i]))
        raise ValueError(f"two keys become {dup!r} in JSON")
    return out


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_unique_keys)


_JSON_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


_BIG = 1 << 63
_MAX_NATIVE_DEPTH = 64


def _native(v: Any, depth: int) -> bool:
    """Is ``v`` already what a JSON round trip would give back (same types, same value)?

    Exact types only (a str or int subclass is converted by the round trip), finite floats,
    ints JSON readers agree on, str keys; shallow enough that a cycle cannot hide. Cheaper
    than the round trip for the small dicts and lists nodes usually return.
    """
    t = type(v)
    if t is str or t is bool or v is None:
        return True
    if t is int:
        return -_BIG <= v < _BIG
    if t is float:
        return v - v == 0.0  # finite: nan - nan and inf - inf are nan
    if depth >= _MAX_NATIVE_DEPTH:
        return False
    if t is dict:
        d = depth + 1
        for k, x in v.items():
            if type(k) is not str or not _native(x, d):
                return False
        return True
    if t is list:
        d = depth + 1
        for x in v:
            if not _native(x, d):
                return False
        return True
    return False


def json_value(value: Any, what: str, error: type[Exception] = OutputNotSerializableError) -> Any:
    """The value as the store keeps it, or ``error`` naming ``what`` (R12, docs/design.md).

    Values pass the JSON boundary once, here, when they are recorded: what a node, a
    ``RunResult`` or a resumed run sees is this value, live and after resume alike (a
    tuple is a list, an int key a str key). NaN and ±Infinity are refused (they are not
    JSON), and so is anything nested deeper than ``MAX_DEPTH`` (flowscope.jsontext: one
    limit, for every value recorded, whoever records it). JSON scalars are returned as they
    and containers of them are returned as they are, without a round trip (a type check
    per element: the common case).
    """
    if _native(value, 0):
        return value
    try:
        text = _dumps(value)
        out = _loads(text)
    except _JSON_ERRORS as exc:
        if isinstance(exc, RecursionError):
            raise error(too_deep(what)) from None
        raise error(
            f"{what} is a {type(value).__name__} that is not JSON-serialisable ({str(exc):.200}); "
            "return JSON data: dict with str keys, list, str, finite number, bool or None"
        ) from None
    if depth_over(out, text):
        raise error(too_deep(what))
    return out


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

    def __init__(self, output: Any, route: str | int | None, has_output: bool) -> None:
        self.output = output
        self.route = route
        self.has_output = has_output


class TrackedState(dict[str, Any]):
    """``ctx.state``: a dict that remembers which keys changed since the last event."""

    def __init__(self, initial: Mapping[str, Any]) -> None:
        super().__init__(initial)
        self.dirty: set[str] = set()

    def __setitem__(self, key: str, value: Any) -> None:
        # Refused where it is set, so the node that set it fails, naming the key; the
        # value kept is the one the store will hold (R12, docs/design.md).
        if type(key) is not str:
            raise StateNotSerializableError(
                f"ctx.state key {key!r} is a {type(key).__name__}: state keys are str (JSON object keys)"
            )
        super().__setitem__(key, json_value(value, f"ctx.state[{key!r}]", StateNotSerializableError))
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

    def check_changes(self) -> None:
        """Raise ``StateNotSerializableError`` naming the first changed key whose value JSON
        cannot hold any more (a list mutated after it was set), else keep the changed
        values as the store will (the same rule as when they were set)."""
        for k in self.dirty:
            if k in self:
                v = dict.__getitem__(self, k)
                if type(v) is dict or type(v) is list:
                    dict.__setitem__(self, k, json_value(v, f"ctx.state[{k!r}]", StateNotSerializableError))

    def take_changes(self) -> tuple[dict[str, Any], list[str]]:
        """The changed keys the store can keep, and the keys it cannot (dropped)."""
        changes: dict[str, Any] = {}
        bad: list[str] = []
        for k in self.dirty:
            v = self.get(k)
            try:
                changes[k] = json_value(v, k, StateNotSerializableError)
            except StateNotSerializableError:
                bad.append(k)
                dict.pop(self, k, None)  # the live state keeps what the log will hold
        self.dirty.clear()
        return changes, bad


class Recorder:
    """The state of one ``run``/``resume`` call and its record: emit, flush, finish."""

    def __init__(
        self,
        *,
        store: EventStore,
        plugins: PluginDispatcher,
        error_codes: Mapping[type, str],
        redact: Redactor,
        max_recoveries: int,
        rng: random.Random,
        session_id: str,
        ws: WorkflowState,
        workflow: str,
        input: Any,
        resumed: bool,
        on_event: Callable[[Event], None] | None,
        lease: Lease,
        lease_s: float,
        commits: GroupCommit | None = None,
    ) -> None:
        self.store = store
        self.commits = commits if commits is not None else GroupCommit(store)
        self.lease = lease  # renewed by the runner's lease keeper, from its thread
        self.lease_s = lease_s
        #: Until when the lease is safe, (monotonic, wall): one tuple, replaced whole by
        #: the keeper's thread, so the loop never reads half of a renewal.
        self.lease_until = safe_until(lease, lease_s)
        #: Why the keeper's last renewal failed, if the store refused the write (a full disk).
        self.renew_fault: BaseException | None = None
        #: The tasks of parallel branches running now (``Invocation._step``): a lost lease
        #: cancels them at once, not only when the root task gets to it.
        self.branches: set[asyncio.Task[Any]] = set()
        self.epoch = lease.epoch  # every append is fenced by it
        self.plugins = plugins
        self.hooks = plugins.has_node_hooks
        self.error_codes = error_codes
        self.redact = redact  # every message recorded passes through it (R13, docs/design.md)
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
        # id(exc) -> (exc, path, error_code, error_message): where a failure was recorded in this
        # invocation, so enclosing runs propagate it without recording it again
        # (R5, docs/design.md). Keyed per invocation: the same exception object raised
        # in another invocation is a new failure and is recorded again.
        self.reported: dict[int, tuple[BaseException, str, str, str]] = {}
        self.aborting = False
        self.abort_reason = "aborted"  # the NodeCancelled reason of an abort (Runner.abort)
        #: Called on the loop when the lease keeper finds a message in the session's inbox.
        self.on_mail: Callable[[], None] | None = None
        self.cancelled_by_request = False  # aborted for a cancel message (flowscope.cancel)
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
        #: Runs the log leaves open that contain another open run (containers, counted once
        #: at the deepest path, docs/design.md): a crash cut off the run inside, so
        #: re-entering one of these is not a recovery of its own.
        open_paths = [p for p, ns in ws.nodes.items() if ns.status in OPEN_STATES]
        self.containers = containers(open_paths) if len(open_paths) > 1 else set()
        deepest_running = self.statuses["running"] - sum(1 for p in self.containers if ws.nodes[p].status == "running")
        self.replayed = 0
        self.recovered = 0
        #: The ids of this session's last invocations in this process that halted on a
        #: store error (set by the runner): the runs they left open were cut off by the
        #: halt, cancelled though it could not be recorded, not by a crash.
        self.cut_off: frozenset[str] = frozenset()
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
            recovered=deepest_running,
            plugins=plugins.names,
            store=store,
        )

    def classify(self, exc: BaseException) -> ErrorInfo:
        """How this invocation names a failure: its error codes, its redaction."""
        return classify(exc, self.error_codes, self.redact)

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
        mono, wall = self.lease_until
        if time.monotonic() >= mono or time.time() >= wall:
            self.check_lease()  # the lease may have expired: record nothing (raises Halted)
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
        """Called on the loop when the lease is gone (taken over, or no longer safe): halt,
        and cancel the runs (a cancellation, never a failure).

        Every branch task is cancelled here, not only the root: a branch woken by its timer
        in the same loop turn would otherwise take its step (the rest of its body up to its
        next ``await``) before the root's cancellation reached it. Called from the keeper
        (``call_soon_threadsafe``) or from a signal handler (:meth:`Runner.check_leases
        <flowscope.engine.runner.Runner.check_leases>`): it takes no lock and calls no store.
        """
        if self.halted is not None:
            return
        self.halt(exc)
        self._cancel_runs(None)

    def _cancel_runs(self, spare: asyncio.Task[Any] | None) -> None:
        """Cancel the root task and every branch task but ``spare``."""
        for task in (self.root_task, *self.branches):
            if task is not None and task is not spare and not task.done():
                task.cancel()

    def lease_ok(self) -> bool:
        """Is the lease still safe by this process's clocks (``lease.py``)?"""
        mono, wall = self.lease_until
        return time.monotonic() < mono and time.time() < wall

    def renewed(self, lease: Lease, t0: float) -> None:
        """The keeper renewed the lease (requested at monotonic ``t0``). Its thread calls this."""
        self.lease_until = safe_until(lease, self.lease_s, t0)
        self.lease = lease
        self.renew_fault = None

    def check_lease(self) -> None:
        """Go on only if this invocation may still act: raise :class:`Halted` if it is
        halted, or if its lease is no longer safe (then it halts with ``LeaseExpired`` and
        its other runs are cancelled). Called before every node body, every retry's next
        attempt and every flush: a read of each clock, no store call."""
        if self.halted is None:
            mono, wall = self.lease_until
            if time.monotonic() < mono and time.time() < wall:
                return
            self.halt(lease_expired(self.session_id, self.renew_fault))
            self._cancel_runs(asyncio.current_task())  # this one unwinds by the Halted below
        error = self.halted
        assert error is not None
        raise Halted(error) from error

    def mail_arrived(self) -> None:
        """Called on the loop when the session's inbox has a message (see :mod:`.inbox`)."""
        if self.on_mail is not None and self.halted is None:
            self.on_mail()

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
