"""What each layer of the telemetry adds per node run: timed, layer by layer, in one run.

    PYTHONPATH=src python bench/telemetry_layers.py [--store memory|sqlite] [--reps 9] [--smoke]

The profilers answer "which function" but inflate small functions two- or threefold; this
answers "which layer" with plain timings. Each configuration adds one layer to the one
before it, on a fresh runner and store per measurement:

1. the engine alone (no plugins);
2. + the hook port: one plugin whose hooks do nothing;
3. + tracing's hooks: ``TracingPlugin`` with the appended events dropped (the node's
   OTel context, its derived span id and traceparent; no span);
4. + the span walk: the events walked into span records, none shipped;
5. + shipping: the whole ``TracingPlugin`` (SDK ``ReadableSpan``, the batch processor's
   queue and export thread, the watermark ledger), as ``targets.py`` configures it;
6. + metrics: the full stack.

Three workloads: a 200-chain run alone; 1,000 sessions of a 10-chain run concurrently; and
1,000 invocations of a 5-chain awaited one after another, timed per invocation: what an
invocation costs beyond its nodes (start, finish, its spans handed over), which short
workflows pay most.
Each is timed with the garbage collector on (as a process runs) and off (``gc.disable()``
inside the timing, ``gc.collect()`` before it): the difference is what the collector
costs. "added" is the median over repetitions of the paired difference from the layer
before (a slow phase of the VM slows both sides alike). Layers 3 and 4 override private
methods of ``TracingPlugin``; the bench says so and stops if they are gone.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowscope.engine.ids import new_id

HERE = Path(__file__).resolve().parent
for p in (str(HERE), str(HERE.parent / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

from prometheus_client import CollectorRegistry  # noqa: E402

import workflows as W  # noqa: E402
from flowscope import Runner  # noqa: E402
from flowscope.observability import MetricsPlugin, TracingPlugin  # noqa: E402
from flowscope.plugins import Plugin  # noqa: E402
from flowscope.store.memory import MemoryEventStore  # noqa: E402
from flowscope.store.sqlite import SqliteEventStore  # noqa: E402
from targets import provider  # noqa: E402

for _private in ("_walk", "_ship"):
    if not callable(getattr(TracingPlugin, _private, None)):
        raise SystemExit(f"TracingPlugin.{_private} is gone: update the layers of this bench")


class NoOp(Plugin):
    """Every hook, doing nothing: what the hook port costs."""

    name = "noop"

    def before_run(self, run: Any) -> None:
        pass

    def after_run(self, run: Any, result: Any, error: Any) -> None:
        pass

    def before_node(self, ctx: Any) -> None:
        pass

    def after_node(self, ctx: Any, outcome: Any) -> None:
        pass

    def on_events(self, events: Any) -> None:
        pass


class HooksOnly(TracingPlugin):
    """Tracing's hooks; the appended events are dropped, so no span is built."""

    def on_events(self, events: Any) -> None:
        pass


class WalkOnly(TracingPlugin):
    """Tracing's hooks and the span walk; what the walk ends is dropped, not shipped."""

    def _ship(self, runs: Sequence[Any], hold: bool = True) -> None:
        for st in runs:
            st.out.clear()


#: (name, plugins for a tracer provider): each adds one layer to the one before
LAYERS: list[tuple[str, Callable[[Any], list[Any]]]] = [
    ("engine alone", lambda tp: []),
    ("+ the hook port (a no-op plugin)", lambda tp: [NoOp()]),
    ("+ tracing's hooks (no span)", lambda tp: [HooksOnly(tracer_provider=tp)]),
    ("+ the span walk (nothing shipped)", lambda tp: [WalkOnly(tracer_provider=tp)]),
    ("+ shipping: the tracing plugin", lambda tp: [TracingPlugin(tracer_provider=tp)]),
    (
        "+ metrics: the full stack",
        lambda tp: [TracingPlugin(tracer_provider=tp), MetricsPlugin(registry=CollectorRegistry())],
    ),
]


def measure(
    layer: int, store_kind: str, folder: str, n: int, sessions: int, collect: bool, one_by_one: bool = False
) -> float:
    """µs per node run of ``sessions`` concurrent ``n``-chains on a fresh runner and store;
    ``one_by_one``: µs per invocation of ``sessions`` runs awaited one after another."""
    tp, _ = provider(True)
    store: Any
    if store_kind == "memory":
        store = MemoryEventStore()
    else:
        store = SqliteEventStore(os.path.join(folder, f"{uuid.uuid4().hex}.db"))
    runner = Runner(W.chain(n), store=store, plugins=LAYERS[layer][1](tp))
    loop = asyncio.new_event_loop()

    async def once(k: int) -> None:
        if one_by_one:
            for _ in range(k):
                await runner.run(0, session_id=new_id())
        else:
            await asyncio.gather(*(runner.run(0, session_id=new_id()) for _ in range(k)))

    try:
        loop.run_until_complete(once(min(sessions, 10)))  # warm: the series, the caches
        tp.force_flush()
        gc.collect()
        if not collect:
            gc.disable()
        try:
            t0 = time.perf_counter()
            loop.run_until_complete(once(sessions))
            tp.force_flush()
            dt = time.perf_counter() - t0
        finally:
            gc.enable()
    finally:
        tp.shutdown()
        loop.close()
        if store_kind == "sqlite":
            store.close()
    return dt / (sessions if one_by_one else sessions * n) * 1e6


def run(store_kind: str, reps: int, n: int, sessions: int, title: str, one_by_one: bool = False) -> None:
    folder = tempfile.mkdtemp(prefix="flowscope-layers-")
    print(f"### {title}, {store_kind} store, µs per {'invocation' if one_by_one else 'node run'}\n")
    print("| layer | GC on | added | GC off | added | the collector's share |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    times: dict[tuple[int, bool], list[float]] = {}
    for rep in range(reps):
        for i in range(len(LAYERS)):
            layer = (i + rep) % len(LAYERS)  # a rotating start: no layer always runs first
            for collect in (True, False):
                times.setdefault((layer, collect), []).append(
                    measure(layer, store_kind, folder, n, sessions, collect, one_by_one)
                )
    for layer, (name, _) in enumerate(LAYERS):
        cells = [name]
        for collect in (True, False):
            mine = times[(layer, collect)]
            cells.append(f"{statistics.median(mine):.1f}")
            if layer == 0:
                cells.append("")
            else:
                before = times[(layer - 1, collect)]
                cells.append(f"{statistics.median(a - b for a, b in zip(mine, before)):+.1f}")
        on, off = statistics.median(times[(layer, True)]), statistics.median(times[(layer, False)])
        cells.append(f"{(on - off) / on:.0%}")
        print("| " + " | ".join(cells) + " |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    args = ap.parse_args()
    chain, sessions, invocations = (20, 20, 20) if args.smoke else (200, 1000, 1000)
    reps = 1 if args.smoke else args.reps
    print(
        f"`{' '.join(['PYTHONPATH=src python bench/telemetry_layers.py', *sys.argv[1:]])}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}; {reps} repetitions\n"
    )
    run(args.store, reps, chain, 1, f"{chain}-chain, one session")
    run(args.store, max(1, reps // 2), 10, sessions, f"{sessions:,} concurrent sessions of a 10-chain")
    run(
        args.store, reps, 5, invocations, f"{invocations:,} invocations of a 5-chain, one after another", True
    )


if __name__ == "__main__":
    main()
