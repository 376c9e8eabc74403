"""Seeded random workflows and a driver, shared by the replay fuzzer and the crash tests.

A generated workflow mixes chains, parallel branches with joins, nested workflows (some
with a retry config), dynamic children, retries, timeouts, input requests and jobs.
Every node body records a side effect (its path) just before it returns, so a test can
count how often each run really did its work.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from flowscope import START, JoinNode, Node, RetryConfig, Workflow
from flowscope.errors import InvocationAbortedError
from flowscope.events import Event
from flowscope.store import EventStore, rebuild
from flowscope.store.base import NodeRun, SessionInfo


class SimulatedCrash(BaseException):
    """The process died: nothing after this point reaches the store."""


@dataclass
class Effects:
    """Side effects performed, per path. A dead process performs none."""

    counts: Counter[str] = field(default_factory=Counter)
    dead: bool = False

    def record(self, path: str) -> None:
        if not self.dead:
            self.counts[path] += 1


def _num(x: Any) -> int:
    if x is None:
        return 0
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, (int, float)):
        return int(x)
    if isinstance(x, dict):
        return sum(_num(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_num(v) for v in x)
    return len(str(x))


def answer_for(interrupt_id: str) -> int:
    return sum(map(ord, interrupt_id)) % 97


JOB_RESULT = {"success": True, "count": 1, "data": {"add": 5}}


async def _dispatch(job: Any) -> None:
    return None


def build_workflow(seed: int, effects: Effects) -> Workflow:
    rng = random.Random(seed)
    ids = itertools.count()

    def leaf(allow_pause: bool = True) -> Node:
        i = next(ids)
        kinds = ["plain", "plain", "marker", "retry", "dynamic", "timeout"]
        if allow_pause:
            kinds += ["input", "job"]
        kind = rng.choice(kinds)
        fail_times = rng.randint(1, 2)
        children = [leaf(allow_pause=False) for _ in range(rng.randint(1, 2))] if kind == "dynamic" else []
        yield_points = rng.randint(0, 2)

        async def body(ctx: Any, x: Any) -> Any:
            v = _num(x)
            for _ in range(yield_points):
                await asyncio.sleep(0)
            if kind == "retry" and ctx.attempt <= fail_times:
                raise ConnectionError(f"flaky {ctx.path}")
            if kind == "timeout" and ctx.attempt == 1:
                await asyncio.sleep(2)  # the 0.02 s timeout fires; attempt 2 is quick
            if kind == "input":
                v += _num(await ctx.request_input("value?"))
            if kind == "job":
                v += _num((await ctx.await_job(_dispatch, payload=v, expect_count=True))["add"])
            for child in children:
                v += _num(await ctx.run_node(child, v))
            effects.record(ctx.path)
            return None if kind == "marker" else (v * 7 + i) % 10007

        retry = None
        timeout = None
        if kind == "retry":
            retry = RetryConfig(max_attempts=fail_times + 1, initial_delay=0, jitter=0)
        elif kind == "timeout":
            timeout = 0.02
            retry = RetryConfig(max_attempts=2, initial_delay=0, jitter=0)
        return Node(body, name=f"{kind}{i}", retry=retry, timeout=timeout)

    def workflow(depth: int, name: str) -> Workflow:
        edges: list[tuple[Any, ...]] = []
        prev: Any = START
        for _ in range(rng.randint(1, 4)):
            shape = rng.choice(["leaf", "leaf", "parallel"] + (["nested"] if depth < 2 else []))
            if shape == "leaf":
                n = leaf()
                edges.append((prev, n))
                prev = n
            elif shape == "parallel":
                branches = tuple(leaf() for _ in range(rng.randint(2, 3)))
                join = JoinNode(f"join{next(ids)}")
                edges.append((prev, branches))
                edges.append((branches, join))
                prev = join
            else:
                retry = RetryConfig(max_attempts=2, initial_delay=0, jitter=0) if rng.random() < 0.3 else None
                inner = workflow(depth + 1, f"sub{next(ids)}")
                inner.retry = retry
                edges.append((prev, inner))
                prev = inner
        return Workflow(name, edges)

    return workflow(0, "fuzz")


class CrashingStore(EventStore):
    """Wraps a store and 'kills the process' once the log reaches ``crash_at`` events.

    The batch that reaches it is committed first when ``commit_last`` is true, or lost
    with the crash otherwise — a transaction is all or nothing either way.
    """

    def __init__(self, inner: EventStore, crash_at: int, commit_last: bool, effects: Effects) -> None:
        self.inner = inner
        self.crash_at = crash_at
        self.commit_last = commit_last
        self.effects = effects
        self.crashed_at_seq: int | None = None

    @property
    def dead(self) -> bool:
        return self.crashed_at_seq is not None

    def append(
        self, session_id: str, events: Any, expected_last_seq: int, *, epoch: int | None = None
    ) -> list[Event]:
        if self.dead:
            raise SimulatedCrash()
        if expected_last_seq + len(events) >= self.crash_at:
            if self.commit_last:
                self.inner.append(session_id, events, expected_last_seq, epoch=epoch)
            self.crashed_at_seq = self.inner.last_seq(session_id)
            self.effects.dead = True
            raise SimulatedCrash()
        return self.inner.append(session_id, events, expected_last_seq, epoch=epoch)

    def read(self, session_id: str, after_seq: int = 0) -> list[Event]:
        return self.inner.read(session_id, after_seq)

    def last_seq(self, session_id: str) -> int:
        return self.inner.last_seq(session_id)

    def sessions(self) -> list[SessionInfo]:
        return self.inner.sessions()

    def heartbeat(self, session_id: str, paths: Any, ts: float | None = None) -> None:
        if not self.dead:
            self.inner.heartbeat(session_id, paths, ts)

    def node_runs(self, session_id: str | None = None) -> list[NodeRun]:
        return self.inner.node_runs(session_id)

    def open_runs(self) -> list[NodeRun]:
        return self.inner.open_runs()

    # the ownership role: passed through; a crash is simulated on appends only
    def acquire(self, *args: Any, **kw: Any) -> Any:
        return self.inner.acquire(*args, **kw)

    def renew(self, *args: Any, **kw: Any) -> Any:
        return self.inner.renew(*args, **kw)

    def release(self, *args: Any, **kw: Any) -> None:
        self.inner.release(*args, **kw)

    def claim(self, *args: Any, **kw: Any) -> Any:
        return self.inner.claim(*args, **kw)

    def workers_seen(self, *args: Any, **kw: Any) -> None:
        self.inner.workers_seen(*args, **kw)

    def workers(self) -> Any:
        return self.inner.workers()

    # the inbox and upkeep roles: passed through (a take-in appends, so a dead store refuses it)
    def send(self, *args: Any, **kw: Any) -> Any:
        return self.inner.send(*args, **kw)

    def inbox(self, session_id: str) -> Any:
        return self.inner.inbox(session_id)

    def take_in(self, *args: Any, **kw: Any) -> Any:
        if self.dead:
            raise SimulatedCrash()
        return self.inner.take_in(*args, **kw)

    def exported_seq(self, session_id: str) -> int:
        return self.inner.exported_seq(session_id)

    def set_exported_seq(self, session_id: str, seq: int) -> None:
        self.inner.set_exported_seq(session_id, seq)

    def delete_sessions(self, session_ids: Any) -> list[str]:
        return self.inner.delete_sessions(session_ids)


def answers(store: EventStore, session_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the outside world would answer for everything the session waits on."""
    inputs: dict[str, Any] = {}
    jobs: dict[str, Any] = {}
    for e in rebuild(store.read(session_id)).pending:
        if e.type == "input_requested":
            inputs[e.interrupt_id] = answer_for(e.interrupt_id)  # type: ignore[attr-defined]
        elif e.type == "job_dispatched":
            jobs[e.job_id] = JOB_RESULT  # type: ignore[attr-defined]
    return inputs, jobs


async def drive(make_runner: Any, session_id: str, run_input: Any, max_invocations: int = 60) -> Any:
    """Run, then resume with the world's answers until the session completes.

    ``make_runner()`` is called for every invocation, as a new process would build one.
    A simulated crash or an abort just ends that invocation; the next one resumes.
    """
    runner = make_runner()
    try:
        result = await runner.run(run_input, session_id=session_id)
    except (SimulatedCrash, InvocationAbortedError):
        result = None
    for _ in range(max_invocations):
        if result is not None and result.status == "completed":
            return result.output
        runner = make_runner()
        events = runner.store.read(session_id)
        state = rebuild(events)
        if state.status == "completed":  # the crash came after the run had finished
            return state.output
        inputs, jobs = answers(runner.store, session_id)
        try:
            if not events:  # the crash came before anything was written: start again
                result = await runner.run(run_input, session_id=session_id)
            else:
                result = await runner.resume(session_id, inputs=inputs, jobs=jobs, force=True)
        except (SimulatedCrash, InvocationAbortedError):
            result = None
    raise AssertionError(f"session {session_id} did not complete in {max_invocations} invocations")
