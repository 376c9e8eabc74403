"""PostgreSQL store benchmarks (issue 16), on a throwaway cluster started here with the
server's durable defaults (fsync on, ``synchronous_commit=on``):

1. node runs per second, ``Worker`` processes claiming submitted 10-node chains: 1, 2 and
   4 workers on PostgreSQL, 1 on SQLite;
2. the 200-node chain, per node, on one Runner: flowscope on PostgreSQL against LangGraph
   with ``langgraph-checkpoint-postgres`` (``PostgresSaver``) on the same server, in the
   same run (LangGraph's default durability, and ``durability="sync"``);
3. a ``StoreCollector`` scrape over 1,000,000 events (10,000 sessions of 100 events).

    python bench/postgres_bench.py [--quick]

Needs ``flowscope[postgres]``; part 2 also ``langgraph`` and ``langgraph-checkpoint-postgres``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from flowscope import Runner, Worker  # noqa: E402
from flowscope.store import EventStore, PostgresEventStore, SqliteEventStore  # noqa: E402

from pg_cluster import PgCluster  # noqa: E402
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


def flowscope_chain_per_node(url: str, n: int, runs: int, synchronous_commit: str | None = None) -> float:
    wf = chain(n, name=f"chain{n}")
    times = []
    with PostgresEventStore(url, synchronous_commit=synchronous_commit) as store:
        for i in range(runs + 1):
            runner = Runner(wf, store)
            t = time.perf_counter()
            asyncio.run(runner.run(0, session_id=f"c{n}-{synchronous_commit}-{i}"))
            times.append((time.perf_counter() - t) / n)
    return statistics.median(times[1:])


def langgraph_chain_per_node(url: str, n: int, runs: int, durability: str | None) -> float:
    from langgraph.checkpoint.postgres import PostgresSaver
    from peers_langgraph import _chain_graph

    times = []
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        graph = _chain_graph(n).compile(checkpointer=saver)
        for i in range(runs + 1):
            config = {"configurable": {"thread_id": f"lg{n}-{durability}-{i}"}, "recursion_limit": n + 10}
            kw = {"durability": durability} if durability else {}
            t = time.perf_counter()
            graph.invoke({"x": 0}, config, **kw)
            times.append((time.perf_counter() - t) / n)
    return statistics.median(times[1:])


def build_million(url: str, sessions: int = 10_000, per_session: int = 100) -> None:
    """One real 100-event session (every tenth node left open), cloned in SQL to ``sessions``."""
    from flowscope.events import NodeCompleted, NodeStarted, RunStarted
    from flowscope.store.testing import ev

    with PostgresEventStore(url) as s:
        events = [ev(RunStarted, "tpl", workflow="orders", ts=1000.0)]
        k = 0
        while len(events) < per_session:
            path = f"orders/n{k}"
            events.append(ev(NodeStarted, "tpl", path=path, node=f"n{k % 20}", ts=1000.0 + k))
            if k % 10 != 9 and len(events) < per_session:
                events.append(ev(NodeCompleted, "tpl", path=path, node=f"n{k % 20}", ts=1000.5 + k))
            k += 1
        s.append("tpl", events[:per_session], 0)
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("INSERT INTO events SELECT 'x' || g || '-' || e.session_id, e.seq, e.type, e.ts, e.invocation_id, "
                  "e.path, e.node, e.payload FROM events e, generate_series(2, %s) g WHERE e.session_id = 'tpl'",
                  (sessions,))
        cols = ("path, workflow, node, kind, parent_path, status, attempt, failures, retries, recoveries, "
                "started_at, ended_at, heartbeat_at, error_code, error_type, job_deadline_at")
        c.execute(f"INSERT INTO node_runs (session_id, {cols}) SELECT 'x' || g || '-' || n.session_id, {cols} "
                  "FROM node_runs n, generate_series(2, %s) g WHERE n.session_id = 'tpl'", (sessions,))
        scols = "workflow, status, started_at, updated_at, last_seq, invocations"
        c.execute(f"INSERT INTO sessions (session_id, {scols}) SELECT 'x' || g || '-' || s.session_id, {scols} "
                  "FROM sessions s, generate_series(2, %s) g WHERE s.session_id = 'tpl'", (sessions,))
        c.execute("VACUUM ANALYZE")
        total = c.execute("SELECT count(*) FROM events").fetchone()
    print(f"  built {total[0]:,} events in {sessions:,} sessions")


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    sessions = 60 if args.quick else 200
    cluster = PgCluster.start(durable=True)
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
        url = cluster.new_database("chain")
        runs = 3 if args.quick else 5
        fs = flowscope_chain_per_node(url, 200, runs)
        rows.append(("200-chain per node, flowscope on PostgreSQL", f"{fs * 1e3:.3f} ms"))
        print(rows[-1])
        fs_off = flowscope_chain_per_node(url, 200, runs, "off")
        rows.append(("200-chain per node, flowscope on PostgreSQL, synchronous_commit=off", f"{fs_off * 1e3:.3f} ms"))
        print(rows[-1])
        try:
            lg_url = cluster.new_database("lg")
            for durability in (None, "sync"):
                lg = langgraph_chain_per_node(lg_url, 200, runs, durability)
                rows.append((f"200-chain per node, LangGraph PostgresSaver ({durability or 'default'})",
                             f"{lg * 1e3:.3f} ms ({lg / fs:.1f}x flowscope; {lg / fs_off:.1f}x with it off)"))
                print(rows[-1])
        except ImportError as exc:
            rows.append(("LangGraph PostgresSaver", f"not installed: {exc}"))
        url = cluster.new_database("million")
        build_million(url, sessions=2_000 if args.quick else 10_000)
        rows.append(("StoreCollector scrape, 1,000,000 events" if not args.quick else "scrape, 200,000 events",
                     f"{scrape_ms(url, 20):.1f} ms"))
        print(rows[-1])
    finally:
        cluster.stop()
    print()
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
