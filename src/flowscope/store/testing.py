"""The :class:`EventStore` contract as a reusable test suite: every adapter must pass it.

Subclass :class:`EventStoreContract` in a class whose name starts with ``Test`` and give
it the one factory, :meth:`~EventStoreContract.create_store`; pytest then collects and
runs every ``test_*`` method against your store::

    from flowscope.store.testing import EventStoreContract

    class TestMyStore(EventStoreContract):
        def create_store(self) -> EventStore:
            return MyStore(self.tmp_path / "events.db")   # a fresh directory per test

Each test gets a new, empty store from ``create_store()`` and closes it afterwards. The
suite needs pytest (it uses fixtures, ``parametrize`` and ``raises``); flowscope does not
import this module, so pytest is only needed where the suite runs. The helpers
(:func:`one_of_each`, :func:`random_log`, :func:`append_in_batches`, ...) build the logs
the contract uses, for an adapter's own tests too.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar

import pytest

from ..errors import ConcurrencyConflict, LeaseLost
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
    RunSubmitted,
    StateUpdated,
    UnknownEvent,
)
from ..fold import OPEN_STATES, containers, rebuild
from ..liveness import ORPHANED, OVERDUE, RUNNING, classify_open_run, owner_alive
from ..ownership import Lease, Owner, process_start_time, this_host, this_process
from .base import EventStore, JobResultGroup, NodeRun, OpenRunGroup, QueuedGroup, SessionInfo, summarize_open_runs

__all__ = [
    "EventStoreContract",
    "SID",
    "INV",
    "ev",
    "node_ev",
    "one_of_each",
    "random_log",
    "append_in_batches",
    "run_of",
    "LIVENESS_CASES",
    "dead_owner",
    "other_host_owner",
]

SID = "s1"
INV = "inv-1"
E = TypeVar("E", bound=Event)


def ev(cls: type[E], sid: str = SID, **kw: Any) -> E:
    """An event of ``cls`` in session ``sid`` (invocation ``INV`` unless given)."""
    kw.setdefault("invocation_id", INV)
    return cls(session_id=sid, **kw)


def node_ev(cls: type[E], path: str, ts: float, sid: str = SID, **kw: Any) -> E:
    """A node event at ``path``; the node name is the path's last segment without ``@n``."""
    return ev(cls, sid=sid, path=path, node=path.rsplit("/", 1)[-1].split("@")[0], ts=ts, **kw)


def one_of_each(sid: str = SID) -> list[Event]:
    """One event of every type in the catalog, every field set to a non-default value."""
    p = "wf@1/fetch@1"
    common: dict[str, Any] = dict(session_id=sid, invocation_id="inv-7", path=p, node="fetch")
    return [
        RunStarted(session_id=sid, invocation_id="inv-7", ts=1.5, workflow="wf", input={"since": "2024-01-01", "n": [1, 2.5]},
                   resumed=True, replayed=3, recovered=1, trace_context={"traceparent": "00-ab-cd-01"}),
        NodeStarted(ts=2.0, attempt=2, kind="workflow", parent_path="wf@1", recovered=True, **common),
        NodeRetrying(ts=2.5, attempt=2, error_type="TimeoutError", error_code="UPSTREAM_TIMEOUT",
                     error_message="timed out after 2s", delay_s=0.25, error_qualname="etl.upstream.TimeoutError", **common),
        StateUpdated(ts=2.6, values={"cursor": 42, "seen": ["a", "b"]}, **common),
        InputRequested(ts=3.0, interrupt_id="approve", prompt="Approve?", payload={"amount": 12.5}, **common),
        InputReceived(ts=3.5, interrupt_id="approve", value={"ok": True, "by": "ann"}, **common),
        JobDispatched(ts=4.0, job_id="job-1", dispatch_attempt=2, idempotency_key="key-2",
                      trace_context={"traceparent": "00-ef-01-01"}, deadline_s=3600.0, expect_count=True,
                      job_key="enrich#1", **common),
        JobResultReceived(ts=4.5, job_id="job-1", success=True, count=7, error="partial", data={"rows": [1, 2]},
                          result="success", **common),
        NodePaused(ts=4.6, waiting="job", origin_path="wf@1/fetch@1/child@1", interrupt_ids=("a", "b"), **common),
        NodeCompleted(ts=5.0, output={"rows": 7, "nested": {"x": None}}, has_output=False, route="ok",
                      attempt_count=3, completed=False, **common),
        NodeErrorEvent(ts=5.5, error_code="BAD_INPUT", error_message="bad row 3", error_type="ValueError",
                       attempt_count=4, error_qualname="etl.rows.ValueError", **common),
        NodeErrorPropagated(ts=5.6, origin_path="wf@1/fetch@1/child@1", error_code="BAD_INPUT",
                            error_type="ValueError", attempt_count=2, error_qualname="etl.rows.ValueError", **common),
        NodeCancelled(ts=5.7, reason="sibling failed", **common),
        RunFinished(session_id=sid, invocation_id="inv-7", ts=6.0, status="failed", output={"partial": True},
                    error_code="BAD_INPUT", error_path=p, replayed=2, recovered=1),
        RunSubmitted(session_id=sid, invocation_id="inv-8", ts=7.0, workflow="wf", input={"again": [1]}, reason="retried by ops: flaky disk"),
    ]


# --------------------------------------------------------------------------- a random valid log

NAMES = ("fetch", "check", "send", "crm", "report")


def random_log(rnd: random.Random, sid: str, n: int, t0: float = 1000.0) -> list[Event]:
    """A plausible session log of about ``n`` events: several invocations, retries,
    failures, cancellations, pauses for input and jobs, crashes, recoveries, unknown types."""
    out: list[Event] = []
    ts = t0
    inv_no = 0
    attempts: dict[str, int] = {}
    waiting: dict[str, str] = {}  # path -> "input" | "job"
    counter = 0

    def add(cls: type[Event], **kw: Any) -> None:
        nonlocal ts
        ts += rnd.choice((0.001, 0.01, 0.5))
        out.append(cls(session_id=sid, invocation_id=f"inv-{inv_no}", ts=ts, **kw))

    while len(out) < n:
        inv_no += 1
        add(RunStarted, workflow="wf", input={"n": inv_no}, resumed=inv_no > 1)
        running: list[str] = []
        # resume what was waiting or cut off by a crash
        for p in list(waiting):
            kind = waiting.pop(p)
            if kind == "input":
                add(InputReceived, path=p, node=p.split("/")[-1].split("@")[0], interrupt_id=f"i-{p}", value=rnd.random())
            else:
                add(JobResultReceived, path=p, node=p.split("/")[-1].split("@")[0], job_id=f"j-{p}",
                    success=True, count=1, data={"k": 1}, result="success")
            add(NodeStarted, path=p, node=p.split("/")[-1].split("@")[0], attempt=attempts[p], parent_path="wf@1")
            running.append(p)
        for _ in range(rnd.randint(3, 30)):
            r = rnd.random()
            if r < 0.3 or not running:
                counter += 1
                name = rnd.choice(NAMES)
                p = f"wf@1/{name}@{counter}"
                attempts[p] = 1
                add(NodeStarted, path=p, node=name, attempt=1, kind=rnd.choice(("function", "workflow")),
                    parent_path="wf@1")
                running.append(p)
                continue
            p = rnd.choice(running)
            node = p.split("/")[-1].split("@")[0]
            if r < 0.4:
                add(NodeRetrying, path=p, node=node, attempt=attempts[p], error_type="TimeoutError",
                    error_code="UPSTREAM_TIMEOUT", error_message="slow", delay_s=0.01)
                attempts[p] += 1
            elif r < 0.45:
                add(StateUpdated, path=p, node=node, values={"k": rnd.randint(0, 9)})
            elif r < 0.5:
                add(UnknownEvent, type="future_event", path=p, node=node, data={"x": rnd.randint(0, 9)})
            else:
                running.remove(p)
                if r < 0.7:
                    has = rnd.random() < 0.7
                    add(NodeCompleted, path=p, node=node, output={"v": rnd.randint(0, 99)} if has else None,
                        has_output=has, attempt_count=attempts[p])
                elif r < 0.76:
                    add(NodeErrorEvent, path=p, node=node, error_code=rnd.choice(("UNKNOWN_ERROR", "BAD")),
                        error_type="ValueError", error_message="boom", attempt_count=attempts[p])
                elif r < 0.8:
                    add(NodeErrorPropagated, path=p, node=node, origin_path=p + "/child@1", error_code="BAD",
                        error_type="ValueError", attempt_count=attempts[p])
                elif r < 0.85:
                    add(NodeCancelled, path=p, node=node, reason="sibling failed")
                elif r < 0.9:
                    add(InputRequested, path=p, node=node, interrupt_id=f"i-{p}", prompt="ok?", payload={"q": 1})
                    waiting[p] = "input"
                elif r < 0.95:
                    add(JobDispatched, path=p, node=node, job_id=f"j-{p}", idempotency_key=f"k-{p}",
                        deadline_s=rnd.choice((None, 60.0, 3600.0)))
                    waiting[p] = "job"
                else:
                    add(NodePaused, path=p, node=node, waiting="input", origin_path=p + "/child@1")
        if rnd.random() < 0.3 and running:
            # the process died: no RunFinished; the next invocation recovers the runs
            for p in running:
                attempts[p] += 1
                waiting.pop(p, None)
            inv_no += 1
            add(RunStarted, workflow="wf", resumed=True, recovered=len(running))
            for p in running:
                add(NodeStarted, path=p, node=p.split("/")[-1].split("@")[0], attempt=attempts[p], recovered=True,
                    parent_path="wf@1")
                add(NodeCompleted, path=p, node=p.split("/")[-1].split("@")[0], output=None, has_output=False,
                    attempt_count=attempts[p])
            running = []
        status = "paused" if waiting else rnd.choice(("completed", "failed", "cancelled"))
        if running and rnd.random() < 0.5:
            status = "failed"
            for p in running:
                add(NodeCancelled, path=p, node=p.split("/")[-1].split("@")[0], reason="aborted")
        add(RunFinished, status=status, output={"inv": inv_no} if status == "completed" else None,
            error_code="BAD" if status == "failed" else None)
    return out


def append_in_batches(store: EventStore, sid: str, events: Sequence[Event], rnd: random.Random) -> None:
    """Append ``events`` in batches of random sizes, as a runner and its resumes would."""
    i = 0
    while i < len(events):
        k = rnd.choice((1, 1, 2, 3, 7, 50))
        store.append(sid, events[i : i + k], i)
        i += k


def run_of(store: EventStore, path: str, sid: str = SID) -> NodeRun:
    """The one node run of ``sid`` at ``path``."""
    [r] = [r for r in store.node_runs(sid) if r.path == path]
    return r


# --------------------------------------------------------------------------- liveness cases

#: ``(node, status, started_at, heartbeat_at, job_deadline_at, expected class)`` at
#: ``now=1000`` with ``stale_after_s=60`` (so the cut-off is 940): each on its own node,
#: so each is its own group of ``open_run_summary``. Boundaries included: a heartbeat at
#: the cut-off is alive, a deadline equal to ``now`` is not yet overdue.
LIVENESS_NOW, LIVENESS_STALE_AFTER_S = 1000.0, 60.0
LIVENESS_CASES: tuple[tuple[str, str, float, float | None, float | None, str], ...] = (
    ("fresh", "running", 900.0, 990.0, None, "running"),
    ("stale", "running", 900.0, 939.0, None, "orphaned"),
    ("at_cutoff", "running", 900.0, 940.0, None, "running"),
    ("old_start", "running", 930.0, None, None, "orphaned"),
    ("new_start", "running", 950.0, None, None, "running"),
    ("late_job", "waiting_job", 900.0, None, 950.0, "overdue"),
    ("due_now", "waiting_job", 900.0, None, 1000.0, "waiting_job"),
    ("future_job", "waiting_job", 900.0, None, 5000.0, "waiting_job"),
    ("no_deadline", "waiting_job", 900.0, None, None, "waiting_job"),
    ("input", "waiting_input", 900.0, None, None, "waiting_input"),
    ("done", "completed", 900.0, None, None, "completed"),
)


def _liveness_log(sid: str = SID) -> list[Event]:
    """Events that leave every run of :data:`LIVENESS_CASES` in its status and times."""
    out: list[Event] = [ev(RunStarted, sid=sid, workflow="live", ts=1.0)]
    for name, status, started, _beat, deadline, _cls in LIVENESS_CASES:
        p = f"live@1/{name}@1"
        out.append(node_ev(NodeStarted, p, ts=started, sid=sid))
        if status == "waiting_job":
            deadline_s = None if deadline is None else deadline - (started + 1.0)
            out.append(node_ev(JobDispatched, p, ts=started + 1.0, sid=sid, job_id=f"j-{name}", deadline_s=deadline_s))
        elif status == "waiting_input":
            out.append(node_ev(InputRequested, p, ts=started + 1.0, sid=sid, interrupt_id=f"i-{name}"))
        elif status == "completed":
            out.append(node_ev(NodeCompleted, p, ts=started + 1.0, sid=sid))
    return out


# --------------------------------------------------------------------------- containers

def _nested_logs(t: float) -> dict[str, list[Event]]:
    """Sessions whose open runs nest (counted once, at the deepest path):

    - ``crashed``: ``wf@1`` > ``inner@1`` (a nested workflow) > ``leaf@1``, all running
      (a dead worker), plus ``wf@1/inner@10`` running with nothing below it (its path starts
      like ``inner@1``'s, it is no descendant of it) and ``wf@1/inner@1-b`` (a character
      below ``/``) running, and a completed ``wf@1/done@1``;
    - ``paused``: ``pw@1`` paused by ``pw@1/ask@1`` (both waiting_input);
    - ``between``: ``bw@1`` running with only finished runs below it: it is the cut-off run.
    """
    crashed: list[Event] = [ev(RunStarted, sid="crashed", workflow="wf", ts=t)]
    for path, kind in (("wf@1", "workflow"), ("wf@1/done@1", "function"), ("wf@1/inner@1", "workflow"),
                       ("wf@1/inner@1/leaf@1", "function"), ("wf@1/inner@10", "function"),
                       ("wf@1/inner@1-b", "function")):
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        crashed.append(node_ev(NodeStarted, path, ts=t + 1, sid="crashed", kind=kind, parent_path=parent))
    crashed.append(node_ev(NodeCompleted, "wf@1/done@1", ts=t + 2, sid="crashed"))
    paused: list[Event] = [
        ev(RunStarted, sid="paused", workflow="pw", ts=t),
        node_ev(NodeStarted, "pw@1", ts=t + 1, sid="paused", kind="workflow"),
        node_ev(NodeStarted, "pw@1/ask@1", ts=t + 1, sid="paused", parent_path="pw@1"),
        node_ev(InputRequested, "pw@1/ask@1", ts=t + 2, sid="paused", interrupt_id="ok"),
        node_ev(NodePaused, "pw@1", ts=t + 2, sid="paused", waiting="input", origin_path="pw@1/ask@1",
                interrupt_ids=("ok",)),
        ev(RunFinished, sid="paused", status="paused", ts=t + 3),
    ]
    between: list[Event] = [
        ev(RunStarted, sid="between", workflow="bw", ts=t),
        node_ev(NodeStarted, "bw@1", ts=t + 1, sid="between", kind="workflow"),
        node_ev(NodeStarted, "bw@1/first@1", ts=t + 1, sid="between", parent_path="bw@1"),
        node_ev(NodeCompleted, "bw@1/first@1", ts=t + 2, sid="between"),
    ]
    return {"crashed": crashed, "paused": paused, "between": between}


# --------------------------------------------------------------------------- owners


def dead_owner(worker_id: str = "w-dead") -> Owner:
    """The owner record of a real process on this host that has been SIGKILLed (and reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = None
        for _ in range(100):  # /proc may lag the fork by a moment
            started = process_start_time(proc.pid)
            if started is not None:
                break
            time.sleep(0.01)
        owner = Owner(worker_id, this_host(), proc.pid, started)
        assert owner_alive(owner, time.time() + 60, time.time())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return owner


def other_host_owner(worker_id: str = "w-far", pid: int = 4242) -> Owner:
    """An owner on another host: alive exactly while its lease lasts."""
    return Owner(worker_id, this_host() + "-elsewhere", pid, 1.0)


def _submitted(sid: str, workflow: str, ts: float) -> list[Event]:
    return [RunSubmitted(session_id=sid, invocation_id="submit-1", ts=ts, workflow=workflow, input={"n": sid})]


def _paused_log(sid: str, workflow: str, t: float) -> list[Event]:
    p = f"{workflow}@1/ask@1"
    return [
        ev(RunStarted, sid=sid, workflow=workflow, ts=t),
        node_ev(NodeStarted, p, ts=t + 1, sid=sid),
        node_ev(InputRequested, p, ts=t + 2, sid=sid, interrupt_id="ok"),
        ev(RunFinished, sid=sid, status="paused", ts=t + 3),
    ]


def _answer(sid: str, workflow: str, t: float) -> list[Event]:
    return [node_ev(InputReceived, f"{workflow}@1/ask@1", ts=t, sid=sid, interrupt_id="ok", value=True,
                    invocation_id="answer-1a2b")]


# --------------------------------------------------------------------------- the contract


class EventStoreContract:
    """What every :class:`EventStore` must do, as pytest test methods.

    Subclass it (in a ``Test*`` class) and implement :meth:`create_store`.
    """

    tmp_path: Path

    def create_store(self) -> EventStore:
        """A new, empty store for one test; ``self.tmp_path`` is a fresh directory."""
        raise NotImplementedError  # abstract

    def open_again(self, store: EventStore) -> EventStore | None:
        """A second handle on ``store``'s data (another connection, as another process
        would have), or None if the store cannot have one (then the claim race runs
        on the one object from two threads). The caller closes it."""
        return None

    @pytest.fixture(autouse=True)
    def _contract_tmp_path(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    @pytest.fixture
    def store(self, _contract_tmp_path: None) -> Iterator[EventStore]:
        s = self.create_store()
        try:
            yield s
        finally:
            s.close()

    def test_open_run_summary_agrees_with_the_liveness_rule(self, store: EventStore) -> None:
        store.append(SID, _liveness_log(), 0)
        beats = {f"live@1/{name}@1": beat for name, _s, _st, beat, _d, _c in LIVENESS_CASES if beat is not None}
        for path, beat in beats.items():
            store.heartbeat(SID, [path], ts=beat)
        now, stale = LIVENESS_NOW, LIVENESS_STALE_AFTER_S
        runs = {r.node: r for r in store.node_runs(SID)}
        groups = {g.node: g for g in store.open_run_summary(now, stale)}
        assert len(groups) == len(LIVENESS_CASES) - 1  # the completed run is in no group
        for name, status, started, _beat, deadline, expected in LIVENESS_CASES:
            r = runs[name]
            assert (r.status, r.started_at, r.job_deadline_at) == (status, started, deadline), name
            cls = classify_open_run(r.status, r.started_at, r.heartbeat_at, r.job_deadline_at, now, stale)
            assert cls == expected, name
            if status not in OPEN_STATES:
                assert name not in groups
                continue
            g = groups[name]
            assert (g.workflow, g.state, g.count, g.oldest_started_at) == ("live", status, 1, started), name
            assert (g.orphaned, g.overdue) == (int(cls == ORPHANED), int(cls == OVERDUE)), name
        key = lambda g: (g.workflow, g.node, g.state)  # noqa: E731
        assert sorted(store.open_run_summary(now, stale), key=key) == sorted(
            summarize_open_runs(store.open_runs(), now, stale), key=key
        )

    def test_open_run_summary_counts_once_at_the_deepest_path(self, store: EventStore) -> None:
        """A run open only because a run below it is (a container) is in no group: one dead
        worker is one orphan, one pause one waiting run (docs/design.md, "Counting once")."""
        for sid, events in _nested_logs(100.0).items():
            store.append(sid, events, 0)
        now, stale = 1000.0, 60.0  # every heartbeat (at 101) is stale: the running runs are orphaned
        key = lambda g: (g.workflow, g.node, g.state)  # noqa: E731
        got = sorted(store.open_run_summary(now, stale), key=key)
        assert got == [
            OpenRunGroup("bw", "bw", "running", 1, 101.0, 1, 0),
            OpenRunGroup("pw", "ask", "waiting_input", 1, 101.0, 0, 0),
            OpenRunGroup("wf", "inner", "running", 2, 101.0, 2, 0),  # inner@10 and inner@1-b
            OpenRunGroup("wf", "leaf", "running", 1, 101.0, 1, 0),
        ]
        assert got == sorted(summarize_open_runs(store.open_runs(), now, stale), key=key)
        by_session: dict[str, list[str]] = {}
        for r in store.open_runs():
            by_session.setdefault(r.session_id, []).append(r.path)
        assert {sid: containers(paths) for sid, paths in by_session.items()} == {
            "crashed": {"wf@1", "wf@1/inner@1"}, "paused": {"pw@1"}, "between": set()}

    def test_job_result_summary_counts_every_result_in_the_log(self, store: EventStore) -> None:
        assert store.job_result_summary() == []
        p = "etl@1/inner@1/enrich@1"
        store.append("j1", [ev(RunStarted, sid="j1", workflow="etl", ts=1.0),
                            node_ev(NodeStarted, p, ts=2.0, sid="j1"),
                            node_ev(JobDispatched, p, ts=3.0, sid="j1", job_id="a"),
                            node_ev(JobResultReceived, p, ts=4.0, sid="j1", job_id="a", success=True, count=0,
                                    result="empty", invocation_id="answer-1")], 0)
        assert store.job_result_summary() == [JobResultGroup("etl", "enrich", "empty", 1)]
        # appended later (another process's answer, another session): counted on the next call
        store.append("j1", [node_ev(JobResultReceived, p, ts=5.0, sid="j1", job_id="b", success=True, count=2,
                                    result="success")], 4)
        store.append("j2", [ev(RunStarted, sid="j2", workflow="etl", ts=1.0),
                            node_ev(JobResultReceived, p, ts=6.0, sid="j2", job_id="c", success=False,
                                    result="failed"),
                            node_ev(JobResultReceived, p, ts=7.0, sid="j2", job_id="d", success=True, count=0,
                                    result="empty")], 0)
        assert sorted(store.job_result_summary(), key=lambda g: g.result) == [
            JobResultGroup("etl", "enrich", "empty", 2), JobResultGroup("etl", "enrich", "failed", 1),
            JobResultGroup("etl", "enrich", "success", 1)]

    def test_round_trip_of_every_event_type(self, store: EventStore) -> None:
        sample = one_of_each()
        stored = store.append(SID, sample, 0)
        assert [e.seq for e in stored] == list(range(1, len(sample) + 1))
        back = store.read(SID)
        assert back == stored
        for a, b in zip(back, sample):
            assert type(a) is type(b)
            assert dataclasses.replace(a, seq=0) == b
        paused = back[8]
        assert isinstance(paused, NodePaused)
        assert paused.interrupt_ids == ("a", "b")  # a tuple again, not a JSON list

    def test_seq_is_gap_free_from_one_across_batches(self, store: EventStore) -> None:
        events = [node_ev(NodeStarted, f"wf@1/n@{i}", ts=float(i)) for i in range(1, 11)]
        out = store.append(SID, events[:3], 0)
        assert [e.seq for e in out] == [1, 2, 3]
        out = store.append(SID, events[3:4], 3)
        assert [e.seq for e in out] == [4]
        out = store.append(SID, events[4:], 4)
        assert [e.seq for e in out] == list(range(5, 11))
        assert [e.seq for e in store.read(SID)] == list(range(1, 11))
        assert store.last_seq(SID) == 10

    def test_sessions_are_numbered_independently(self, store: EventStore) -> None:
        store.append("a", [ev(RunStarted, sid="a", workflow="w", ts=1.0)], 0)
        store.append("b", [ev(RunStarted, sid="b", workflow="w", ts=2.0)], 0)
        store.append("a", [ev(RunFinished, sid="a", ts=3.0)], 1)
        assert [e.seq for e in store.read("a")] == [1, 2]
        assert [e.seq for e in store.read("b")] == [1]

    def test_pre_numbered_events_that_continue_the_log_are_kept(self, store: EventStore) -> None:
        e1 = ev(RunStarted, workflow="w", ts=1.0, seq=1)
        e2 = node_ev(NodeStarted, "w@1/a@1", ts=2.0, seq=2)
        assert store.append(SID, [e1, e2], 0) == [e1, e2]
        assert store.read(SID) == [e1, e2]

    @pytest.mark.parametrize("bad_seq", [1, 2, 4, 7])
    def test_pre_numbered_events_that_do_not_continue_the_log_are_rejected(self, store: EventStore, bad_seq: int) -> None:
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        before = (store.read(SID), store.sessions(), store.node_runs())
        with pytest.raises(ValueError):
            store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0, seq=bad_seq)], 2)
        # a valid first event does not let an invalid second one through
        with pytest.raises(ValueError):
            store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0, seq=3),
                                     node_ev(NodeStarted, "w@1/b@1", ts=4.0, seq=3)], 2)
        assert (store.read(SID), store.sessions(), store.node_runs()) == before

    def test_an_event_of_another_session_is_rejected(self, store: EventStore) -> None:
        with pytest.raises(ValueError):
            store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), ev(RunFinished, sid="other", ts=2.0)], 0)
        assert store.read(SID) == [] and store.read("other") == []
        assert store.last_seq(SID) == 0
        assert store.node_runs() == []

    @pytest.mark.parametrize("stale", [0, 1, 3, 9])
    def test_stale_expected_seq_raises_conflict_and_writes_nothing(self, store: EventStore, stale: int) -> None:
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        before = (store.read(SID), store.sessions(), store.node_runs(), store.open_runs())
        with pytest.raises(ConcurrencyConflict):
            store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0), ev(RunFinished, ts=4.0)], stale)
        assert (store.read(SID), store.sessions(), store.node_runs(), store.open_runs()) == before
        assert store.last_seq(SID) == 2

    def test_conflict_on_a_new_session_creates_nothing(self, store: EventStore) -> None:
        with pytest.raises(ConcurrencyConflict):
            store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 1)
        assert store.read(SID) == []
        assert store.last_seq(SID) == 0
        assert store.sessions() == []

    def test_the_second_of_two_writers_with_the_same_expected_seq_loses(self, store: EventStore) -> None:
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 0)
        seen = store.last_seq(SID)
        store.append(SID, [node_ev(NodeStarted, "w@1/a@1", ts=2.0)], seen)
        with pytest.raises(ConcurrencyConflict):
            store.append(SID, [node_ev(NodeStarted, "w@1/b@1", ts=2.0)], seen)
        assert [e.path for e in store.read(SID)] == ["", "w@1/a@1"]

    def test_read_after_seq(self, store: EventStore) -> None:
        events = store.append(SID, [node_ev(NodeStarted, f"wf@1/n@{i}", ts=float(i)) for i in range(1, 8)], 0)
        assert store.read(SID, 0) == events
        assert store.read(SID, 3) == events[3:]
        assert [e.seq for e in store.read(SID, 6)] == [7]
        assert store.read(SID, 7) == []
        assert store.read(SID, 50) == []
        assert store.read("nobody") == []

    def test_last_seq(self, store: EventStore) -> None:
        assert store.last_seq(SID) == 0
        assert not store.has_session(SID)
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 0)
        assert store.last_seq(SID) == 1
        assert store.has_session(SID)
        store.append(SID, [ev(RunFinished, ts=2.0)] * 1, 1)
        assert store.last_seq(SID) == 2

    def test_sessions_follow_run_started_and_run_finished(self, store: EventStore) -> None:
        assert store.sessions() == []
        store.append(SID, [ev(RunStarted, workflow="orders", ts=10.0)], 0)
        [s] = store.sessions()
        assert s == SessionInfo(SID, "orders", "running", 10.0, 10.0, 1, 1)
        store.append(SID, [node_ev(NodeStarted, "orders@1/a@1", ts=11.0),
                                 node_ev(InputRequested, "orders@1/a@1", ts=12.0, interrupt_id="x"),
                                 ev(RunFinished, status="paused", ts=13.0)], 1)
        [s] = store.sessions()
        assert (s.status, s.last_seq, s.updated_at, s.invocations) == ("paused", 4, 13.0, 1)
        # a resume: a second invocation, the workflow and start time stay those of the first
        store.append(SID, [ev(RunStarted, workflow="renamed", resumed=True, ts=20.0, invocation_id="inv-2")], 4)
        [s] = store.sessions()
        assert (s.workflow, s.status, s.started_at, s.invocations) == ("orders", "running", 10.0, 2)
        store.append(SID, [ev(RunFinished, status="completed", ts=21.0, invocation_id="inv-2")], 5)
        assert store.sessions() == [SessionInfo(SID, "orders", "completed", 10.0, 21.0, 6, 2)]

    def test_sessions_are_listed_most_recently_updated_first(self, store: EventStore) -> None:
        store.append("a", [ev(RunStarted, sid="a", workflow="wa", ts=1.0)], 0)
        store.append("b", [ev(RunStarted, sid="b", workflow="wb", ts=2.0)], 0)
        store.append("c", [ev(RunStarted, sid="c", workflow="wc", ts=3.0)], 0)
        store.append("a", [ev(RunFinished, sid="a", status="failed", ts=4.0)], 1)
        assert [(s.session_id, s.status) for s in store.sessions()] == [
            ("a", "failed"), ("c", "running"), ("b", "running")]

    def test_node_runs_projection_follows_the_state_machine(self, store: EventStore) -> None:
        s = store
        p = "orders@1/fetch@1"
        seq = s.append(SID, [ev(RunStarted, workflow="orders", ts=100.0),
                             node_ev(NodeStarted, p, ts=101.0, kind="function", parent_path="orders@1")], 0)[-1].seq
        r = run_of(s, p)
        assert (r.session_id, r.workflow, r.node, r.path, r.kind) == (SID, "orders", "fetch", p, "function")
        assert (r.status, r.attempt, r.retries, r.recoveries) == ("running", 1, 0, 0)
        assert (r.started_at, r.ended_at, r.heartbeat_at, r.error_code, r.error_type, r.job_deadline_at) == (
            101.0, None, 101.0, None, None, None)

        seq = s.append(SID, [node_ev(NodeRetrying, p, ts=102.0, attempt=1, error_type="TimeoutError",
                                     error_code="UPSTREAM_TIMEOUT")], seq)[-1].seq
        r = run_of(s, p)
        assert (r.status, r.attempt, r.retries, r.heartbeat_at) == ("running", 2, 1, 102.0)
        seq = s.append(SID, [node_ev(NodeRetrying, p, ts=103.0, attempt=2, error_type="TimeoutError")], seq)[-1].seq
        assert (run_of(s, p).attempt, run_of(s, p).retries) == (3, 2)

        seq = s.append(SID, [node_ev(NodeCompleted, p, ts=104.0, output={"rows": 3}, attempt_count=3)], seq)[-1].seq
        r = run_of(s, p)
        assert (r.status, r.attempt, r.retries, r.started_at, r.ended_at) == ("completed", 3, 2, 101.0, 104.0)

        q = "orders@1/check@1"
        seq = s.append(SID, [node_ev(NodeStarted, q, ts=105.0),
                             node_ev(NodeErrorEvent, q, ts=106.0, error_code="BAD_INPUT", error_type="ValueError",
                                     error_message="row 3", attempt_count=1)], seq)[-1].seq
        r = run_of(s, q)
        assert (r.status, r.error_code, r.error_type, r.ended_at, r.attempt) == ("failed", "BAD_INPUT", "ValueError", 106.0, 1)

        c = "orders@1/crm@1"
        seq = s.append(SID, [node_ev(NodeStarted, c, ts=107.0), node_ev(NodeCancelled, c, ts=108.0)], seq)[-1].seq
        assert (run_of(s, c).status, run_of(s, c).ended_at) == ("cancelled", 108.0)

        i = "orders@1/approve@1"
        seq = s.append(SID, [node_ev(NodeStarted, i, ts=109.0),
                             node_ev(InputRequested, i, ts=110.0, interrupt_id="ok", prompt="?")], seq)[-1].seq
        assert run_of(s, i).status == "waiting_input"
        # resume: the input arrives and the run starts again, same attempt
        seq = s.append(SID, [node_ev(InputReceived, i, ts=111.0, interrupt_id="ok", value=True),
                             node_ev(NodeStarted, i, ts=112.0, attempt=1)], seq)[-1].seq
        r = run_of(s, i)
        assert (r.status, r.attempt, r.started_at, r.ended_at) == ("running", 1, 109.0, None)

        j = "orders@1/enrich@1"
        seq = s.append(SID, [node_ev(NodeStarted, j, ts=113.0),
                             node_ev(JobDispatched, j, ts=114.0, job_id="job-1", deadline_s=3600.0)], seq)[-1].seq
        r = run_of(s, j)
        assert (r.status, r.job_deadline_at) == ("waiting_job", 114.0 + 3600.0)
        seq = s.append(SID, [node_ev(JobResultReceived, j, ts=115.0, job_id="job-1", success=True, result="success")],
                       seq)[-1].seq
        assert run_of(s, j).job_deadline_at is None
        seq = s.append(SID, [node_ev(JobDispatched, j, ts=116.0, job_id="job-2")], seq)[-1].seq
        assert (run_of(s, j).status, run_of(s, j).job_deadline_at) == ("waiting_job", None)  # no deadline given

        w = "orders@1/sub@1"
        seq = s.append(SID, [node_ev(NodeStarted, w, ts=117.0, kind="workflow"),
                             node_ev(NodePaused, w, ts=118.0, waiting="job", origin_path=w + "/x@1")], seq)[-1].seq
        assert (run_of(s, w).status, run_of(s, w).kind) == ("waiting_job", "workflow")

        # a crash: the next invocation recovers the running run with the next attempt
        seq = s.append(SID, [ev(RunStarted, workflow="orders", resumed=True, recovered=1, ts=120.0, invocation_id="i2"),
                             node_ev(NodeStarted, i, ts=121.0, attempt=2, recovered=True, invocation_id="i2")], seq)[-1].seq
        r = run_of(s, i)
        assert (r.status, r.attempt, r.recoveries, r.heartbeat_at) == ("running", 2, 1, 121.0)

        # the projection is the fold of the log
        state = rebuild(s.read(SID))
        assert s.node_runs(SID) == [NodeRun.from_state(SID, state.workflow, ns) for ns in state.nodes.values()]

    def test_a_failed_run_resumed_by_an_operator_keeps_numbering(self, store: EventStore) -> None:
        p = "w@1/a@1"
        s = store
        s.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, p, ts=2.0),
                       node_ev(NodeRetrying, p, ts=3.0, attempt=1), node_ev(NodeRetrying, p, ts=4.0, attempt=2),
                       node_ev(NodeErrorEvent, p, ts=5.0, attempt_count=3, error_code="X")], 0)
        assert (run_of(s, p).status, run_of(s, p).attempt, run_of(s, p).error_code) == ("failed", 3, "X")
        s.append(SID, [node_ev(NodeStarted, p, ts=6.0, attempt=4)], 5)
        r = run_of(s, p)
        assert (r.status, r.attempt, r.retries, r.error_code, r.error_type) == ("running", 4, 2, None, None)

    def test_node_runs_for_one_session_or_all(self, store: EventStore) -> None:
        store.append("a", [ev(RunStarted, sid="a", workflow="wa", ts=1.0),
                                 node_ev(NodeStarted, "wa@1/x@1", sid="a", ts=2.0)], 0)
        store.append("b", [ev(RunStarted, sid="b", workflow="wb", ts=1.0),
                                 node_ev(NodeStarted, "wb@1/y@1", sid="b", ts=2.0),
                                 node_ev(NodeStarted, "wb@1/z@1", sid="b", ts=3.0)], 0)
        assert [r.path for r in store.node_runs("a")] == ["wa@1/x@1"]
        assert [r.path for r in store.node_runs("b")] == ["wb@1/y@1", "wb@1/z@1"]
        assert sorted((r.session_id, r.workflow, r.path) for r in store.node_runs()) == [
            ("a", "wa", "wa@1/x@1"), ("b", "wb", "wb@1/y@1"), ("b", "wb", "wb@1/z@1")]
        assert store.node_runs("nobody") == []

    def test_heartbeat_changes_only_running_rows(self, store: EventStore) -> None:
        s = store
        s.append(SID, [ev(RunStarted, workflow="w", ts=1.0),
                       node_ev(NodeStarted, "w@1/run@1", ts=2.0),
                       node_ev(NodeStarted, "w@1/done@1", ts=2.0), node_ev(NodeCompleted, "w@1/done@1", ts=3.0),
                       node_ev(NodeStarted, "w@1/wait@1", ts=2.0),
                       node_ev(InputRequested, "w@1/wait@1", ts=3.0, interrupt_id="i"),
                       node_ev(NodeStarted, "w@1/job@1", ts=2.0), node_ev(JobDispatched, "w@1/job@1", ts=3.0, job_id="j")], 0)
        before = {r.path: r for r in s.node_runs(SID)}
        s.heartbeat(SID, ["w@1/run@1", "w@1/done@1", "w@1/wait@1", "w@1/job@1", "w@1/nope@1"], ts=50.0)
        after = {r.path: r for r in s.node_runs(SID)}
        assert after["w@1/run@1"].heartbeat_at == 50.0
        assert after["w@1/run@1"] == dataclasses.replace(before["w@1/run@1"], heartbeat_at=50.0)
        for p in ("w@1/done@1", "w@1/wait@1", "w@1/job@1"):
            assert after[p] == before[p]
        assert set(after) == set(before)
        s.heartbeat("nobody", ["w@1/run@1"], ts=60.0)  # an unknown session is not an error
        s.heartbeat(SID, [], ts=60.0)
        assert run_of(s, "w@1/run@1").heartbeat_at == 50.0
        t0 = time.time()
        s.heartbeat(SID, ["w@1/run@1"])
        beat = run_of(s, "w@1/run@1").heartbeat_at
        assert beat is not None and t0 - 1 <= beat <= time.time() + 1
        assert s.read(SID)[-1].seq == 8  # heartbeats are not events

    def test_heartbeat_many_beats_running_rows_of_several_sessions(self, store: EventStore) -> None:
        s = store
        for sid in ("a", "b"):
            s.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1.0),
                           node_ev(NodeStarted, "w@1/run@1", sid=sid, ts=2.0),
                           node_ev(NodeStarted, "w@1/done@1", sid=sid, ts=2.0),
                           node_ev(NodeCompleted, "w@1/done@1", sid=sid, ts=3.0)], 0)
        s.heartbeat_many({"a": ["w@1/run@1", "w@1/done@1"], "b": ["w@1/run@1"], "nobody": ["w@1/run@1"]}, ts=50.0)
        for sid in ("a", "b"):
            beats = {r.path: r.heartbeat_at for r in s.node_runs(sid)}
            assert beats == {"w@1/run@1": 50.0, "w@1/done@1": 2.0}, (sid, beats)
        s.heartbeat_many({}, ts=60.0)
        s.heartbeat_many({"a": []}, ts=60.0)
        assert {r.path: r.heartbeat_at for r in s.node_runs("a")}["w@1/run@1"] == 50.0

    def test_open_runs_lists_only_open_states_oldest_first(self, store: EventStore) -> None:
        s = store
        s.append("a", [ev(RunStarted, sid="a", workflow="wa", ts=1.0),
                       node_ev(NodeStarted, "wa@1/late@1", sid="a", ts=30.0),
                       node_ev(NodeStarted, "wa@1/done@1", sid="a", ts=5.0), node_ev(NodeCompleted, "wa@1/done@1", sid="a", ts=6.0),
                       node_ev(NodeStarted, "wa@1/bad@1", sid="a", ts=4.0),
                       node_ev(NodeErrorEvent, "wa@1/bad@1", sid="a", ts=6.0),
                       node_ev(NodeStarted, "wa@1/job@1", sid="a", ts=10.0),
                       node_ev(JobDispatched, "wa@1/job@1", sid="a", ts=11.0, job_id="j", deadline_s=5.0)], 0)
        s.append("b", [ev(RunStarted, sid="b", workflow="wb", ts=1.0),
                       node_ev(NodeStarted, "wb@1/wait@1", sid="b", ts=20.0),
                       node_ev(InputRequested, "wb@1/wait@1", sid="b", ts=21.0, interrupt_id="i"),
                       node_ev(NodeStarted, "wb@1/first@1", sid="b", ts=2.0),
                       node_ev(NodeStarted, "wb@1/gone@1", sid="b", ts=3.0),
                       node_ev(NodeCancelled, "wb@1/gone@1", sid="b", ts=7.0)], 0)
        runs = s.open_runs()
        assert [(r.session_id, r.path, r.status) for r in runs] == [
            ("b", "wb@1/first@1", "running"),
            ("a", "wa@1/job@1", "waiting_job"),
            ("b", "wb@1/wait@1", "waiting_input"),
            ("a", "wa@1/late@1", "running"),
        ]
        assert all(r.status in OPEN_STATES for r in runs)
        assert runs[1].job_deadline_at == 16.0 and runs[1].workflow == "wa"
        # the open set shrinks as runs end
        s.append("b", [node_ev(NodeCompleted, "wb@1/first@1", sid="b", ts=40.0)], 6)
        assert [r.path for r in s.open_runs()] == ["wa@1/job@1", "wb@1/wait@1", "wa@1/late@1"]

    def test_unknown_event_types_round_trip_and_are_skipped_by_the_projection(self, store: EventStore) -> None:
        s = store
        unknown_run = UnknownEvent(type="run_annotated", session_id=SID, invocation_id=INV, ts=2.0,
                                   data={"note": "from a newer writer", "schema_version": 9})
        unknown_node = UnknownEvent(type="node_progress", session_id=SID, invocation_id=INV, ts=3.5,
                                    path="w@1/a@1", node="a", data={"percent": 40})
        unknown_new_path = UnknownEvent(type="node_progress", session_id=SID, invocation_id=INV, ts=3.6,
                                        path="w@1/ghost@1", node="ghost", data={})
        stored = s.append(SID, [ev(RunStarted, workflow="w", ts=1.0), unknown_run,
                                node_ev(NodeStarted, "w@1/a@1", ts=3.0), unknown_node, unknown_new_path,
                                node_ev(NodeCompleted, "w@1/a@1", ts=4.0)], 0)
        back = s.read(SID)
        assert back == stored
        run_note, node_note = back[1], back[3]
        assert type(run_note) is UnknownEvent and run_note.type == "run_annotated"
        assert run_note.data == {"note": "from a newer writer", "schema_version": 9}
        assert isinstance(node_note, UnknownEvent)
        assert node_note.data == {"percent": 40} and node_note.path == "w@1/a@1"
        assert [r.path for r in s.node_runs(SID)] == ["w@1/a@1"]  # no row for the unknown-only path
        assert run_of(s, "w@1/a@1").status == "completed"
        [info] = s.sessions()
        assert (info.status, info.last_seq, info.workflow) == ("running", 6, "w")
        assert rebuild(back).unknown_events == 3

    def test_projection_equals_the_fold_of_the_log(self, store: EventStore) -> None:
        rnd = random.Random(7)
        for k, sid in enumerate(("r1", "r2", "r3")):
            log = random_log(rnd, sid, 120, t0=1000.0 * (k + 1))
            append_in_batches(store, sid, log, rnd)
        for sid in ("r1", "r2", "r3"):
            events = store.read(sid)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            state = rebuild(events)
            assert store.node_runs(sid) == [NodeRun.from_state(sid, state.workflow, ns) for ns in state.nodes.values()]
            [info] = [i for i in store.sessions() if i.session_id == sid]
            assert info == SessionInfo(sid, state.workflow, state.status, state.started_at, state.updated_at,
                                       state.last_seq, state.invocations)
        open_runs = store.open_runs()
        assert open_runs == sorted((r for r in store.node_runs() if r.status in OPEN_STATES),
                                   key=lambda r: r.started_at or 0.0)

    def test_node_run_output_values_round_trip_exactly(self, store: EventStore) -> None:
        values = [None, 0, -1, 2**53 + 1, 1.5, -0.25, 1e300, "", "ünïcødé ✓ \u2028", "emoji \U0001F600", True, False,
                  [], {}, [1, [2, [3]]], {"a": {"b": None, "c": [True, 1.0]}}]
        events = [node_ev(NodeCompleted, f"w@1/v@{i}", ts=float(i), output=v) for i, v in enumerate(values)]
        store.append(SID, events, 0)
        back = store.read(SID)
        completed = [e for e in back if isinstance(e, NodeCompleted)]
        assert len(completed) == len(back)
        assert [e.output for e in completed] == values
        assert [type(e.output) for e in completed] == [type(v) for v in values]

    # ------------------------------------------------------------------ ownership (issue 13)

    def test_acquire_records_owner_epoch_and_lease_on_the_session(self, store: EventStore) -> None:
        me = this_process("w-1")
        lease = store.acquire(SID, me, 15.0, now=1000.0)  # the session need not exist yet
        assert lease == Lease(SID, me, 1, 1015.0)
        assert store.sessions() == [] and store.session_info(SID) is None  # no event, no session
        store.append(SID, [ev(RunStarted, workflow="w", ts=1000.5)], 0, epoch=lease.epoch)
        [info] = store.sessions()
        assert (info.owner, info.epoch, info.lease_expires_at, info.status) == (me, 1, 1015.0, "running")
        assert store.session_info(SID) == info
        assert store.session_info("nobody") is None

    def test_the_owner_record_keeps_whether_it_ships_its_own_spans(self, store: EventStore) -> None:
        shipper = dataclasses.replace(this_process("w-1"), ships_spans=True)
        lease = store.acquire("a", shipper, 15.0, now=1000.0)
        store.append("a", [ev(RunStarted, sid="a", workflow="w", ts=1000.5)], 0, epoch=lease.epoch)
        plain = store.acquire("b", this_process("w-2"), 15.0, now=1000.0)
        store.append("b", [ev(RunStarted, sid="b", workflow="w", ts=1000.5)], 0, epoch=plain.epoch)
        a, b = store.session_info("a"), store.session_info("b")
        assert a is not None and a.owner == shipper and a.owner.ships_spans
        assert b is not None and b.owner is not None and not b.owner.ships_spans

    def test_acquire_refuses_a_live_owner_naming_host_pid_and_lease_age(self, store: EventStore) -> None:
        now = time.time()
        holder = this_process("w-holder")  # this very process: alive
        store.acquire(SID, holder, 15.0, now=now - 2.0)
        with pytest.raises(ConcurrencyConflict) as err:
            store.acquire(SID, this_process("w-other"), 15.0, now=now)
        assert not isinstance(err.value, LeaseLost)
        msg = str(err.value)
        assert f"{holder.worker_id} on {holder.host} pid {holder.pid}" in msg, msg
        assert "renewed 2.0s ago" in msg and "expires in 13.0s" in msg, msg
        info = store.session_info(SID)
        assert info is None or info.epoch == 1  # nothing changed
        # a live owner on another host is refused too, while its lease lasts
        far = other_host_owner()
        store.acquire("s2", far, 10.0, now=now)
        with pytest.raises(ConcurrencyConflict, match=f"pid {far.pid}"):
            store.acquire("s2", this_process("w-other"), 10.0, now=now + 9.9)

    def test_acquire_by_the_same_owner_or_with_force_advances_the_epoch(self, store: EventStore) -> None:
        now = time.time()
        a, b = this_process("w-a"), this_process("w-b")
        assert store.acquire(SID, a, 15.0, now=now).epoch == 1
        assert store.acquire(SID, a, 15.0, now=now + 1).epoch == 2
        lease = store.acquire(SID, b, 15.0, force=True, now=now + 2)
        assert (lease.owner, lease.epoch, lease.expires_at) == (b, 3, now + 17.0)

    def test_acquire_takes_over_a_dead_same_host_owner_at_once(self, store: EventStore) -> None:
        now = time.time()
        gone = dead_owner()
        store.acquire(SID, gone, 3600.0, now=now)  # a long lease, still current
        store.append(SID, [ev(RunStarted, workflow="w", ts=now)], 0, epoch=1)
        lease = store.acquire(SID, this_process("w-new"), 15.0, now=now + 0.1)
        assert lease.epoch == 2
        info = store.session_info(SID)
        assert info is not None and info.owner == lease.owner

    def test_acquire_takes_over_an_expired_lease_from_another_host(self, store: EventStore) -> None:
        far = other_host_owner()
        store.acquire(SID, far, 10.0, now=1000.0)
        with pytest.raises(ConcurrencyConflict):
            store.acquire(SID, this_process("w-here"), 10.0, now=1009.0)
        lease = store.acquire(SID, this_process("w-here"), 10.0, now=1010.0)  # expires_at <= now: expired
        assert lease.epoch == 2

    def test_append_under_a_superseded_epoch_raises_lease_lost_and_writes_nothing(self, store: EventStore) -> None:
        first = store.acquire(SID, this_process("w-1"), 15.0, force=True)
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0,
                     epoch=first.epoch)
        second = store.acquire(SID, this_process("w-2"), 15.0, force=True)
        assert second.epoch == first.epoch + 1
        before = (store.read(SID), store.sessions(), store.node_runs(), store.open_runs())
        with pytest.raises(LeaseLost) as err:
            store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0)], 2, epoch=first.epoch)
        assert isinstance(err.value, ConcurrencyConflict)
        assert "w-2" in str(err.value)
        assert (store.read(SID), store.sessions(), store.node_runs(), store.open_runs()) == before
        with pytest.raises(LeaseLost):  # an epoch on a session nobody acquired
            store.append("s2", [ev(RunStarted, sid="s2", workflow="w", ts=1.0)], 0, epoch=1)
        assert store.read("s2") == []
        # the current epoch, and no epoch at all (bridges), both append
        store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0)], 2, epoch=second.epoch)
        store.append(SID, [ev(RunFinished, ts=4.0)], 3)
        assert store.last_seq(SID) == 4

    def test_renew_extends_the_lease_and_refuses_a_superseded_one(self, store: EventStore) -> None:
        lease = store.acquire(SID, this_process("w-1"), 15.0, now=1000.0)
        renewed = store.renew(lease, 15.0, now=1010.0)
        assert renewed == dataclasses.replace(lease, expires_at=1025.0)
        store.append(SID, [ev(RunStarted, workflow="w", ts=1010.0)], 0)
        info = store.session_info(SID)
        assert info is not None and info.lease_expires_at == 1025.0
        store.acquire(SID, this_process("w-2"), 15.0, force=True, now=1011.0)
        with pytest.raises(LeaseLost):
            store.renew(renewed, 15.0, now=1012.0)
        info = store.session_info(SID)
        assert info is not None and (info.epoch, info.lease_expires_at) == (2, 1026.0)

    def test_renew_many_renews_the_held_and_reports_the_lost(self, store: EventStore) -> None:
        leases = {sid: store.acquire(sid, this_process("w-1"), 15.0, now=1000.0) for sid in ("a", "b", "c")}
        for sid in leases:
            store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1000.0)], 0, epoch=leases[sid].epoch)
        taker = store.acquire("b", this_process("w-2"), 15.0, force=True, now=1005.0)
        out = store.renew_many([leases["a"], leases["b"], leases["c"]], 15.0, now=1010.0)
        assert out[0] == dataclasses.replace(leases["a"], expires_at=1025.0)
        assert out[2] == dataclasses.replace(leases["c"], expires_at=1025.0)
        assert isinstance(out[1], LeaseLost)
        info_b = store.session_info("b")
        assert info_b is not None and info_b.epoch == taker.epoch  # the taker's lease is untouched
        expiries = {sid: store.session_info(sid) for sid in leases}
        assert {sid: i.lease_expires_at for sid, i in expiries.items() if i is not None} == {"a": 1025.0, "b": 1020.0, "c": 1025.0}
        assert store.renew_many([], 15.0) == []

    def test_renew_from_another_thread(self, store: EventStore) -> None:
        lease = store.acquire(SID, this_process("w-1"), 15.0)
        store.append(SID, [ev(RunStarted, workflow="w", ts=time.time())], 0, epoch=lease.epoch)
        out: list[Any] = []

        def renew_loop() -> None:
            try:
                current = lease
                for _ in range(20):
                    current = store.renew(current, 30.0)
                out.append(current)
            except BaseException as exc:  # reported below
                out.append(exc)

        t = threading.Thread(target=renew_loop)
        t.start()
        for i in range(20):  # the owning thread keeps appending meanwhile
            store.append(SID, [node_ev(StateUpdated, "w@1/a@1", ts=time.time(), values={"i": i})], i + 1,
                         epoch=lease.epoch)
        t.join(30)
        [result] = out
        assert isinstance(result, Lease), result
        info = store.session_info(SID)
        assert info is not None and info.lease_expires_at == result.expires_at > lease.expires_at
        assert store.last_seq(SID) == 21

    def test_release_keeps_the_owner_and_lets_another_take_over_without_force(self, store: EventStore) -> None:
        a = this_process("w-a")
        lease = store.acquire(SID, a, 15.0)
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), ev(RunFinished, status="paused", ts=2.0)], 0)
        store.release(lease)
        info = store.session_info(SID)
        assert info is not None and (info.owner, info.epoch, info.lease_expires_at) == (a, 1, 0.0)
        taken = store.acquire(SID, this_process("w-b"), 15.0)
        assert taken.epoch == 2
        store.release(lease)  # superseded: ignored, never raises
        info = store.session_info(SID)
        assert info is not None and info.owner == taken.owner and info.lease_expires_at == taken.expires_at

    def test_status_goes_queued_running_paused_answered_running(self, store: EventStore) -> None:
        store.append(SID, _submitted(SID, "orders", 5.0), 0)
        [s] = store.sessions()
        assert (s.status, s.workflow, s.submitted_at, s.started_at, s.invocations) == ("queued", "orders", 5.0, None, 0)
        assert rebuild(store.read(SID)).input == {"n": SID}
        store.append(SID, _paused_log(SID, "orders", 10.0), 1)
        [s] = store.sessions()
        assert (s.status, s.started_at, s.submitted_at, s.invocations) == ("paused", 10.0, 5.0, 1)
        store.append(SID, _answer(SID, "orders", 20.0), 5)
        assert store.sessions()[0].status == "answered"
        store.append(SID, _answer(SID, "orders", 21.0), 6)  # a second answer keeps it answered
        assert store.sessions()[0].status == "answered"
        store.append(SID, [ev(RunStarted, workflow="orders", resumed=True, ts=30.0, invocation_id="inv-2")], 7)
        assert store.sessions()[0].status == "running"
        assert rebuild(store.read(SID)).status == "running"
        # an input received inside an invocation is no answer
        store.append("s2", _paused_log("s2", "orders", 1.0)
                     + [node_ev(InputReceived, "orders@1/ask@1", ts=5.0, sid="s2", interrupt_id="ok")], 0)
        info = store.session_info("s2")
        assert info is not None and info.status == "paused"

    def test_claim_takes_queued_answered_and_orphaned_sessions_oldest_first(self, store: EventStore) -> None:
        now = time.time()
        me = this_process("w-claimer")
        store.append("q-new", _submitted("q-new", "wf", now - 10), 0)
        store.append("q-old", _submitted("q-old", "wf", now - 50), 0)
        store.append("answered", _paused_log("answered", "wf", now - 40) + _answer("answered", "wf", now - 30), 0)
        gone = dead_owner()
        store.acquire("orphan", gone, 3600.0, now=now - 20)
        store.append("orphan", [ev(RunStarted, sid="orphan", workflow="wf", ts=now - 20)], 0, epoch=1)
        far = other_host_owner()
        store.acquire("expired", far, 10.0, now=now - 100)  # ended at now - 90
        store.append("expired", [ev(RunStarted, sid="expired", workflow="wf", ts=now - 100)], 0, epoch=1)
        claims = store.claim(me, ["wf"], 15.0, limit=10, now=now)
        assert [(c.session_id, c.reason) for c in claims] == [
            ("expired", "orphaned"), ("q-old", "queued"), ("answered", "answered"), ("orphan", "orphaned"),
            ("q-new", "queued")]
        for c in claims:
            assert c.workflow == "wf" and c.lease.owner == me and c.lease.expires_at == now + 15.0
            info = store.session_info(c.session_id)
            assert info is not None and (info.owner, info.epoch) == (me, c.lease.epoch)
        assert {c.session_id: c.lease.epoch for c in claims} == {
            "expired": 2, "q-old": 1, "answered": 1, "orphan": 2, "q-new": 1}
        assert store.claim(this_process("w-second"), ["wf"], 15.0, limit=10, now=now + 1) == []  # all held now

    def test_claim_leaves_what_it_may_not_take(self, store: EventStore) -> None:
        now = time.time()
        me = this_process("w-claimer")
        store.append("other-wf", _submitted("other-wf", "other", now - 60), 0)
        store.append("paused", _paused_log("paused", "wf", now - 60), 0)
        store.append("done", [ev(RunStarted, sid="done", workflow="wf", ts=now - 60),
                              ev(RunFinished, sid="done", status="completed", ts=now - 59)], 0)
        store.append("ownerless", [ev(RunStarted, sid="ownerless", workflow="wf", ts=now - 3600)], 0)
        live = this_process("w-live")
        store.acquire("held", live, 15.0, now=now)
        store.append("held", [ev(RunStarted, sid="held", workflow="wf", ts=now)], 0, epoch=1)
        store.acquire("held-queued", live, 15.0, now=now)
        store.append("held-queued", _submitted("held-queued", "wf", now - 60), 0)
        store.append("q", _submitted("q", "wf", now - 1), 0)
        assert store.claim(me, ["wf"], 15.0, limit=0, now=now) == []
        assert store.claim(me, [], 15.0, limit=5, now=now) == []
        [c] = store.claim(me, ["wf"], 15.0, limit=5, now=now)
        assert (c.session_id, c.reason) == ("q", "queued")
        # once the leases end (the live owner's, and the claim's own: it never started
        # "q"), the sessions can be claimed again
        later = store.claim(me, ["wf", "other"], 15.0, limit=5, now=now + 16)
        assert sorted((c.session_id, c.reason) for c in later) == [
            ("held", "orphaned"), ("held-queued", "queued"), ("other-wf", "queued"), ("q", "queued")]

    def test_claim_respects_the_limit_and_max_recoveries(self, store: EventStore) -> None:
        now = 1000.0
        for i in range(5):
            store.append(f"q{i}", _submitted(f"q{i}", "wf", now - 100 + i), 0)
        a, b = this_process("w-a"), this_process("w-b")
        first = store.claim(a, ["wf"], 15.0, limit=2, now=now)
        second = store.claim(b, ["wf"], 15.0, limit=2, now=now)
        assert [c.session_id for c in first] == ["q0", "q1"] and [c.session_id for c in second] == ["q2", "q3"]
        far = other_host_owner()
        store.acquire("crashy", far, 10.0, now=now)
        store.append("crashy", [ev(RunStarted, sid="crashy", workflow="crash", ts=now)], 0, epoch=1)
        t = now
        for _ in range(3):  # taken over as orphaned 3 times: its lease runs out each time
            t += 20.0
            [c] = store.claim(other_host_owner("w-x", pid=7), ["crash"], 10.0, limit=5, max_recoveries=2, now=t)
            assert (c.session_id, c.reason) == ("crashy", "orphaned")
        assert store.claim(a, ["crash"], 10.0, limit=5, max_recoveries=2, now=t + 20) == []
        [c] = store.claim(a, ["crash"], 10.0, limit=5, now=t + 20)  # no limit given
        assert c.lease.epoch == 5

    def test_two_claimers_at_once_never_get_the_same_session(self, store: EventStore) -> None:
        other = self.open_again(store)
        second = other if other is not None else store
        try:
            for r in range(5):
                sids = [f"r{r}-{i}" for i in range(12)]
                for i, sid in enumerate(sids):
                    store.append(sid, _submitted(sid, f"wf{r}", 1000.0 + i), 0)
                barrier = threading.Barrier(2)
                got: dict[str, list[str]] = {}

                def claim(name: str, s: EventStore, r: int = r) -> None:
                    barrier.wait()
                    for _ in range(6):
                        got.setdefault(name, []).extend(c.session_id for c in s.claim(this_process(name), [f"wf{r}"], 60.0, limit=2))

                threads = [threading.Thread(target=claim, args=("w-a", store)), threading.Thread(target=claim, args=("w-b", second))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                taken = got.get("w-a", []) + got.get("w-b", [])
                assert sorted(taken) == sorted(sids), got  # every session once, none twice
                for sid in sids:
                    info = store.session_info(sid)
                    assert info is not None and info.epoch == 1
                    assert info.owner is not None and sid in got[info.owner.worker_id]
        finally:
            if other is not None:
                other.close()

    def test_workers_seen_and_workers(self, store: EventStore) -> None:
        assert store.workers() == []
        a, b = this_process("w-a"), other_host_owner("w-b", pid=99)
        store.workers_seen(a, ["orders", "billing"], ts=1000.0)
        store.workers_seen(b, ["orders"], ts=1001.0)
        assert [(w.worker_id, w.host, w.pid, w.workflows, w.seen_at) for w in store.workers()] == [
            ("w-b", b.host, 99, ("orders",), 1001.0), ("w-a", a.host, a.pid, ("billing", "orders"), 1000.0)]
        store.workers_seen(a, ["orders"], ts=1002.0)  # each renewal updates the one row
        assert [(w.worker_id, w.workflows, w.seen_at) for w in store.workers()] == [
            ("w-a", ("orders",), 1002.0), ("w-b", ("orders",), 1001.0)]
        store.workers_seen(a, ["orders"], ts=1001.0 + 86400.0 + 1)  # b not seen for a day: forgotten
        assert [w.worker_id for w in store.workers()] == ["w-a"]

    def test_queued_summary(self, store: EventStore) -> None:
        assert store.queued_summary() == []
        store.append("a1", _submitted("a1", "alpha", 30.0), 0)
        store.append("a2", _submitted("a2", "alpha", 10.0), 0)
        store.append("b1", _submitted("b1", "beta", 20.0), 0)
        store.append("r", _paused_log("r", "alpha", 1.0), 0)
        assert store.queued_summary() == [QueuedGroup("alpha", 2, 10.0), QueuedGroup("beta", 1, 20.0)]
        store.append("a2", [ev(RunStarted, sid="a2", workflow="alpha", ts=40.0)], 1)  # started: no longer queued
        assert store.queued_summary() == [QueuedGroup("alpha", 1, 30.0), QueuedGroup("beta", 1, 20.0)]

    def test_open_run_summary_uses_the_owner_rule(self, store: EventStore) -> None:
        now = time.time()
        me, gone, far = this_process("w-me"), dead_owner(), other_host_owner()
        # (session, owner, lease from now, heartbeat age, expected class of its running run)
        cases: list[tuple[str, Owner | None, float | None, float, str]] = [
            ("live-stale-beat", me, 15.0, 3600.0, RUNNING),  # a blocked loop keeps its lease
            ("expired-fresh-beat", far, -1.0, 0.0, ORPHANED),
            ("dead-here", gone, 3600.0, 0.0, ORPHANED),  # at once, lease or not
            ("far-live", far, 15.0, 3600.0, RUNNING),
            ("released", me, None, 0.0, ORPHANED),  # released while running (a store fault)
            ("no-owner-fresh", None, None, 1.0, RUNNING),
            ("no-owner-stale", None, None, 3600.0, ORPHANED),
        ]
        for sid, owner, lease_in, age, _cls in cases:
            if owner is not None:
                lease = store.acquire(sid, owner, 3600.0, force=True, now=now - 7200)
                if lease_in is None:
                    store.release(lease)
                else:
                    store.renew(lease, lease_in, now=now)
            store.append(sid, [ev(RunStarted, sid=sid, workflow="own", ts=now - 7200),
                               node_ev(NodeStarted, f"own@1/{sid}@1", ts=now - 7200, sid=sid)], 0)
            store.heartbeat(sid, [f"own@1/{sid}@1"], ts=now - age)
        groups = {g.node: g for g in store.open_run_summary(now, 60.0)}
        owners = {s.session_id: (s.owner, s.lease_expires_at) for s in store.sessions()}
        for sid, _owner, _lease, _age, expected in cases:
            g = groups[sid]
            assert (g.state, g.count, g.orphaned) == ("running", 1, int(expected == ORPHANED)), sid
            r = run_of(store, f"own@1/{sid}@1", sid)
            owner, lease_end = owners[sid]
            got = classify_open_run(r.status, r.started_at, r.heartbeat_at, r.job_deadline_at, now, 60.0,
                                    owner=owner, lease_expires_at=lease_end)
            assert got == expected, sid
        key = lambda g: (g.workflow, g.node, g.state)  # noqa: E731
        owned = {sid: o for sid, o in owners.items() if o[0] is not None}
        assert sorted(store.open_run_summary(now, 60.0), key=key) == sorted(
            summarize_open_runs(store.open_runs(), now, 60.0, owned), key=key)

    # ------------------------------------------------------------------ the inbox: one writer per session

    def test_a_message_is_kept_in_order_until_taken_in_with_its_events(self, store: EventStore) -> None:
        store.append(SID, _paused_log(SID, "orders", 10.0), 0)
        first = store.send(SID, "answer", {"inputs": {"ok": True}, "jobs": {}}, ts=11.0)
        second = store.send(SID, "answer", {"inputs": {"ok": False}, "jobs": {}}, ts=12.0)
        store.send("other", "answer", {"inputs": {"x": 1}, "jobs": {}}, ts=12.5)
        assert first.message_id < second.message_id
        assert [(m.message_id, m.kind, dict(m.body), m.sent_at) for m in store.inbox(SID)] == [
            (first.message_id, "answer", {"inputs": {"ok": True}, "jobs": {}}, 11.0),
            (second.message_id, "answer", {"inputs": {"ok": False}, "jobs": {}}, 12.0),
        ]
        lease = store.acquire(SID, this_process("w-owner"), 15.0)
        with pytest.raises(LeaseLost):  # a superseded owner takes nothing in
            store.take_in(SID, _answer(SID, "orders", 13.0), 4, [first.message_id], epoch=lease.epoch - 1)
        with pytest.raises(ConcurrencyConflict):  # nor one behind the log
            store.take_in(SID, _answer(SID, "orders", 13.0), 3, [first.message_id], epoch=lease.epoch)
        assert len(store.inbox(SID)) == 2 and store.last_seq(SID) == 4  # nothing written
        stored = store.take_in(SID, _answer(SID, "orders", 13.0), 4, [first.message_id, second.message_id],
                               epoch=lease.epoch)
        assert [e.seq for e in stored] == [5] and store.last_seq(SID) == 5
        assert store.inbox(SID) == [] and [m.session_id for m in store.inbox("other")] == ["other"]
        assert store.session_info(SID).status == "answered"  # type: ignore[union-attr]
        # messages that no longer apply are taken in with no event
        late = store.send(SID, "answer", {"inputs": {"ok": True}, "jobs": {}})
        assert store.take_in(SID, [], 5, [late.message_id], epoch=lease.epoch) == []
        assert store.inbox(SID) == [] and store.last_seq(SID) == 5

    def test_a_session_with_a_message_is_claimed_paused_as_answered_failed_as_queued(self, store: EventStore) -> None:
        now = time.time()
        store.append("mailed", _paused_log("mailed", "wf", now - 50), 0)
        store.append("quiet", _paused_log("quiet", "wf", now - 60), 0)
        store.append("held", _paused_log("held", "wf", now - 70), 0)
        store.acquire("held", this_process("w-live"), 15.0, now=now)  # a live owner keeps its mail
        store.append("failed", [ev(RunStarted, sid="failed", workflow="wf", ts=now - 45),
                                ev(RunFinished, sid="failed", status="failed", ts=now - 44)], 0)
        store.send("mailed", "answer", {"inputs": {"ok": True}, "jobs": {}})
        store.send("held", "answer", {"inputs": {"ok": True}, "jobs": {}})
        store.send("failed", "retry", {"from_path": None, "reason": "again"})
        claims = store.claim(this_process("w-claimer"), ["wf"], 15.0, limit=5, now=now)
        assert sorted((c.session_id, c.reason) for c in claims) == [("failed", "queued"), ("mailed", "answered")]
        assert store.claim(this_process("w-other"), ["other"], 15.0, limit=5, now=now) == []

    def test_a_deleted_session_takes_its_inbox_with_it(self, store: EventStore) -> None:
        _finished_session(store, "done", "completed")
        store.send("done", "answer", {"inputs": {"ok": True}, "jobs": {}})
        assert store.delete_sessions(["done"]) == ["done"]
        assert store.inbox("done") == []

    # ------------------------------------------------------------------ pruning: delete_sessions (issue 18)

    def test_delete_sessions_removes_whole_finished_sessions_only(self, store: EventStore) -> None:
        for sid, status in (("done", "completed"), ("bad", "failed"), ("gone", "cancelled")):
            _finished_session(store, sid, status, with_snapshot=True)
        store.append("open", [ev(RunStarted, sid="open", workflow="w", ts=1.0),
                              node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="open"),
                              node_ev(InputRequested, "w@1/a@1", ts=3.0, sid="open", interrupt_id="x"),
                              ev(RunFinished, sid="open", status="paused", ts=4.0)], 0)
        keep = store.read("open")
        assert store.delete_sessions(["open", "done", "nope", "bad", "done"]) == ["done", "bad"]
        for sid in ("done", "bad"):
            assert store.read(sid) == [] and store.last_seq(sid) == 0 and not store.has_session(sid)
            assert store.node_runs(sid) == [] and store.load_snapshot(sid) is None
        assert {s.session_id for s in store.sessions()} == {"gone", "open"}
        assert store.read("open") == keep  # a paused session is never deleted
        assert [r.session_id for r in store.open_runs()] == ["open"]
        # a deleted id starts again from seq 1
        _finished_session(store, "done", "completed")
        assert store.last_seq("done") == 4

    def test_delete_sessions_never_deletes_a_failed_session_with_an_open_run(self, store: EventStore) -> None:
        store.append("f", [ev(RunStarted, sid="f", workflow="w", ts=1.0),
                           node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="f"),
                           node_ev(NodeStarted, "w@1/b@1", ts=2.0, sid="f"),
                           node_ev(NodeErrorEvent, "w@1/b@1", ts=3.0, sid="f"),
                           ev(RunFinished, sid="f", status="failed", ts=4.0)], 0)
        assert store.delete_sessions(["f"]) == []
        assert store.last_seq("f") == 5

    def test_delete_sessions_removes_the_owner_and_spares_a_live_one(self, store: EventStore) -> None:
        now = time.time()
        me = this_process("w-prune")  # this very process: alive while its lease lasts
        for sid in ("released", "held", "dead", "far-expired"):
            _finished_session(store, sid, "completed")
        store.release(store.acquire("released", me, 15.0, now=now))
        store.acquire("held", me, 15.0, now=now)  # finished, but its owner still holds it
        store.acquire("dead", dead_owner(), 3600.0, now=now)  # the owner's process is gone
        store.acquire("far-expired", other_host_owner(), 10.0, now=now - 60.0)
        store.workers_seen(me, ["w"], ts=now)
        assert store.delete_sessions(["released", "held", "dead", "far-expired"]) == ["released", "dead", "far-expired"]
        assert {s.session_id for s in store.sessions()} == {"held"}
        for sid in ("released", "dead", "far-expired"):
            assert store.session_info(sid) is None
            # the owner row went with the log: a new session of that id starts at epoch 1
            assert store.acquire(sid, me, 15.0, now=now).epoch == 1
        info = store.session_info("held")
        assert info is not None and info.owner == me and info.epoch == 1
        assert [w.worker_id for w in store.workers()] == [me.worker_id]  # workers are per worker: kept

    def test_storage_bytes_shrink_when_sessions_are_deleted(self, store: EventStore) -> None:
        for i in range(20):
            _finished_session(store, f"s{i}", "completed")
        before = store.storage_bytes()
        store.delete_sessions([f"s{i}" for i in range(20)])
        after = store.storage_bytes()
        if before is None:  # the memory store cannot tell
            assert after is None
        else:
            assert after is not None and after < before

    # ------------------------------------------------------------------ group commit, span watermark (issue 15)

    def test_append_many_keeps_the_good_batches_and_returns_each_refusal(self, store: EventStore) -> None:
        store.append("b", [ev(RunSubmitted, sid="b", workflow="w", ts=1.0)], 0)
        lease = store.acquire("c", this_process(), 30.0)
        store.append("c", [ev(RunSubmitted, sid="c", workflow="w", ts=1.0)], 0, epoch=lease.epoch)
        out = store.append_many([
            ("d", [ev(RunStarted, sid="d", workflow="w", ts=2.0)], 0, None),
            ("a", [ev(RunStarted, sid="a", workflow="w", ts=2.0), node_ev(NodeStarted, "w@1/x@1", ts=3.0, sid="a")], 0, None),
            ("b", [ev(RunStarted, sid="b", workflow="w", ts=2.0)], 0, None),  # the session is at 1: a conflict
            ("c", [ev(RunStarted, sid="c", workflow="w", ts=2.0)], 1, lease.epoch + 1),  # a superseded epoch: fenced
            ("a", [node_ev(NodeCompleted, "w@1/x@1", ts=4.0, sid="a")], 2, None),  # the same session again, in order
        ])  # fmt: skip
        assert len(out) == 5
        assert isinstance(out[2], ConcurrencyConflict) and isinstance(out[3], LeaseLost)
        assert [[e.seq for e in r] for r in (out[0], out[1], out[4]) if isinstance(r, list)] == [[1], [1, 2], [3]]
        assert [store.last_seq(s) for s in "abcd"] == [3, 1, 1, 1]
        assert [e.type for e in store.read("a")] == ["run_started", "node_started", "node_completed"]
        assert run_of(store, "w@1/x@1", sid="a").status == "completed"  # the projection kept up
        assert store.read("b")[0].type == "run_submitted" and len(store.read("c")) == 1

    def test_the_span_watermark_only_moves_forward_and_goes_with_a_pruned_session(self, store: EventStore) -> None:
        assert store.exported_seq("s") == 0
        _finished_session(store, "s", "completed")
        store.set_exported_seq("s", 3)
        store.set_exported_seq("s", 1)  # never moves back
        assert (store.exported_seq("s"), store.exported_seq("other")) == (3, 0)
        store.set_exported_seq("s", 4)
        assert store.exported_seq("s") == 4
        assert store.delete_sessions(["s"]) == ["s"]
        assert store.exported_seq("s") == 0  # a new session of that id ships its spans

    def test_watermarks_of_several_sessions_advance_in_one_call_and_never_move_back(self, store: EventStore) -> None:
        store.set_exported_seqs({})
        store.set_exported_seqs({"a": 3, "b": 2})
        store.set_exported_seqs({"a": 1, "b": 5, "c": 1})  # a stays: never moves back
        assert [store.exported_seq(s) for s in "abcd"] == [3, 5, 1, 0]
        store.set_exported_seq("c", 4)  # the one-session form is the same write
        assert store.exported_seq("c") == 4

    def test_unexported_lists_the_sessions_past_their_watermark_with_it(self, store: EventStore) -> None:
        assert store.unexported() == []
        for sid in ("a", "b", "c"):
            _finished_session(store, sid, "completed")  # 4 events each
        assert sorted((i.session_id, m) for i, m in store.unexported()) == [("a", 0), ("b", 0), ("c", 0)]
        store.set_exported_seq("a", 4)  # all shipped
        store.set_exported_seq("b", 2)  # part
        got = sorted((i.session_id, i.last_seq, m) for i, m in store.unexported())
        assert got == [("b", 4, 2), ("c", 4, 0)]
        info = dict((i.session_id, i) for i, _m in store.unexported())["b"]
        assert info == store.session_info("b")
        store.acquire("new", this_process("w"), 15.0)  # owned, no event: no session yet
        assert "new" not in {i.session_id for i, _m in store.unexported()}


def _finished_session(store: EventStore, sid: str, status: str, with_snapshot: bool = False) -> None:
    """A session of four events that ended with ``status`` (a prune candidate)."""
    store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1.0),
                       node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid=sid),
                       node_ev(NodeCompleted, "w@1/a@1", ts=3.0, sid=sid),
                       ev(RunFinished, sid=sid, status=status, ts=4.0)], 0)
    if with_snapshot:
        store.save_snapshot(sid, 4, '{"format": 0}')
