"""The floor under the sessions-flatness target: plain asyncio, no flowscope.

    python bench/asyncio_floor.py                 # the four shapes below, ~1 minute
    python bench/asyncio_floor.py --state 58 --step 13

``targets.py``'s flatness target wants the time per node run of k concurrent sessions of a
10-node chain within 1.3x from k = 10 to 10,000. This runs k concurrent tasks that each
take 10 steps the way a flowscope session does with group commit: a step queues itself in
a per-turn batch (one loop callback resolves every queued future) and awaits its future.
``--state N``: objects each task keeps for its whole life (a session's invocation, its
fold); ``--step M``: objects each step keeps alive across its await (a flush's events, a
node run's context). Timed as ``targets.py`` times a run: ``gc.collect()`` before, median
over repetitions (10,000 tasks: one). Prints µs per step per k, and max/min.

What it shows on a 2-core machine: even with no state at all the cost per step is not
flat from 10 to 10,000 tasks (a run of 10 tasks pays the gather and loop start-up over 100
steps; at 10,000 the tasks and frames no longer fit the caches and the collector walks
them), and with a session's worth of objects the collector's full walks, which CPython
makes each time a quarter of the oldest generation is new, grow with k.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any


class Obj:
    __slots__ = ("a", "b", "c")

    def __init__(self) -> None:
        self.a = self.b = self.c = None


class Batch:
    """A group commit's shape: the steps queued in a loop turn, resolved by one callback."""

    def __init__(self) -> None:
        self.queue: list[tuple[Any, asyncio.Future[None]]] = []

    def submit(self, item: Any) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not self.queue:
            loop.call_soon(self.commit)
        self.queue.append((item, fut))
        return fut

    def commit(self) -> None:
        queue, self.queue = self.queue, []
        for _item, fut in queue:
            fut.set_result(None)


async def session(batch: Batch, state: int, step: int) -> int:
    kept = [Obj() for _ in range(state)]
    await asyncio.sleep(0)  # every task starts before any steps, as sessions started together
    for _ in range(10):
        await batch.submit([Obj() for _ in range(step)])
    return len(kept)


def measure(state: int, step: int, sizes: list[int], loop: asyncio.AbstractEventLoop) -> dict[int, float]:
    out: dict[int, float] = {}
    for k in sizes:
        reps = 1 if k >= 10_000 else (max(3, 3000 // k) if k <= 100 else 2)
        runs = []
        for _ in range(reps):
            batch = Batch()

            async def run_all(k: int = k, batch: Batch = batch) -> None:
                await asyncio.gather(*(session(batch, state, step) for _ in range(k)))

            gc.collect()
            t0 = time.perf_counter()
            loop.run_until_complete(run_all())
            runs.append((time.perf_counter() - t0) / (k * 10) * 1e6)
        out[k] = statistics.median(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=int, default=None, help="objects a task keeps (default: 0 and 58)")
    ap.add_argument(
        "--step", type=int, default=None, help="objects a step keeps across its await (default: 0 and 13)"
    )
    ap.add_argument("--sizes", default="10,100,1000,10000")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    shapes = (
        [(args.state or 0, args.step or 0)]
        if args.state is not None or args.step is not None
        else [(0, 0), (58, 0), (0, 13), (58, 13)]
    )
    loop = asyncio.new_event_loop()
    print(
        "| objects kept per task | per step | "
        + " | ".join(f"{k:,} tasks, µs/step" for k in sizes)
        + " | max/min |"
    )
    print("| ---: | ---: | " + " | ".join("---:" for _ in sizes) + " | ---: |")
    for state, step in shapes:
        got = measure(state, step, sizes, loop)
        cells = " | ".join(f"{got[k]:.2f}" for k in sizes)
        print(f"| {state} | {step} | {cells} | {max(got.values()) / min(got.values()):.2f} |")


if __name__ == "__main__":
    main()
