"""PostgreSQL store benchmarks, on a throwaway cluster started here with the
server's durable defaults (fsync on, ``synchronous_commit=on``):

1. node runs per second, ``Worker`` processes claiming submitted 10-node chains: 1, 2 and
   4 workers on PostgreSQL, 1 on SQLite;
2. the 200-node chain, per node, on one Runner: flowscope on PostgreSQL against LangGraph
   with ``langgraph-checkpoint-postgres`` (``PostgresSaver``) on the same server, in the
   same run, interleaved (LangGraph's default durability, and ``durability="sync"``);
3. a ``StoreCollector`` scrape over 1,000,000 events (10,000 sessions of 100 events):
   mostly finished sessions with ~1% running (~1,000 open runs); the same open runs among
   100,000 sessions of 10 events; then every session running (~50,000 open runs).

    python bench/postgres_bench.py [--quick] [--reps 7]

Needs ``flowscope[postgres]``; part 2 also ``langgraph`` and ``langgraph-checkpoint-postgres``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from flowscope import Runner, Worker  # noqa: E402
from flowscope.store import EventStore, PostgresEventStore, SqliteEventStore  # noqa: E402
from flowscope.store.postgres.queries import SQL_APPEND_CACHED  # noqa: E402
from pg_cluster import BIN_DIR, PgCluster  # noqa: E402
from workflows import chain  # noqa: E402

CHAIN = 10


def _open(db: str) -> EventStore:
    return PostgresEventStore(db, max_size=4) if db.startswith("postgresql://") else SqliteEventStore(db)


def _worker_proc(db: str, n_total: int, ready: Any, go: Any) -> None:
    store = _open(db)
    wf = chain(CHAIN, name="bench_chain")
    worker = Worker(store, [wf], concurrency=32, lease_s=30.0, poll_s=0.05)

    async def serve() -> None:
        async def watch() -> None:
            while True:
                await asyncio.sleep(0.5)  # a cheap check: sessions() reads every row
                if sum(1 for s in store.sessions() if s.status == "completed") >= n_total:
                    worker.stop()
                    return

        ready.set()
        go.wait()
        await asyncio.gather(worker.run(), watch())

    asyncio.run(serve())
    store.close()


def node_runs_per_second(db: str, workers: int, sessions: int) -> float:
    store = _open(db)
    wf = chain(CHAIN, name="bench_chain")
    runner = Runner(wf, store)
    for i in range(sessions):
        runner.submit(i, session_id=f"b{workers}-{i}")
    store.close()
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(workers)]
    procs = [ctx.Process(target=_worker_proc, args=(db, sessions, r, go)) for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(60)
    t = time.perf_counter()
    go.set()
    for p in procs:
        p.join(600)
    elapsed = time.perf_counter() - t
    return sessions * CHAIN / elapsed


def chain_per_node(cluster: PgCluster, n: int, reps: int) -> dict[str, float]:
    """Seconds per node of an ``n``-chain, median of ``reps`` runs of each configuration
    (after one warm-up), interleaved: every repetition runs each once, in a rotating order,
    so machine noise hits every configuration alike. LangGraph needs its peer packages."""
    configs: dict[str, Callable[[str], None]] = {}
    opened: list[Any] = []
    wf = chain(n, name=f"chain{n}")
    for sc in (None, "off"):
        store = PostgresEventStore(cluster.new_database("chain"), synchronous_commit=sc)
        opened.append(store)
        configs[f"flowscope {sc or 'on'}"] = lambda sid, store=store: asyncio.run(
            Runner(wf, store).run(0, session_id=sid)
        )
    try:
        from langgraph.checkpoint.postgres import PostgresSaver

        from peers_langgraph import _chain_graph
    except ImportError as exc:
        print(f"  LangGraph PostgresSaver not installed: {exc}")
    else:
        for durability in ("default", "sync"):
            cm = PostgresSaver.from_conn_string(cluster.new_database("lg"))
            saver = cm.__enter__()
            opened.append(cm)
            saver.setup()
            graph = _chain_graph(n).compile(checkpointer=saver)
            kw = {} if durability == "default" else {"durability": durability}

            def lg(sid: str, graph: Any = graph, kw: dict[str, Any] = kw) -> None:
                out = graph.invoke(
                    {"x": 0}, {"configurable": {"thread_id": sid}, "recursion_limit": n + 10}, **kw
                )
                assert out["x"] == n

            configs[f"langgraph {durability}"] = lg
    # The floors, on the same server in the same repetitions: what any store that commits
    # every step pays before it does anything (one round trip; one durable one-row commit).
    floor_db = cluster.new_database("floor")
    floor = psycopg.connect(floor_db, autocommit=True)
    opened.append(floor)
    floor.execute("CREATE TABLE step (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)")
    for label, sql in (
        ("floor: round trip", "SELECT 1"),
        ("floor: durable one-row commit", "INSERT INTO step (v) VALUES ('x')"),
    ):

        def run_floor(_sid: str, sql: str = sql) -> None:
            for _ in range(n):
                floor.execute(sql, prepare=True)

        configs[label] = run_floor
    stats = stat_statements(cluster)  # from here: the chains' statements only
    times: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    try:
        for rep in range(reps + 1):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                gc.collect()
                t = time.perf_counter()
                configs[name](f"{name.replace(' ', '-')}-{rep}")
                if rep:
                    times[name].append((time.perf_counter() - t) / n)
    finally:
        for o in opened:
            o.close() if isinstance(o, (PostgresEventStore, psycopg.Connection)) else o.__exit__(
                None, None, None
            )
    out = {name: statistics.median(ts) for name, ts in times.items()}
    exec_s = append_exec_seconds(cluster) if stats else None
    if exec_s is not None:
        out["server execution of flowscope's append"] = exec_s
    return out


def stat_statements(cluster: PgCluster) -> bool:
    """Start counting statements afresh (``pg_stat_statements``, which the cluster preloads;
    its view covers the whole cluster); False where the extension is not installed."""
    with cluster.admin() as c:  # the extension needs a superuser
        try:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        except psycopg.Error:
            return False
        c.execute("SELECT pg_stat_statements_reset()")
    return True


def append_exec_seconds(cluster: PgCluster) -> float | None:
    """The server's mean execution time of flowscope's one-statement append
    (``SQL_APPEND_CACHED``) since :func:`stat_statements`; None if it never ran."""
    # pg_stat_statements shows the statement with $n for its parameters: match its text
    # up to the first one (no LIKE wildcard in it).
    prefix = SQL_APPEND_CACHED.split("%(", 1)[0]
    with cluster.admin() as c:
        row = c.execute(
            "SELECT sum(total_exec_time) / sum(calls) FROM pg_stat_statements WHERE query LIKE %s",
            (prefix + "%",),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0]) / 1e3


def _template(store: PostgresEventStore, sid: str, per_session: int, finished: bool) -> None:
    """One real session of ``per_session`` events (``per_session`` even when finished):
    every node completed and the run finished, or (``finished=False``) running with every
    tenth node left open."""
    from flowscope.events import NodeCompleted, NodeStarted, RunFinished, RunStarted
    from flowscope.store.testing import ev

    events: list[Any] = [ev(RunStarted, sid, workflow="orders", ts=1000.0)]
    room = per_session - 1 if finished else per_session  # the RunFinished at the end
    k = 0
    while len(events) + (2 if finished else 1) <= room:
        path, name = f"orders/n{k}", f"n{k % 20}"
        events.append(ev(NodeStarted, sid, path=path, node=name, ts=1000.0 + k))
        if (finished or k % 10 != 9) and len(events) < room:
            events.append(ev(NodeCompleted, sid, path=path, node=name, ts=1000.5 + k))
        k += 1
    if finished:
        events.append(ev(RunFinished, sid, status="completed", output=1, ts=1001.0 + k))
    store.append(sid, events, 0)


def build_million(url: str, sessions: int = 10_000, per_session: int = 100, open_sessions: int = 180) -> int:
    """``sessions`` sessions of ``per_session`` events, cloned in SQL from two real ones:
    ``open_sessions`` running with every tenth node open, the rest finished (a real store
    of 1M events has few open runs). Returns the number of open runs."""
    with PostgresEventStore(url) as s:
        _template(s, "tpl-done", per_session, finished=True)
        _template(s, "tpl-open", per_session, finished=False)

    clones = (("tpl-done", 1, sessions - open_sessions), ("tpl-open", sessions - open_sessions + 1, sessions))
    cols = (
        "path, workflow, node, kind, parent_path, status, attempt, failures, retries, recoveries, "
        "started_at, ended_at, heartbeat_at, error_code, error_type, job_deadline_at"
    )
    scols = "workflow, status, started_at, updated_at, last_seq, invocations"
    with psycopg.connect(url, autocommit=True) as c:
        for tpl, lo, hi in clones:
            if hi < lo:
                continue
            c.execute(
                "INSERT INTO events SELECT 'x' || g, e.seq, e.type, e.ts, e.invocation_id, e.path, e.node, e.payload "
                "FROM events e, generate_series(%s::int, %s::int) g WHERE e.session_id = %s",
                (lo, hi, tpl),
            )
            c.execute(
                f"INSERT INTO node_runs (session_id, {cols}) SELECT 'x' || g, {cols} "
                "FROM node_runs n, generate_series(%s::int, %s::int) g WHERE n.session_id = %s",
                (lo, hi, tpl),
            )
            c.execute(
                f"INSERT INTO sessions (session_id, {scols}) SELECT 'x' || g, {scols} "
                "FROM sessions s, generate_series(%s::int, %s::int) g WHERE s.session_id = %s",
                (lo, hi, tpl),
            )
        c.execute("DELETE FROM events WHERE session_id LIKE 'tpl-%%'")
        c.execute("DELETE FROM node_runs WHERE session_id LIKE 'tpl-%%'")
        c.execute("DELETE FROM sessions WHERE session_id LIKE 'tpl-%%'")
        c.execute("VACUUM ANALYZE")
        total = c.execute("SELECT count(*) FROM events").fetchone()
        open_runs = c.execute("SELECT count(*) FROM node_runs WHERE status = 'running'").fetchone()
    print(f"  built {total[0]:,} events in {sessions:,} sessions, {open_runs[0]:,} open runs")
    return int(open_runs[0])


def scrape_ms(url: str, runs: int) -> float:
    from prometheus_client import CollectorRegistry, generate_latest

    from flowscope.observability.store_collector import StoreCollector

    with PostgresEventStore(url) as s:
        reg = CollectorRegistry()
        reg.register(StoreCollector(s))
        generate_latest(reg)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            text = generate_latest(reg)
            times.append((time.perf_counter() - t) * 1000)
        assert b"flowscope_store_open_runs" in text
    return statistics.median(times)


def peer_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in ("psycopg", "psycopg-binary", "langgraph", "langgraph-checkpoint-postgres"):
        try:
            out.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            out.append(f"{dist} not installed")
    server = subprocess.run(
        [str(BIN_DIR / "postgres"), "--version"], capture_output=True, text=True
    ).stdout.strip()
    return ", ".join(out + [server])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=7, help="timed runs of each 200-chain configuration")
    args = ap.parse_args(argv)
    sessions = 60 if args.quick else 200
    print(f"  {peer_versions()}")
    # pg_stat_statements: the server's own time for flowscope's append (a few µs per statement)
    cluster = PgCluster.start(durable=True, shared_preload_libraries="pg_stat_statements")
    rows: list[tuple[str, str]] = []
    try:
        for n in (1, 2, 4):
            rate = node_runs_per_second(cluster.new_database(f"w{n}"), n, sessions)
            rows.append((f"node runs/s, {n} worker(s), PostgreSQL", f"{rate:,.0f}"))
            print(rows[-1])
        with tempfile.TemporaryDirectory() as d:
            rate = node_runs_per_second(str(Path(d) / "bench.db"), 1, sessions)
        rows.append(("node runs/s, 1 worker, SQLite", f"{rate:,.0f}"))
        print(rows[-1])
        med = chain_per_node(cluster, 200, 3 if args.quick else args.reps)
        fs, fs_off = med["flowscope on"], med["flowscope off"]
        chain_rows = len(rows)  # the 200-chain's rows, printed together below
        rows.append(("200-chain per node, flowscope on PostgreSQL", f"{fs * 1e3:.3f} ms"))
        rows.append(
            ("200-chain per node, flowscope on PostgreSQL, synchronous_commit=off", f"{fs_off * 1e3:.3f} ms")
        )
        for durability in ("default", "sync"):
            lg = med.get(f"langgraph {durability}")
            if lg is not None:
                rows.append(
                    (
                        f"200-chain per node, LangGraph PostgresSaver ({durability})",
                        f"{lg * 1e3:.3f} ms ({lg / fs:.1f}x flowscope; {lg / fs_off:.1f}x with it off)",
                    )
                )
        floor_rt, floor_commit = med["floor: round trip"], med["floor: durable one-row commit"]
        rows.append(("floor: one round trip (`SELECT 1`), per step", f"{floor_rt * 1e3:.3f} ms"))
        rows.append(
            (
                "floor: one durable one-row commit (autocommit `INSERT`), per step",
                f"{floor_commit * 1e3:.3f} ms",
            )
        )
        exec_s = med.get("server execution of flowscope's append")
        if exec_s is not None:
            rows.append(
                (
                    "server execution of flowscope's one-statement append (pg_stat_statements mean)",
                    f"{exec_s * 1e3:.3f} ms",
                )
            )
        lg_default = med.get("langgraph default")
        if lg_default is not None:
            budget = lg_default / 5
            rows.append(
                (
                    "5x LangGraph (default) needs per node; above the durable floor that leaves",
                    f"{budget * 1e3:.3f} ms; {(budget - floor_commit) * 1e3:.3f} ms (flowscope uses {(fs - floor_commit) * 1e3:.3f})",
                )
            )
        for row in rows[chain_rows:]:
            print(row)
        k = 5 if args.quick else 1  # the quick run: a fifth of the sessions
        # (sessions, events each, running sessions): ~1% running (~1,000 open runs); the
        # same open runs among 10x the sessions (the scrape must not grow with them); all running
        for sessions_m, per, open_sessions in (
            (10_000, 100, 181),
            (100_000, 10, 1_000),
            (10_000, 100, 10_000),
        ):
            url = cluster.new_database("million")
            open_runs = build_million(
                url, sessions=sessions_m // k, per_session=per, open_sessions=open_sessions // k
            )
            rows.append(
                (
                    f"StoreCollector scrape, {sessions_m // k * per:,} events in {sessions_m // k:,} sessions, "
                    f"{open_runs:,} open runs",
                    f"{scrape_ms(url, 20):.1f} ms",
                )
            )
            print(rows[-1])
    finally:
        cluster.stop()
    print()
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
