"""A process that runs or resumes one session on a SQLite file, for the ownership tests.

    python ownership_proc.py DB EFFECTS SESSION MODE LEASE_S

MODE ``run-hang``: a chain ``first -> hang -> last``; ``hang`` writes ``EFFECTS.hanging``
and waits forever on its first attempt (so the test can kill or stop the process), and
completes on a later one. ``run-block``: ``first -> block -> last`` where ``block`` is a
sync body that holds the event loop for ``3 * LEASE_S`` seconds. ``resume``: resume the
session (no force). Every node body appends ``pid path attempt`` to EFFECTS. The process
prints how its call ended: the status, ``conflict``, or ``lease_lost``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from flowscope import START, Runner, Workflow, node
from flowscope.errors import ConcurrencyConflict, LeaseLost
from flowscope.store.sqlite import SqliteEventStore


def effect(effects: str, ctx) -> None:
    with open(effects, "a") as f:
        f.write(f"{os.getpid()} {ctx.path} {ctx.attempt}\n")


def build(effects: str, lease_s: float) -> Workflow:
    @node
    def first(ctx, x):
        effect(effects, ctx)
        return x + 1

    @node
    async def hang(ctx, x):
        effect(effects, ctx)
        if ctx.attempt == 1:
            open(effects + ".hanging", "w").close()
            while True:
                await asyncio.sleep(0.05)
        return x + 1

    @node
    def block(ctx, x):
        effect(effects, ctx)
        open(effects + ".blocking", "w").close()
        time.sleep(3 * lease_s)  # holds the event loop: only the lease thread keeps running
        return x + 1

    @node
    def last(ctx, x):
        effect(effects, ctx)
        return x + 1

    middle = block if os.environ.get("OWNERSHIP_BLOCK") else hang
    return Workflow("owned", edges=[(START, first, middle, last)])


async def main() -> None:
    db, effects, session, mode, lease_s = sys.argv[1:6]
    if mode == "run-block":
        os.environ["OWNERSHIP_BLOCK"] = "1"
    runner = Runner(build(effects, float(lease_s)), store=SqliteEventStore(db), lease_s=float(lease_s))
    try:
        if mode == "resume":
            result = await runner.resume(session)
        else:
            result = await runner.run(1, session_id=session)
    except LeaseLost:
        print("lease_lost", flush=True)
        return
    except ConcurrencyConflict as exc:
        print("conflict", exc, flush=True)
        return
    print(result.status, result.output, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
