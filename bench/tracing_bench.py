"""Per-node cost of the TracingPlugin, side by side in one run.

A chain of N nodes (default 200), run on a MemoryEventStore:

- ``engine``: no plugins;
- ``tracing``: TracingPlugin on an SDK TracerProvider with a BatchSpanProcessor and a no-op
  exporter (what a production process pays, minus the network);
- ``full stack`` (for the DESIGN.md section 10 target of 250 us/node): SqliteEventStore +
  TracingPlugin (same SDK setup) + MetricsPlugin on a private prometheus registry.

Each configuration is warmed up, then timed ``--repeat`` times (at least 5); the medians are
printed as microseconds per node, with the tracing delta. ``--profile`` prints a cProfile of
the tracing configuration (the hot path to look at when the numbers regress).

    python bench/tracing_bench.py [--nodes 200] [--repeat 7] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from flowscope import START, Runner, Workflow, node  # noqa: E402
from flowscope.observability import TracingPlugin  # noqa: E402
from flowscope.store import MemoryEventStore  # noqa: E402


class NoOpExporter(SpanExporter):
    """Accepts every batch and drops it: the cost left is the SDK's and the plugin's."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def chain(n: int) -> Workflow:
    nodes = [node(lambda x: x + 1, name=f"n{i}") for i in range(n)]
    return Workflow("chain", edges=[(START, *nodes)])


def sdk_provider() -> tuple[TracerProvider, NoOpExporter]:
    exporter = NoOpExporter()
    provider = TracerProvider()
    # a queue big enough that nothing is dropped during a timed run
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    return provider, exporter


Config = Callable[[], tuple[Runner, Callable[[], None]]]


def engine_only(wf: Workflow) -> Config:
    def make() -> tuple[Runner, Callable[[], None]]:
        return Runner(wf, store=MemoryEventStore(), heartbeat_interval=0), lambda: None

    return make


def with_tracing(wf: Workflow) -> Config:
    def make() -> tuple[Runner, Callable[[], None]]:
        provider, _ = sdk_provider()
        runner = Runner(
            wf,
            store=MemoryEventStore(),
            plugins=[TracingPlugin(tracer_provider=provider)],
            heartbeat_interval=0,
        )
        return runner, provider.shutdown

    return make


def with_noop_api(wf: Workflow) -> Config:
    """The plugin on the API's no-op provider: its own cost and the hook dispatch, without the SDK."""
    from opentelemetry.trace import NoOpTracerProvider

    def make() -> tuple[Runner, Callable[[], None]]:
        plugins = [TracingPlugin(tracer_provider=NoOpTracerProvider())]
        return Runner(wf, store=MemoryEventStore(), plugins=plugins, heartbeat_interval=0), lambda: None

    return make


def full_stack(wf: Workflow, tmp: str) -> Config | None:
    try:
        from prometheus_client import CollectorRegistry

        from flowscope.observability import MetricsPlugin
        from flowscope.store import SqliteEventStore
    except Exception as exc:  # pragma: no cover - a piece of the stack is missing in this checkout
        print(f"(full stack skipped: {type(exc).__name__}: {exc})")
        return None
    counter = iter(range(1 << 30))

    def make() -> tuple[Runner, Callable[[], None]]:
        provider, _ = sdk_provider()
        store = SqliteEventStore(os.path.join(tmp, f"bench-{next(counter)}.db"))
        plugins = [TracingPlugin(tracer_provider=provider), MetricsPlugin(registry=CollectorRegistry())]
        runner = Runner(wf, store=store, plugins=plugins, heartbeat_interval=0)

        def close() -> None:
            provider.shutdown()
            getattr(store, "close", lambda: None)()

        return runner, close

    return make


def time_one(make: Config, n: int) -> float:
    """Seconds per node for one run (setup and teardown not timed)."""
    runner, close = make()
    gc.collect()
    t0 = time.perf_counter()
    result = asyncio.run(runner.run(0))
    elapsed = time.perf_counter() - t0
    close()
    assert result.output == n, result.output
    return elapsed / n


def measure(make: Config, n: int, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        time_one(make, n)
    return statistics.median(time_one(make, n) for _ in range(repeat))


def profile(make: Config, n: int, top: int = 25) -> None:
    runner, close = make()
    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(runner.run(0))
    prof.disable()
    close()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(top)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--profile", action="store_true", help="cProfile the tracing configuration")
    p.add_argument("--no-full-stack", action="store_true")
    args = p.parse_args(argv)
    repeat = max(5, args.repeat)
    n = args.nodes
    wf = chain(n)

    with tempfile.TemporaryDirectory() as tmp:
        configs: list[tuple[str, Config]] = [
            ("engine (memory store, no plugins)", engine_only(wf)),
            ("engine + TracingPlugin (SDK, batch, no-op exporter)", with_tracing(wf)),
            ("engine + TracingPlugin (API no-op provider: no SDK)", with_noop_api(wf)),
        ]
        if not args.no_full_stack:
            fs = full_stack(wf, tmp)
            if fs is not None:
                configs.append(("full stack (sqlite + tracing + metrics)", fs))
        results = {}
        for label, make in configs:
            results[label] = measure(make, n, repeat)
        print(f"chain of {n} nodes, median of {repeat} runs after warm-up (python {sys.version.split()[0]})")
        for label, per_node in results.items():
            print(f"  {label:<55} {per_node * 1e6:8.1f} us/node")
        base, traced, api_only = list(results.values())[:3]
        print(
            f"  {'tracing overhead (delta)':<55} {(traced - base) * 1e6:8.1f} us/node  ({traced / base:.2f}x the engine alone)"
        )
        print(f"  {'  of which plugin + hook dispatch (no SDK)':<55} {(api_only - base) * 1e6:8.1f} us/node")
        print(f"  {'  of which the OpenTelemetry SDK':<55} {(traced - api_only) * 1e6:8.1f} us/node")
        if len(results) > 3:
            full = list(results.values())[3]
            verdict = "within" if full * 1e6 <= 250 else "OVER"
            print(f"  {'full stack target 250 us/node':<55} {verdict}")
        if args.profile:
            profile(configs[1][1], n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
