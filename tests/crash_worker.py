"""A worker process for the crash tests: runs (or resumes) one session on a SQLite file.

    python crash_worker.py DB EFFECTS SESSION run|resume [KILL_AFTER_APPENDS]

With KILL_AFTER_APPENDS=k the process sends itself SIGKILL right after its k-th append
has committed: a real, uncatchable death at a chosen point. Side effects are lines
appended (and fsynced) to EFFECTS, so they survive the kill.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from flowscope import START, JoinNode, RetryConfig, Runner, Workflow, node
from flowscope.errors import ConcurrencyConflict
from flowscope.store import SqliteEventStore, rebuild


def effect(path_file: str, what: str) -> None:
    with open(path_file, "a") as f:
        f.write(what + "\n")
        f.flush()
        os.fsync(f.fileno())


def build(effects: str) -> Workflow:
    hold = os.environ.get("CRASH_WORKER_HOLD")
    # a race: the winner holds its lease this long inside "report", so the other process
    # meets the lease (not a session that is already over) however late it is scheduled
    linger = float(os.environ.get("CRASH_WORKER_LINGER") or 0)

    async def held(ctx):
        """Wait to be killed here if the test holds this run (on its first attempt)."""
        if ctx.path == hold and not ctx.recovered:
            open(effects + ".holding", "w").close()  # tell the test we are inside the body
            await asyncio.sleep(30)  # ... and wait to be killed

    def leaf(name, output=True):
        async def fn(ctx, x):
            await held(ctx)
            if name == "report" and linger:
                await asyncio.sleep(linger)
            effect(effects, ctx.path)
            return None if not output else f"{name}({x})"

        return node(fn, name=name)

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0, jitter=0))
    def fetch(ctx, x):
        if ctx.attempt == 1:
            raise ConnectionError("first attempt always fails")
        effect(effects, ctx.path)
        return "orders"

    child = leaf("charge")

    @node
    async def bill(ctx, x):
        out = await ctx.run_node(child, x)
        await held(ctx)  # the child has completed: a kill here must not run it again
        effect(effects, ctx.path)
        return out

    @node
    async def approve(ctx, x):
        answer = await ctx.request_input("ship?", interrupt_id="approval")
        effect(effects, ctx.path)
        return f"{x}:{answer}"

    a, marker = leaf("pack"), leaf("notify", output=False)
    join = JoinNode("join")
    inner = Workflow("ship", edges=[(START, leaf("label"), leaf("dispatch"))])
    return Workflow(
        "orders",
        edges=[
            (START, fetch, bill, (a, marker)),  # bill alone: nothing beside it flushes for it
            ((a, marker), join),
            (join, inner, approve, leaf("report"), leaf("archive"), leaf("close")),
        ],
    )


class KillingStore(SqliteEventStore):
    kill_after = 0
    appends = 0

    def append(self, session_id, events, expected_last_seq, **kw):
        out = super().append(session_id, events, expected_last_seq, **kw)
        KillingStore.appends += 1
        if self.kill_after and KillingStore.appends >= self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return out


async def main() -> None:
    db, effects, session, mode = sys.argv[1:5]
    store = KillingStore(db)
    store.kill_after = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    runner = Runner(build(effects), store=store, heartbeat_interval=0.05, snapshot_every=1)
    if mode == "run":
        result = await runner.run("start", session_id=session)
    else:
        go = os.environ.get("CRASH_WORKER_GO")
        if go:  # race another process: both read the session, then start together
            store.read(session)  # the read that races
            open(go + f".ready{os.getpid()}", "w").close()
            while not os.path.exists(go):
                await asyncio.sleep(0.001)
        pending = rebuild(store.read(session)).pending
        inputs = {e.interrupt_id: "yes" for e in pending if e.type == "input_requested"}
        try:
            result = await runner.resume(session, inputs=inputs, force=not go)
        except ConcurrencyConflict as exc:
            print("conflict", exc)
            return
    print(result.status)
    print(KillingStore.appends, file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
