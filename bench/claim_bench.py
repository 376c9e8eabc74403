"""What a worker's claim costs beside the sessions it does not take (not a test).

    PYTHONPATH=src python bench/claim_bench.py [--reps 9] [--no-postgres] [--no-drain]

A claim runs on the worker's event loop, between the steps of every session it runs, so
its cost should grow with what it takes, not with what else is in the store. Two tables:

- ``claim(limit=1)`` in ms (median of ``--reps``) on SQLite and on a throwaway PostgreSQL
  (Debian's binaries, ``tests/pg_cluster.py``), beside k sessions that a live owner on
  this host holds (a worker's own, running) and beside q queued sessions of its workflow;
- a :class:`~flowscope.Worker` in this process draining 5,000 queued sessions of a
  10-chain whose nodes sleep 0-20 ms (so sessions end at scattered times, as real ones
  do, and the worker claims while about 1,000 run): its claims, the time the loop spent
  in them, and the drain's wall time.

Run it against two checkouts (``PYTHONPATH=old/src`` and ``PYTHONPATH=src``) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from flowscope import START, Runner, Worker, Workflow, node  # noqa: E402
from flowscope.events import RunStarted  # noqa: E402
from flowscope.ownership import this_process  # noqa: E402
from flowscope.store import EventStore, SqliteEventStore  # noqa: E402
from workflows import chain  # noqa: E402

HELD = (10, 1_000, 10_000)
QUEUED = (200, 5_000, 50_000)


def _held(store: EventStore, k: int) -> None:
    """k running sessions, each leased to this process (as a worker running them is)."""
    me, now = this_process("bench-holder"), time.time()
    for i in range(k):
        sid = f"held-{i}"
        store.acquire(sid, me, 3600.0, now=now)
        store.append(
            sid, [RunStarted(session_id=sid, invocation_id=f"i-{i}", ts=now, workflow="chain10")], 0, epoch=1
        )


def _queued(store: EventStore, q: int) -> None:
    runner = Runner(chain(10, name="chain10"), store)
    for _ in range(q):
        runner.submit(0)


def claim_ms(store: EventStore, reps: int) -> float:
    """Median ms of a claim of one session (which finds none, or the oldest queued one)."""
    claimer = this_process("bench-claimer")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        store.claim(claimer, ["chain10", "chain20"], 60.0, limit=1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def claim_table(open_store: Callable[[str], EventStore], reps: int) -> list[tuple[str, float]]:
    rows = []
    for what, sizes, fill in (("held", HELD, _held), ("queued", QUEUED, _queued)):
        for n in sizes:
            store = open_store(f"{what}{n}")
            try:
                fill(store, n)
                rows.append((f"{n:,} {what}", claim_ms(store, reps)))
            finally:
                store.close()
            print(f"  {rows[-1][0]}: {rows[-1][1]:.2f} ms", file=sys.stderr)
    return rows


def _jitter_step(name: str) -> Any:
    async def step(x: int) -> int:
        await asyncio.sleep(random.random() * 0.02)
        return x + 1

    return node(step, name=name)


def drain(folder: str, sessions: int = 5_000, concurrency: int = 1_000) -> tuple[int, float, float]:
    """A worker draining ``sessions`` jittered 10-chains: (claims, s in claims, s to drain)."""
    wf = Workflow("jitter", edges=[(START, *[_jitter_step(f"n{i}") for i in range(10)])])
    store = SqliteEventStore(os.path.join(folder, "drain.db"))
    runner = Runner(wf, store)
    for _ in range(sessions):
        runner.submit(0)
    spent = [0, 0.0]
    real = store.claim

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += 1
            spent[1] += time.perf_counter() - t0

    store.claim = timed  # type: ignore[method-assign]
    worker = Worker(store, [wf], concurrency=concurrency, poll_s=0.05, lease_s=60.0)

    async def main() -> float:
        task = asyncio.ensure_future(worker.run())
        t0 = time.perf_counter()
        while sum(worker.outcomes.values()) < sessions:
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - t0
        worker.stop()
        await task
        return elapsed

    try:
        elapsed = asyncio.run(main())
    finally:
        store.close()
    return int(spent[0]), float(spent[1]), elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-drain", action="store_true")
    args = ap.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="claim-bench-")
    try:
        columns = {
            "SQLite": claim_table(
                lambda name: SqliteEventStore(os.path.join(folder, f"{name}.db")), args.reps
            )
        }
        if not args.no_postgres:
            from flowscope.store import PostgresEventStore
            from pg_cluster import PgCluster

            cluster = PgCluster.start()
            try:
                columns["PostgreSQL"] = claim_table(
                    lambda name: PostgresEventStore(cluster.new_database(name)), args.reps
                )
            finally:
                cluster.stop()
        names = list(columns)
        print(f"| beside | {' | '.join(f'{n}, ms' for n in names)} |")
        print(f"| --- | {' | '.join('---:' for _ in names)} |")
        for i, (label, _ms) in enumerate(columns[names[0]]):
            print(f"| {label} | {' | '.join(f'{columns[n][i][1]:.2f}' for n in names)} |")
        if not args.no_drain:
            claims, in_claims, elapsed = drain(folder)
            print(
                f"\nDrain of 5,000 jittered 10-chains at concurrency 1,000 (SQLite): {claims} claims, "
                f"{in_claims * 1e3:.0f} ms in them ({in_claims / max(claims, 1) * 1e3:.2f} ms each), "
                f"{elapsed:.2f} s to drain"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
