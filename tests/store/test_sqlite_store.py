"""What only the SQLite adapter has to show: files, processes, schema, bad input."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from test_store_contract import append_in_batches, node_ev, one_of_each, random_log

from conftest import unavailable
from flowscope.errors import (
    ConcurrencyConflict,
    NotAFlowscopeDatabase,
    StoreCorrupt,
    StoreDiskFull,
    StoreError,
    StoreLocked,
    StoreNotWritable,
    StoreReadOnly,
    StoreSchemaTooNew,
    StoreUnavailable,
)
from flowscope.events import (
    EVENT_TYPES,
    JobDispatched,
    JobResultReceived,
    NodeCompleted,
    NodeStarted,
    RunFinished,
    RunStarted,
    StateUpdated,
    from_dict,
    to_dict,
)
from flowscope.store import MemoryEventStore, NodeRun, SqliteEventStore, rebuild
from flowscope.store.sqlite import EventNotSerializableError
from flowscope.store.sqlite import queries as queries_mod
from flowscope.store.sqlite import schema as sqlite_mod

SID = "s1"


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "flow.db"


def started(sid=SID, ts=1.0, workflow="w"):
    return RunStarted(session_id=sid, invocation_id="i1", ts=ts, workflow=workflow)


def raw(path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def snapshot(store, sid=SID):
    return (store.read(sid), store.last_seq(sid), store.sessions(), store.node_runs(), store.open_runs())


# --------------------------------------------------------------------------- persistence


def test_everything_survives_close_and_reopen(db_path):
    rnd = random.Random(3)
    log = random_log(rnd, SID, 200)
    with SqliteEventStore(db_path) as s:
        append_in_batches(s, SID, log, rnd)
        s.heartbeat(SID, [r.path for r in s.open_runs() if r.status == "running"], ts=99999.0)
        before = snapshot(s)
    with SqliteEventStore(db_path) as s:
        assert snapshot(s) == before
        assert [e.seq for e in s.read(SID)] == list(range(1, len(log) + 1))
        # and the log goes on where it stopped
        s.append(SID, [RunFinished(session_id=SID, ts=5e6)], len(log))
        assert s.last_seq(SID) == len(log) + 1


def test_a_second_store_on_the_same_file_sees_the_appends(db_path):
    a = SqliteEventStore(db_path)
    b = SqliteEventStore(db_path)
    a.append(SID, [started()], 0)
    assert b.read(SID) == a.read(SID)
    b.append(SID, [node_ev(NodeStarted, "w@1/x@1", ts=2.0)], 1)
    assert [e.seq for e in a.read(SID)] == [1, 2]
    assert a.node_runs() == b.node_runs()
    a.close()
    b.close()


def test_an_empty_file_and_a_new_path_get_the_schema(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for p in (empty, tmp_path / "new.db"):
        with SqliteEventStore(p) as s:
            assert s.schema_version == sqlite_mod.DB_SCHEMA_VERSION
            assert {"meta", "events", "sessions", "node_runs"} <= set(s.db.table_names())
        meta = dict(raw(p).execute("SELECT key, value FROM meta").fetchall())
        assert meta == {"application": "flowscope", "schema_version": str(sqlite_mod.DB_SCHEMA_VERSION)}


def test_in_memory_database(tmp_path):
    with SqliteEventStore(":memory:") as s:
        s.append(SID, [started()], 0)
        assert s.last_seq(SID) == 1


def test_events_table_keeps_hot_fields_in_columns_and_the_rest_as_json(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, one_of_each(), 0)
    c = raw(db_path)
    row = c.execute(
        "SELECT type, ts, invocation_id, path, node, json_extract(payload, '$.error_code'), payload "
        "FROM events WHERE session_id = ? AND type = 'node_error'",
        (SID,),
    ).fetchone()
    assert row[:6] == ("node_error", 5.5, "inv-7", "wf@1/fetch@1", "fetch", "BAD_INPUT")
    payload = json.loads(row[6])
    assert set(payload) == {"error_code", "error_message", "error_type", "attempt_count", "error_qualname"}
    # the projection row for the same run
    nr = c.execute(
        "SELECT status, error_code, workflow FROM node_runs WHERE session_id = ?", (SID,)
    ).fetchone()
    assert nr == ("cancelled", "BAD_INPUT", "wf")


def test_fast_decoding_equals_from_dict_for_every_type(db_path):
    sample = one_of_each()
    with SqliteEventStore(db_path) as s:
        stored = s.append(SID, sample, 0)
        for e in s.read(SID):
            assert e == from_dict(to_dict(e))
            assert type(e) is EVENT_TYPES[e.type]
        assert s.read(SID) == stored


def test_rows_from_older_and_newer_writers_decode_like_from_dict(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [node_ev(JobDispatched, "w@1/j@1", ts=1.0, job_id="j", job_key="k", deadline_s=5.0)], 0)
    c = raw(db_path)
    # an older writer did not know job_key; a newer one adds a field this version does not know
    c.execute("UPDATE events SET payload = json_set(json_remove(payload, '$.job_key'), '$.shiny', 1)")
    with SqliteEventStore(db_path) as s:
        [e] = s.read(SID)
    assert (e.job_key, e.job_id, e.deadline_s) == ("", "j", 5.0)
    assert not hasattr(e, "shiny")


# --------------------------------------------------------------------------- concurrency


def test_two_store_objects_racing_with_the_same_expected_seq(db_path):
    a, b = SqliteEventStore(db_path), SqliteEventStore(db_path)
    a.append(SID, [started()], 0)
    barrier = threading.Barrier(2)
    outcome: dict[str, list[str]] = {"a": [], "b": []}
    rounds = 40

    def writer(name, store):
        for r in range(rounds):
            barrier.wait()
            last = store.last_seq(SID)
            barrier.wait()
            try:
                store.append(
                    SID,
                    [
                        StateUpdated(
                            session_id=SID,
                            ts=float(r),
                            path="w@1/x@1",
                            node="x",
                            values={"writer": name, "round": r},
                        )
                    ],
                    last,
                )
                outcome[name].append("won")
            except ConcurrencyConflict:
                outcome[name].append("lost")

    threads = [threading.Thread(target=writer, args=(n, st)) for n, st in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(rounds):
        assert sorted((outcome["a"][r], outcome["b"][r])) == ["lost", "won"]
    events = a.read(SID)
    assert [e.seq for e in events] == list(range(1, rounds + 2))
    assert [e.values["round"] for e in events[1:]] == list(range(rounds))
    for e in events[1:]:
        assert outcome[e.values["writer"]][e.values["round"]] == "won"
    a.close()
    b.close()


def _race_worker(path, name, rounds, barrier, queue):  # runs in a separate process
    store = SqliteEventStore(path)
    results = []
    for r in range(rounds):
        barrier.wait()
        last = store.last_seq(SID)
        barrier.wait()
        try:
            store.append(
                SID,
                [
                    StateUpdated(
                        session_id=SID,
                        ts=float(r),
                        path="w@1/x@1",
                        node="x",
                        values={"writer": name, "round": r},
                    )
                ],
                last,
            )
            results.append("won")
        except ConcurrencyConflict:
            results.append("lost")
    store.close()
    queue.put((name, results))


@pytest.mark.slow
def test_two_processes_racing_appends_exactly_one_wins(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)
    ctx = multiprocessing.get_context("spawn")
    rounds = 25
    barrier = ctx.Barrier(2)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(str(db_path), n, rounds, barrier, queue)) for n in ("p1", "p2")
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for r in range(rounds):
        assert sorted((results["p1"][r], results["p2"][r])) == ["lost", "won"]
    with SqliteEventStore(db_path) as s:
        events = s.read(SID)
        assert [e.seq for e in events] == list(range(1, rounds + 2))
        assert [e.values["round"] for e in events[1:]] == list(range(rounds))  # nothing lost or duplicated
        for e in events[1:]:
            assert results[e.values["writer"]][e.values["round"]] == "won"
        assert s.sessions()[0].last_seq == rounds + 1


def _create_worker(path, name, barrier, queue):  # runs in a separate process
    barrier.wait()
    try:
        with SqliteEventStore(path) as store:
            store.append(name, [started(name)], 0)
        queue.put((name, "ok"))
    except Exception as exc:  # pragma: no cover - reported by the test
        queue.put((name, repr(exc)))


@pytest.mark.slow
def test_processes_creating_the_same_new_file_at_once(db_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_create_worker, args=(str(db_path), f"p{i}", barrier, queue)) for i in range(3)
    ]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == {"p0": "ok", "p1": "ok", "p2": "ok"}
    with SqliteEventStore(db_path) as s:
        assert sorted(i.session_id for i in s.sessions()) == ["p0", "p1", "p2"]
        assert s.schema_version == sqlite_mod.DB_SCHEMA_VERSION


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_opening_waits_for_another_writer_before_switching_to_wal(db_path):
    # SQLite answers the switch to WAL with SQLITE_BUSY at once, without its busy handler,
    # while another connection holds a write lock on a rollback-journal file (as when
    # processes create the same new file at once): the open must wait, not fail.
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)
    raw(db_path).execute("PRAGMA journal_mode = DELETE")
    holder = raw(db_path)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    t0 = time.monotonic()
    with SqliteEventStore(db_path, busy_timeout=10) as s:
        assert time.monotonic() - t0 >= 0.25
        assert s.journal_mode == "wal"
        assert [e.seq for e in s.read(SID)] == [1]
    holder.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_writer_waits_for_another_process_lock_then_succeeds(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)
    holder = raw(db_path)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    with SqliteEventStore(db_path, busy_timeout=10) as s:
        t0 = time.monotonic()
        s.append(SID, [RunFinished(session_id=SID, ts=2.0)], 1)
        assert time.monotonic() - t0 >= 0.2
        assert s.last_seq(SID) == 2
    holder.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_lock_held_too_long_is_a_store_error_naming_the_file(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)
    holder = raw(db_path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with SqliteEventStore(db_path, busy_timeout=0.2) as s:
            with pytest.raises(StoreError) as exc:
                s.append(SID, [RunFinished(session_id=SID, ts=2.0)], 1)
            assert str(db_path) in str(exc.value) and "locked" in str(exc.value)
            assert [e.seq for e in s.read(SID)] == [1]  # nothing written
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with SqliteEventStore(db_path) as s:
        assert s.last_seq(SID) == 1


def test_threads_sharing_one_store(db_path):
    s = SqliteEventStore(db_path)
    errors = []

    def work(k):
        try:
            sid = f"t{k}"
            seq = 0
            for i in range(30):
                seq = s.append(sid, [node_ev(NodeStarted, f"w@1/n@{i}", sid=sid, ts=float(i))], seq)[-1].seq
                s.read(sid)
                s.open_runs()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(i.last_seq for i in s.sessions()) == [30] * 4
    assert len(s.open_runs()) == 120
    s.close()


CRASH_SCRIPT = textwrap.dedent(
    """
    import sys, os
    from flowscope.events import NodeStarted, NodeCompleted, RunStarted
    from flowscope.store import SqliteEventStore
    s = SqliteEventStore(sys.argv[1])
    seq = s.append("c", [RunStarted(session_id="c", ts=1.0, workflow="w")], 0)[-1].seq
    i = 0
    while True:
        i += 1
        p = f"w@1/n@{i}"
        seq = s.append("c", [NodeStarted(session_id="c", ts=float(i), path=p, node="n")], seq)[-1].seq
        seq = s.append("c", [NodeCompleted(session_id="c", ts=float(i) + 0.5, path=p, node="n", output={"i": i}),
                             NodeStarted(session_id="c", ts=float(i) + 0.5, path=p + "/x@1", node="x")], seq)[-1].seq
        if i == 20:
            print("ready", flush=True)
    """
)


@pytest.mark.slow
def test_a_writer_killed_mid_stream_leaves_a_consistent_file(db_path, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(CRASH_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(db_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with SqliteEventStore(db_path) as s:
        events = s.read("c")
        n = len(events)
        assert n > 40 and [e.seq for e in events] == list(range(1, n + 1))
        state = rebuild(events)
        assert s.node_runs("c") == [NodeRun.from_state("c", "w", ns) for ns in state.nodes.values()]
        assert s.last_seq("c") == n
        # every committed batch is whole: a NodeCompleted is always followed by its child's NodeStarted
        for a, b in zip(events, events[1:]):
            if a.type == "node_completed":
                assert b.type == "node_started" and b.path == a.path + "/x@1"
        s.append("c", [NodeCompleted(session_id="c", ts=1e9, path="w@1/n@1/x@1", node="x")], n)


# --------------------------------------------------------------------------- projections


def test_rebuild_projections_equals_the_incremental_projection(db_path):
    rnd = random.Random(11)
    with SqliteEventStore(db_path) as s:
        memory = MemoryEventStore()
        for k in range(4):
            sid = f"r{k}"
            log = random_log(rnd, sid, rnd.randint(80, 160), t0=1000.0 * k)
            append_in_batches(s, sid, log, random.Random(k))
            memory.append(sid, log, 0)
        total = sum(i.last_seq for i in s.sessions())
        assert total >= 300
        incremental = (s.sessions(), s.node_runs(), s.open_runs())
        assert incremental == (memory.sessions(), memory.node_runs(), memory.open_runs())
        c = raw(db_path)
        # damage the projection, then rebuild it from the log
        c.execute("UPDATE node_runs SET status = 'running', attempt = 99 WHERE rowid % 3 = 0")
        c.execute("DELETE FROM node_runs WHERE rowid % 5 = 0")
        c.execute("UPDATE sessions SET status = 'bogus', last_seq = 1")
        assert (s.sessions(), s.node_runs()) != incremental[:2]
        s.rebuild_projections()
        assert (s.sessions(), s.node_runs(), s.open_runs()) == incremental
        s.rebuild_projections()  # idempotent
        assert (s.sessions(), s.node_runs(), s.open_runs()) == incremental
        assert s.last_seq("r0") == incremental[0][[i.session_id for i in incremental[0]].index("r0")].last_seq


def test_rebuild_projections_keeps_recorded_heartbeats(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        s.heartbeat(SID, ["w@1/a@1"], ts=500.0)
        s.rebuild_projections()
        assert s.node_runs(SID)[0].heartbeat_at == 500.0


def _random_logs(prefix: str, seeds: int, events: int):
    """Per seed: the seed, its generator (the log drew from it), a session id, a random log
    of ``events`` events for it, and a memory store to hold the same."""
    for seed in range(seeds):
        rnd = random.Random(seed)
        sid = f"{prefix}{seed}"
        yield seed, rnd, sid, random_log(rnd, sid, events), MemoryEventStore()


def test_sqlite_projection_equals_memory_on_random_logs(db_path):
    for seed, _rnd, sid, log, memory in _random_logs("seed", 5, 150):
        with SqliteEventStore(db_path) as s:
            append_in_batches(s, sid, log, random.Random(seed))
            append_in_batches(memory, sid, log, random.Random(seed + 100))
            assert s.read(sid) == memory.read(sid)
            assert s.node_runs(sid) == memory.node_runs(sid)
            assert [i for i in s.sessions() if i.session_id == sid] == memory.sessions()


def test_open_runs_uses_the_open_runs_index_not_a_scan(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        statements: list[str] = []
        s._conn.set_trace_callback(statements.append)
        s.open_runs()
        s._conn.set_trace_callback(None)
        [sql] = [q for q in statements if q.lstrip().upper().startswith("SELECT")]
        plan = " | ".join(r[-1] for r in raw(db_path).execute("EXPLAIN QUERY PLAN " + sql).fetchall())
    assert "node_runs_open" in plan, plan
    assert "events" not in plan, plan
    assert "SCAN node_runs" not in plan or "USING INDEX" in plan, plan


def _node_reads(store: SqliteEventStore, fn) -> tuple[int, int]:
    """Run ``fn()``; its reads of node-run rows: by path, and of all of a session's."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        fn()
    finally:
        store._conn.set_trace_callback(None)
    reads = [
        q for q in statements if q.startswith("SELECT path") and "FROM node_runs WHERE session_id = " in q
    ]
    by_path = sum(" AND path IN " in q for q in reads)
    return by_path, len(reads) - by_path


def test_a_resumed_session_reads_its_node_runs_once_not_one_lookup_per_node(db_path):
    from flowscope import START, Runner, Workflow, node

    wf = Workflow("c", edges=[(START, *[node(lambda x: x + 1, name=f"n{i}") for i in range(5)])])
    with SqliteEventStore(db_path) as s:
        sid = Runner(wf, s).submit(0)  # queued, as `flowscope start` leaves it
    with SqliteEventStore(db_path) as worker:  # the worker's process: nothing of the session at hand
        runner = Runner(wf, worker)
        by_path, every = _node_reads(worker, lambda: runner.resume_sync(sid))
        assert worker.session_info(sid).status == "completed"
        assert [r.status for r in worker.node_runs(sid)] == ["completed"] * 6
    # the first append read the session's runs (none yet); the other five looked none up
    assert (by_path, every) == (0, 1)


def test_a_resumed_session_keeps_only_its_open_runs_at_hand(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(
            SID,
            [
                started(),
                node_ev(NodeStarted, "w@1/a@1", 2.0),
                node_ev(NodeCompleted, "w@1/a@1", 3.0),
                node_ev(NodeStarted, "w@1/b@1", 4.0),
            ],
            0,
        )
    with SqliteEventStore(db_path) as s:  # another process: nothing of the session at hand
        s.append(SID, [node_ev(NodeCompleted, "w@1/b@1", 5.0), node_ev(NodeStarted, "w@1/c@1", 6.0)], 4)
        kept = s._node_cache[SID]
        assert set(kept.ws.nodes) == {"w@1/c@1"}  # the open run; the ended ones let go, as after any append
        assert kept.finished == {"w@1/a@1", "w@1/b@1"}
        s.append(SID, [node_ev(NodeCompleted, "w@1/c@1", 7.0)], 6)
        assert [(r.path, r.status) for r in s.node_runs(SID)] == [
            ("w@1/a@1", "completed"),
            ("w@1/b@1", "completed"),
            ("w@1/c@1", "completed"),
        ]


def test_past_the_bound_a_first_append_reads_no_row_it_does_not_touch(db_path, monkeypatch):
    from flowscope.store.sqlite import writer as writer_mod

    monkeypatch.setattr(writer_mod, "FULL_LOAD_MAX", 3)
    runs = [node_ev(cls, f"w@1/n{k}@1", 2.0 + k) for k in range(5) for cls in (NodeStarted, NodeCompleted)]
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started(), *runs, node_ev(NodeStarted, "w@1/x@1", 9.0)], 0)
    with SqliteEventStore(db_path) as s:  # nothing at hand: five runs, past the bound of three
        by_path, every = _node_reads(s, lambda: s.append(SID, [node_ev(NodeCompleted, "w@1/x@1", 10.0)], 12))
        assert s.node_runs(SID)[-1].status == "completed"
    assert (by_path, every) == (1, 0)  # the run it completes; none of the five read to be dropped


def test_past_the_bound_an_append_reads_the_runs_it_touches_and_the_projection_holds(db_path, monkeypatch):
    from flowscope.store.sqlite import writer as writer_mod

    monkeypatch.setattr(writer_mod, "FULL_LOAD_MAX", 3)
    for _seed, rnd, sid, log, memory in _random_logs("bound", 4, 120):
        with SqliteEventStore(db_path) as s:
            reads = [0, 0]
            i = 0
            while i < len(log):  # every batch as the first append of a new process
                k = rnd.choice((1, 2, 3, 7))
                s._node_cache.clear()
                by_path, every = _node_reads(s, lambda: s.append(sid, log[i : i + k], i))
                reads[0] += by_path
                reads[1] += every
                memory.append(sid, log[i : i + k], i)
                i += k
            assert s.node_runs(sid) == memory.node_runs(sid)
            assert s.read(sid) == memory.read(sid)
        assert reads[1] > 0 and reads[0] > 0  # both ways: all of few runs, and past the bound by path


def test_pragmas_wal_and_synchronous(db_path):
    with SqliteEventStore(db_path) as s:
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert s._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    with SqliteEventStore(db_path, durability="full") as s:
        assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        s.append(SID, [started()], 0)
        assert s.last_seq(SID) == 1
    assert raw(db_path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    with pytest.raises(ValueError):
        SqliteEventStore(db_path, durability="paranoid")


def _grow_wal(store, sessions: int, steps: int) -> None:
    """Append a run start and ``steps`` node runs to each of ``sessions`` sessions, a step
    (one node's completion and the next one's start) per transaction."""
    for i in range(sessions):
        sid = f"wal-{i}"
        store.append(sid, [started(sid)], 0)
        for k in range(steps):
            store.append(
                sid,
                [
                    node_ev(NodeStarted, f"w@1/n{k}@1", 2.0 + k, sid),
                    node_ev(NodeCompleted, f"w@1/n{k}@1", 2.5 + k, sid),
                ],
                store.last_seq(sid),
            )


def test_the_wal_is_checkpointed_every_16_mib_not_every_mib(db_path):
    # SQLite's default (1,000 pages: 1 MiB at flowscope's page size) checkpoints every
    # ~100 steps, each time syncing both files and copying the session's hot pages again.
    with SqliteEventStore(db_path) as s:
        page = s._conn.execute("PRAGMA page_size").fetchone()[0]
        assert page == sqlite_mod.PAGE_SIZE
        assert (
            s._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
            == sqlite_mod.WAL_CHECKPOINT_BYTES // page
        )
        _grow_wal(s, 4, 100)
        wal = os.path.getsize(f"{db_path}-wal")
        assert 2 * 1024 * 1024 < wal < sqlite_mod.WAL_CHECKPOINT_BYTES, (
            wal
        )  # grew past 1 MiB: no checkpoint yet
        assert (
            raw(db_path).execute("SELECT count(*) FROM events").fetchone()[0] == 4 * 201
        )  # all in the WAL, visible


@pytest.mark.slow
def test_the_wal_stays_bounded_and_everything_reaches_the_database_file(db_path):
    with SqliteEventStore(db_path) as s:
        schema_only = os.path.getsize(db_path)
        _grow_wal(s, 20, 300)  # ~6,000 steps of ~10 frames: several times WAL_CHECKPOINT_BYTES
        wal = os.path.getsize(f"{db_path}-wal")
        assert wal <= sqlite_mod.WAL_CHECKPOINT_BYTES * 1.1, (
            wal
        )  # reset at each checkpoint, never past the limit
        assert (
            os.path.getsize(db_path) > schema_only + 1024 * 1024
        )  # checkpoints moved the pages into the file
    with SqliteEventStore(db_path, readonly=True) as r:
        assert all(r.last_seq(f"wal-{i}") == 601 for i in range(20))


def test_a_read_only_store_never_checkpoints(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)
    with SqliteEventStore(db_path, readonly=True) as r:
        assert (
            r._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
        )  # untouched: it writes nothing


# --------------------------------------------------------------------------- bad input


def test_missing_file_read_only_names_the_file(tmp_path):
    p = tmp_path / "missing.db"
    with pytest.raises(StoreError) as exc:
        SqliteEventStore(p, readonly=True)
    assert str(p) in str(exc.value) and "does not exist" in str(exc.value)
    assert not p.exists()


def test_missing_directory_names_the_file(tmp_path):
    p = tmp_path / "no" / "such" / "dir.db"
    with pytest.raises(StoreError) as exc:
        SqliteEventStore(p)
    assert str(p) in str(exc.value)


def test_a_directory_is_not_a_database(tmp_path):
    with pytest.raises(StoreError) as exc:
        SqliteEventStore(tmp_path)
    assert str(tmp_path) in str(exc.value)


@pytest.mark.parametrize(
    "content", [b"hello, I am a text file\n" * 10, b"\x00" * 4096, b"SQLite format 3\x00" + b"\xff" * 4000]
)
def test_a_file_that_is_not_sqlite(tmp_path, content):
    p = tmp_path / "notes.db"
    p.write_bytes(content)
    for readonly in (False, True):
        with pytest.raises(StoreError) as exc:
            SqliteEventStore(p, readonly=readonly)
        assert str(p) in str(exc.value)
        assert "is not a SQLite database" in str(exc.value) or "corrupt" in str(exc.value)
    assert p.read_bytes() == content  # never modified


def test_a_sqlite_file_of_another_application(tmp_path):
    p = tmp_path / "other.db"
    c = raw(p)
    c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    c.execute("INSERT INTO users (name) VALUES ('ann')")
    c.close()
    before = p.read_bytes()
    for readonly in (False, True):
        with pytest.raises(StoreError) as exc:
            SqliteEventStore(p, readonly=readonly)
        assert str(exc.value) == f"{p} is not a flowscope database (it has no flowscope meta table)"
    assert p.read_bytes() == before
    assert raw(p).execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL


@pytest.mark.parametrize(
    "ddl,rows",
    [
        (
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
            [("application", "someone-else"), ("schema_version", "1")],
        ),
        ("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)", []),
        ("CREATE TABLE meta (id INTEGER, blob BLOB)", None),
    ],
)
def test_a_foreign_meta_table(tmp_path, ddl, rows):
    p = tmp_path / "other.db"
    c = raw(p)
    c.execute(ddl)
    if rows:
        c.executemany("INSERT INTO meta VALUES (?, ?)", rows)
    c.close()
    with pytest.raises(StoreError) as exc:
        SqliteEventStore(p)
    assert str(exc.value).startswith(f"{p} is not a flowscope database")


def test_a_schema_newer_than_the_code(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)
    newer = sqlite_mod.DB_SCHEMA_VERSION + 1
    raw(db_path).execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(newer),))
    for readonly in (False, True):
        with pytest.raises(StoreError) as exc:
            SqliteEventStore(db_path, readonly=readonly)
        assert str(exc.value) == (
            f"{db_path} was written by a newer flowscope (schema {newer}, this version supports "
            f"{sqlite_mod.DB_SCHEMA_VERSION}): upgrade flowscope"
        )


@pytest.mark.parametrize("bad", ["{not json", '{"output": 1', "[1, 2]", '"text"', "", '{"a": 1}, {"b": 2}'])
def test_a_corrupt_row_names_the_file_the_session_and_the_seq(db_path, bad):
    with SqliteEventStore(db_path) as s:
        s.append(
            SID,
            [
                started(),
                node_ev(NodeStarted, "w@1/a@1", ts=2.0),
                node_ev(NodeCompleted, "w@1/a@1", ts=3.0, output=1),
                RunFinished(session_id=SID, ts=4.0),
            ],
            0,
        )
        s.append("other", [started("other")], 0)
        raw(db_path).execute("UPDATE events SET payload = ? WHERE session_id = ? AND seq = 3", (bad, SID))
        with pytest.raises(StoreError) as exc:
            s.read(SID)
        msg = str(exc.value)
        assert str(db_path) in msg and repr(SID) in msg and "seq 3" in msg, msg
        assert not isinstance(exc.value.__cause__, sqlite3.Error)
        assert [e.seq for e in s.read(SID, after_seq=3)] == [4]  # the rest of the log is still readable
        assert len(s.read("other")) == 1


@pytest.mark.parametrize("bad", [None, "noon", 1e300, -5.0])
def test_a_row_whose_time_is_no_time_is_corruption_named_by_its_seq(db_path, bad):
    with SqliteEventStore(db_path) as s:
        s.append(
            SID, [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0), RunFinished(session_id=SID, ts=3.0)], 0
        )
        raw(db_path).execute("UPDATE events SET ts = ? WHERE session_id = ? AND seq = 2", (bad, SID))
        with pytest.raises(StoreCorrupt, match="seq 2: bad ts .*restore the file from a backup"):
            s.read(SID)
        assert [e.seq for e in s.read(SID, after_seq=2)] == [3]


def test_a_gap_in_the_log_is_reported(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(
            SID, [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0), RunFinished(session_id=SID, ts=3.0)], 0
        )
        raw(db_path).execute("DELETE FROM events WHERE seq = 2")
        with pytest.raises(StoreError) as exc:
            s.read(SID)
        assert str(db_path) in str(exc.value) and "seq 2 is missing" in str(exc.value)


def test_an_unserialisable_field_raises_and_writes_nothing(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        before = snapshot(s)
        bad = node_ev(NodeCompleted, "w@1/a@1", ts=3.0, output={"when": object()})
        with pytest.raises(EventNotSerializableError) as exc:
            s.append(SID, [node_ev(NodeStarted, "w@1/b@1", ts=2.5), bad], 2)
        msg = str(exc.value)
        assert isinstance(exc.value, StoreError) and isinstance(exc.value, TypeError)
        assert str(db_path) in msg and "'output'" in msg and repr(SID) in msg and "w@1/a@1" in msg, msg
        assert snapshot(s) == before
        circular: list = []
        circular.append(circular)
        with pytest.raises(EventNotSerializableError):
            s.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0, output=circular)], 2)
        assert snapshot(s) == before
        s.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0, output={"ok": 1})], 2)  # still usable


def test_readonly_store_reads_but_never_writes(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
    writer = SqliteEventStore(db_path)
    with SqliteEventStore(db_path, readonly=True) as ro:
        assert ro.last_seq(SID) == 2 and ro.open_runs() == writer.open_runs()
        for call in (
            lambda: ro.append(SID, [RunFinished(session_id=SID, ts=3.0)], 2),
            lambda: ro.heartbeat(SID, ["w@1/a@1"], ts=9.0),
            ro.rebuild_projections,
        ):
            with pytest.raises(StoreError) as exc:
                call()
            assert str(db_path) in str(exc.value) and "read-only" in str(exc.value)
        writer.append(SID, [RunFinished(session_id=SID, ts=3.0)], 2)
        assert ro.last_seq(SID) == 3  # sees another connection's commits
    writer.close()


def test_a_closed_store_raises_store_error(db_path):
    s = SqliteEventStore(db_path)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError):
        s.read(SID)
    with pytest.raises(StoreError):
        s.append(SID, [started()], 0)


# --------------------------------------------------------------------------- schema migrations


def test_a_version_0_database_is_migrated(db_path):
    c = raw(db_path)
    c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    c.executemany("INSERT INTO meta VALUES (?, ?)", [("application", "flowscope"), ("schema_version", "0")])
    c.close()
    with SqliteEventStore(db_path) as s:
        assert s.schema_version == sqlite_mod.DB_SCHEMA_VERSION
        s.append(SID, [started()], 0)
        assert s.last_seq(SID) == 1


def test_an_older_schema_is_migrated_once_and_keeps_the_data(db_path, monkeypatch):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        before = snapshot(s)
    calls = []

    def add_note_column(db):
        calls.append(1)
        db["sessions"].add_column("note", str)

    monkeypatch.setattr(sqlite_mod, "MIGRATIONS", sqlite_mod.MIGRATIONS + [add_note_column])
    monkeypatch.setattr(sqlite_mod, "DB_SCHEMA_VERSION", len(sqlite_mod.MIGRATIONS))
    with pytest.raises(StoreError) as exc:  # read-only cannot migrate
        SqliteEventStore(db_path, readonly=True)
    assert "migrate" in str(exc.value) and str(db_path) in str(exc.value)
    with SqliteEventStore(db_path) as s:
        assert calls == [1]
        assert s.schema_version == len(sqlite_mod.MIGRATIONS)
        assert "note" in s.db["sessions"].columns_dict
        assert snapshot(s) == before
    with SqliteEventStore(db_path) as s:
        assert calls == [1]  # not again
    meta = dict(raw(db_path).execute("SELECT key, value FROM meta").fetchall())
    assert meta["schema_version"] == str(len(sqlite_mod.MIGRATIONS))


def test_a_schema_6_file_gets_each_restarted_runs_last_start_from_its_log(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(
            SID,
            [started(), node_ev(NodeStarted, "w@1/a@1", ts=2.0), node_ev(NodeStarted, "w@1/b@1", ts=3.0)],
            0,
        )
        s.append(SID, [node_ev(NodeStarted, "w@1/a@1", ts=7.0, attempt=2, recovered=True)], 3)
        s.append(SID, [node_ev(NodeStarted, "w@1/a@1", ts=9.0, attempt=3, recovered=True)], 4)
    c = raw(db_path)  # the file as schema 6 kept it: no restarted_at
    c.execute("ALTER TABLE node_runs DROP COLUMN restarted_at")
    c.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    c.close()
    with SqliteEventStore(db_path) as s:
        assert s.schema_version == sqlite_mod.DB_SCHEMA_VERSION
        runs = {r.path: r for r in s.node_runs(SID)}
        assert (runs["w@1/a@1"].started_at, runs["w@1/a@1"].restarted_at) == (2.0, 9.0)
        assert (runs["w@1/b@1"].started_at, runs["w@1/b@1"].restarted_at) == (3.0, None)
        state = rebuild(s.read(SID))
        assert s.node_runs(SID) == [
            NodeRun.from_state(SID, state.workflow, ns) for ns in state.nodes.values()
        ]


def test_a_failing_migration_leaves_the_file_as_it_was(db_path, monkeypatch):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)

    def broken(db):
        db["sessions"].add_column("half_done", str)
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    monkeypatch.setattr(sqlite_mod, "MIGRATIONS", sqlite_mod.MIGRATIONS + [broken])
    monkeypatch.setattr(sqlite_mod, "DB_SCHEMA_VERSION", len(sqlite_mod.MIGRATIONS))
    with pytest.raises(StoreError) as exc:
        SqliteEventStore(db_path)
    assert str(db_path) in str(exc.value) and "migrat" in str(exc.value)
    c = raw(db_path)
    assert dict(c.execute("SELECT key, value FROM meta").fetchall())["schema_version"] == str(
        len(sqlite_mod.MIGRATIONS) - 1
    )
    assert "half_done" not in [r[1] for r in c.execute("PRAGMA table_info(sessions)")]


def test_migrations_list_matches_the_schema_version():
    assert len(sqlite_mod.MIGRATIONS) == sqlite_mod.DB_SCHEMA_VERSION >= 1


# --------------------------------------------------------------------------- the node-state cache


def test_cached_node_states_are_dropped_when_another_writer_appended(db_path):
    """An append reuses the node states it wrote last time only while nobody else appended."""
    from flowscope.events import NodeCompleted, NodeRetrying, NodeStarted

    a, b = SqliteEventStore(db_path), SqliteEventStore(db_path)
    a.append(SID, [started(), node_ev(NodeStarted, "w@1/x@1", 2.0, attempt=1)], 0)
    b.append(SID, [node_ev(NodeRetrying, "w@1/x@1", 3.0, attempt=1), node_ev(NodeStarted, "w@1/y@1", 3.5)], 2)
    a.append(
        SID,
        [node_ev(NodeCompleted, "w@1/x@1", 4.0, attempt_count=2), node_ev(NodeCompleted, "w@1/y@1", 4.5)],
        4,
    )
    incremental = {r.path: r for r in a.node_runs(SID)}
    assert incremental["w@1/x@1"].retries == 1 and incremental["w@1/x@1"].attempt == 2  # b's retry kept
    a.rebuild_projections()
    assert {r.path: r for r in a.node_runs(SID)} == incremental


def test_an_append_from_cached_state_never_moves_a_heartbeat_back(db_path):
    from flowscope.events import NodeRetrying, NodeStarted

    store = SqliteEventStore(db_path)
    store.append(
        SID, [started(), node_ev(NodeStarted, "w@1/x@1", 2.0), node_ev(NodeStarted, "w@1/y@1", 2.0)], 0
    )
    store.heartbeat(SID, ["w@1/x@1"], ts=50.0)
    store.append(SID, [node_ev(NodeRetrying, "w@1/x@1", 3.0, attempt=1)], 3)  # cached heartbeat is 2.0
    (row,) = [r for r in store.node_runs(SID) if r.path == "w@1/x@1"]
    assert row.heartbeat_at == 50.0 and row.retries == 1


def test_open_run_summary_matches_folding_open_runs(db_path):
    """The scrape's GROUP BY gives exactly what the reference fold of open_runs() gives."""
    from flowscope.events import InputRequested, JobDispatched, NodeCompleted, NodeStarted
    from flowscope.observability.store_collector import summarize_open_runs

    store = SqliteEventStore(db_path)
    rnd = random.Random(7)
    for i in range(60):
        sid = f"s{i}"
        evs = [RunStarted(session_id=sid, invocation_id="i", ts=float(i), workflow=rnd.choice(["a", "b"]))]
        for j in range(rnd.randint(1, 4)):
            path = f"w@1/{rnd.choice(['x', 'y', 'z'])}@{j + 1}"
            evs.append(node_ev(NodeStarted, path, 10.0 + i + j, sid=sid))
            end = rnd.choice(["done", "running", "input", "job", "job_late"])
            if end == "done":
                evs.append(node_ev(NodeCompleted, path, 11.0 + i, sid=sid))
            elif end == "input":
                evs.append(node_ev(InputRequested, path, 11.0 + i, sid=sid, interrupt_id="q"))
            elif end.startswith("job"):
                deadline = 5.0 if end == "job_late" else 1e9
                evs.append(
                    node_ev(JobDispatched, path, 11.0 + i, sid=sid, job_id=f"j{i}{j}", deadline_s=deadline)
                )
        store.append(sid, evs, 0)
    store.heartbeat("s3", [r.path for r in store.node_runs("s3")], ts=1000.0)
    now, stale = 100.0, 50.0
    expected = sorted(
        summarize_open_runs(store.open_runs(), now, stale), key=lambda g: (g.workflow, g.node, g.state)
    )
    got = store.open_run_summary(now=now, stale_after_s=stale)
    assert got == expected and any(g.orphaned for g in got) and any(g.overdue for g in got)
    plan = " ".join(
        str(r)
        for r in raw(db_path).execute(
            "EXPLAIN QUERY PLAN " + queries_mod.SQL_OPEN_SUMMARY, {"now": now, "stale_before": now - stale}
        )
    )
    assert "node_runs_open" in plan


# --------------------------------------------------------------------------- typed store errors, from real faults


def _filled(path, n=400):
    with SqliteEventStore(path) as s:
        s.append(
            SID,
            [started()]
            + [node_ev(NodeCompleted, f"w@1/n@{i}", ts=float(i), output={"x": "y" * 200}) for i in range(n)],
            0,
        )


def _assert_typed(exc_info, cls, path, code_name):
    err = exc_info.value
    assert type(err) is cls, (type(err), err)
    assert str(path) in str(err) and "\n" not in str(err)
    assert isinstance(err.__cause__, sqlite3.Error) and err.__cause__.sqlite_errorname == code_name


def test_a_file_of_random_bytes_is_not_a_flowscope_database(tmp_path):
    p = tmp_path / "noise.db"
    p.write_bytes(random.Random(5).randbytes(8192))
    for readonly in (False, True):
        with pytest.raises(NotAFlowscopeDatabase) as exc:
            SqliteEventStore(p, readonly=readonly)
        _assert_typed(exc, NotAFlowscopeDatabase, p, "SQLITE_NOTADB")


def test_damaged_pages_are_store_corrupt(db_path):
    _filled(db_path)
    size = db_path.stat().st_size
    with open(db_path, "r+b") as f:  # overwrite pages in the middle of the file, the header intact
        f.seek(size // 2)
        f.write(b"\xde\xad\xbe\xef" * 2048)
    with pytest.raises(StoreCorrupt) as exc:
        with SqliteEventStore(db_path) as s:
            s.read(SID)
    _assert_typed(exc, StoreCorrupt, db_path, "SQLITE_CORRUPT")
    assert "backup" in str(exc.value)


def test_a_truncated_file_is_store_corrupt(db_path):
    _filled(db_path)
    with open(db_path, "r+b") as f:
        f.truncate(db_path.stat().st_size // 2)
    with pytest.raises(StoreCorrupt) as exc:
        with SqliteEventStore(db_path) as s:
            s.read(SID)
    _assert_typed(exc, StoreCorrupt, db_path, "SQLITE_CORRUPT")


@pytest.fixture
def unwritable(db_path):
    """``db_path`` with data, made unwritable for real: chmod for a user, chattr +i for root
    (root ignores file modes). SQLite then opens it read-only by itself."""
    _filled(db_path, n=3)
    if os.geteuid() != 0:
        db_path.chmod(0o444)
        yield db_path
        db_path.chmod(0o644)
        return
    if (
        shutil.which("chattr") is None
        or subprocess.run(["chattr", "+i", str(db_path)], capture_output=True).returncode
    ):
        unavailable("running as root without chattr +i: no way to make a file unwritable")
    try:
        yield db_path
    finally:
        subprocess.run(["chattr", "-i", str(db_path)], check=True)


def test_an_unwritable_file_is_store_read_only(unwritable):
    with SqliteEventStore(unwritable) as s:
        assert s.last_seq(SID) == 4  # reading works
        with pytest.raises(StoreReadOnly) as exc:
            s.append(SID, [RunFinished(session_id=SID, ts=9.0)], 4)
        _assert_typed(exc, StoreReadOnly, unwritable, "SQLITE_READONLY")
        assert "make the file and its folder writable" in str(exc.value)  # what to do, in any caller's terms
        assert "readonly=True" not in str(exc.value)  # not the Python API's word to a CLI user
        assert s.last_seq(SID) == 4


def _io_error() -> sqlite3.OperationalError:
    """A disk I/O error as SQLite reports it on a write (its extended code included)."""
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE  # type: ignore[attr-defined]
    exc.sqlite_errorname = "SQLITE_IOERR_WRITE"  # type: ignore[attr-defined]
    return exc


def test_an_io_error_on_a_mount_gone_read_only_is_store_read_only(db_path, monkeypatch):
    """A connection opened before its filesystem went read-only (ext4's errors=remount-ro)
    gets SQLITE_IOERR, not SQLITE_READONLY: it is the same fault, a store that refuses
    writes, which a worker backs off on and stops at when it lasts."""
    from flowscope.store.sqlite import faults

    monkeypatch.setattr(faults, "mounted_read_only", lambda path: path == str(db_path))
    err = faults.store_error(_io_error(), str(db_path), "claim sessions", 5.0)
    assert type(err) is StoreReadOnly and "mounted read-only" in str(err) and "dmesg" in str(err)
    other = faults.store_error(_io_error(), str(db_path) + "x", "claim sessions", 5.0)
    assert type(other) is StoreNotWritable and "disk I/O error" in str(other)  # a failing disk


def test_a_writable_or_unknown_folder_is_not_said_to_be_mounted_read_only(tmp_path):
    from flowscope.store.sqlite.faults import mounted_read_only

    assert not mounted_read_only(str(tmp_path / "x.db"))  # the test's own folder takes writes
    assert not mounted_read_only("/no/such/folder/x.db")  # unknown: an I/O error stays a failing disk


def test_a_full_database_is_store_disk_full(db_path):
    _filled(db_path, n=3)
    with SqliteEventStore(db_path) as s:
        pages = s._conn.execute("PRAGMA page_count").fetchone()[0]
        s._conn.execute(f"PRAGMA max_page_count = {pages}")  # the file may not grow: a full disk
        seq = s.last_seq(SID)
        with pytest.raises(StoreDiskFull) as exc:
            for i in range(200):
                seq = s.append(
                    SID, [node_ev(NodeCompleted, f"w@1/m@{i}", ts=1.0, output={"x": "z" * 3000})], seq
                )[-1].seq
        _assert_typed(exc, StoreDiskFull, db_path, "SQLITE_FULL")
        assert s.last_seq(SID) == seq  # the failed append wrote nothing
        assert [e.seq for e in s.read(SID)] == list(range(1, seq + 1))


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_lock_held_past_busy_timeout_is_store_locked_whatever_the_path_says(tmp_path):
    folder = tmp_path / "corrupt"  # a folder name must not change the advice
    folder.mkdir()
    p = folder / "flow.db"
    with SqliteEventStore(p) as s:
        s.append(SID, [started()], 0)
    holder = raw(p)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with SqliteEventStore(p, busy_timeout=0.1) as s:
            for call in (
                lambda: s.append(SID, [RunFinished(session_id=SID, ts=2.0)], 1),
                lambda: s.heartbeat(SID, ["w@1/a@1"], ts=3.0),
            ):
                with pytest.raises(StoreLocked) as exc:
                    call()
                _assert_typed(exc, StoreLocked, p, "SQLITE_BUSY")
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_newer_schema_is_store_schema_too_new(db_path):
    with SqliteEventStore(db_path) as s:
        s.append(SID, [started()], 0)
    raw(db_path).execute(
        "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(sqlite_mod.DB_SCHEMA_VERSION + 1),)
    )
    for readonly in (False, True):
        with pytest.raises(StoreSchemaTooNew):
            SqliteEventStore(db_path, readonly=readonly)


def test_another_applications_database_is_not_a_flowscope_database(tmp_path):
    p = tmp_path / "corrupt" / "locked.db"  # words in the path change nothing
    p.parent.mkdir()
    c = raw(p)
    c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    c.close()
    for readonly in (False, True):
        with pytest.raises(NotAFlowscopeDatabase):
            SqliteEventStore(p, readonly=readonly)
    with pytest.raises(NotAFlowscopeDatabase):
        SqliteEventStore(tmp_path)  # a directory


def test_missing_files_are_store_unavailable(tmp_path):
    with pytest.raises(StoreUnavailable):
        SqliteEventStore(tmp_path / "missing.db", readonly=True)
    with pytest.raises(StoreUnavailable):
        SqliteEventStore(tmp_path / "no" / "dir.db")
    s = SqliteEventStore(tmp_path / "x.db")
    s.close()
    with pytest.raises(StoreUnavailable):
        s.read(SID)


def test_sqlite_codes_map_to_classes_not_messages(tmp_path):
    """The mapping reads the SQLite code of a real error; its text does not matter."""
    from flowscope.store.sqlite.faults import store_error

    with pytest.raises(sqlite3.Error) as cantopen:
        sqlite3.connect(f"file:{tmp_path}/no/such/dir/x.db?mode=ro", uri=True)
    err = store_error(cantopen.value, "x.db", "open it", 1.0)
    assert type(err) is StoreUnavailable and "x.db" in str(err)
    # an error raised by Python code has no SQLite code: a plain StoreError, even if it says "locked"
    err = store_error(
        sqlite3.OperationalError("database is locked, corrupt, readonly, full"), "x.db", "read", 1.0
    )
    assert type(err) is StoreError


async def test_the_append_cache_holds_only_sessions_in_the_middle_of_an_invocation(tmp_path):
    """The store keeps the node states it wrote for a session's next append; one that ends
    its invocation drops them, so the cache follows the concurrent sessions, not all that
    ever ran (at 10,000 concurrent sessions a fixed 4,096 made every append read its rows)."""
    import asyncio

    from flowscope import START, Runner, Workflow, node

    release = asyncio.Event()

    @node
    async def first(ctx, x):
        return x + 1

    @node
    async def held(ctx, x):
        await release.wait()
        return x + 1

    store = SqliteEventStore(str(tmp_path / "f.db"))
    runner = Runner(Workflow("w", edges=[(START, first), (first, held)]), store=store)
    runs = [asyncio.ensure_future(runner.run(i, session_id=f"s{i}")) for i in range(50)]
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(store._node_cache) == 50:
            break
    assert set(store._node_cache) == {f"s{i}" for i in range(50)}  # mid-run: kept for the next append
    release.set()
    assert [r.output for r in await asyncio.gather(*runs)] == [i + 2 for i in range(50)]
    assert store._node_cache == {}  # every invocation ended: nothing kept
    # a submit queues the session for a worker (another store, often another process): this
    # store appends to it no more, so a process that submits thousands keeps none of them
    for i in range(20):
        runner.submit(i, session_id=f"q{i}")
    assert store._node_cache == {}
    store.close()


def test_job_results_appended_after_a_prune_that_emptied_the_log_are_counted(db_path):
    # a prune that deleted the log's newest rows gave their rowids to the next appends: the
    # count, which reads the rows after the last rowid it counted, skipped them for good
    from flowscope.store.records import JobResultGroup
    from flowscope.store.testing import ev

    def job_session(sid: str) -> None:
        p = "etl@1/enrich@1"
        store.append(
            sid,
            [
                ev(RunStarted, sid=sid, workflow="etl", ts=1.0),
                node_ev(NodeStarted, p, ts=2.0, sid=sid),
                node_ev(JobResultReceived, p, ts=3.0, sid=sid, job_id="a", success=True, result="success"),
                node_ev(NodeCompleted, p, ts=4.0, sid=sid),
                ev(RunFinished, sid=sid, status="completed", ts=5.0),
            ],
            0,
        )

    store = SqliteEventStore(db_path)
    for sid in ("a", "b", "c"):
        job_session(sid)
    assert store.job_result_summary() == [JobResultGroup("etl", "enrich", "success", 3)]
    assert store.delete_sessions(["a", "b", "c"]) == ["a", "b", "c"]
    job_session("d")  # rowids the pruned rows had
    job_session("e")
    assert store.job_result_summary() == [JobResultGroup("etl", "enrich", "success", 5)]
    job_session("f")
    assert store.job_result_summary() == [JobResultGroup("etl", "enrich", "success", 6)]
    store.close()
