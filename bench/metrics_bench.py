"""Benchmarks of the metrics: the cost of MetricsPlugin per node, and a StoreCollector scrape.

    python bench/metrics_bench.py                 # both parts
    python bench/metrics_bench.py --part plugin   # per-node cost only
    python bench/metrics_bench.py --part scrape --db /tmp/fs-1m.db   # reuse a built store

Part 1 runs a 200-node chain on the memory store with no plugin, with MetricsPlugin
(prometheus-client), with MetricsPlugin under a sampled span (exemplars), and with both
backends (prometheus-client + an OTel MeterProvider); configurations are interleaved, and
each reports the median of >= 5 timed runs after warm-up. It also times the plugin's
hooks alone (before_node + after_node on a prepared context), which is the plugin's own
cost without the engine's noise.

Part 2 builds a SqliteEventStore of 1,000,000 events (10,000 sessions of 100 events, 2 %
of them left open: running with a stale heartbeat, waiting for input, waiting for an
overdue job) with the store's own ``append`` (one transaction per session), then times
``StoreCollector.collect()``: through the generic ``open_runs()`` path, and through the
aggregate a store could offer (``open_run_summary``, prototyped here as one SQL GROUP BY).
Target: < 50 ms per scrape. Nothing here is a test: no timed assertions.
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
from pathlib import Path

from prometheus_client import CollectorRegistry

from flowscope import START, Runner, Workflow, node
from flowscope.events import (
    InputRequested,
    JobDispatched,
    NodeCompleted,
    NodePaused,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from flowscope.observability.metrics import MetricsPlugin
from flowscope.observability.store_collector import OpenRunGroup, StoreCollector
from flowscope.store import MemoryEventStore, SqliteEventStore

# ----------------------------------------------------------------------------- part 1


def chain_workflow(n: int) -> Workflow:
    nodes = [node(lambda x: x, name=f"n{i:04d}") for i in range(n)]
    return Workflow("bench", edges=[(START, *nodes)])


def per_node_us(wf: Workflow, n: int, plugins: list, span: bool) -> float:
    runner = Runner(wf, store=MemoryEventStore(), plugins=plugins, heartbeat_interval=0)
    tracer = _tracer() if span else None

    async def go() -> float:
        t0 = time.perf_counter()
        if tracer is not None:
            with tracer.start_as_current_span("bench"):
                await runner.run(1)
        else:
            await runner.run(1)
        return time.perf_counter() - t0

    gc.collect()
    return asyncio.run(go()) / n * 1e6


_TRACER = None


def _tracer():
    global _TRACER
    if _TRACER is None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        _TRACER = TracerProvider(sampler=ALWAYS_ON).get_tracer("bench")
    return _TRACER


def hooks_only_us(make_plugin, span: bool, rounds: int = 20000) -> float:
    """before_node + after_node of the plugin alone, per node run."""
    from flowscope.engine.context import NodeOutcome, RunInfo
    from flowscope.events import NodeCompleted as NC

    plugin = make_plugin()

    class Ctx:  # what the hooks read from a NodeContext
        __slots__ = ("run", "node_name", "plugin_state", "trace_context")

    run = RunInfo("sid", "inv", "bench", None, False, time.time())
    ctxs = []
    for i in range(20):
        c = Ctx()
        c.run, c.node_name, c.plugin_state, c.trace_context = run, f"n{i:04d}", {}, {}
        ctxs.append(c)
    outcome = NodeOutcome("success", NC(), 1, False, None, None, 0.0001)
    before, after = plugin.before_node, plugin.after_node

    def loop() -> float:
        t0 = time.perf_counter()
        for i in range(rounds):
            c = ctxs[i % 20]
            before(c)
            after(c, outcome)
        return time.perf_counter() - t0

    if span:
        with _tracer().start_as_current_span("bench"):
            loop()
            return min(loop() for _ in range(5)) / rounds * 1e6
    loop()
    return min(loop() for _ in range(5)) / rounds * 1e6


def part_plugin(n: int = 200, runs: int = 9, warmup: int = 3) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    wf = chain_workflow(n)
    configs = {
        "no plugin": (lambda: [], False),
        "MetricsPlugin (prometheus)": (lambda: [MetricsPlugin(CollectorRegistry())], False),
        "MetricsPlugin (prometheus) + sampled span": (lambda: [MetricsPlugin(CollectorRegistry())], True),
        "MetricsPlugin (prometheus + OTel)": (
            lambda: [
                MetricsPlugin(
                    CollectorRegistry(), meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()])
                )
            ],
            False,
        ),
    }
    # One plugin per configuration for all its runs, as in a worker: the label series of
    # the 200 nodes are created on the first run (reported as "cold") and reused after.
    plugins = {name: make() for name, (make, _span) in configs.items()}
    cold = {name: per_node_us(wf, n, plugins[name], span) for name, (_make, span) in configs.items()}
    samples: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(warmup):
        for name, (_make, span) in configs.items():
            per_node_us(wf, n, plugins[name], span)
    for _ in range(runs):  # interleaved, so drift hits every configuration alike
        for name, (_make, span) in configs.items():
            samples[name].append(per_node_us(wf, n, plugins[name], span))
    base = statistics.median(samples["no plugin"])
    print(
        f"\n== per-node cost, chain of {n} nodes, memory store, median of {runs} runs after {warmup} warm-up"
    )
    print(
        f"{'configuration':45s} {'µs/node':>9s} {'plugin µs/node':>15s} {'ratio':>7s} {'cold 1st run':>13s}"
    )
    for name, xs in samples.items():
        med = statistics.median(xs)
        print(f"{name:45s} {med:9.1f} {med - base:15.1f} {med / base:7.2f} {cold[name]:10.1f} µs")

    print("\n== the plugin's hooks alone (before_node + after_node), best of 5 x 20,000")
    reg_plugin = lambda: MetricsPlugin(CollectorRegistry())  # noqa: E731
    both = lambda: MetricsPlugin(  # noqa: E731
        CollectorRegistry(), meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()])
    )
    print(f"{'prometheus':45s} {hooks_only_us(reg_plugin, False):9.2f} µs/node")
    print(f"{'prometheus, sampled span (exemplar)':45s} {hooks_only_us(reg_plugin, True):9.2f} µs/node")
    print(f"{'prometheus + OTel':45s} {hooks_only_us(both, False):9.2f} µs/node")


# ----------------------------------------------------------------------------- part 2

NODES_PER_SESSION = 48  # a completed session: RunStarted, root start, 48 x (start, complete), root end, RunFinished = 100 events
WORKFLOWS = ("orders", "billing", "etl", "onboarding")


def session_events(i: int, base_ts: float, open_kind: str | None) -> list:
    """One session's events (100 for a completed one); ``open_kind`` leaves its last node
    open: ``running`` (the worker died during a retry), ``input`` or ``job`` (paused)."""
    sid = f"s{i:06d}"
    inv = f"inv{i:06d}"
    wf = WORKFLOWS[i % len(WORKFLOWS)]
    root = f"{wf}@1"
    ts = base_ts + i * 0.01
    common = dict(session_id=sid, invocation_id=inv)
    ev: list = [RunStarted(ts=ts, workflow=wf, input=i, **common)]
    ev.append(NodeStarted(ts=ts, path=root, node=wf, kind="workflow", **common))
    for k in range(NODES_PER_SESSION):
        name = f"step{k:02d}"
        path = f"{root}/{name}@1"
        t = ts + k * 0.001
        ev.append(NodeStarted(ts=t, path=path, node=name, parent_path=root, **common))
        last = k == NODES_PER_SESSION - 1
        if last and open_kind == "running":
            ev.append(
                NodeRetrying(ts=t, path=path, node=name, error_type="ConnectionError", delay_s=1.0, **common)
            )
        elif last and open_kind == "input":
            ev.append(InputRequested(ts=t, path=path, node=name, interrupt_id=path, prompt="ok?", **common))
        elif last and open_kind == "job":
            ev.append(
                JobDispatched(
                    ts=t, path=path, node=name, job_id=f"job{i}", deadline_s=60.0, job_key=path, **common
                )
            )
        else:
            ev.append(NodeCompleted(ts=t, path=path, node=name, output=k, **common))
    end = ts + 0.1
    if open_kind is None:
        ev.append(NodeCompleted(ts=end, path=root, node=wf, output=1, **common))
        ev.append(RunFinished(ts=end, status="completed", output=1, **common))
    elif open_kind in ("input", "job"):
        waiting = "input" if open_kind == "input" else "job"
        last_path = f"{root}/step{NODES_PER_SESSION - 1:02d}@1"
        ev.append(NodePaused(ts=end, path=root, node=wf, waiting=waiting, origin_path=last_path, **common))
        ev.append(RunFinished(ts=end, status="paused", **common))
    # "running": the process died; nothing more was written
    return ev


def build_store(path: str, total_events: int, open_fraction: float) -> None:
    every = max(1, round(1 / open_fraction)) if open_fraction > 0 else 0
    kinds = ("running", "input", "job")
    base_ts = time.time() - 2 * 3600  # two hours ago: heartbeats stale, job deadlines passed
    store = SqliteEventStore(path)
    t0 = time.perf_counter()
    written = i = 0
    while written < total_events:
        open_kind = kinds[(i // every) % 3] if every and i % every == 0 else None
        events = session_events(i, base_ts, open_kind)[: total_events - written]
        store.append(f"s{i:06d}", events, 0)  # one transaction per session
        written += len(events)
        i += 1
        if i % 2000 == 0:
            print(
                f"  {written:>9,d} events ({written / (time.perf_counter() - t0):,.0f} events/s)", flush=True
            )
    store.close()
    print(f"built {written:,d} events in {i:,d} sessions in {time.perf_counter() - t0:.1f}s")


#: The index the proposed schema migration would add: partial (open runs only, so it
#: stays small however long the log grows) and covering (the GROUP BY never reads a row).
PROPOSED_INDEX = (
    "CREATE INDEX IF NOT EXISTS node_runs_open ON node_runs "
    "(status, workflow, node, started_at, heartbeat_at, job_deadline_at) "
    "WHERE status IN ('running', 'waiting_input', 'waiting_job')"
)


class SummarisingSqliteStore(SqliteEventStore):
    """A prototype of the store-port method the collector would use: one GROUP BY over
    the ``node_runs`` status index instead of one NodeRun object per open run."""

    def open_run_summary(self, now: float, stale_after_s: float) -> list[OpenRunGroup]:
        sql = (
            "SELECT workflow, node, status, count(*), min(started_at), "
            "sum(status = 'running' AND coalesce(heartbeat_at, started_at, 0) < :stale_before), "
            "sum(status = 'waiting_job' AND job_deadline_at IS NOT NULL AND job_deadline_at < :now) "
            "FROM node_runs WHERE status IN ('running', 'waiting_input', 'waiting_job') "
            "GROUP BY workflow, node, status"
        )
        with self._op("summarise open runs") as conn:
            rows = conn.execute(sql, {"now": now, "stale_before": now - stale_after_s}).fetchall()
        return [OpenRunGroup(*r) for r in rows]


def time_scrapes(collector: StoreCollector, n: int = 30) -> tuple[float, float, float]:
    first_t0 = time.perf_counter()
    list(collector.collect())
    first = time.perf_counter() - first_t0
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        for family in collector.collect():
            for _s in family.samples:
                pass
        xs.append(time.perf_counter() - t0)
    return first * 1e3, statistics.median(xs) * 1e3, max(xs) * 1e3


def part_scrape(db: str | None, total_events: int, open_fraction: float) -> None:
    tmp = None
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="flowscope-bench-")
        db = os.path.join(tmp.name, "bench.db")
    try:
        if not Path(db).exists():
            print(f"\n== building {db}: {total_events:,d} events, {open_fraction:.0%} of sessions left open")
            build_store(db, total_events, open_fraction)
        generic = SqliteEventStore(db)
        with generic._op("count events") as conn:
            n_events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        open_runs = generic.open_runs()
        print(f"\n== StoreCollector scrape over {n_events:,d} events, {len(open_runs):,d} open runs "
              f"({db}, {os.path.getsize(db) / 1e6:.0f} MB)")  # fmt: skip
        t0 = time.perf_counter()
        for _ in range(10):
            generic.open_runs()
        print(f"{'store.open_runs() alone':45s} {(time.perf_counter() - t0) / 10 * 1e3:8.2f} ms")
        first, med, worst = time_scrapes(StoreCollector(generic, stale_after_s=300))
        print(
            f"{'scrape via open_runs() (generic port)':45s} {med:8.2f} ms median  (first {first:.2f}, max {worst:.2f})"
        )
        summarising = SummarisingSqliteStore(db)
        first, med, worst = time_scrapes(StoreCollector(summarising, stale_after_s=300))
        print(
            f"{'scrape via open_run_summary() (SQL GROUP BY)':45s} {med:8.2f} ms median  (first {first:.2f}, max {worst:.2f})"
        )
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in StoreCollector(generic, stale_after_s=300).collect()
            for s in f.samples
        }
        fast = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in StoreCollector(summarising, stale_after_s=300).collect()
            for s in f.samples
        }
        print(f"both paths give the same {len(samples)} samples: {samples == fast}")
        # the proposed migration, on the bench file only, removed again afterwards
        with summarising._op("create the proposed index") as conn:
            conn.execute(PROPOSED_INDEX)
            conn.execute("ANALYZE node_runs")
        try:
            first, med, worst = time_scrapes(StoreCollector(summarising, stale_after_s=300))
            print(
                f"{'  ... + partial covering index (proposed)':45s} {med:8.2f} ms median  (first {first:.2f}, max {worst:.2f})"
            )
        finally:
            with summarising._op("drop the proposed index") as conn:
                conn.execute("DROP INDEX IF EXISTS node_runs_open")
        generic.close()
        summarising.close()
    finally:
        if tmp is not None:
            tmp.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("plugin", "scrape", "all"), default="all")
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--db", help="SQLite file to build (if missing) and scrape; default: a temporary file")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--open-fraction", type=float, default=0.02)
    args = p.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    if args.part in ("plugin", "all"):
        part_plugin(args.nodes, max(5, args.runs))
    if args.part in ("scrape", "all"):
        part_scrape(args.db, args.events, args.open_fraction)


if __name__ == "__main__":
    main()
