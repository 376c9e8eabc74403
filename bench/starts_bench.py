"""Sessions started together: their leases taken one transaction each, or in one step.

    PYTHONPATH=src python bench/starts_bench.py [--reps 21] [--sessions 1000]

A runner takes a new session's lease in ``acquire_new``. When other sessions run, the
sessions that start in one loop turn take theirs together at its end
(``acquire_new_many``: one SQLite transaction for all of them). This times ``--sessions``
concurrent 10-chains on SQLite alone and on the full stack (``targets.Flow``; the full stack
also with ``durability="full"``, an fsync per transaction), each against
the same configuration with the leases taken one by one (the group commit's
``acquire_new`` replaced by the store's, as before the batching), alternated in one
process; it prints the medians and the median of the paired differences.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workflows as W  # noqa: E402
from flowscope.store.sqlite import SqliteEventStore  # noqa: E402
from targets import Flow  # noqa: E402


def one_by_one(flow: Flow) -> None:
    """The runner's starts as before the batching: each its own ``acquire_new``."""
    commits: Any = flow.runner._commits  # the bench's one override
    store = commits.store

    async def acquire_new(session_id: str, owner: Any, lease_s: float) -> Any:
        return store.acquire_new(session_id, owner, lease_s)

    commits.acquire_new = acquire_new


def measure(
    full: bool, durability: str, reps: int, sessions: int, loop: asyncio.AbstractEventLoop, tmp: str
) -> None:
    wf = W.chain(10)
    stores = [
        SqliteEventStore(os.path.join(tmp, f"{k}-{full}-{durability}.db"), durability=durability)
        for k in "ab"
    ]
    alone, together = (Flow(wf, store, full) for store in stores)
    one_by_one(alone)
    for flow in (alone, together):
        loop.run_until_complete(flow.once(100))  # warm
    times: dict[Flow, list[float]] = {alone: [], together: []}
    for i in range(reps):
        for flow in (alone, together) if i % 2 == 0 else (together, alone):
            times[flow].append(loop.run_until_complete(flow.once(sessions)) * 1e6 / (10 * sessions))
    diffs = [a - b for a, b in zip(times[alone], times[together])]
    name = ("full stack" if full else "SQLite alone") + (
        f' (durability="{durability}")' if durability != "normal" else ""
    )
    print(
        f"| {name} | {statistics.median(times[alone]):.1f} | {statistics.median(times[together]):.1f} "
        f"| {statistics.median(diffs):.1f} |"
    )
    for flow in (alone, together):
        flow.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--sessions", type=int, default=1000)
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    tmp = tempfile.mkdtemp(prefix="flowscope-starts-")
    print(f"{args.sessions:,} concurrent 10-chains, µs per node run, {args.reps} alternated repetitions\n")
    print("| configuration | leases one by one | leases together | paired difference (median) |")
    print("| --- | ---: | ---: | ---: |")
    for full, durability in ((False, "normal"), (True, "normal"), (True, "full")):
        measure(full, durability, args.reps, args.sessions, loop, tmp)


if __name__ == "__main__":
    main()
