"""Run ownership in the SQLite store, across real processes: claims race
between processes, a SIGKILLed owner is taken over at once, a schema-2 file migrates in
place, and the claim and queued queries read only their indexes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
import sqlite_utils

from flowscope.errors import ConcurrencyConflict, LeaseLost
from flowscope.events import NodeStarted, RunStarted, RunSubmitted
from flowscope.ownership import this_process
from flowscope.store import SqliteEventStore
from flowscope.store.sqlite import DB_SCHEMA_VERSION, MIGRATIONS
from flowscope.store.sqlite import queries as q
from flowscope.store.sqlite.codec import encode
from flowscope.store.sqlite.schema import OPEN_WHERE
from flowscope.store.testing import ev, node_ev
from flowscope.store.testing.helpers import summary_asks_each_owner_once


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "own.db"


def submit(store, sid, workflow="wf", ts=1000.0):
    store.append(
        sid, [RunSubmitted(session_id=sid, invocation_id="submit", ts=ts, workflow=workflow, input=sid)], 0
    )


# --------------------------------------------------------------------------- two processes claim


def _claimer(path, name, barrier, queue):  # runs in a separate process
    store = SqliteEventStore(path, busy_timeout=30.0)
    me = this_process(name)
    got = []
    barrier.wait()
    idle = 0
    while idle < 3:  # until the queue stays empty
        claims = store.claim(me, ["race"], 60.0, limit=1)
        got.extend(c.session_id for c in claims)
        idle = 0 if claims else idle + 1
        time.sleep(0.005)  # a worker's poll: a tight loop would keep SQLite's lock to itself
    barrier.wait()  # both stay alive until both are done: a dead claimer's sessions are free again
    store.close()
    queue.put((name, got))


@pytest.mark.slow
def test_two_processes_claiming_the_same_queued_sessions_each_get_distinct_ones(db_path):
    sids = [f"s{i:03d}" for i in range(200)]
    with SqliteEventStore(db_path) as s:
        for i, sid in enumerate(sids):
            submit(s, sid, "race", 1000.0 + i)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(str(db_path), n, barrier, queue)) for n in ("p1", "p2")]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(got["p1"] + got["p2"]) == sids  # every session exactly once
    assert got["p1"] and got["p2"]  # both took part
    with SqliteEventStore(db_path) as s:
        for sid in sids:
            info = s.session_info(sid)
            assert info is not None and info.epoch == 1
            assert info.owner is not None and sid in got[info.owner.worker_id]


# --------------------------------------------------------------------------- a SIGKILLed owner

OWNER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from flowscope.events import RunStarted, NodeStarted
    from flowscope.ownership import this_process
    from flowscope.store import SqliteEventStore
    store = SqliteEventStore(sys.argv[1])
    lease = store.acquire("s1", this_process("w-child"), 3600.0)
    store.append("s1", [RunStarted(session_id="s1", invocation_id="i1", ts=time.time(), workflow="wf"),
                        NodeStarted(session_id="s1", invocation_id="i1", ts=time.time(), path="wf@1/a@1", node="a")],
                 0, epoch=lease.epoch)
    print("ready", flush=True)
    time.sleep(120)
    """
)


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_sigkilled_owner_process_is_taken_over_at_once(db_path):
    child = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, str(db_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with SqliteEventStore(db_path) as store:
            me = this_process("w-parent")
            with pytest.raises(ConcurrencyConflict, match=f"w-child on .* pid {child.pid} "):
                store.acquire("s1", me, 15.0)  # alive: refused
            assert store.claim(me, ["wf"], 15.0, limit=5) == []
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            t0 = time.monotonic()
            [c] = store.claim(me, ["wf"], 15.0, limit=5)  # its lease has an hour left: no matter
            assert (c.session_id, c.reason, c.lease.epoch) == ("s1", "orphaned", 2)
            assert time.monotonic() - t0 < 1.0
            with pytest.raises(LeaseLost):  # the dead owner's epoch is fenced off
                store.append("s1", [node_ev(NodeStarted, "wf@1/b@1", ts=1.0, sid="s1")], 2, epoch=1)
            store.append(
                "s1",
                [node_ev(NodeStarted, "wf@1/a@1", ts=2.0, sid="s1", attempt=2, recovered=True)],
                2,
                epoch=c.lease.epoch,
            )
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# --------------------------------------------------------------------------- migration from schema 2


def make_schema_2_file(path) -> None:
    """A database as flowscope with DB_SCHEMA_VERSION 2 wrote it: one running session."""
    conn = sqlite3.connect(path, isolation_level=None)
    db = sqlite_utils.Database(conn)
    db.table("meta").create({"key": str, "value": str}, pk="key")
    MIGRATIONS[0](db)
    MIGRATIONS[1](db)
    conn.executemany(
        "INSERT INTO meta VALUES (?, ?)", [("application", "flowscope"), ("schema_version", "2")]
    )
    events = [
        ev(RunStarted, sid="old", workflow="legacy", ts=10.0),
        node_ev(NodeStarted, "legacy@1/a@1", ts=11.0, sid="old"),
    ]
    for seq, e in enumerate(events, 1):
        conn.execute(q.SQL_INSERT_EVENT, ("old", seq) + encode(str(path), "old", e))
    conn.execute("INSERT INTO sessions VALUES ('old', 'legacy', 'running', 10.0, 11.0, 2, 1)")
    conn.execute(
        "INSERT INTO node_runs (session_id, path, workflow, node, kind, parent_path, status, attempt, failures, "
        "retries, recoveries, started_at, heartbeat_at) VALUES ('old', 'legacy@1/a@1', 'legacy', 'a', 'function', '', "
        "'running', 1, 0, 0, 0, 11.0, 11.0)"
    )
    conn.close()


def test_a_schema_2_database_migrates_in_place(db_path):
    assert DB_SCHEMA_VERSION == 7
    make_schema_2_file(db_path)
    with SqliteEventStore(db_path) as store:
        assert store.schema_version == 7
        # schema 5: the inbox, empty
        assert store.inbox("old") == []
        # schema 4: the open-runs index's predicate is the OR form, with the old open run in it
        [sql] = [
            r[0] for r in store._conn.execute("SELECT sql FROM sqlite_master WHERE name = 'node_runs_open'")
        ]
        assert "status = 'running' OR" in sql and " IN (" not in sql, sql
        assert store._conn.execute(
            f"SELECT count(*) FROM node_runs INDEXED BY node_runs_open WHERE {OPEN_WHERE}"
        ).fetchone() == (1,)
        [info] = store.sessions()
        assert (info.session_id, info.workflow, info.status, info.last_seq) == ("old", "legacy", "running", 2)
        assert (info.owner, info.epoch, info.lease_expires_at, info.submitted_at) == (None, 0, None, None)
        assert [e.seq for e in store.read("old")] == [1, 2]
        # no owner recorded: the heartbeat fallback still classifies its run
        [g] = store.open_run_summary(now=1000.0, stale_after_s=60.0)
        assert (g.count, g.orphaned) == (1, 1)
        assert store.claim(this_process("w"), ["legacy"], 15.0, limit=5) == []  # ownerless: left to resume
        lease = store.acquire("old", this_process("w"), 15.0)
        assert lease.epoch == 1
        # schema 6: the held lease's owner, in the index a claim reads owners from
        assert store._conn.execute(
            "SELECT count(*) FROM sessions INDEXED BY sessions_leased WHERE lease_expires_at > 0"
        ).fetchone() == (1,)
        store.append("old", [node_ev(NodeStarted, "legacy@1/b@1", ts=12.0, sid="old")], 2, epoch=1)
        submit(store, "new")
        assert [g.workflow for g in store.queued_summary()] == ["wf"]
        store.workers_seen(this_process("w"), ["legacy"])
        assert [w.worker_id for w in store.workers()] == ["w"]
        store.rebuild_projections()  # keeps ownership, recomputes submit times from the log
        info = store.session_info("old")
        assert info is not None and (info.epoch, info.owner) == (1, lease.owner)
        new = store.session_info("new")
        assert new is not None and (new.status, new.submitted_at) == ("queued", 1000.0)


# --------------------------------------------------------------------------- query plans


@pytest.mark.parametrize(
    "sql, index",
    [
        (q.SQL_CLAIM_QUEUED, "sessions_queued"),
        (q.SQL_CLAIM_ANSWERED, "sessions_answered"),
        (q.SQL_CLAIM_ORPHANED, "sessions_running"),
        (q.SQL_LEASE_OWNERS, "sessions_leased"),
        (q.SQL_CLAIM_HELD_BY_DEAD, "sessions_leased"),
        (q.SQL_QUEUED_SUMMARY, "sessions_queued"),
    ],
)
def test_claim_and_queued_queries_read_only_their_index(db_path, sql, index):
    plan = _plan(db_path, sql)
    assert index in plan, plan
    assert "events" not in plan, plan
    assert "SCAN sessions " not in plan + " " or f"USING INDEX {index}" in plan, plan


@pytest.mark.parametrize("sql", [q.SQL_CLAIM_QUEUED, q.SQL_CLAIM_ANSWERED])
def test_a_claim_reads_the_queue_in_index_order_without_a_sort(db_path, sql):
    # A sort would read every queued session to return the first: a claim's cost would
    # grow with the queue, not with what it takes.
    plan = _plan(db_path, sql)
    assert "TEMP B-TREE" not in plan and "SCAN sessions " not in plan + " ", plan


def _plan(db_path, sql: str) -> str:
    """``sql``'s query plan, one step after another, beside 50 queued sessions."""
    params = {"now": 1.0, "host": "h", "workflows": '["wf", "other"]', "workflow": "wf", "dead": '["{}"]'}
    with SqliteEventStore(db_path) as store:
        for i in range(50):
            submit(store, f"s{i}", "wf", float(i))
        conn = store._conn
        assert conn is not None
        conn.execute("ANALYZE")
        return " / ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params))


def test_the_open_run_summary_asks_whether_each_owner_is_alive_once(db_path, monkeypatch):
    with SqliteEventStore(db_path) as store:
        summary_asks_each_owner_once(store, monkeypatch)


def test_a_read_only_open_of_an_older_schema_says_a_writing_command_migrates_it(db_path):
    from click.testing import CliRunner

    from flowscope.cli import cli
    from flowscope.errors import StoreSchemaTooOld

    make_schema_2_file(db_path)
    with pytest.raises(StoreSchemaTooOld, match="schema 2; this version uses schema 7"):
        SqliteEventStore(db_path, readonly=True)
    r = CliRunner().invoke(cli, ["--db", str(db_path), "runs"], catch_exceptions=False)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "run a command that writes to it once" in r.output and "permissions" not in r.output, r.output
    assert "readonly" not in r.output  # the API's word, not the CLI user's
    with SqliteEventStore(db_path) as store:  # a writable open migrates it
        assert store.schema_version == 7


def test_an_owner_record_that_cannot_be_read_is_an_unreadable_owner_its_lease_speaks_for(db_path):
    from flowscope.store.appending import UNREADABLE_OWNER

    store = SqliteEventStore(db_path)
    submit(store, "bad")
    submit(store, "good")
    store.acquire("bad", this_process("first"), 60.0)
    sqlite3.connect(db_path).execute(
        "UPDATE sessions SET owner = 'not json' WHERE session_id = 'bad'"
    ).connection.commit()
    owners = {info.session_id: info.owner for info in store.find_sessions()}
    assert owners == {"bad": UNREADABLE_OWNER, "good": None}  # one bad row lists, and so do the rest
    assert UNREADABLE_OWNER.describe() == "(unreadable owner record)"
    with pytest.raises(ConcurrencyConflict):  # its lease still runs: nobody takes the session
        store.acquire("bad", this_process("second"), 60.0)
    store.close()
