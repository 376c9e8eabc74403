"""Telemetry at the cost floor: flowscope's layers against LangGraph, side by side.

    PYTHONPATH=src python bench/telemetry_bench.py            # the full run, prints Markdown
    PYTHONPATH=src python bench/telemetry_bench.py --quick    # fewer repetitions

One process, interleaved repetitions (every repetition runs every configuration once, from
a rotating offset), medians, ratios from the same run:

1. a chain of 200 trivial nodes, µs per node: the engine alone (memory store), SQLite,
   SQLite + tracing, SQLite + metrics, the full stack (SQLite + tracing + metrics), the
   engine with a plugin whose hooks do nothing (the floor under any plugin), and
   LangGraph + ``SqliteSaver`` (no telemetry on its side). A layer's cost, such as tracing
   over SQLite, and a ratio to LangGraph are medians of pairs from the same repetition.
   One long-lived Runner per configuration, a new session per run; tracing is an SDK
   ``TracerProvider`` with a ``BatchSpanProcessor`` and a ``WatermarkExporter`` around an
   exporter that drops the spans (what ``configure_tracing`` builds, but for the network),
   flushed inside the timing;
2. 1,000 concurrent sessions of a 10-node chain in one process: the engine alone (memory
   store, the ceiling of every flowscope configuration), SQLite bare and the full stack,
   against LangGraph + ``AsyncSqliteSaver`` running 1,000 threads concurrently;
3. flatness: the full stack's µs per node from 20 to 2,000 nodes, and per node run from
   10 to 10,000 concurrent sessions, with the memory per session (tracemalloc peak over
   the run, in a separate untimed run).

LangGraph's SQLite connections run ``synchronous=NORMAL``, the store's durability.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from flowscope.engine.ids import new_id

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from prometheus_client import CollectorRegistry  # noqa: E402

import peers_langgraph  # noqa: E402
import workflows as W  # noqa: E402
from flowscope import Runner  # noqa: E402
from flowscope.observability import MetricsPlugin, TracingPlugin  # noqa: E402
from flowscope.observability.shipping import WatermarkExporter  # noqa: E402
from flowscope.plugins import Plugin  # noqa: E402
from flowscope.store import MemoryEventStore  # noqa: E402
from flowscope.store.sqlite import SqliteEventStore  # noqa: E402

TMP = tempfile.mkdtemp(prefix="flowscope-telbench-")


def provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tp = TracerProvider()
    # A queue that holds the spans of 10,000 sessions between flushes (the default 2,048 drops)
    tp.add_span_processor(BatchSpanProcessor(WatermarkExporter(W.NoopSpanExporter()), max_queue_size=200_000))
    return tp


class EmptyPlugin(Plugin):
    """A plugin whose node hooks and ``on_event`` do nothing: what the hook port itself costs
    per node, the floor under any plugin that watches node runs."""

    name = "empty"

    def before_node(self, ctx: Any) -> None:
        pass

    def after_node(self, ctx: Any, outcome: Any) -> None:
        pass

    def on_event(self, event: Any) -> None:
        pass


class Flow:
    """A flowscope configuration: a long-lived Runner over one store."""

    def __init__(
        self, label: str, wf: Any, sqlite: bool, tracing: bool, metrics: bool, empty: bool = False
    ) -> None:
        self.label = label
        self.store = (
            SqliteEventStore(os.path.join(TMP, f"{uuid.uuid4().hex}.db")) if sqlite else MemoryEventStore()
        )
        self.tp = provider() if tracing else None
        plugins: list[Any] = []
        if self.tp is not None:
            plugins.append(TracingPlugin(tracer_provider=self.tp))
        if metrics:
            plugins.append(MetricsPlugin(registry=CollectorRegistry()))
        if empty:
            plugins.append(EmptyPlugin())
        self.runner = Runner(wf, store=self.store, plugins=plugins)

    async def once(self, sessions: int = 1) -> float:
        ids = [new_id() for _ in range(sessions)]
        gc.collect()
        t0 = time.perf_counter()
        if sessions == 1:
            await self.runner.run(0, session_id=ids[0])
        else:
            await asyncio.gather(*(self.runner.run(0, session_id=i) for i in ids))
        if self.tp is not None:
            self.tp.force_flush()
        return time.perf_counter() - t0


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


EMPTY = "engine alone + a plugin that does nothing"
#: Above this spread of the engine alone's middle half (as a share of its median), the run
#: fell in one of the VM's slow phases: calm runs here stay under 15%, slow ones reach 40%.
NOISY_SPREAD = 0.2
NOISY = (
    ": the VM went through slow phases during this run. Its absolute figures are not "
    "comparable with a calm run's, and only the paired figures below mean much."
)


async def chain200(reps: int) -> dict[str, list[float]]:
    """µs/node of every timed repetition, by configuration; the i-th of each list is from
    the same repetition (for :func:`paired`)."""
    n = 200
    wf = W.chain(n)
    flows = [
        Flow("engine alone (memory)", wf, False, False, False),
        Flow("SQLite", wf, True, False, False),
        Flow("SQLite + tracing", wf, True, True, False),
        Flow("SQLite + metrics", wf, True, False, True),
        Flow("full stack", wf, True, True, True),
        Flow(EMPTY, wf, False, False, False, empty=True),
    ]
    lg_run, lg_close = peers_langgraph.sqlite_chain(n, TMP, peers_langgraph.SAME_AS_STORE)
    times: dict[str, list[float]] = {f.label: [] for f in flows}
    times["LangGraph + SqliteSaver"] = []
    for rep in range(reps + 1):
        order = list(range(len(flows) + 1))
        order = order[rep % len(order) :] + order[: rep % len(order)]
        for i in order:
            if i < len(flows):
                dt = await flows[i].once()
                label = flows[i].label
            else:
                gc.collect()
                t0 = time.perf_counter()
                lg_run()
                dt = time.perf_counter() - t0
                label = "LangGraph + SqliteSaver"
            if rep:  # the first repetition is a warm-up
                times[label].append(dt)
    lg_close()
    for f in flows:
        if f.tp is not None:
            f.tp.shutdown()
    per_node = {k: [t / n * 1e6 for t in v] for k, v in times.items()}
    return per_node


def paired(runs: dict[str, list[float]], a: str, b: str, op: Callable[[float, float], float]) -> float:
    """The median over repetitions of ``op(a, b)``, each pair from one repetition. The
    configurations of a repetition run back to back, so a slow phase of the VM (they last
    seconds here) slows both sides of a pair alike, where it shifts one median of two."""
    return med([op(x, y) for x, y in zip(runs[a], runs[b])])


def minus(x: float, y: float) -> float:
    return x - y


def over(x: float, y: float) -> float:
    return x / y


async def concurrent(reps: int, sessions: int = 1000, n: int = 10) -> dict[str, list[float]]:
    """Node runs per second. The engine alone (memory store, no plugins) is the ceiling of
    every flowscope configuration on this machine: a store and plugins only add to it."""
    wf = W.chain(n)
    engine = Flow("engine alone (memory)", wf, False, False, False)
    bare = Flow("SQLite", wf, True, False, False)
    full = Flow("full stack", wf, True, True, True)
    lg = await peers_langgraph.async_sqlite_chain(n, sessions, TMP, peers_langgraph.SAME_AS_STORE)
    out: dict[str, list[float]] = {
        engine.label: [],
        "SQLite": [],
        "full stack": [],
        "LangGraph + AsyncSqliteSaver": [],
    }
    for rep in range(reps + 1):
        runs: list[tuple[str, Callable[[], Awaitable[float]]]] = [
            (engine.label, lambda: engine.once(sessions)),
            ("SQLite", lambda: bare.once(sessions)),
            ("full stack", lambda: full.once(sessions)),
            ("LangGraph + AsyncSqliteSaver", lg),
        ]
        runs = runs[rep % len(runs) :] + runs[: rep % len(runs)]
        for label, fn in runs:
            dt = await fn()
            if rep:
                out[label].append(sessions * n / dt)
    assert full.tp is not None
    full.tp.shutdown()
    return out


async def flatness(reps: int) -> tuple[dict[int, float], dict[int, tuple[float, float]]]:
    chains: dict[int, float] = {}
    for n in (20, 200, 2000):
        f = Flow("full", W.chain(n), True, True, True)
        await f.once()
        ts = [await f.once() for _ in range(max(3, reps // (1 if n < 2000 else 2)))]
        chains[n] = med(ts) / n * 1e6
    sess: dict[int, tuple[float, float]] = {}
    for s in (10, 100, 1000, 10000):
        f = Flow("full", W.chain(10), True, True, True)
        await f.once(min(s, 100))
        ts = [await f.once(s) for _ in range(3 if s < 10000 else 1)]
        per_run = med(ts) / (s * 10) * 1e6
        gc.collect()
        tracemalloc.start()
        await f.once(s)
        _cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        sess[s] = (per_run, peak / s / 1024)
    return chains, sess


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    reps = 3 if args.quick else 9
    t0 = time.time()
    runs = await chain200(3 * reps)  # a 200-chain run is short: three times the repetitions
    c = {k: med(v) for k, v in runs.items()}
    spread = {k: quartiles(v) for k, v in runs.items()}
    conc_runs = await concurrent(2 if args.quick else 3)
    conc = {k: med(v) for k, v in conc_runs.items()}
    chains, sess = await flatness(reps)
    lg, lga = "LangGraph + SqliteSaver", "LangGraph + AsyncSqliteSaver"
    # A layer's cost and a ratio to a peer are taken pair by pair (``paired``), not from two medians.
    rows = [
        ("engine alone, µs/node", c["engine alone (memory)"], "≤ 15"),
        ("tracing over SQLite, µs/node", paired(runs, "SQLite + tracing", "SQLite", minus), "≤ 20"),
        ("metrics over SQLite, µs/node", paired(runs, "SQLite + metrics", "SQLite", minus), "≤ 5"),
        ("full stack vs LangGraph + SqliteSaver", paired(runs, lg, "full stack", over), "≥ 8x"),
        ("1,000 sessions full stack, node runs/s", conc["full stack"], "≥ 20,000"),
        (
            "1,000 sessions full stack vs LangGraph + AsyncSqliteSaver",
            paired(conc_runs, "full stack", lga, over),
            "≥ 25x",
        ),
    ]
    print(f"## Telemetry at the cost floor, {time.strftime('%Y-%m-%d')}\n")
    print(
        f"`PYTHONPATH=src python bench/telemetry_bench.py{' --quick' if args.quick else ''}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, load average at start {os.getloadavg()[0]:.1f}; "
        f"langgraph {version('langgraph')}, langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}, "
        f"opentelemetry-sdk {version('opentelemetry-sdk')}, prometheus-client {version('prometheus-client')}; "
        f"{3 * reps} timed repetitions of the 200-chain, {reps} of the rest (medians), took {time.time() - t0:.0f} s.\n"
    )
    print(
        "### 200-chain, µs per node (median)\n\n| configuration | µs/node | middle half of the runs |\n| --- | ---: | ---: |"
    )
    for k, v in c.items():
        lo, hi = spread[k]
        print(f"| {k} | {v:.1f} | {lo:.1f}–{hi:.1f} |")
    lo, hi = spread["engine alone (memory)"]
    width = (hi - lo) / c["engine alone (memory)"]
    print(
        f"\nThe engine alone, the steadiest configuration, spread over {width:.0%} of its median in its "
        f"middle half{NOISY if width > NOISY_SPREAD else '.'}"
    )
    print(
        "\n### 1,000 concurrent sessions of a 10-node chain, node runs/s (median)\n\n| configuration | node runs/s |\n| --- | ---: |"
    )
    for k, v in conc.items():
        print(f"| {k} | {v:,.0f} |")
    print("\n### Flatness (full stack)\n\n| chain length | µs/node |\n| ---: | ---: |")
    for n, v in chains.items():
        print(f"| {n:,} | {v:.1f} |")
    print(
        "\n| concurrent sessions (10-chain) | µs per node run | memory per session (KiB, tracemalloc peak) |\n| ---: | ---: | ---: |"
    )
    for s, (v, kib) in sess.items():
        print(f"| {s:,} | {v:.1f} | {kib:.1f} |")
    print("\n### Targets\n\n| target | measured | wanted | |\n| --- | ---: | ---: | --- |")
    for name, value, want in rows:
        num = float(want.split()[1].replace(",", "").rstrip("x"))
        ok = value <= num if want.startswith("≤") else value >= num
        shown = (
            f"{value:,.1f}x" if want.endswith("x") else (f"{value:,.0f}" if value > 1000 else f"{value:.1f}")
        )
        print(f"| {name} | {shown} | {want} | {'pass' if ok else 'MISS'} |")
    flat_c = max(chains.values()) / min(chains.values())
    flat_s = max(v for v, _ in sess.values()) / min(v for v, _ in sess.values())
    print(
        f"| per-node cost 20 → 2,000 nodes (max/min) | {flat_c:.2f} | ≤ 1.3 | {'pass' if flat_c <= 1.3 else 'MISS'} |"
    )
    print(
        f"| per-run cost 10 → 10,000 sessions (max/min) | {flat_s:.2f} | ≤ 1.3 | {'pass' if flat_s <= 1.3 else 'MISS'} |"
    )
    print("\nLayers' costs and ratios to a peer are medians of pairs from the same repetition.")
    print("\nWhat the targets sit on, from the same run:\n")
    print(
        f"- the 1,000-session figures: the engine alone (no store, no plugins) ran "
        f"{conc['engine alone (memory)']:,.0f} node runs/s, and SQLite alone was "
        f"{paired(conc_runs, 'SQLite', lga, over):.1f}x LangGraph + AsyncSqliteSaver;"
    )
    print(
        f"- the 200-chain: SQLite alone was {paired(runs, lg, 'SQLite', over):.1f}x LangGraph + SqliteSaver, so 8x "
        f"leaves {paired(runs, lg, 'SQLite', lambda x, y: x / 8 - y):.1f} µs/node for all the telemetry;"
    )
    print(
        f"- a plugin whose node hooks and `on_event` do nothing added "
        f"{paired(runs, EMPTY, 'engine alone (memory)', minus):.1f} µs/node to the engine alone (memory store): "
        "the hook port's own cost, under tracing's and metrics' figures."
    )


if __name__ == "__main__":
    asyncio.run(main())
