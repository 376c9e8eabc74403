"""Concurrent sessions on PostgreSQL: one Runner, k new 10-node chains at once (not a test).

    PYTHONPATH=src python bench/postgres_sessions.py [--sessions 1000] [--reps 5]

A throwaway cluster of Debian's binaries (``tests/pg_cluster.py``) with the server's
durable defaults (fsync on, ``synchronous_commit=on``); the store alone, no telemetry.
Prints the median µs per node run of ``--reps`` runs of ``--sessions`` sessions started
together with ``asyncio.gather`` (the group commit: their starts, appends and releases),
after a warm-up of 50. Run it against two checkouts (``PYTHONPATH=old/src`` and
``PYTHONPATH=src``) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[1:1] = [str(ROOT / "tests"), str(ROOT / "bench")]

import workflows as W  # noqa: E402
from flowscope import Runner  # noqa: E402
from flowscope.engine.ids import new_id  # noqa: E402
from flowscope.store import PostgresEventStore  # noqa: E402
from pg_cluster import PgCluster  # noqa: E402


async def once(runner: Runner, sessions: int) -> float:
    """Seconds to run ``sessions`` new sessions concurrently to the end."""
    t0 = time.perf_counter()
    out = await asyncio.gather(*(runner.run(0, session_id=new_id()) for _ in range(sessions)))
    dt = time.perf_counter() - t0
    if any(o.status != "completed" for o in out):
        raise AssertionError("a run did not complete")
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    cluster = PgCluster.start(durable=True)
    try:
        with PostgresEventStore(cluster.new_database("sessions")) as store:
            runner = Runner(W.chain(10), store=store)
            loop = asyncio.new_event_loop()
            loop.run_until_complete(once(runner, 50))
            runs = [loop.run_until_complete(once(runner, args.sessions)) for _ in range(args.reps)]
            loop.close()
    finally:
        cluster.stop()
    per = sorted(dt / (args.sessions * 10) * 1e6 for dt in runs)
    print(
        f"{args.sessions} concurrent 10-chains on PostgreSQL: {statistics.median(per):.1f} µs per node run "
        f"(median of {args.reps}; runs {', '.join(f'{p:.1f}' for p in per)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
