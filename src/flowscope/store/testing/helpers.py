"""Logs, owners and events the store contracts build, for an adapter's own tests too."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from ... import liveness
from ...events import (
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
from ...ownership import Owner, process_start_id, process_start_time, this_host, this_process
from ..base import EventLog, NodeRun, Upkeep

__all__ = [
    "SID",
    "INV",
    "ev",
    "node_ev",
    "one_of_each",
    "random_log",
    "append_in_batches",
    "varied_sessions",
    "run_of",
    "LIVENESS_CASES",
    "dead_owner",
    "other_host_owner",
    "LIVENESS_NOW",
    "LIVENESS_STALE_AFTER_S",
    "NAMES",
    "liveness_log",
    "nested_logs",
    "submitted_log",
    "paused_log",
    "answer_events",
    "finished_session",
    "hold_running",
    "process_checks",
    "summary_asks_each_owner_once",
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
        RunStarted(
            session_id=sid,
            invocation_id="inv-7",
            ts=1.5,
            workflow="wf",
            input={"since": "2024-01-01", "n": [1, 2.5]},
            resumed=True,
            replayed=3,
            recovered=1,
            trace_context={"traceparent": "00-ab-cd-01"},
            owner={"worker_id": "w-7", "host": "h-7", "pid": 7},
            engine="langgraph",
        ),
        NodeStarted(ts=2.0, attempt=2, kind="workflow", parent_path="wf@1", recovered=True, **common),
        NodeRetrying(
            ts=2.5,
            attempt=2,
            error_type="TimeoutError",
            error_code="UPSTREAM_TIMEOUT",
            error_message="timed out after 2s",
            delay_s=0.25,
            error_qualname="etl.upstream.TimeoutError",
            **common,
        ),
        StateUpdated(ts=2.6, values={"cursor": 42, "seen": ["a", "b"]}, deleted=["page"], **common),
        InputRequested(ts=3.0, interrupt_id="approve", prompt="Approve?", payload={"amount": 12.5}, **common),
        InputReceived(ts=3.5, interrupt_id="approve", value={"ok": True, "by": "ann"}, **common),
        JobDispatched(
            ts=4.0,
            job_id="job-1",
            dispatch_attempt=2,
            idempotency_key="key-2",
            trace_context={"traceparent": "00-ef-01-01"},
            deadline_s=3600.0,
            expect_count=True,
            job_key="enrich#1",
            **common,
        ),
        JobResultReceived(
            ts=4.5,
            job_id="job-1",
            success=True,
            count=7,
            error="partial",
            data={"rows": [1, 2]},
            result="success",
            **common,
        ),
        NodePaused(
            ts=4.6, waiting="job", origin_path="wf@1/fetch@1/child@1", interrupt_ids=("a", "b"), **common
        ),
        NodeCompleted(
            ts=5.0,
            output={"rows": 7, "nested": {"x": None}},
            has_output=False,
            route="ok",
            attempt_count=3,
            completed=False,
            **common,
        ),
        NodeErrorEvent(
            ts=5.5,
            error_code="BAD_INPUT",
            error_message="bad row 3",
            error_type="ValueError",
            attempt_count=4,
            error_qualname="etl.rows.ValueError",
            **common,
        ),
        NodeErrorPropagated(
            ts=5.6,
            origin_path="wf@1/fetch@1/child@1",
            error_code="BAD_INPUT",
            error_type="ValueError",
            attempt_count=2,
            error_qualname="etl.rows.ValueError",
            **common,
        ),
        NodeCancelled(ts=5.7, reason="sibling failed", **common),
        RunFinished(
            session_id=sid,
            invocation_id="inv-7",
            ts=6.0,
            status="failed",
            output={"partial": True},
            error_code="BAD_INPUT",
            error_path=p,
            replayed=2,
            recovered=1,
            final=True,
        ),
        RunSubmitted(
            session_id=sid,
            invocation_id="inv-8",
            ts=7.0,
            workflow="wf",
            input={"again": [1]},
            reason="retried by ops: flaky disk",
        ),
    ]


# --------------------------------------------------------------------------- a random valid log

NAMES = ("fetch", "check", "send", "crm", "report")


def random_log(rnd: random.Random, sid: str, n: int, t0: float = 1000.0) -> list[Event]:
    """A plausible log of about ``n`` events: retries, failures, cancels, pauses, crashes, ..."""
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
                add(
                    InputReceived,
                    path=p,
                    node=p.split("/")[-1].split("@")[0],
                    interrupt_id=f"i-{p}",
                    value=rnd.random(),
                )
            else:
                add(
                    JobResultReceived,
                    path=p,
                    node=p.split("/")[-1].split("@")[0],
                    job_id=f"j-{p}",
                    success=True,
                    count=1,
                    data={"k": 1},
                    result="success",
                )
            add(
                NodeStarted,
                path=p,
                node=p.split("/")[-1].split("@")[0],
                attempt=attempts[p],
                parent_path="wf@1",
            )
            running.append(p)
        for _ in range(rnd.randint(3, 30)):
            r = rnd.random()
            if r < 0.3 or not running:
                counter += 1
                name = rnd.choice(NAMES)
                p = f"wf@1/{name}@{counter}"
                attempts[p] = 1
                add(
                    NodeStarted,
                    path=p,
                    node=name,
                    attempt=1,
                    kind=rnd.choice(("function", "workflow")),
                    parent_path="wf@1",
                )
                running.append(p)
                continue
            p = rnd.choice(running)
            node = p.split("/")[-1].split("@")[0]
            if r < 0.4:
                add(
                    NodeRetrying,
                    path=p,
                    node=node,
                    attempt=attempts[p],
                    error_type="TimeoutError",
                    error_code="UPSTREAM_TIMEOUT",
                    error_message="slow",
                    delay_s=0.01,
                )
                attempts[p] += 1
            elif r < 0.45:
                add(StateUpdated, path=p, node=node, values={"k": rnd.randint(0, 9)})
            elif r < 0.5:
                add(UnknownEvent, type="future_event", path=p, node=node, data={"x": rnd.randint(0, 9)})
            else:
                running.remove(p)
                if r < 0.7:
                    has = rnd.random() < 0.7
                    add(
                        NodeCompleted,
                        path=p,
                        node=node,
                        output={"v": rnd.randint(0, 99)} if has else None,
                        has_output=has,
                        attempt_count=attempts[p],
                    )
                elif r < 0.76:
                    add(
                        NodeErrorEvent,
                        path=p,
                        node=node,
                        error_code=rnd.choice(("UNKNOWN_ERROR", "BAD")),
                        error_type="ValueError",
                        error_message="boom",
                        attempt_count=attempts[p],
                    )
                elif r < 0.8:
                    add(
                        NodeErrorPropagated,
                        path=p,
                        node=node,
                        origin_path=p + "/child@1",
                        error_code="BAD",
                        error_type="ValueError",
                        attempt_count=attempts[p],
                    )
                elif r < 0.85:
                    add(NodeCancelled, path=p, node=node, reason="sibling failed")
                elif r < 0.9:
                    add(
                        InputRequested,
                        path=p,
                        node=node,
                        interrupt_id=f"i-{p}",
                        prompt="ok?",
                        payload={"q": 1},
                    )
                    waiting[p] = "input"
                elif r < 0.95:
                    add(
                        JobDispatched,
                        path=p,
                        node=node,
                        job_id=f"j-{p}",
                        idempotency_key=f"k-{p}",
                        deadline_s=rnd.choice((None, 60.0, 3600.0)),
                    )
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
                add(
                    NodeStarted,
                    path=p,
                    node=p.split("/")[-1].split("@")[0],
                    attempt=attempts[p],
                    recovered=True,
                    parent_path="wf@1",
                )
                add(
                    NodeCompleted,
                    path=p,
                    node=p.split("/")[-1].split("@")[0],
                    output=None,
                    has_output=False,
                    attempt_count=attempts[p],
                )
            running = []
        status = "paused" if waiting else rnd.choice(("completed", "failed", "cancelled"))
        if running and rnd.random() < 0.5:
            status = "failed"
            for p in running:
                add(NodeCancelled, path=p, node=p.split("/")[-1].split("@")[0], reason="aborted")
        add(
            RunFinished,
            status=status,
            output={"inv": inv_no} if status == "completed" else None,
            error_code="BAD" if status == "failed" else None,
        )
    return out


def append_in_batches(store: EventLog, sid: str, events: Sequence[Event], rnd: random.Random) -> None:
    """Append ``events`` in batches of random sizes, as a runner and its resumes would."""
    i = 0
    while i < len(events):
        k = rnd.choice((1, 1, 2, 3, 7, 50))
        store.append(sid, events[i : i + k], i)
        i += k


def varied_sessions(store: EventLog, seed: int, sessions: int, events: int) -> None:
    """Sessions ``r0``, ``r1``, ... of :func:`random_log` and of :func:`nested_logs`: some of everything."""
    rnd = random.Random(seed)
    for k in range(sessions):  # ~``events`` events each, appended in batches as a runner would
        append_in_batches(store, f"r{k}", random_log(rnd, f"r{k}", events, t0=1000.0 * (k + 1)), rnd)
    for sid, log in nested_logs(1000.0 * (sessions + 2)).items():
        store.append(sid, log, 0)


def run_of(store: EventLog, path: str, sid: str = SID) -> NodeRun:
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


def liveness_log(sid: str = SID) -> list[Event]:
    """Events that leave every run of :data:`LIVENESS_CASES` in its status and times."""
    out: list[Event] = [ev(RunStarted, sid=sid, workflow="live", ts=1.0)]
    for name, status, started, _beat, deadline, _cls in LIVENESS_CASES:
        p = f"live@1/{name}@1"
        out.append(node_ev(NodeStarted, p, ts=started, sid=sid))
        if status == "waiting_job":
            deadline_s = None if deadline is None else deadline - (started + 1.0)
            out.append(
                node_ev(
                    JobDispatched, p, ts=started + 1.0, sid=sid, job_id=f"j-{name}", deadline_s=deadline_s
                )
            )
        elif status == "waiting_input":
            out.append(node_ev(InputRequested, p, ts=started + 1.0, sid=sid, interrupt_id=f"i-{name}"))
        elif status == "completed":
            out.append(node_ev(NodeCompleted, p, ts=started + 1.0, sid=sid))
    return out


# --------------------------------------------------------------------------- containers


def nested_logs(t: float) -> dict[str, list[Event]]:
    """Sessions whose open runs nest (counted once, at the deepest path):

    - ``crashed``: ``wf@1`` > ``inner@1`` (a nested workflow) > ``leaf@1``, all running
      (a dead worker), plus ``wf@1/inner@10`` running with nothing below it (its path starts
      like ``inner@1``'s, it is no descendant of it) and ``wf@1/inner@1-b`` (a character
      below ``/``) running, and a completed ``wf@1/done@1``;
    - ``paused``: ``pw@1`` paused by ``pw@1/ask@1`` (both waiting_input);
    - ``between``: ``bw@1`` running with only finished runs below it: it is the cut-off run.
    """
    crashed: list[Event] = [ev(RunStarted, sid="crashed", workflow="wf", ts=t)]
    for path, kind in (
        ("wf@1", "workflow"),
        ("wf@1/done@1", "function"),
        ("wf@1/inner@1", "workflow"),
        ("wf@1/inner@1/leaf@1", "function"),
        ("wf@1/inner@10", "function"),
        ("wf@1/inner@1-b", "function"),
    ):
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        crashed.append(node_ev(NodeStarted, path, ts=t + 1, sid="crashed", kind=kind, parent_path=parent))
    crashed.append(node_ev(NodeCompleted, "wf@1/done@1", ts=t + 2, sid="crashed"))
    paused: list[Event] = [
        ev(RunStarted, sid="paused", workflow="pw", ts=t),
        node_ev(NodeStarted, "pw@1", ts=t + 1, sid="paused", kind="workflow"),
        node_ev(NodeStarted, "pw@1/ask@1", ts=t + 1, sid="paused", parent_path="pw@1"),
        node_ev(InputRequested, "pw@1/ask@1", ts=t + 2, sid="paused", interrupt_id="ok"),
        node_ev(
            NodePaused,
            "pw@1",
            ts=t + 2,
            sid="paused",
            waiting="input",
            origin_path="pw@1/ask@1",
            interrupt_ids=("ok",),
        ),
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
        started = start_id = None
        for _ in range(100):  # /proc may lag the fork by a moment
            started, start_id = process_start_time(proc.pid), process_start_id(proc.pid)
            if started is not None and start_id is not None:
                break
            time.sleep(0.01)
        owner = Owner(worker_id, this_host(), proc.pid, started, start_id=start_id)
        assert liveness.owner_alive(owner, time.time() + 60, time.time())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return owner


def other_host_owner(worker_id: str = "w-far", pid: int = 4242) -> Owner:
    """An owner on another host: alive exactly while its lease lasts."""
    return Owner(worker_id, this_host() + "-elsewhere", pid, 1.0)


def submitted_log(sid: str, workflow: str, ts: float) -> list[Event]:
    return [
        RunSubmitted(session_id=sid, invocation_id="submit-1", ts=ts, workflow=workflow, input={"n": sid})
    ]


def paused_log(sid: str, workflow: str, t: float) -> list[Event]:
    p = f"{workflow}@1/ask@1"
    return [
        ev(RunStarted, sid=sid, workflow=workflow, ts=t),
        node_ev(NodeStarted, p, ts=t + 1, sid=sid),
        node_ev(InputRequested, p, ts=t + 2, sid=sid, interrupt_id="ok"),
        ev(RunFinished, sid=sid, status="paused", ts=t + 3),
    ]


def answer_events(sid: str, workflow: str, t: float) -> list[Event]:
    return [
        node_ev(
            InputReceived,
            f"{workflow}@1/ask@1",
            ts=t,
            sid=sid,
            interrupt_id="ok",
            value=True,
            invocation_id="answer-1a2b",
        )
    ]


# --------------------------------------------------------------------------- the contract


def finished_session(store: Upkeep, sid: str, status: str, with_snapshot: bool = False) -> None:
    """A session of four events that ended with ``status`` (a prune candidate)."""
    store.append(
        sid,
        [
            ev(RunStarted, sid=sid, workflow="w", ts=1.0),
            node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid=sid),
            node_ev(NodeCompleted, "w@1/a@1", ts=3.0, sid=sid),
            ev(RunFinished, sid=sid, status=status, ts=4.0),
        ],
        0,
    )
    if with_snapshot:
        store.save_snapshot(sid, 4, '{"format": 0}')


def hold_running(store: Any, owner: Owner, n: int, now: float, workflow: str = "wf") -> list[str]:
    """``n`` sessions that ``owner`` holds, each with a run of node ``a`` running, as a
    worker running them has them (leases of an hour, taken a millisecond apart from
    ``now`` on: each its own expiry); their ids."""
    sids = [f"held-{i}" for i in range(n)]
    for i, sid in enumerate(sids):
        store.acquire(sid, owner, 3600.0, now=now + i / 1000)
        events = [
            ev(RunStarted, sid=sid, workflow=workflow, ts=now),
            node_ev(NodeStarted, f"{workflow}@1/a@1", sid=sid, ts=now),
        ]
        store.append(sid, events, 0, epoch=1)
    return sids


def process_checks(monkeypatch: Any) -> list[int]:
    """The pids the liveness rule reads /proc for from now on (``monkeypatch`` undoes it)."""
    asked: list[int] = []
    real = liveness.process_alive

    def counted(pid: int, started_at: float | None, start_id: str | None = None) -> bool:
        asked.append(pid)
        return real(pid, started_at, start_id)

    monkeypatch.setattr(liveness, "process_alive", counted)
    return asked


def summary_asks_each_owner_once(store: Any, monkeypatch: Any) -> None:
    """Check that an SQL store's ``open_run_summary`` asks the liveness rule about a live
    same-host owner once, not once per session it holds (each lease has its own expiry):
    a scrape beside a worker running thousands of sessions reads /proc once for it. The
    memory store's summary, the reference fold, classifies run by run."""
    now = time.time()
    live = this_process("w-live")
    hold_running(store, live, 30, now)
    asked = process_checks(monkeypatch)
    [group] = store.open_run_summary(now=now + 1, stale_after_s=60.0)
    assert (group.count, group.orphaned) == (30, 0)
    assert asked.count(live.pid) <= 1, f"the live owner's process was checked {asked.count(live.pid)} times"
