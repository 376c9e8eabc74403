"""Which of the PostgreSQL store's two append paths a ``Worker``'s group commits take.

    PYTHONPATH=src python bench/postgres_worker_paths.py [--sessions 1000] [--concurrency 32] [--runs 3]

Submits ``--sessions`` 10-node chains (as another process would: the worker's store keeps
no state of them), serves them with one in-process ``Worker`` on a durable throwaway
cluster (``tests/pg_cluster.py``), and counts, by wrapping the writer's two functions, the
groups (and the batches in them) that went through the one-statement path on the state the
store kept (``append_many_cached``) and through the locking path
(``append_many_locking``), with the µs per node run of each run. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from flowscope import Runner, Worker  # noqa: E402
from flowscope.store import PostgresEventStore  # noqa: E402
from flowscope.store.postgres import store as pg_store  # noqa: E402
from pg_cluster import PgCluster  # noqa: E402
from workflows import chain  # noqa: E402

#: groups and batches by path, for the run under way
counts = {"cached groups": 0, "cached batches": 0, "locking groups": 0, "locking batches": 0}
_cached, _locking = pg_store.append_many_cached, pg_store.append_many_locking


def _counted_cached(conn: Any, channel: str, prepared: Any, cached: Any) -> Any:
    done = _cached(conn, channel, prepared, cached)
    if done is not None:  # None: nothing written, the locking path runs next
        counts["cached groups"] += 1
        counts["cached batches"] += len(prepared)
    return done


def _counted_locking(conn: Any, channel: str, prepared: Any, cached: Any) -> Any:
    counts["locking groups"] += 1
    counts["locking batches"] += len(prepared)
    return _locking(conn, channel, prepared, cached)


def serve(url: str, sessions: int, concurrency: int, prefix: str) -> float:
    """Seconds for one worker to run ``sessions`` submitted 10-chains to the end."""
    store = PostgresEventStore(url, max_size=4)
    wf = chain(10, name="bench_chain")
    runner = Runner(wf, store)
    for i in range(sessions):
        runner.submit(i, session_id=f"{prefix}-{i:05d}")
    worker = Worker(store, [wf], concurrency=concurrency, lease_s=30.0, poll_s=0.05)

    async def run() -> None:
        async def watch() -> None:
            while sum(1 for s in store.sessions() if s.status == "completed") < sessions:
                await asyncio.sleep(0.2)
            worker.stop()

        await asyncio.gather(worker.run(), watch())

    try:
        t0 = time.perf_counter()
        asyncio.run(run())
        return time.perf_counter() - t0
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    pg_store.append_many_cached = _counted_cached  # type: ignore[assignment]
    pg_store.append_many_locking = _counted_locking  # type: ignore[assignment]
    cluster = PgCluster.start(durable=True)
    try:
        for run in range(args.runs):
            for key in counts:
                counts[key] = 0
            dt = serve(cluster.new_database("paths"), args.sessions, args.concurrency, f"r{run}")
            per = dt / (args.sessions * 10) * 1e6
            print(
                f"concurrency {args.concurrency}: {per:.1f} µs per node run; "
                + ", ".join(f"{k} {v}" for k, v in counts.items()),
                flush=True,
            )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
