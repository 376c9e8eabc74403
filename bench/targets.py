"""Speed at scale: every target, side by side in one run, with the floors under them.

    PYTHONPATH=src python bench/targets.py            # the full run (about 10 minutes on 2 cores)
    PYTHONPATH=src python bench/targets.py --quick    # fewer repetitions
    PYTHONPATH=src python bench/targets.py --quick --smoke   # tiny sizes: checks that it runs (seconds)

Prints Markdown (every figure, then the targets table: target, wanted, measured, the floor
measured in the same run, pass/fail) and exits 1 when a target is missed or could not be
measured. ``--only chain,invoke,sessions,flat,worker,adk,pg,resume,scrape,console`` runs
some sections (the targets of the others show as not measured). The last three are the
targets set as a time under a fixed limit (``limits.py``): a resume of a 100,000-event
session, a ``StoreCollector`` scrape over 1,000,000 events, the console over 100,000
sessions and a session of 10,000 node runs.

Method: one process (the worker figures: a ``flowscope worker`` child). In a section every
repetition runs every configuration once, from a rotating offset; the first repetition is
a warm-up. A ratio is the median over repetitions of the ratio of the two configurations'
times in the same repetition (a slow phase of the VM slows both sides of a pair alike).
``gc.collect()`` runs before every measurement, outside the timing; the spans are flushed
to the exporter inside it. Configurations:

- flowscope: the engine alone (memory store, no plugins), SQLite alone (a temp file,
  ``durability="normal"``), the full stack (SQLite + ``TracingPlugin`` into an SDK
  ``TracerProvider``/``BatchSpanProcessor``/``WatermarkExporter`` around an exporter that
  drops the spans, what ``configure_tracing`` builds but for the network, + ``MetricsPlugin``
  on a fresh registry); on PostgreSQL the same with ``PostgresEventStore``;
- LangGraph: ``SqliteSaver`` (sync ``invoke``), the same traced by
  ``openinference-instrumentation-langchain`` (``LangChainInstrumentor``) into an SDK
  ``BatchSpanProcessor`` with the same no-op exporter, ``AsyncSqliteSaver`` for the
  concurrent sessions, ``PostgresSaver`` on the same PostgreSQL server. On SQLite the
  targets compare at the same durability: the peer's connection runs flowscope's default,
  ``synchronous=NORMAL`` (no fsync at a commit; durable through a process crash). The
  peer's own default, SQLite's ``synchronous=FULL`` (an fsync of the WAL at every commit),
  runs beside it, and so does flowscope's full stack with ``durability="full"`` (the same
  fsync), so that both pairs of equal durability are measured;
- ADK: ``google.adk.workflow.Workflow`` under ``Runner(node=...)`` and an
  ``InMemorySessionService`` (``peers_adk.py``);
- floors: a durable one-row commit per step (SQLite: WAL, ``synchronous=NORMAL``, the
  store's setting; PostgreSQL: autocommit ``INSERT``, fsync on), the engine alone, SQLite
  alone. A target on the full stack cannot pass where its floor's own figure misses it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(HERE), str(ROOT / "src"), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

import asyncio_floor  # noqa: E402
import limits  # noqa: E402
import workflows as W  # noqa: E402
from flowscope import Runner  # noqa: E402
from flowscope.engine.ids import new_id  # noqa: E402
from flowscope.observability import MetricsPlugin, TracingPlugin  # noqa: E402
from flowscope.observability.shipping import WatermarkExporter  # noqa: E402
from flowscope.store import MemoryEventStore  # noqa: E402
from flowscope.store.sqlite import SqliteEventStore  # noqa: E402
from peers_langgraph import SAME_AS_STORE  # noqa: E402  (the store's setting, the peers' too)

#: The labels of LangGraph on SQLite at flowscope's durability and at its own default.
LG_SAME, LG_DEFAULT = (
    f"LangGraph + SqliteSaver ({SAME_AS_STORE})",
    "LangGraph + SqliteSaver (its default: FULL)",
)
TRACED = ", OpenInference"
LGA_SAME, LGA_DEFAULT = (
    f"LangGraph + AsyncSqliteSaver ({SAME_AS_STORE})",
    "LangGraph + AsyncSqliteSaver (its default: FULL)",
)
#: flowscope's full stack with an fsync at every commit: the pair of LangGraph's default.
FULL_FSYNC = 'full stack (durability="full")'

SECTIONS = ("chain", "invoke", "sessions", "flat", "worker", "adk", "pg", "resume", "scrape", "console")


# ----------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """How much each section runs: ``--quick`` and ``--smoke`` shrink it."""

    chain: int = 200
    chain_reps: int = 21
    invoke_nodes: int = 5
    invoke_reps: int = 41
    sessions: int = 1000
    session_chain: int = 10
    session_reps: int = 5
    flat_chains: tuple[int, ...] = (20, 200, 2000)
    flat_sessions: tuple[int, ...] = (10, 100, 1000, 10000)
    flat_reps: int = 5
    #: of the sessions rows (the 10,000 sessions' take ~20 s a process): one worker process
    #: of the same row read from 112.7 to 150.5 µs per node run in one run, so a median of three
    worker_reps: int = 3
    #: of the chain rows, a second or so each: a median of two read 1.35 one run and 1.12
    #: the next, so five
    worker_chain_reps: int = 5
    worker_node_runs: int = 4000  # per chain length in the worker, one session at a time
    #: Sessions submitted at each concurrency at least: ten sessions at a time over a
    #: thousand, so the row measures the worker's steady pace at that concurrency, not one
    #: burst of ten sessions (a hundred node runs, ~20 ms: its start and its end).
    worker_sessions_min: int = 1000
    pg_reps: int = 9
    #: The targets in seconds are set at these sizes; --quick times fewer repetitions of them.
    resume_events: int = 100_000
    resume_reps: int = 5
    scrape_events: int = 1_000_000
    scrape_reps: int = 10
    console_sessions: int = 100_000
    console_runs: int = 5


FULL = Sizes()
QUICK = Sizes(
    chain_reps=9,
    invoke_reps=15,
    session_reps=1,
    flat_reps=3,
    worker_reps=1,
    worker_chain_reps=3,
    pg_reps=5,
    resume_reps=3,
    scrape_reps=5,
    console_runs=3,
)
SMOKE = Sizes(
    chain=20,
    chain_reps=2,
    invoke_reps=1,
    sessions=20,
    session_reps=1,
    flat_chains=(5, 20),
    flat_sessions=(5, 20),
    flat_reps=1,
    worker_reps=1,
    worker_chain_reps=1,
    worker_node_runs=40,
    worker_sessions_min=20,
    pg_reps=1,
    resume_events=1_000,
    resume_reps=1,
    scrape_events=10_000,
    scrape_reps=2,
    console_sessions=200,
    console_runs=1,
)


# ----------------------------------------------------------------------------- parts


class CountingExporter(W.NoopSpanExporter):
    """Drops the spans, counting them: a run's spans are checked to have reached it."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.spans += len(spans)
        return super().export(spans)  # reads each span as an exporter would


def provider(watermark: bool) -> tuple[Any, CountingExporter]:
    """An SDK ``TracerProvider`` with a ``BatchSpanProcessor`` into a counting no-op exporter,
    through flowscope's ``WatermarkExporter`` when ``watermark`` (what ``configure_tracing``
    builds); the queue holds the spans of 10,000 sessions between flushes."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    counting = CountingExporter()
    exporter: Any = WatermarkExporter(counting) if watermark else counting
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=400_000))
    return tp, counting


class Flow:
    """A flowscope configuration: one long-lived Runner over one store."""

    def __init__(self, wf: Any, store: Any, full: bool, lease_s: float = 15.0) -> None:
        self.store = store
        self.tp, self.exported = provider(True) if full else (None, None)
        # the benches' chains: a span per node and the invocation's
        self.spans_per_session = len(wf.nodes) + 1
        plugins: list[Any] = []
        if self.tp is not None:
            plugins = [TracingPlugin(tracer_provider=self.tp), MetricsPlugin(registry=CollectorRegistry())]
        self.runner = Runner(wf, store=store, plugins=plugins, lease_s=lease_s)

    async def once(self, sessions: int = 1) -> float:
        """Seconds to run ``sessions`` new sessions concurrently to the end, spans handed to the exporter."""
        ids = [
            new_id() for _ in range(sessions)
        ]  # the runner's default kind (LangGraph's threads get the same)
        before = self.exported.spans if self.exported is not None else 0
        gc.collect()
        t0 = time.perf_counter()
        if sessions == 1:
            res = [await self.runner.run(0, session_id=ids[0])]
        else:
            res = await asyncio.gather(*(self.runner.run(0, session_id=i) for i in ids))
        if self.tp is not None:
            self.tp.force_flush()
        dt = time.perf_counter() - t0
        if any(r.status != "completed" for r in res):
            raise AssertionError("a flowscope run did not complete")
        if self.exported is not None and self.exported.spans - before != sessions * self.spans_per_session:
            raise AssertionError(
                f"{self.exported.spans - before} spans reached the exporter, not {sessions * self.spans_per_session}"
            )
        return dt

    def close(self) -> None:
        if self.tp is not None:
            self.tp.shutdown()
        self.store.close()


def floor_db(folder: str) -> sqlite3.Connection:
    """A new file for the one-row commit: WAL with ``synchronous=NORMAL`` (the SQLite
    store's durability), one table of integer keys."""
    conn = sqlite3.connect(os.path.join(folder, f"floor-{uuid.uuid4().hex}.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {SAME_AS_STORE}")  # the store's
    conn.execute("CREATE TABLE step (id INTEGER PRIMARY KEY, v TEXT)")
    return conn


def one_row_commits(conn: sqlite3.Connection, n: int) -> None:
    """``n`` one-row commits (``BEGIN; INSERT; COMMIT``) on a :func:`floor_db`."""
    for _ in range(n):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO step (v) VALUES ('x')")
        conn.execute("COMMIT")


def sqlite_commit_floor(folder: str, n: int) -> Callable[[], float]:
    """``n`` one-row commits on a :func:`floor_db`: what any store that commits every step
    pays at least."""
    conn = floor_db(folder)

    def run() -> float:
        gc.collect()
        t0 = time.perf_counter()
        one_row_commits(conn, n)
        return time.perf_counter() - t0

    return run


def lg_sqlite(
    n: int, folder: str, traced: bool, synchronous: str | None = None
) -> tuple[Callable[[], float], Callable[[], None]]:
    """LangGraph + ``SqliteSaver``, an ``n``-chain compiled once; ``traced``: the
    OpenInference instrumentor on, into a ``BatchSpanProcessor`` with the no-op exporter,
    for the timed run only (it patches LangChain process-wide, so it is switched off for
    the other configurations); ``synchronous``: its connection's setting (None: SQLite's
    default, FULL)."""
    import peers_langgraph

    run, close = peers_langgraph.sqlite_chain(n, folder, synchronous)
    if not traced:

        def plain() -> float:
            gc.collect()
            t0 = time.perf_counter()
            run()
            return time.perf_counter() - t0

        return plain, close
    from openinference.instrumentation.langchain import LangChainInstrumentor

    tp, counting = provider(False)
    inst = LangChainInstrumentor()

    def traced_run() -> float:
        inst.instrument(tracer_provider=tp)
        try:
            before = counting.spans
            gc.collect()
            t0 = time.perf_counter()
            run()
            tp.force_flush()
            dt = time.perf_counter() - t0
        finally:
            inst.uninstrument()
        if counting.spans - before < n:
            raise AssertionError(f"OpenInference exported {counting.spans - before} spans for {n} nodes")
        return dt

    def close_all() -> None:
        close()
        tp.shutdown()

    return traced_run, close_all


# ----------------------------------------------------------------------------- running


def spread(by_size: dict[int, float]) -> float:
    """A flatness: the slowest size's figure over the fastest's (max/min)."""
    return max(by_size.values()) / min(by_size.values())


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def interleave(
    configs: dict[str, Callable[[], float]], reps: int, log: Callable[[str], None]
) -> dict[str, list[float]]:
    """Seconds of every timed repetition, by configuration: every repetition runs each
    configuration once from a rotating offset; the first is a warm-up."""
    names = list(configs)
    out: dict[str, list[float]] = {k: [] for k in names}
    for rep in range(reps + 1):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            dt = configs[name]()
            if rep:
                out[name].append(dt)
        if rep and (rep % 5 == 0 or rep == reps):
            log(f"  repetition {rep}/{reps}")
    return out


def pair_ratios(runs: dict[str, list[float]], slow: str, fast: str) -> list[float]:
    """How many times faster ``fast`` was than ``slow`` in each repetition."""
    return [a / b for a, b in zip(runs[slow], runs[fast])]


def paired(runs: dict[str, list[float]], slow: str, fast: str) -> float:
    """How many times faster ``fast`` is than ``slow``: the median over repetitions of the
    ratio of their times in the same repetition."""
    return med(pair_ratios(runs, slow, fast))


@dataclass
class Target:
    name: str
    wanted: str  # "≥ 8x", "≥ 85%", "≤ 1.3"
    measured: float | None
    floor: str
    #: the middle half of the repetitions' ratios (a ratio target); None for max/min of medians
    spread: tuple[float, float] | None = None

    @property
    def ok(self) -> bool | None:
        if self.measured is None:
            return None
        num = float(self.wanted.split()[1].rstrip("x%"))
        if self.wanted.endswith("%"):
            num /= 100
        return self.measured >= num if self.wanted.startswith("≥") else self.measured <= num


def middle_half(xs: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``xs``: where the middle half of the values lie."""
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def ratio_target(
    name: str, wanted: str, runs: dict[str, list[float]], slow: str, fast: str, floor: str
) -> Target:
    """A target on :func:`paired`'s ratio, with the middle half of the repetitions' ratios:
    how far this run's own noise reaches on either side of the median."""
    ratios = pair_ratios(runs, slow, fast)
    return Target(name, wanted, med(ratios), floor, spread=middle_half(ratios))


def lg_sqlite_configs(
    n: int, folder: str, configs: dict[str, Callable[[], float]]
) -> list[Callable[[], None]]:
    """LangGraph + ``SqliteSaver`` on an ``n``-chain, untraced and traced, at flowscope's
    durability and at its own default, added to ``configs``; returns their closers."""
    closers = []
    for sync, label in ((SAME_AS_STORE, LG_SAME), (None, LG_DEFAULT)):
        for traced in (False, True):
            run, close = lg_sqlite(n, folder, traced, sync)
            configs[label + (TRACED if traced else "")] = run
            closers.append(close)
    return closers


def durability_note(
    runs: dict[str, list[float]], unit: float, unit_name: str, same: str = LG_SAME, default: str = LG_DEFAULT
) -> str:
    """What an fsync at every commit costs each side (the paired median differences), and
    the full stack's ratio to LangGraph (``same``: at flowscope's durability; ``default``:
    at its own) in each pair of equal durability and in the mixed one."""

    def added(a: str, b: str) -> float:
        return med([(x - y) * unit for x, y in zip(runs[a], runs[b])])

    return (
        f"An fsync at every commit (SQLite's `synchronous=FULL`, LangGraph's default) costs LangGraph "
        f"{added(default, same):,.1f} {unit_name} and flowscope's full stack "
        f'{added(FULL_FSYNC, "full stack"):,.1f} (`durability="full"`; concurrent sessions share one per '
        f"group commit). At the same durability the full stack is {paired(runs, same, 'full stack'):.1f}x "
        f"LangGraph without it and {paired(runs, default, FULL_FSYNC):.1f}x with it; against LangGraph at its "
        f"default it is {paired(runs, default, 'full stack'):.1f}x (the comparison before 2026-12-06, which set "
        "flowscope's commit without an fsync against LangGraph's with one).\n"
    )


@dataclass
class Bench:
    sizes: Sizes
    only: set[str]
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    tmp: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="flowscope-targets-"))
    started: float = field(default_factory=time.time)
    out: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    sessions_floor: str = ""  # the flatness section's asyncio floor, shown under the worker's too

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.started:6.0f}s] {msg}", file=sys.stderr, flush=True)

    def p(self, text: str = "") -> None:
        self.out.append(text)

    def wants(self, section: str) -> bool:
        return not self.only or section in self.only

    def sync(self, coro_fn: Callable[[], Any]) -> Callable[[], float]:
        return lambda: self.loop.run_until_complete(coro_fn())

    def sqlite(self, durability: str = "normal") -> SqliteEventStore:
        return SqliteEventStore(os.path.join(self.tmp, f"{uuid.uuid4().hex}.db"), durability=durability)

    def table(self, title: str, runs: dict[str, list[float]], unit: float, unit_name: str) -> None:
        self.p(f"| {title} | {unit_name} (median) | middle half |\n| --- | ---: | ---: |")
        for k, v in runs.items():
            xs = [t * unit for t in v]
            low, high = middle_half(xs)
            self.p(f"| {k} | {med(xs):,.1f} | {low:,.1f}–{high:,.1f} |")
        self.p()

    def against_langgraph(self, n: int, floor: str, reps: int) -> dict[str, list[float]]:
        """An ``n``-chain on the engine alone, SQLite alone and the full stack (at both
        durabilities), the one-row commit floor (named ``floor``) and LangGraph + SqliteSaver
        (untraced and traced, at both durabilities): ``reps`` interleaved repetitions of each."""
        wf = W.chain(n)
        flows = {
            "engine alone (memory)": Flow(wf, MemoryEventStore(), False),
            "SQLite alone": Flow(wf, self.sqlite(), False),
            "full stack": Flow(wf, self.sqlite(), True),
            FULL_FSYNC: Flow(wf, self.sqlite("full"), True),
        }
        configs: dict[str, Callable[[], float]] = {k: self.sync(f.once) for k, f in flows.items()}
        configs[floor] = sqlite_commit_floor(self.tmp, n)
        closers = lg_sqlite_configs(n, self.tmp, configs)
        try:
            return interleave(configs, reps, self.log)
        finally:
            for f in flows.values():
                f.close()
            for c in closers:
                c()

    # ------------------------------------------------------------------- sections

    def chain(self) -> None:
        """The 200-chain: the full stack against LangGraph + SqliteSaver, untraced and traced."""
        n, s = self.sizes.chain, self.sizes
        self.log(f"{n}-chain")
        runs = self.against_langgraph(n, "floor: one-row commit per node", s.chain_reps)
        self.p(
            f"### {n}-chain, µs per node\n\n{s.chain_reps} timed repetitions after a warm-up, interleaved.\n"
        )
        self.table("configuration", runs, 1e6 / n, "µs/node")
        self.p(durability_note(runs, 1e6 / n, "µs per node"))
        lg, lgt = LG_SAME, LG_SAME + TRACED
        floor = (
            f"SQLite alone {paired(runs, lg, 'SQLite alone'):.1f}x; engine alone {paired(runs, lg, 'engine alone (memory)'):.0f}x; "
            f"one-row commit per node {paired(runs, lg, 'floor: one-row commit per node'):.0f}x"
        )
        floor_t = (
            f"SQLite alone {paired(runs, lgt, 'SQLite alone'):.1f}x; engine alone {paired(runs, lgt, 'engine alone (memory)'):.0f}x; "
            f"one-row commit per node {paired(runs, lgt, 'floor: one-row commit per node'):.0f}x"
        )
        added = {  # µs per node each side's telemetry adds: the median of the repetitions' differences
            side: med([(a - b) * 1e6 / n for a, b in zip(runs[traced], runs[plain])])
            for side, traced, plain in (("peer", lgt, lg), ("ours", "full stack", "SQLite alone"))
        }
        self.p(
            f"OpenInference's tracing costs LangGraph {paired(runs, lgt, lg):.2f}x its untraced time, "
            f"{added['peer']:,.1f} µs per node; flowscope's telemetry costs it "
            f"{paired(runs, 'full stack', 'SQLite alone'):.2f}x SQLite alone's, {added['ours']:,.1f} µs per node.\n"
        )
        self.targets += [
            ratio_target(
                f"{n}-chain: full stack vs LangGraph + SqliteSaver, same durability",
                "≥ 8x",
                runs,
                lg,
                "full stack",
                floor + f"; LangGraph at its default (FULL) {paired(runs, LG_DEFAULT, 'full stack'):.1f}x",
            ),
            ratio_target(
                f"{n}-chain: full stack vs LangGraph + SqliteSaver traced by OpenInference, same durability",
                "≥ 12x",
                runs,
                lgt,
                "full stack",
                floor_t
                + f"; LangGraph at its default (FULL) {paired(runs, LG_DEFAULT + TRACED, 'full stack'):.1f}x",
            ),
            ratio_target(
                f"{n}-chain: full stack's speed / SQLite alone's",
                "≥ 85%",
                runs,
                "SQLite alone",
                "full stack",
                f"SQLite alone {med(runs['SQLite alone']) * 1e6 / n:.0f} µs/node; engine alone "
                f"{med(runs['engine alone (memory)']) * 1e6 / n:.1f} µs/node",
            ),
        ]

    def invoke(self) -> None:
        """A 5-node workflow invocation end to end: start, run, finish, spans handed to the exporter."""
        n, s = self.sizes.invoke_nodes, self.sizes
        self.log(f"{n}-node invocation")
        runs = self.against_langgraph(n, f"floor: {n} one-row commits", s.invoke_reps)
        self.p(
            f"### A {n}-node workflow invocation, µs per invocation\n\nStart, run, finish, spans handed to the "
            f"exporter (`force_flush` inside the timing, both sides). {s.invoke_reps} timed repetitions.\n"
        )
        self.table("configuration", runs, 1e6, "µs/invocation")
        self.p(durability_note(runs, 1e6, "µs per invocation"))
        lgt = LG_SAME + TRACED
        self.targets.append(
            ratio_target(
                f"{n}-node invocation: full stack vs LangGraph + SqliteSaver traced by OpenInference, same durability",
                "≥ 10x",
                runs,
                lgt,
                "full stack",
                f"SQLite alone {paired(runs, lgt, 'SQLite alone'):.1f}x; engine alone {paired(runs, lgt, 'engine alone (memory)'):.0f}x; "
                f"untraced LangGraph {paired(runs, LG_SAME, 'full stack'):.1f}x; "
                f"LangGraph at its default (FULL) {paired(runs, LG_DEFAULT + TRACED, 'full stack'):.1f}x",
            )
        )

    def sessions(self) -> None:
        """1,000 concurrent sessions of a 10-chain against LangGraph + AsyncSqliteSaver."""
        import peers_langgraph

        k, n, s = self.sizes.sessions, self.sizes.session_chain, self.sizes
        self.log(f"{k} sessions x {n}-chain")
        wf = W.chain(n)
        flows = {
            "engine alone (memory)": Flow(wf, MemoryEventStore(), False),
            "SQLite alone": Flow(wf, self.sqlite(), False),
            "full stack": Flow(wf, self.sqlite(), True),
            FULL_FSYNC: Flow(wf, self.sqlite("full"), True),
        }
        configs: dict[str, Callable[[], float]] = {
            key: self.sync(lambda f=f: f.once(k)) for key, f in flows.items()
        }
        lg_onces = []
        for sync, label in ((SAME_AS_STORE, LGA_SAME), (None, LGA_DEFAULT)):
            lg_once = self.loop.run_until_complete(peers_langgraph.async_sqlite_chain(n, k, self.tmp, sync))
            configs[label] = self.sync(lg_once)
            lg_onces.append(lg_once)
        for f in flows.values():  # a smaller warm-up than a repetition: LangGraph's takes ~30 s
            self.loop.run_until_complete(f.once(min(k, 100)))
        for lg_once in lg_onces:
            self.loop.run_until_complete(lg_once(min(k, 100)))
        names = list(configs)
        runs: dict[str, list[float]] = {key: [] for key in names}
        for rep in range(s.session_reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                runs[name].append(configs[name]())
            self.log(f"  repetition {rep + 1}/{s.session_reps}")
        for f in flows.values():
            f.close()
        # AsyncSqliteSaver's connection is a non-daemon aiosqlite thread: closed here, or the
        # interpreter waits for it at exit and the command never ends
        for lg_once in lg_onces:
            self.loop.run_until_complete(lg_once.keep[0].__aexit__(None, None, None))
        self.p(
            f"### {k:,} concurrent sessions of a {n}-node chain, µs per node run\n\n{s.session_reps} timed "
            "repetitions after a warm-up of 100 sessions each; LangGraph runs `ainvoke` of every thread concurrently.\n"
        )
        self.table("configuration", runs, 1e6 / (k * n), "µs/node run")
        lga = LGA_SAME
        self.p("Node runs/s: " + ", ".join(f"{key} {k * n / med(v):,.0f}" for key, v in runs.items()) + ".\n")
        self.p(durability_note(runs, 1e6 / (k * n), "µs per node run", LGA_SAME, LGA_DEFAULT))
        self.targets += [
            ratio_target(
                f"{k:,} sessions: full stack vs LangGraph + AsyncSqliteSaver, same durability",
                "≥ 12x",
                runs,
                lga,
                "full stack",
                f"SQLite alone {paired(runs, lga, 'SQLite alone'):.1f}x; engine alone {paired(runs, lga, 'engine alone (memory)'):.0f}x; "
                f"LangGraph at its default (FULL) {paired(runs, LGA_DEFAULT, 'full stack'):.1f}x",
            ),
            ratio_target(
                f"{k:,} sessions: full stack's speed / SQLite alone's",
                "≥ 85%",
                runs,
                "SQLite alone",
                "full stack",
                f"engine alone {k * n / med(runs['engine alone (memory)']):,.0f} node runs/s",
            ),
        ]

    def flat(self) -> None:
        """Per node, 20 -> 2,000 nodes; per node run, 10 -> 10,000 sessions; memory per session."""
        s = self.sizes
        self.log("flatness in the bench process")
        chains: dict[str, dict[int, float]] = {"full stack": {}, "SQLite alone": {}}
        for n in s.flat_chains:
            wf = W.chain(n)
            flows = {
                "full stack": Flow(wf, self.sqlite(), True),
                "SQLite alone": Flow(wf, self.sqlite(), False),
            }
            reps = s.flat_reps if n < 2000 else max(1, s.flat_reps - 2)
            runs = interleave({k: self.sync(f.once) for k, f in flows.items()}, reps, lambda _m: None)
            for k, f in flows.items():
                chains[k][n] = med(runs[k]) * 1e6 / n
                f.close()
        sess: dict[str, dict[int, float]] = {"full stack": {}, "SQLite alone": {}}
        mem: dict[int, float] = {}
        for k in s.flat_sessions:
            wf = W.chain(10)
            # A lease of two minutes: the memory pass runs under tracemalloc, which slows
            # 10,000 sessions (and the lease keeper's rounds) past a 15 s lease. The timed
            # runs end before any renewal is due with either lease.
            flows = {
                "full stack": Flow(wf, self.sqlite(), True, lease_s=120.0),
                "SQLite alone": Flow(wf, self.sqlite(), False, lease_s=120.0),
            }
            for f in flows.values():
                self.loop.run_until_complete(f.once(min(k, 100)))
            reps = 1 if k >= 10000 else (s.flat_reps if k <= 100 else 2)
            runs = {key: [] for key in flows}
            for rep in range(reps):
                order = list(flows) if rep % 2 == 0 else list(flows)[::-1]
                for key in order:
                    runs[key].append(self.loop.run_until_complete(flows[key].once(k)))
            for key in flows:
                sess[key][k] = med(runs[key]) * 1e6 / (k * 10)
            gc.collect()
            tracemalloc.start()
            self.loop.run_until_complete(flows["full stack"].once(k))
            _cur, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            mem[k] = peak / k / 1024
            for f in flows.values():
                f.close()
            self.log(f"  {k} sessions done")
        # The floor: plain asyncio tasks taking 10 steps each through a per-turn batch, as
        # sessions do through group commit; bare, and with a session's worth of objects.
        bare = asyncio_floor.measure(0, 0, list(s.flat_sessions), self.loop)
        shaped = asyncio_floor.measure(58, 13, list(s.flat_sessions), self.loop)
        self.p("### Flatness in the bench process\n")
        self.p("| chain length | full stack µs/node | SQLite alone µs/node |\n| ---: | ---: | ---: |")
        for n in s.flat_chains:
            self.p(f"| {n:,} | {chains['full stack'][n]:.1f} | {chains['SQLite alone'][n]:.1f} |")
        self.p(
            "\n| concurrent sessions (10-chain) | full stack µs/node run | SQLite alone µs/node run | full stack memory per session (KiB, tracemalloc peak / sessions) |\n| ---: | ---: | ---: | ---: |"
        )
        for k in s.flat_sessions:
            self.p(f"| {k:,} | {sess['full stack'][k]:.1f} | {sess['SQLite alone'][k]:.1f} | {mem[k]:.1f} |")
        self.p(
            "\nThe floor under the sessions row (`bench/asyncio_floor.py`): k plain asyncio tasks of 10 steps "
            "through a per-turn batch, no flowscope; bare, and keeping 58 objects per task and 13 per step "
            "(what a live session and a node run keep).\n"
        )
        self.p(
            "| concurrent tasks | bare µs/step | with a session's objects µs/step |\n| ---: | ---: | ---: |"
        )
        for k in s.flat_sessions:
            self.p(f"| {k:,} | {bare[k]:.2f} | {shaped[k]:.2f} |")
        self.p()

        lo_c, hi_c, lo_s, hi_s = s.flat_chains[0], s.flat_chains[-1], s.flat_sessions[0], s.flat_sessions[-1]
        self.sessions_floor = (
            f"plain asyncio {spread(bare):.2f}, with a session's objects {spread(shaped):.2f}; "
        )
        self.targets += [
            Target(
                f"bench process: per node, {lo_c:,} → {hi_c:,} nodes (max/min)",
                "≤ 1.3",
                spread(chains["full stack"]),
                f"SQLite alone {spread(chains['SQLite alone']):.2f}",
            ),
            Target(
                f"bench process: per node run, {lo_s:,} → {hi_s:,} sessions (max/min)",
                "≤ 1.3",
                spread(sess["full stack"]),
                f"SQLite alone {spread(sess['SQLite alone']):.2f}; plain asyncio {spread(bare):.2f}, "
                f"with a session's objects {spread(shaped):.2f}; {mem[hi_s]:.1f} KiB per session at {hi_s:,}",
            ),
        ]

    def worker(self) -> None:
        """The same flatness in a ``flowscope worker`` process, with its full stack on and
        with none of it (SQLite alone: the same command without tracing or metrics)."""
        s = self.sizes
        self.log("flatness in a flowscope worker")
        kinds = {"full stack": True, "SQLite alone": False}
        chain_rows = {kind: {n: [] for n in s.flat_chains} for kind in kinds}
        sess_rows = {kind: {k: [] for k in s.flat_sessions} for kind in kinds}
        hwm: dict[int, float] = {}
        for rep in range(s.worker_chain_reps):
            for n in s.flat_chains:  # about worker_node_runs node runs each, one session at a time
                count = max(2, s.worker_node_runs // n)
                for kind in kinds if rep % 2 == 0 else list(kinds)[::-1]:
                    per_run, _mem = self.worker_once(n, count, concurrency=1, full=kinds[kind])
                    chain_rows[kind][n].append(per_run)
                took = ", ".join(f"{kind} {rows[n][-1]:.1f}" for kind, rows in chain_rows.items())
                self.log(f"  worker: {n}-chain done ({took} µs/node)")
        for rep in range(s.worker_reps):
            for k in s.flat_sessions:
                for kind in kinds if rep % 2 == 0 else list(kinds)[::-1]:
                    per_run, mem_kib = self.worker_once(
                        10, max(k, s.worker_sessions_min), concurrency=k, full=kinds[kind]
                    )
                    sess_rows[kind][k].append(per_run)
                    if kinds[kind]:
                        hwm[k] = max(hwm.get(k, 0.0), mem_kib)
                took = ", ".join(f"{kind} {rows[k][-1]:.1f}" for kind, rows in sess_rows.items())
                self.log(f"  worker: {k} sessions done ({took} µs/node run)")
        chains = {kind: {n: med(v) for n, v in rows.items()} for kind, rows in chain_rows.items()}
        sess = {kind: {k: med(v) for k, v in rows.items()} for kind, rows in sess_rows.items()}
        full, alone = chains["full stack"], chains["SQLite alone"]
        lo_s, hi_s = s.flat_sessions[0], s.flat_sessions[-1]
        self.p("### Flatness in a `flowscope worker` process\n")
        self.p(
            "`bench/worker_main.py worker worker_flows:WORKFLOWS --otlp-endpoint ... --metrics-port 0`: the real "
            "command with its full stack on (tracing as `configure_tracing` builds it, into the no-op exporter; "
            "metrics), SQLite; SQLite alone is the same command without `--otlp-endpoint` and `--metrics-port`. "
            "Submitted sessions; the figure is the time from the first `run_started` to the last "
            "`run_finished` in the log, per node run; memory is the full stack's peak RSS (`VmHWM`). At each "
            f"concurrency the worker runs at least {s.worker_sessions_min:,} sessions, `--concurrency` of them at a time. "
            f"Medians of {s.worker_chain_reps} worker processes per chain length, {s.worker_reps} per concurrency, "
            "the two kinds alternated.\n"
        )
        self.p(
            "| chain length (one session at a time) | full stack µs/node | SQLite alone µs/node |\n| ---: | ---: | ---: |"
        )
        for n in s.flat_chains:
            self.p(f"| {n:,} | {full[n]:.1f} | {alone[n]:.1f} |")
        self.p(
            "\n| concurrent sessions (10-chain, `--concurrency` = sessions) | full stack µs/node run | "
            "SQLite alone µs/node run | full stack peak RSS (MiB) | "
            f"per session above {lo_s:,} sessions' (KiB) |\n| ---: | ---: | ---: | ---: | ---: |"
        )
        for k in s.flat_sessions:
            extra = "" if k == lo_s else f"{(hwm[k] - hwm[lo_s]) / (k - lo_s):.1f}"
            self.p(
                f"| {k:,} | {sess['full stack'][k]:.1f} | {sess['SQLite alone'][k]:.1f} | "
                f"{hwm[k] / 1024:.0f} | {extra} |"
            )
        self.p()

        lo_c, hi_c = s.flat_chains[0], s.flat_chains[-1]
        self.targets += [
            Target(
                f"worker process: per node, {lo_c:,} → {hi_c:,} nodes (max/min)",
                "≤ 1.3",
                spread(full),
                f"SQLite alone {spread(alone):.2f}",
            ),
            Target(
                f"worker process: per node run, {lo_s:,} → {hi_s:,} sessions (max/min)",
                "≤ 1.3",
                spread(sess["full stack"]),
                f"SQLite alone {spread(sess['SQLite alone']):.2f}; {self.sessions_floor}"
                f"{(hwm[hi_s] - hwm[lo_s]) / (hi_s - lo_s):.1f} KiB per session at {hi_s:,}",
            ),
        ]

    def worker_once(self, n: int, sessions: int, concurrency: int, full: bool = True) -> tuple[float, float]:
        """A ``flowscope worker`` serving ``sessions`` submitted ``n``-chains: µs per node run
        from the first claim to the last completion, and its peak RSS in KiB. ``full``: with
        tracing and metrics, else SQLite alone (the same command, neither option given)."""
        db = os.path.join(self.tmp, f"worker-{uuid.uuid4().hex}.db")
        store = SqliteEventStore(db)
        runner = Runner(W.chain(n, name=f"chain{n}"), store)
        for _ in range(sessions):
            runner.submit(0)
        store.close()
        cmd = [
            sys.executable,
            str(HERE / "worker_main.py"),
            "worker",
            "worker_flows:WORKFLOWS",
            "--db",
            db,
            "--concurrency",
            str(concurrency),
            "--poll",
            "50ms",
            "--lease",
            "60s",
        ]
        if full:
            cmd += ["--otlp-endpoint", "http://127.0.0.1:9", "--metrics-port", "0"]
        env = dict(
            {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},  # no tracing but ours
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(HERE), os.environ.get("PYTHONPATH", "")]),
            FLOWSCOPE_BENCH_CHAINS=str(n),
        )
        proc = subprocess.Popen(
            cmd, cwd=str(HERE), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        conn = sqlite3.connect(db)
        last_progress, last_done = time.time(), -1
        try:
            while True:
                time.sleep(0.1)
                done = conn.execute(
                    "SELECT count(*) FROM sessions WHERE status != 'queued' AND status != 'running'"
                ).fetchone()[0]
                if done >= sessions:
                    break
                if done != last_done:
                    last_progress, last_done = time.time(), done
                if proc.poll() is not None or time.time() - last_progress > 120:
                    raise RuntimeError(
                        f"the worker stopped, or finished no session in 120 s: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}"
                    )
            peak_kib = _vm_hwm(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        first, last = conn.execute(
            "SELECT (SELECT min(ts) FROM events WHERE type = 'run_started'), (SELECT max(ts) FROM events WHERE type = 'run_finished')"
        ).fetchone()
        bad = conn.execute("SELECT count(*) FROM sessions WHERE status != 'completed'").fetchone()[0]
        # every span reached the exporter: the worker's WatermarkExporter put each session's on record
        unshipped = (
            conn.execute(
                "SELECT count(*) FROM sessions LEFT JOIN span_exports AS x USING (session_id) "
                "WHERE last_seq > coalesce(x.exported_seq, 0)"
            ).fetchone()[0]
            if full
            else 0
        )
        conn.close()
        os.unlink(db)
        if bad:
            raise AssertionError(f"{bad} of {sessions} sessions did not complete in the worker")
        if unshipped:
            raise AssertionError(
                f"the spans of {unshipped} of {sessions} sessions did not reach the worker's exporter"
            )
        return (last - first) * 1e6 / (n * sessions), peak_kib

    def adk(self) -> None:
        """The ADK workflow engine, 200-chain, in memory."""
        import peers_adk

        n, s = self.sizes.chain, self.sizes
        why = peers_adk.available()
        if why:
            self.skipped["adk"] = why
            return
        self.log(f"ADK {n}-chain")
        wf = W.chain(n)
        flows = {
            "engine alone (memory)": Flow(wf, MemoryEventStore(), False),
            "full stack": Flow(wf, self.sqlite(), True),
        }
        configs: dict[str, Callable[[], float]] = {k: self.sync(f.once) for k, f in flows.items()}
        key = f"chain{n}"
        spec = W.WORKFLOWS.get(key) or W.WorkflowSpec(key, key, n, n, key)
        fn, _na, _close = peers_adk.adk_configs()[0].make(key, spec, self.tmp)

        async def adk_once() -> float:
            sid = await fn.new_session()
            gc.collect()
            t0 = time.perf_counter()
            out = await fn(sid)
            dt = time.perf_counter() - t0
            if out != n:
                raise AssertionError(f"ADK returned {out!r}")
            return dt

        configs["ADK Workflow (InMemorySessionService)"] = self.sync(adk_once)
        runs = interleave(configs, max(3, s.chain_reps // 3), self.log)
        for f in flows.values():
            f.close()
        self.p(f"### ADK workflow engine, {n}-chain, µs per node\n")
        self.table("configuration", runs, 1e6 / n, "µs/node")
        adk = "ADK Workflow (InMemorySessionService)"
        self.targets.append(
            ratio_target(
                f"{n}-chain: full stack vs ADK Workflow",
                "≥ 10x",
                runs,
                adk,
                "full stack",
                f"engine alone {paired(runs, adk, 'engine alone (memory)'):.0f}x (both in memory)",
            )
        )

    def pg(self) -> None:
        """PostgreSQL: flowscope against LangGraph's PostgresSaver on the same durable server."""
        try:
            import psycopg
            from langgraph.checkpoint.postgres import PostgresSaver

            import peers_langgraph
            from flowscope.store import PostgresEventStore
            from pg_cluster import PgCluster
        except ImportError as exc:
            self.skipped["pg"] = f"{exc}"
            return
        n, s = self.sizes.chain, self.sizes
        self.log(f"PostgreSQL {n}-chain: starting a durable cluster")
        try:
            cluster = PgCluster.start(durable=True)
        except Exception as exc:
            self.skipped["pg"] = f"no PostgreSQL server: {exc}"
            return
        opened: list[Any] = []
        try:
            wf = W.chain(n)
            flows = {
                "PostgreSQL alone": Flow(wf, PostgresEventStore(cluster.new_database("alone")), False),
                "full stack on PostgreSQL": Flow(wf, PostgresEventStore(cluster.new_database("full")), True),
            }
            configs: dict[str, Callable[[], float]] = {k: self.sync(f.once) for k, f in flows.items()}
            cm = PostgresSaver.from_conn_string(cluster.new_database("lg"))
            saver = cm.__enter__()
            opened.append(cm)
            saver.setup()
            graph = peers_langgraph._chain_graph(n).compile(checkpointer=saver)

            def lg() -> float:
                cfg = {"configurable": {"thread_id": new_id()}, "recursion_limit": 2 * n + 10}
                gc.collect()
                t0 = time.perf_counter()
                out = graph.invoke({"x": 0}, cfg)
                dt = time.perf_counter() - t0
                assert out["x"] == n
                return dt

            configs["LangGraph + PostgresSaver"] = lg
            floor = psycopg.connect(cluster.new_database("floor"), autocommit=True)
            opened.append(floor)
            floor.execute("CREATE TABLE step (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)")

            def commit_floor() -> float:
                gc.collect()
                t0 = time.perf_counter()
                for _ in range(n):
                    floor.execute("INSERT INTO step (v) VALUES ('x')", prepare=True)
                return time.perf_counter() - t0

            configs["floor: durable one-row commit per node"] = commit_floor
            runs = interleave(configs, s.pg_reps, self.log)
            for f in flows.values():
                f.close()
        finally:
            for o in opened:
                if isinstance(o, psycopg.Connection):
                    o.close()
                else:  # PostgresSaver's context manager
                    o.__exit__(None, None, None)
            cluster.stop()
        self.p(
            f"### PostgreSQL, {n}-chain, µs per node\n\nA throwaway cluster of Debian's binaries with the server's "
            "durable defaults (fsync on, `synchronous_commit=on`), every configuration on its own database.\n"
        )
        self.table("configuration", runs, 1e6 / n, "µs/node")
        lg_key = "LangGraph + PostgresSaver"
        self.targets.append(
            ratio_target(
                f"{n}-chain on PostgreSQL: full stack vs LangGraph + PostgresSaver",
                "≥ 4x",
                runs,
                lg_key,
                "full stack on PostgreSQL",
                f"PostgreSQL alone {paired(runs, lg_key, 'PostgreSQL alone'):.1f}x; durable one-row commit per node "
                f"{paired(runs, lg_key, 'floor: durable one-row commit per node'):.1f}x "
                f"({med(runs['floor: durable one-row commit per node']) * 1e6 / n:.0f} µs)",
            )
        )

    # --------------------------------------------- the targets in seconds (limits.py)

    def resume(self) -> None:
        """A resume of a 100,000-event session, end to end in a new process."""
        s = self.sizes
        self.log(f"resume of a {s.resume_events:,}-event session")
        r = limits.measure_resume(self.tmp, s.resume_events, s.resume_reps)
        low, high = middle_half(r.runs)
        self.p(f"### Resume of a {r.events:,}-event session, seconds\n")
        self.p(
            f"A {r.nodes:,}-node chain paused at its last node, recorded on SQLite by a real run (which kept a "
            "snapshot of the fold); `Runner.resume()` with the answer, until completed, in a new interpreter each "
            f"time (timed inside it, after its imports), on a fresh copy of the file; {len(r.runs)} timed after a "
            "warm-up.\n"
        )
        self.p("| | seconds (median) | middle half |\n| --- | ---: | ---: |")
        self.p(f"| resume, end to end | {r.median_s:.3f} | {low:.3f}–{high:.3f} |")
        self.p(f"| the store's read of the whole log (a resume without the snapshot) | {r.read_s:.3f} | |")
        self.p(f"| the fold of the whole log | {r.fold_s:.3f} | |\n")
        self.targets.append(
            Target(
                f"resume of a {r.events:,}-event session, end to end in a new process",
                f"≤ {limits.RESUME_MAX_S:g} s",
                r.median_s,
                f"without the snapshot: read {r.read_s:.3f} s + fold {r.fold_s:.3f} s",
                (low, high),
            )
        )

    def scrape(self) -> None:
        """A ``StoreCollector`` scrape over 1,000,000 events."""
        s = self.sizes
        self.log(f"StoreCollector scrape over {s.scrape_events:,} events (building the store)")
        sc = limits.measure_scrape(self.tmp, s.scrape_events, s.scrape_reps)
        ms = [t * 1e3 for t in sc.runs]
        low, high = middle_half(ms)
        self.p(f"### A `StoreCollector` scrape over {sc.events:,} events, milliseconds\n")
        self.p(
            f"{sc.sessions:,} sessions of 100 events (2% left open: running with a stale heartbeat, waiting for "
            f"input, waiting for an overdue job), {sc.node_runs:,} node runs of which {sc.open_runs:,} open, "
            f"appended one session per transaction in {sc.build_s:.0f} s; `generate_latest()` on a registry "
            f"holding only the collector ({sc.samples} samples), {len(sc.runs)} timed after a warm-up.\n"
        )
        self.p("| | ms (median) | middle half |\n| --- | ---: | ---: |")
        self.p(f"| scrape (`generate_latest`) | {statistics.median(ms):.1f} | {low:.1f}–{high:.1f} |")
        self.p(f"| the collector's `collect()` alone | {sc.collect_s * 1e3:.1f} | |\n")
        self.targets.append(
            Target(
                f"StoreCollector scrape over {sc.events:,} events",
                f"≤ {limits.SCRAPE_MAX_S * 1e3:g} ms",
                statistics.median(ms),
                f"`collect()` alone {sc.collect_s * 1e3:.1f} ms",
                (low, high),
            )
        )

    def console(self) -> None:
        """The console over 100,000 sessions and a session of 10,000 node runs, in Chromium."""
        s = self.sizes
        try:
            import playwright  # noqa: F401

            import console_bench
        except ImportError as exc:
            self.skipped["console"] = f"{exc} (the ui extra and playwright)"
            return
        if not os.path.exists(console_bench.CHROMIUM):
            self.skipped["console"] = f"no Chromium at {console_bench.CHROMIUM} (apt-get install chromium)"
            return
        self.log(f"console over {s.console_sessions:,} sessions (building the store)")
        fig = limits.measure_console(self.tmp, s.console_sessions, s.console_runs)
        self.p(f"### The console over {s.console_sessions:,} sessions, seconds\n")
        self.p(
            "`bench/console_bench.py`'s figures: the server's time in process (`flowscope.console.api`), then "
            "`flowscope ui --read-only` and Debian's Chromium (Playwright) loading each page, medians of "
            f"{s.console_runs} loads; navigation to drawn is the page's `flowscope-ready` mark, set once its rows "
            "are in the page.\n"
        )
        self.p("| what | seconds |\n| --- | ---: |")
        for k, v in fig.items():
            self.p(f"| {k} | {v:.3f} |")
        self.p()
        big = "session of 10,000 runs"
        listing = {k: v for k, v in fig.items() if not k.startswith(big) and "first paint" not in k}
        worst = max(listing, key=lambda k: listing[k])
        self.targets += [
            Target(
                f"console: the session list over {s.console_sessions:,} sessions (slowest of its requests and "
                "navigation to drawn)",
                f"≤ {limits.CONSOLE_MAX_S:g} s",
                listing[worst],
                f"slowest: {worst}; first paint {fig['the session list: first paint']:.3f} s",
            ),
            Target(
                "console: a session of 10,000 node runs (slower of its request and navigation to drawn)",
                f"≤ {limits.CONSOLE_MAX_S:g} s",
                max(fig[big], fig[f"{big}: navigation to drawn"]),
                f"first paint {fig[f'{big}: first paint']:.3f} s",
            ),
        ]

    # ------------------------------------------------------------------- report

    def run(self) -> int:
        steps = {
            "chain": self.chain,
            "invoke": self.invoke,
            "sessions": self.sessions,
            "flat": self.flat,
            "worker": self.worker,
            "adk": self.adk,
            "pg": self.pg,
            "resume": self.resume,
            "scrape": self.scrape,
            "console": self.console,
        }
        asyncio.set_event_loop(self.loop)
        load = os.getloadavg()
        for name, fn in steps.items():
            if not self.wants(name):
                continue
            try:
                fn()
            except Exception as exc:  # a section that fails is reported, and its targets are not met
                import traceback

                traceback.print_exc()
                self.skipped[name] = f"{type(exc).__name__}: {exc}"
        took = time.time() - self.started
        header = [
            f"`PYTHONPATH=src python bench/targets.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(self.started))}, {took:.0f} s; "
            f"load average (1, 5, 15 min) at start {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}, at the end "
            + ", ".join(f"{x:.1f}" for x in os.getloadavg())
            + f"; {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}.",
            "",
            "Versions: "
            + ", ".join(
                f"{d} {_version(d)}"
                for d in (
                    "langgraph",
                    "langgraph-checkpoint",
                    "langgraph-checkpoint-sqlite",
                    "langgraph-checkpoint-postgres",
                    "langchain-core",
                    "openinference-instrumentation-langchain",
                    "google-adk",
                    "opentelemetry-sdk",
                    "prometheus-client",
                    "psycopg",
                )
            )
            + ".",
            "",
        ]
        table = [
            "### Targets\n",
            "| target | wanted | measured (middle half of the repetitions) | floor, same run | |",
            "| --- | ---: | ---: | --- | --- |",
        ]
        expected = _expected_targets(self.sizes, self.only)
        for t in self.targets:
            m = t.measured
            shown = "—" if m is None else _shown(t.wanted, m)
            if m is not None and t.spread is not None:
                shown += f" ({_shown(t.wanted, t.spread[0])}–{_shown(t.wanted, t.spread[1])})"
            table.append(f"| {t.name} | {t.wanted} | {shown} | {t.floor} | {'pass' if t.ok else 'MISS'} |")
        missing = max(0, expected - len(self.targets))
        for name, why in self.skipped.items():
            table.append(f"| section `{name}` | | not measured | {why} | MISS |")
        if missing and not self.skipped:
            table.append(f"| {missing} target(s) of the sections not run (`--only`) | | not measured | | |")
        text = "\n".join(header + self.out + table) + "\n"
        print(text)
        shutil.rmtree(self.tmp, ignore_errors=True)
        failed = [t for t in self.targets if not t.ok] or list(self.skipped)
        return 1 if failed else 0


def _shown(wanted: str, value: float) -> str:
    """A measured value as its target reads: a percentage, a ratio (``8.1x``) or a max/min."""
    if wanted.endswith("%"):
        return f"{value:.0%}"
    if wanted.endswith(" ms"):
        return f"{value:.1f} ms"
    if wanted.endswith(" s"):
        return f"{value:.3f} s"
    return f"{value:.1f}x" if wanted.endswith("x") else f"{value:.2f}"


def _expected_targets(sizes: Sizes, only: set[str]) -> int:
    per = {"chain": 3, "invoke": 1, "sessions": 2, "flat": 2, "worker": 2, "adk": 1, "pg": 1}
    per.update(resume=1, scrape=1, console=2)
    return sum(v for k, v in per.items() if not only or k in only)


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _vm_hwm(pid: int) -> float:
    """A process's peak resident set size in KiB (``VmHWM``); 0 where /proc has none."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny sizes: checks that the bench runs, measures nothing"
    )
    ap.add_argument("--only", default="", help=f"some sections, comma-separated: {','.join(SECTIONS)}")
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    if only - set(SECTIONS):
        ap.error(
            f"--only: unknown section(s) {', '.join(sorted(only - set(SECTIONS)))}; choose from {','.join(SECTIONS)}"
        )
    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    return Bench(sizes, only).run()


if __name__ == "__main__":
    sys.exit(main())
