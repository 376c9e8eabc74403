"""PostgresEventStore's cached append: after its first append to a session, a store sends
each further one as a single statement folded on the state it wrote last. These tests
check that it is one statement, and that a cached state that is no longer the session's
(another store appended, the session was taken over, pruned and made again) is never
written: the append then takes the locking path and gives the same answer as without a
cache."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import psycopg
import pytest

from flowscope.errors import ConcurrencyConflict, LeaseLost, StoreError
from flowscope.events import (
    InputReceived,
    InputRequested,
    NodeCompleted,
    NodeStarted,
    RunFinished,
    RunStarted,
    RunSubmitted,
)
from flowscope.ownership import Owner
from flowscope.store import NodeRun, PostgresEventStore, rebuild
from flowscope.store.postgres import writer
from flowscope.store.testing import ev
from pg_cluster import PgCluster

# A real PostgreSQL cluster, started by the test session: the full suite, not the fast loop.
pytestmark = pytest.mark.slow


@pytest.fixture
def url(pg_cluster: PgCluster) -> str:
    return pg_cluster.new_database("append")


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The text of every statement psycopg sends from this process, in order."""
    sent: list[str] = []
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counting_execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, params, **kw)

    def counting_executemany(self: Any, query: Any, params_seq: Any, **kw: Any) -> Any:
        rows = list(params_seq)
        sent.extend(str(query) for _ in rows)
        return executemany(self, query, rows, **kw)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting_execute)
    monkeypatch.setattr(psycopg.Cursor, "executemany", counting_executemany)
    yield sent


def node_step(sid: str, k: int) -> list[Any]:
    """What a runner appends per node of a chain: the previous node's result, this one's start."""
    out: list[Any] = [ev(NodeCompleted, sid, path=f"wf/n{k - 1}", node=f"n{k - 1}", ts=10.0 + k)] if k else []
    return out + [ev(NodeStarted, sid, path=f"wf/n{k}", node=f"n{k}", ts=10.5 + k)]


def projection_matches_the_log(store: PostgresEventStore, sid: str) -> None:
    ws = rebuild(store.read(sid))
    expected = sorted(
        (NodeRun.from_state(sid, ws.workflow, ns) for ns in ws.nodes.values()), key=lambda r: r.path
    )
    assert sorted(store.node_runs(sid), key=lambda r: r.path) == expected
    info = store.session_info(sid)
    assert info is not None
    assert (
        info.workflow,
        info.status,
        info.started_at,
        info.updated_at,
        info.last_seq,
        info.invocations,
    ) == (ws.workflow, ws.status, ws.started_at, ws.updated_at, ws.last_seq, ws.invocations)


def start(store: PostgresEventStore, sid: str, epoch: int | None = None) -> int:
    store.append(sid, [ev(RunStarted, sid, workflow="wf", input=1, ts=10.0)], 0, epoch=epoch)
    return 1


def test_an_append_after_the_first_is_one_statement(url: str, statements: list[str]):
    with PostgresEventStore(url) as s:
        last = start(s, "a")
        for k in range(5):
            before = len(statements)
            last = s.append("a", node_step("a", k), last)[-1].seq
            sent = statements[before:]
            assert len(sent) == 1 and sent[0].startswith("WITH s AS (UPDATE sessions"), sent
        projection_matches_the_log(s, "a")


def test_a_cached_state_behind_another_stores_append_is_not_written(url: str):
    with PostgresEventStore(url) as a, PostgresEventStore(url) as b:
        last = start(a, "s")
        last = a.append("s", node_step("s", 0), last)[-1].seq  # a's cache: at seq `last`
        last = b.append("s", node_step("s", 1), last)[-1].seq  # b moves the session on
        with pytest.raises(ConcurrencyConflict):  # a's cached seq is no longer the session's
            a.append("s", node_step("s", 1), last - 2)
        assert a.append("s", node_step("s", 2), last)[-1].seq == last + 2  # the locking path
        last += 2
        assert (
            a.append("s", [ev(RunFinished, "s", status="completed", output=3, ts=20.0)], last)[-1].seq
            == last + 1
        )
        assert [e.seq for e in a.read("s")] == list(range(1, last + 2))
        projection_matches_the_log(a, "s")
        assert a.session_info("s").status == "completed"  # type: ignore[union-attr]


def test_a_cached_append_under_a_superseded_epoch_writes_nothing(url: str):
    with PostgresEventStore(url) as a, PostgresEventStore(url) as b:
        lease = a.acquire("f", Owner("w1", "host-x", 999_999, 1.0), 30.0)
        last = start(a, "f", lease.epoch)
        last = a.append("f", node_step("f", 0), last, epoch=lease.epoch)[-1].seq
        taken = b.acquire("f", Owner("w2", "host-y", 999_998, 1.0), 30.0, force=True)
        with pytest.raises(LeaseLost):
            a.append("f", node_step("f", 1), last, epoch=lease.epoch)
        assert len(a.read("f")) == last
        projection_matches_the_log(a, "f")
        assert b.append("f", node_step("f", 1), last, epoch=taken.epoch)[-1].seq == last + 2


def test_a_session_pruned_and_made_again_is_another_row(url: str):
    with PostgresEventStore(url) as a, PostgresEventStore(url) as b:
        last = start(a, "p")
        last = a.append("p", node_step("p", 0), last)[-1].seq  # a keeps its state: running, at `last`
        done = node_step("p", 1)[:1] + [ev(RunFinished, "p", status="completed", output=1, ts=12.0)]
        b.append("p", done, last)  # b ends the session behind a's back
        assert b.delete_sessions(["p"]) == ["p"]
        # the same id again, by another store, up to the seq a's kept state holds
        remade = [ev(RunStarted, "p", workflow="wf", input=2, ts=30.0)]
        remade += [ev(NodeStarted, "p", path="wf/x", node="x", ts=31.0)] * (last - len(remade))
        assert b.append("p", remade, 0)[-1].seq == last
        assert a.append("p", [ev(NodeStarted, "p", path="wf/y", node="y", ts=32.0)], last)[-1].seq == last + 1
        projection_matches_the_log(a, "p")  # the row's columns are the new session's, not a's fold
        assert {r.path for r in a.node_runs("p")} == {"wf/x", "wf/y"}  # none of the old n0


def test_an_append_notifies_only_when_it_makes_the_session_claimable(url: str):
    """Running, then paused: nobody to wake. The answer (which the paused session's state,
    not kept, makes the locking path's) makes it claimable: the workers wake."""
    with PostgresEventStore(url) as s, PostgresEventStore(url) as listener:
        assert listener.wait_for_work(5.0)  # the listener's first look after LISTEN
        last = start(s, "q")
        for k in range(3):
            last = s.append("q", node_step("q", k), last)[-1].seq
        pause = [
            ev(InputRequested, "q", path="wf/n2", node="n2", interrupt_id="i1", ts=20.0),
            ev(RunFinished, "q", status="paused", ts=20.5),
        ]
        last = s.append("q", pause, last)[-1].seq
        assert listener.wait_for_work(0.3) is False  # running, then paused: nobody to wake
        answer = ev(
            InputReceived,
            "q",
            path="wf/n2",
            node="n2",
            interrupt_id="i1",
            value=1,
            ts=21.0,
            invocation_id="answer-1",
        )
        s.append("q", [answer], last)
        assert s.session_info("q").status == "answered"  # type: ignore[union-attr]
        assert listener.wait_for_work(5.0) is True
        projection_matches_the_log(s, "q")


def test_the_append_cache_holds_every_session_in_the_middle_of_an_invocation_and_no_other(
    url: str, statements: list[str]
):
    """Like SQLite's: a session's state is kept for its next append while it is mid-run,
    whatever the number of such sessions (with a fixed 64, a process running 100 sessions
    made most appends take the locking path); a finished, paused or submitted one is not."""
    with PostgresEventStore(url) as s:
        sids = [f"c{i}" for i in range(100)]
        last = {sid: start(s, sid) for sid in sids}
        for k in range(2):
            for sid in sids:
                before = len(statements)
                last[sid] = s.append(sid, node_step(sid, k), last[sid])[-1].seq
                if k:  # every append after a session's first: folded on its kept state
                    sent = statements[before:]
                    assert len(sent) == 1 and sent[0].startswith("WITH s AS (UPDATE sessions"), (sid, sent)
        assert set(s._node_cache) == set(sids)
        s.append("c0", [ev(RunFinished, "c0", status="completed", ts=30.0)], last["c0"])
        s.append(
            "c1",
            [
                ev(InputRequested, "c1", path="wf/n1", node="n1", interrupt_id="r", ts=30.0),
                ev(RunFinished, "c1", status="paused", ts=30.0),
            ],
            last["c1"],
        )
        s.append("q", [ev(RunSubmitted, "q", workflow="wf", input=1, ts=30.0)], 0)
        assert not {"c0", "c1", "q"} & set(s._node_cache)
        for sid in ("c0", "c1"):
            projection_matches_the_log(s, sid)


def _group(sids: list[str], step: int, lasts: dict[str, int], epochs: dict[str, int]) -> list[Any]:
    return [(sid, node_step(sid, step), lasts[sid], epochs[sid]) for sid in sids]


def test_a_group_commit_is_one_statement_per_session_from_the_first_append_after_the_start(
    url: str, statements: list[str]
):
    """Sessions started together (``acquire_new_many``) and group-committed: every append
    of the group, the first included, is the one statement folded on the state the store
    kept (sent together, in one pipeline), never the locking path's several per session."""
    sids = [f"g{i:02d}" for i in range(20)]
    me = Owner(worker_id="grp", host="h", pid=1, started_at=1.0)
    with PostgresEventStore(url) as s:
        leases = s.acquire_new_many(sids, me, 60.0)
        epochs = {
            lease.session_id: lease.epoch
            for lease in leases
            if lease is not None and not isinstance(lease, Exception)
        }
        assert sorted(epochs) == sids
        first = [
            (sid, [ev(RunStarted, sid, workflow="wf", input=1, ts=10.0)], 0, epochs[sid]) for sid in sids
        ]
        before = len(statements)
        out = s.append_many(first)
        lasts = {sid: r[-1].seq for sid, r in zip(sids, out) if isinstance(r, list)}
        for step in range(3):
            out = s.append_many(_group(sids, step, lasts, epochs))
            lasts = {sid: r[-1].seq for sid, r in zip(sids, out) if isinstance(r, list)}
        sent = statements[before:]
        appends = [q for q in sent if q.startswith("WITH s AS (UPDATE sessions")]
        assert len(appends) == 4 * len(sids), sent[:12]
        assert len(sent) - len(appends) <= 4 * 3, sent[:12]  # per group: its savepoint, no more
        for sid in sids:
            projection_matches_the_log(s, sid)


def test_a_group_whose_state_moved_on_takes_the_locking_path_for_all_and_loses_nothing(url: str):
    """One session of a group appended by another store meanwhile: its statement matches
    nothing, the savepoint lets every row of the group go, and the locking path answers
    each batch as without a kept state (the moved one refused, the others written)."""
    sids = ["m1", "m2", "m3"]
    with PostgresEventStore(url) as s, PostgresEventStore(url) as other:
        lasts = {sid: start(s, sid) for sid in sids}
        epochs = {sid: None for sid in sids}
        out = s.append_many(_group(sids, 0, lasts, epochs))  # the states kept
        lasts = {sid: r[-1].seq for sid, r in zip(sids, out) if isinstance(r, list)}
        other.append("m2", node_step("m2", 1), lasts["m2"])  # m2 moves on behind s's state
        out = s.append_many(_group(sids, 1, lasts, epochs))
        assert isinstance(out[1], ConcurrencyConflict)
        assert [type(r) for r in (out[0], out[2])] == [list, list]
        for sid in sids:
            projection_matches_the_log(s, sid)
        assert [e.type for e in s.read("m2")][-2:] == ["node_completed", "node_started"]


def _event_behind_the_stores_back(url: str, sid: str, seq: int) -> None:
    """An event row at ``seq`` that no append wrote: the session's row still says it is not there."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO events (session_id, seq, type, ts, invocation_id, path, node, payload) "
            "VALUES (%s, %s, 'node_started', 1.0, 'inv', 'wf/x', 'x', '{}')",
            (sid, seq),
        )


def test_an_append_whose_next_seq_is_taken_is_a_conflict_and_writes_nothing(url: str):
    """A kept state whose row still matches, but whose next seq holds an event no append of
    this store wrote: the one statement fails on the events' key, and the store answers as
    the locking path would, a conflict (never the driver's error), with nothing written."""
    with PostgresEventStore(url) as s:
        last = start(s, "u")
        last = s.append("u", node_step("u", 0), last)[-1].seq  # a kept state
        _event_behind_the_stores_back(url, "u", last + 1)
        with pytest.raises(ConcurrencyConflict, match="another process appended first"):
            s.append("u", node_step("u", 1), last)
        assert s.session_info("u").last_seq == last  # type: ignore[union-attr]
        assert [e.seq for e in s.read("u")] == list(range(1, last + 1))  # read to the row's last_seq


def test_a_group_with_a_taken_seq_refuses_that_batch_and_writes_the_others(url: str):
    """The same in a group commit: the pipelined statements fail on the events' key, the
    savepoint lets them all go, and the locking path refuses that session's batch alone."""
    sids = ["k1", "k2", "k3"]
    with PostgresEventStore(url) as s:
        lasts = {sid: start(s, sid) for sid in sids}
        epochs = {sid: None for sid in sids}
        out = s.append_many(_group(sids, 0, lasts, epochs))  # the states kept
        lasts = {sid: r[-1].seq for sid, r in zip(sids, out) if isinstance(r, list)}
        _event_behind_the_stores_back(url, "k2", lasts["k2"] + 1)
        out = s.append_many(_group(sids, 1, lasts, epochs))
        assert isinstance(out[1], ConcurrencyConflict) and "appended first" in str(out[1])
        assert [type(r) for r in (out[0], out[2])] == [list, list]
        for sid in ("k1", "k3"):
            projection_matches_the_log(s, sid)
        assert s.session_info("k2").last_seq == lasts["k2"]  # type: ignore[union-attr]


def test_an_invocations_last_appends_and_the_end_of_their_leases_commit_together(
    url: str, statements: list[str]
):
    """``append_and_release`` of a group is one transaction: the releases of the sessions
    without mail in one statement after the appends; and when the server refuses a release
    (a trigger here), the appends are not written either."""
    sids = ["r1", "r2", "r3"]
    me = Owner(worker_id="rel", host="h", pid=1, started_at=1.0)
    with PostgresEventStore(url) as s:
        got = s.acquire_new_many(sids + ["x1", "x2"], me, 60.0)
        leases = {g.session_id: g for g in got if g is not None and not isinstance(g, Exception)}
        for group in (sids, ["x1", "x2"]):
            s.append_many(
                [(sid, [ev(RunStarted, sid, workflow="wf", ts=10.0)], 0, leases[sid].epoch) for sid in group]
            )
        s.send("r2", "answer", {"inputs": {"ok": True}, "jobs": {}})  # mail: r2's owner takes it in first

        def last(group: list[str]) -> list[Any]:
            return [
                (sid, [ev(RunFinished, sid, status="completed", ts=11.0)], 1, leases[sid].epoch)
                for sid in group
            ]

        before = len(statements)
        out, released = s.append_and_release(last(sids), {sid: leases[sid] for sid in sids})
        assert all(isinstance(r, list) for r in out) and released == {"r1", "r3"}
        assert (
            sum(q.startswith("UPDATE sessions AS s SET lease_expires_at = 0") for q in statements[before:])
            == 1
        )
        with psycopg.connect(url, autocommit=True) as conn:
            ended = dict(
                conn.execute(
                    "SELECT session_id, lease_expires_at = 0 FROM sessions WHERE session_id = ANY(%s)",
                    (sids,),
                ).fetchall()
            )
            assert ended == {"r1": True, "r2": False, "r3": True}
            conn.execute(
                "CREATE FUNCTION refuse_release() RETURNS trigger AS $$ BEGIN "
                "IF NEW.lease_expires_at = 0 THEN RAISE EXCEPTION 'release refused'; END IF; RETURN NEW; END $$ "
                "LANGUAGE plpgsql"
            )
            conn.execute(
                "CREATE TRIGGER refuse_release BEFORE UPDATE ON sessions FOR EACH ROW EXECUTE FUNCTION refuse_release()"
            )
        with pytest.raises(StoreError):
            s.append_and_release(last(["x1", "x2"]), {sid: leases[sid] for sid in ("x1", "x2")})
        assert [s.last_seq(sid) for sid in ("x1", "x2")] == [1, 1]  # the appends went with the release


def test_a_first_append_that_queues_a_session_started_without_events_wakes_the_workers(
    url: str, statements: list[str]
):
    """A session started by ``acquire_new`` is kept as new: its first append is the one
    statement, and a submission there makes it claimable, so it notifies as the locking path does."""
    with PostgresEventStore(url) as s, PostgresEventStore(url) as listener:
        assert listener.wait_for_work(5.0)  # the listener's first look after LISTEN
        lease = s.acquire_new("n", Owner("w1", "host-x", 999_999, 1.0), 30.0)
        assert lease is not None and listener.wait_for_work(0.3) is False  # a start wakes nobody
        before = len(statements)
        s.append("n", [ev(RunSubmitted, "n", workflow="wf", input=1, ts=5.0)], 0, epoch=lease.epoch)
        assert [q[:25] for q in statements[before:]] == ["WITH s AS (UPDATE session"]
        assert s.session_info("n").status == "queued"  # type: ignore[union-attr]
        assert listener.wait_for_work(5.0) is True


def test_a_group_on_the_locking_path_locks_its_rows_in_session_id_order(
    url: str, monkeypatch: pytest.MonkeyPatch
):
    """Two group commits of the same sessions in opposite orders, neither with a kept
    state: each locks its rows in session-id order, so the second waits for the first
    rather than both holding one row and waiting for the other (a deadlock)."""
    with PostgresEventStore(url) as maker:
        for sid in ("a", "b"):
            start(maker, sid)
    real, first_lock, barrier = writer.Writer.session, threading.local(), threading.Barrier(2, timeout=1.0)

    def session(self: writer.Writer, session_id: str) -> Any:
        row = real(self, session_id)  # the row now locked
        if not getattr(first_lock, "done", False):
            first_lock.done = True
            with suppress(threading.BrokenBarrierError):  # both hold a first row before going on
                barrier.wait()
        return row

    monkeypatch.setattr(writer.Writer, "session", session)
    results: dict[str, Any] = {}

    def group(name: str, order: list[str]) -> None:
        with PostgresEventStore(url) as s:
            try:
                results[name] = s.append_many([(sid, node_step(sid, 0), 1, None) for sid in order])
            except StoreError as exc:
                results[name] = exc

    threads = [threading.Thread(target=group, args=(n, o)) for n, o in (("x", ["a", "b"]), ("y", ["b", "a"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(r, list) for r in results.values()), results  # neither group failed
    outcomes = {
        n: sorted(sid for sid, x in zip(o, results[n]) if isinstance(x, list))
        for n, o in (("x", ["a", "b"]), ("y", ["b", "a"]))
    }
    assert sorted(outcomes["x"] + outcomes["y"]) == ["a", "b"], outcomes  # each session appended once
