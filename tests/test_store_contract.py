"""The EventStore contract: every adapter (memory, SQLite) must pass this one suite."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from flowscope.errors import ConcurrencyConflict
from flowscope.events import (
    COMMON_FIELDS,
    EVENT_TYPES,
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
    UnknownEvent,
)
from flowscope.store import MemoryEventStore, NodeRun, SessionInfo, rebuild
from flowscope.fold import OPEN_STATES

SID = "s1"
INV = "inv-1"


@pytest.fixture(params=["memory", "sqlite"])
def event_store(request, tmp_path):
    if request.param == "memory":
        s = MemoryEventStore()
    else:
        from flowscope.store import SqliteEventStore

        s = SqliteEventStore(tmp_path / "x.db")
    yield s
    s.close()


def ev(cls, sid=SID, **kw):
    kw.setdefault("invocation_id", INV)
    return cls(session_id=sid, **kw)


def node_ev(cls, path, ts, sid=SID, **kw):
    return ev(cls, sid=sid, path=path, node=path.rsplit("/", 1)[-1].split("@")[0], ts=ts, **kw)


def one_of_each(sid=SID) -> list[Event]:
    """One event of every type in the catalog, every field set to a non-default value."""
    p = "wf@1/fetch@1"
    common = dict(session_id=sid, invocation_id="inv-7", path=p, node="fetch")
    return [
        RunStarted(session_id=sid, invocation_id="inv-7", ts=1.5, workflow="wf", input={"since": "2024-01-01", "n": [1, 2.5]},
                   resumed=True, replayed=3, recovered=1, trace_context={"traceparent": "00-ab-cd-01"}),
        NodeStarted(ts=2.0, attempt=2, kind="workflow", parent_path="wf@1", recovered=True, **common),
        NodeRetrying(ts=2.5, attempt=2, error_type="TimeoutError", error_code="UPSTREAM_TIMEOUT",
                     error_message="timed out after 2s", delay_s=0.25, **common),
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
                       attempt_count=4, **common),
        NodeErrorPropagated(ts=5.6, origin_path="wf@1/fetch@1/child@1", error_code="BAD_INPUT",
                            error_type="ValueError", attempt_count=2, **common),
        NodeCancelled(ts=5.7, reason="sibling failed", **common),
        RunFinished(session_id=sid, invocation_id="inv-7", ts=6.0, status="failed", output={"partial": True},
                    error_code="BAD_INPUT", error_path=p, replayed=2, recovered=1),
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

    def add(cls, **kw):
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


def append_in_batches(store, sid, events, rnd):
    i = 0
    while i < len(events):
        k = rnd.choice((1, 1, 2, 3, 7, 50))
        store.append(sid, events[i : i + k], i)
        i += k


# --------------------------------------------------------------------------- the contract


def test_catalog_sample_covers_every_type_with_non_default_values():
    sample = one_of_each()
    assert {e.type for e in sample} == set(EVENT_TYPES)
    for e in sample:
        for f in dataclasses.fields(e):
            if f.name in COMMON_FIELDS:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            assert getattr(e, f.name) != default, (e.type, f.name)


def test_round_trip_of_every_event_type(event_store):
    sample = one_of_each()
    stored = event_store.append(SID, sample, 0)
    assert [e.seq for e in stored] == list(range(1, len(sample) + 1))
    back = event_store.read(SID)
    assert back == stored
    for a, b in zip(back, sample):
        assert type(a) is type(b)
        assert dataclasses.replace(a, seq=0) == b
    assert back[8].interrupt_ids == ("a", "b")  # a tuple again, not a JSON list


def test_seq_is_gap_free_from_one_across_batches(event_store):
    events = [node_ev(NodeStarted, f"wf@1/n@{i}", ts=float(i)) for i in range(1, 11)]
    out = event_store.append(SID, events[:3], 0)
    assert [e.seq for e in out] == [1, 2, 3]
    out = event_store.append(SID, events[3:4], 3)
    assert [e.seq for e in out] == [4]
    out = event_store.append(SID, events[4:], 4)
    assert [e.seq for e in out] == list(range(5, 11))
    assert [e.seq for e in event_store.read(SID)] == list(range(1, 11))
    assert event_store.last_seq(SID) == 10


def test_sessions_are_numbered_independently(event_store):
    event_store.append("a", [ev(RunStarted, sid="a", workflow="w", ts=1.0)], 0)
    event_store.append("b", [ev(RunStarted, sid="b", workflow="w", ts=2.0)], 0)
    event_store.append("a", [ev(RunFinished, sid="a", ts=3.0)], 1)
    assert [e.seq for e in event_store.read("a")] == [1, 2]
    assert [e.seq for e in event_store.read("b")] == [1]


def test_pre_numbered_events_that_continue_the_log_are_kept(event_store):
    e1 = ev(RunStarted, workflow="w", ts=1.0, seq=1)
    e2 = node_ev(NodeStarted, "w@1/a@1", ts=2.0, seq=2)
    assert event_store.append(SID, [e1, e2], 0) == [e1, e2]
    assert event_store.read(SID) == [e1, e2]


@pytest.mark.parametrize("bad_seq", [1, 2, 4, 7])
def test_pre_numbered_events_that_do_not_continue_the_log_are_rejected(event_store, bad_seq):
    event_store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
    before = (event_store.read(SID), event_store.sessions(), event_store.node_runs())
    with pytest.raises(ValueError):
        event_store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0, seq=bad_seq)], 2)
    # a valid first event does not let an invalid second one through
    with pytest.raises(ValueError):
        event_store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0, seq=3),
                                 node_ev(NodeStarted, "w@1/b@1", ts=4.0, seq=3)], 2)
    assert (event_store.read(SID), event_store.sessions(), event_store.node_runs()) == before


def test_an_event_of_another_session_is_rejected(event_store):
    with pytest.raises(ValueError):
        event_store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), ev(RunFinished, sid="other", ts=2.0)], 0)
    assert event_store.read(SID) == [] and event_store.read("other") == []
    assert event_store.last_seq(SID) == 0
    assert event_store.node_runs() == []


@pytest.mark.parametrize("stale", [0, 1, 3, 9])
def test_stale_expected_seq_raises_conflict_and_writes_nothing(event_store, stale):
    event_store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
    before = (event_store.read(SID), event_store.sessions(), event_store.node_runs(), event_store.open_runs())
    with pytest.raises(ConcurrencyConflict):
        event_store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0), ev(RunFinished, ts=4.0)], stale)
    assert (event_store.read(SID), event_store.sessions(), event_store.node_runs(), event_store.open_runs()) == before
    assert event_store.last_seq(SID) == 2


def test_conflict_on_a_new_session_creates_nothing(event_store):
    with pytest.raises(ConcurrencyConflict):
        event_store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 1)
    assert event_store.read(SID) == []
    assert event_store.last_seq(SID) == 0
    assert event_store.sessions() == []


def test_the_second_of_two_writers_with_the_same_expected_seq_loses(event_store):
    event_store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 0)
    seen = event_store.last_seq(SID)
    event_store.append(SID, [node_ev(NodeStarted, "w@1/a@1", ts=2.0)], seen)
    with pytest.raises(ConcurrencyConflict):
        event_store.append(SID, [node_ev(NodeStarted, "w@1/b@1", ts=2.0)], seen)
    assert [e.path for e in event_store.read(SID)] == ["", "w@1/a@1"]


def test_read_after_seq(event_store):
    events = event_store.append(SID, [node_ev(NodeStarted, f"wf@1/n@{i}", ts=float(i)) for i in range(1, 8)], 0)
    assert event_store.read(SID, 0) == events
    assert event_store.read(SID, 3) == events[3:]
    assert [e.seq for e in event_store.read(SID, 6)] == [7]
    assert event_store.read(SID, 7) == []
    assert event_store.read(SID, 50) == []
    assert event_store.read("nobody") == []


def test_last_seq(event_store):
    assert event_store.last_seq(SID) == 0
    assert not event_store.has_session(SID)
    event_store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 0)
    assert event_store.last_seq(SID) == 1
    assert event_store.has_session(SID)
    event_store.append(SID, [ev(RunFinished, ts=2.0)] * 1, 1)
    assert event_store.last_seq(SID) == 2


def test_sessions_follow_run_started_and_run_finished(event_store):
    assert event_store.sessions() == []
    event_store.append(SID, [ev(RunStarted, workflow="orders", ts=10.0)], 0)
    [s] = event_store.sessions()
    assert s == SessionInfo(SID, "orders", "running", 10.0, 10.0, 1, 1)
    event_store.append(SID, [node_ev(NodeStarted, "orders@1/a@1", ts=11.0),
                             node_ev(InputRequested, "orders@1/a@1", ts=12.0, interrupt_id="x"),
                             ev(RunFinished, status="paused", ts=13.0)], 1)
    [s] = event_store.sessions()
    assert (s.status, s.last_seq, s.updated_at, s.invocations) == ("paused", 4, 13.0, 1)
    # a resume: a second invocation, the workflow and start time stay those of the first
    event_store.append(SID, [ev(RunStarted, workflow="renamed", resumed=True, ts=20.0, invocation_id="inv-2")], 4)
    [s] = event_store.sessions()
    assert (s.workflow, s.status, s.started_at, s.invocations) == ("orders", "running", 10.0, 2)
    event_store.append(SID, [ev(RunFinished, status="completed", ts=21.0, invocation_id="inv-2")], 5)
    assert event_store.sessions() == [SessionInfo(SID, "orders", "completed", 10.0, 21.0, 6, 2)]


def test_sessions_are_listed_most_recently_updated_first(event_store):
    event_store.append("a", [ev(RunStarted, sid="a", workflow="wa", ts=1.0)], 0)
    event_store.append("b", [ev(RunStarted, sid="b", workflow="wb", ts=2.0)], 0)
    event_store.append("c", [ev(RunStarted, sid="c", workflow="wc", ts=3.0)], 0)
    event_store.append("a", [ev(RunFinished, sid="a", status="failed", ts=4.0)], 1)
    assert [(s.session_id, s.status) for s in event_store.sessions()] == [
        ("a", "failed"), ("c", "running"), ("b", "running")]


def run_of(store, path, sid=SID) -> NodeRun:
    [r] = [r for r in store.node_runs(sid) if r.path == path]
    return r


def test_node_runs_projection_follows_the_state_machine(event_store):
    s = event_store
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


def test_a_failed_run_resumed_by_an_operator_keeps_numbering(event_store):
    p = "w@1/a@1"
    s = event_store
    s.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, p, ts=2.0),
                   node_ev(NodeRetrying, p, ts=3.0, attempt=1), node_ev(NodeRetrying, p, ts=4.0, attempt=2),
                   node_ev(NodeErrorEvent, p, ts=5.0, attempt_count=3, error_code="X")], 0)
    assert (run_of(s, p).status, run_of(s, p).attempt, run_of(s, p).error_code) == ("failed", 3, "X")
    s.append(SID, [node_ev(NodeStarted, p, ts=6.0, attempt=4)], 5)
    r = run_of(s, p)
    assert (r.status, r.attempt, r.retries, r.error_code, r.error_type) == ("running", 4, 2, None, None)


def test_node_runs_for_one_session_or_all(event_store):
    event_store.append("a", [ev(RunStarted, sid="a", workflow="wa", ts=1.0),
                             node_ev(NodeStarted, "wa@1/x@1", sid="a", ts=2.0)], 0)
    event_store.append("b", [ev(RunStarted, sid="b", workflow="wb", ts=1.0),
                             node_ev(NodeStarted, "wb@1/y@1", sid="b", ts=2.0),
                             node_ev(NodeStarted, "wb@1/z@1", sid="b", ts=3.0)], 0)
    assert [r.path for r in event_store.node_runs("a")] == ["wa@1/x@1"]
    assert [r.path for r in event_store.node_runs("b")] == ["wb@1/y@1", "wb@1/z@1"]
    assert sorted((r.session_id, r.workflow, r.path) for r in event_store.node_runs()) == [
        ("a", "wa", "wa@1/x@1"), ("b", "wb", "wb@1/y@1"), ("b", "wb", "wb@1/z@1")]
    assert event_store.node_runs("nobody") == []


def test_heartbeat_changes_only_running_rows(event_store):
    s = event_store
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
    assert t0 - 1 <= run_of(s, "w@1/run@1").heartbeat_at <= time.time() + 1
    assert s.read(SID)[-1].seq == 8  # heartbeats are not events


def test_open_runs_lists_only_open_states_oldest_first(event_store):
    s = event_store
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


def test_unknown_event_types_round_trip_and_are_skipped_by_the_projection(event_store):
    s = event_store
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
    assert type(back[1]) is UnknownEvent and back[1].type == "run_annotated"
    assert back[1].data == {"note": "from a newer writer", "schema_version": 9}
    assert back[3].data == {"percent": 40} and back[3].path == "w@1/a@1"
    assert [r.path for r in s.node_runs(SID)] == ["w@1/a@1"]  # no row for the unknown-only path
    assert run_of(s, "w@1/a@1").status == "completed"
    [info] = s.sessions()
    assert (info.status, info.last_seq, info.workflow) == ("running", 6, "w")
    assert rebuild(back).unknown_events == 3


def test_projection_equals_the_fold_of_the_log(event_store):
    rnd = random.Random(7)
    for k, sid in enumerate(("r1", "r2", "r3")):
        log = random_log(rnd, sid, 120, t0=1000.0 * (k + 1))
        append_in_batches(event_store, sid, log, rnd)
    for sid in ("r1", "r2", "r3"):
        events = event_store.read(sid)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        state = rebuild(events)
        assert event_store.node_runs(sid) == [NodeRun.from_state(sid, state.workflow, ns) for ns in state.nodes.values()]
        [info] = [i for i in event_store.sessions() if i.session_id == sid]
        assert info == SessionInfo(sid, state.workflow, state.status, state.started_at, state.updated_at,
                                   state.last_seq, state.invocations)
    open_runs = event_store.open_runs()
    assert open_runs == sorted((r for r in event_store.node_runs() if r.status in OPEN_STATES),
                               key=lambda r: r.started_at or 0.0)


def test_node_run_output_values_round_trip_exactly(event_store):
    values = [None, 0, -1, 2**53 + 1, 1.5, -0.25, 1e300, "", "ünïcødé ✓ \u2028", "emoji \U0001F600", True, False,
              [], {}, [1, [2, [3]]], {"a": {"b": None, "c": [True, 1.0]}}]
    events = [node_ev(NodeCompleted, f"w@1/v@{i}", ts=float(i), output=v) for i, v in enumerate(values)]
    event_store.append(SID, events, 0)
    back = event_store.read(SID)
    assert [e.output for e in back] == values
    assert [type(e.output) for e in back] == [type(v) for v in values]


# --------------------------------------------------------------------------- pruning: delete_sessions
# (one block: it moves with the contract into flowscope.store.testing)


def _finished_session(store, sid, status, with_snapshot=False):
    store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1.0),
                       node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid=sid),
                       node_ev(NodeCompleted, "w@1/a@1", ts=3.0, sid=sid),
                       ev(RunFinished, sid=sid, status=status, ts=4.0)], 0)
    if with_snapshot:
        store.save_snapshot(sid, 4, '{"format": 0}')


def test_delete_sessions_removes_whole_finished_sessions_only(event_store):
    for sid, status in (("done", "completed"), ("bad", "failed"), ("gone", "cancelled")):
        _finished_session(event_store, sid, status, with_snapshot=True)
    event_store.append("open", [ev(RunStarted, sid="open", workflow="w", ts=1.0),
                                node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="open"),
                                node_ev(InputRequested, "w@1/a@1", ts=3.0, sid="open", interrupt_id="x"),
                                ev(RunFinished, sid="open", status="paused", ts=4.0)], 0)
    keep = event_store.read("open")
    assert event_store.delete_sessions(["open", "done", "nope", "bad", "done"]) == ["done", "bad"]
    for sid in ("done", "bad"):
        assert event_store.read(sid) == [] and event_store.last_seq(sid) == 0 and not event_store.has_session(sid)
        assert event_store.node_runs(sid) == [] and event_store.load_snapshot(sid) is None
    assert {s.session_id for s in event_store.sessions()} == {"gone", "open"}
    assert event_store.read("open") == keep  # a paused session is never deleted
    assert [r.session_id for r in event_store.open_runs()] == ["open"]
    # a deleted id starts again from seq 1
    _finished_session(event_store, "done", "completed")
    assert event_store.last_seq("done") == 4


def test_delete_sessions_never_deletes_a_failed_session_with_an_open_run(event_store):
    event_store.append("f", [ev(RunStarted, sid="f", workflow="w", ts=1.0),
                             node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="f"),
                             node_ev(NodeStarted, "w@1/b@1", ts=2.0, sid="f"),
                             node_ev(NodeErrorEvent, "w@1/b@1", ts=3.0, sid="f"),
                             ev(RunFinished, sid="f", status="failed", ts=4.0)], 0)
    assert event_store.delete_sessions(["f"]) == []
    assert event_store.last_seq("f") == 5


def test_storage_bytes_shrink_when_sessions_are_deleted(event_store):
    for i in range(20):
        _finished_session(event_store, f"s{i}", "completed")
    before = event_store.storage_bytes()
    event_store.delete_sessions([f"s{i}" for i in range(20)])
    after = event_store.storage_bytes()
    if before is None:  # the memory store cannot tell
        assert after is None
    else:
        assert after < before
