"""flowscope against LangGraph and the Agent Development Kit, side by side, in one run.

    python bench/harness.py            # the full run (about 5-10 minutes on 2 cores): prints the report (--out FILE writes it)
    python bench/harness.py --quick    # a smoke run (about a minute)
                                       # unless --out is given

What it does (DESIGN.md section 10):

- builds the same workflows (``workflows.py``) on flowscope in five configurations and on
  the peers (``peers_langgraph.py``, ``peers_adk.py``);
- runs them in ONE process, INTERLEAVED: every repetition visits every workflow and, for
  each, every configuration once (starting at a rotating offset), so machine noise hits
  all configurations alike; the first repetition is a warm-up and is discarded;
- reports medians of at least 5 runs, µs per node, ratios against flowscope's engine and
  full stack and against the peers measured in this same run;
- measures the store figures (append throughput, resume of a 100,000-event session,
  StoreCollector scrape over 1,000,000 events), reusing ``store_bench.py`` /
  ``metrics_bench.py`` where they provide them;
- checks the targets and, where one is missed, profiles the flowscope configuration with
  cProfile and records the hot spots;
- prints its report (``--out FILE`` writes it; ``bench/RESULTS.md`` holds ``targets.py``'s run).

Outputs are checked after every run (a benchmark of a broken run measures nothing).
``gc.collect()`` runs before every measurement, outside the timing. Async frameworks run
on one long-lived event loop; the timer is read inside the coroutine, so loop start-up is
not counted. Per-run set-up that is not part of running a workflow (a session row for ADK,
a thread id for LangGraph, a session id for flowscope) is done outside the timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime as _dt
import gc
import io
import math
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from flowscope.engine.ids import new_id

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import workflows as W  # noqa: E402  (bench/ is on sys.path)
from limits import (  # noqa: E402
    RESUME_MAX_S,
    SCRAPE_MAX_S,
    measure_resume,
    measure_scrape,
    resume_workflow,
)

# ------------------------------------------------------------------------- targets

FULL_STACK_MAX_US = 250.0  # full stack, 200-chain, per node
ENGINE_MAX_US = 40.0  # engine alone, 200-chain, per node
FLAT_MAX = 1.3  # per-node cost from 20 to 2,000 nodes
VS_LANGGRAPH_MIN = 8.0  # × faster than LangGraph + SqliteSaver
VS_ADK_MIN = 10.0  # × faster than ADK's Workflow


# A run shorter than SHORT_S is measured warm: an untimed run first, then enough runs back
# to back to fill INNER_TARGET_S, their mean being one measurement. Longer runs are timed
# once per repetition (a few hundred µs of cold caches is noise at that length).
SHORT_S = 0.050
INNER_TARGET_S = 0.020

# ------------------------------------------------------------------------- the cases


@dataclass
class Case:
    """One (workflow, configuration) pair and its measurements."""

    wf: W.WorkflowSpec
    key: str  # configuration key
    label: str
    family: str  # flowscope | langgraph | adk
    reps: int
    run: Callable[[], float] | None = None  # one timed run; returns seconds
    close: Callable[[], None] | None = None
    na: str | None = None  # why this case is not measured
    times: list[float] = field(default_factory=list)
    error: str | None = None
    inner: int = 1  # runs per measurement (back to back; the measurement is their mean)
    prime: bool = False  # an untimed run first, to warm the caches

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def us_per_node(self) -> float | None:
        m = self.median
        return None if m is None else m * 1e6 / self.wf.nodes


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick: bool = args.quick
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.tmp = W.new_tmpdir()
        self.cases: list[Case] = []
        self.notes: list[str] = []
        self.store: dict[str, Any] = {}
        self.profiles: list[tuple[str, str]] = []
        self.started = time.time()
        self.peer_status: dict[str, str | None] = {}
        self.load_before = _loadavg()

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- building cases

    def workflows(self) -> list[W.WorkflowSpec]:
        keys = ["chain20", "chain200", "chain2000", "fanout50", "nested", "pause200"]
        if self.args.only:
            keys = [k for k in keys if k in self.args.only.split(",")]
        return [W.WORKFLOWS[k] for k in keys]

    def reps_for(self, wf: W.WorkflowSpec) -> int:
        if self.args.reps:
            return self.args.reps
        if self.quick:
            return 2
        return 5 if wf.key == "chain2000" else 7

    def build(self) -> None:
        import peers_adk
        import peers_langgraph

        self.peer_status = {"langgraph": peers_langgraph.available(), "adk": peers_adk.available()}
        if self.args.no_peers:
            self.peer_status = {"langgraph": "skipped (--no-peers)", "adk": "skipped (--no-peers)"}
        for wf in self.workflows():
            reps = self.reps_for(wf)
            for cfg in W.flowscope_configs():
                case = Case(wf, cfg.key, cfg.label, "flowscope", reps)
                why = cfg.available
                if why:
                    case.na = f"not landed yet ({why})"
                else:
                    self._flowscope_case(case, cfg)
                self.cases.append(case)
            for cfg in peers_langgraph.langgraph_configs():
                case = Case(wf, cfg.key, cfg.label, "langgraph", reps)
                if self.peer_status["langgraph"]:
                    case.na = f"LangGraph unavailable: {self.peer_status['langgraph']}"
                elif self.quick and wf.key == "chain2000":
                    case.na = "skipped in --quick"
                else:
                    self._sync_case(case, cfg.make(wf.key, wf, self.tmp))
                self.cases.append(case)
            for cfg in peers_adk.adk_configs():
                case = Case(wf, cfg.key, cfg.label, "adk", reps)
                if self.peer_status["adk"]:
                    case.na = f"ADK unavailable: {self.peer_status['adk']}"
                elif self.quick and wf.key == "chain2000":
                    case.na = "skipped in --quick (about 20 s per run)"
                else:
                    self._adk_case(case, cfg.make(wf.key, wf, self.tmp))
                self.cases.append(case)

    def _flowscope_case(self, case: Case, cfg: W.FlowscopeConfig) -> None:
        wf = W.build_flowscope(case.wf.key)
        runner, after_run, close = cfg.make(wf, self.tmp)
        loop = self.loop
        pause = case.wf.key == "pause200"

        async def timed(sid: str) -> tuple[float, Any]:
            t0 = time.perf_counter()
            res = await runner.run(0, session_id=sid)
            if pause:
                if res.status != "paused":
                    raise AssertionError(f"expected a pause, got {res.status}")
                res = await runner.resume(sid, inputs={"approval": 5})
            dt = time.perf_counter() - t0
            if res.status != "completed":
                raise AssertionError(f"run ended {res.status}")
            return dt, res.output

        def run() -> float:
            dt, out = loop.run_until_complete(timed(new_id()))
            after_run()
            _check(case, out)
            return dt

        case.run, case.close = run, close
        case.runner = runner  # type: ignore[attr-defined]  # for profiling
        case.timed = timed  # type: ignore[attr-defined]
        case.after_run = after_run  # type: ignore[attr-defined]

    def _sync_case(self, case: Case, made: tuple[Any, str | None, Callable[[], None]]) -> None:
        fn, na, close = made
        case.close = close
        if fn is None:
            case.na = na
            return

        def run() -> float:
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            _check(case, out)
            return dt

        case.run = run

    def _adk_case(self, case: Case, made: tuple[Any, str | None, Callable[[], None]]) -> None:
        fn, na, close = made
        case.close = close
        if fn is None:
            case.na = na
            return
        loop = self.loop

        async def timed(sid: str) -> tuple[float, Any]:
            t0 = time.perf_counter()
            out = await fn(sid)
            return time.perf_counter() - t0, out

        def run() -> float:
            sid = loop.run_until_complete(fn.new_session())
            dt, out = loop.run_until_complete(timed(sid))
            _check(case, out)
            return dt

        case.run = run

    # ---------------------------------------------------------------- measuring

    def measure(self) -> None:
        warmup = 1
        rounds = warmup + max(c.reps for c in self.cases)
        by_wf: dict[str, list[Case]] = {}
        for c in self.cases:
            by_wf.setdefault(c.wf.key, []).append(c)
        for r in range(rounds):
            self.log(f"repetition {r} of {rounds - 1}{' (warm-up)' if r < warmup else ''}")
            for wf_key, cases in by_wf.items():
                live = [c for c in cases if c.run is not None and c.error is None and r < warmup + c.reps]
                if not live:
                    continue
                k = r % len(live)
                for c in live[k:] + live[:k]:  # round-robin, rotating the first configuration
                    gc.collect()
                    try:
                        if r < warmup:
                            dt = c.run()  # type: ignore[misc]
                            # Calibrate: a run shorter than SHORT_S is repeated back to back
                            # (one untimed run first to warm the caches that the previous
                            # configuration and gc.collect() evicted) and the mean taken.
                            c.inner = max(1, math.ceil(INNER_TARGET_S / dt)) if dt < SHORT_S else 1
                            c.prime = dt < SHORT_S
                            continue
                        if c.prime:
                            c.run()  # type: ignore[misc]
                        dts = [c.run() for _ in range(c.inner)]  # type: ignore[misc]
                    except Exception as exc:
                        c.error = f"{type(exc).__name__}: {exc}"
                        self.log(f"  {wf_key} / {c.key}: FAILED {c.error}")
                        traceback.print_exc()
                        continue
                    c.times.append(sum(dts) / len(dts))
        for c in self.cases:
            if c.close:
                try:
                    c.close()
                except Exception:
                    pass

    def case(self, wf: str, key: str) -> Case | None:
        for c in self.cases:
            if c.wf.key == wf and c.key == key:
                return c
        return None

    def us(self, wf: str, key: str) -> float | None:
        c = self.case(wf, key)
        return c.us_per_node if c else None

    # ---------------------------------------------------------------- store figures

    def store_figures(self) -> None:
        try:
            import flowscope.store.sqlite  # noqa: F401
        except Exception as exc:
            self.store["na"] = f"the SQLite store has not landed ({type(exc).__name__}: {exc})"
            return
        for name, fn in (("append", self._append), ("resume", self._resume), ("scrape", self._scrape)):
            self.log(f"store figure: {name}")
            try:
                fn()
            except Exception as exc:
                traceback.print_exc()
                self.store[f"{name}_error"] = f"{type(exc).__name__}: {exc}"

    def _append(self) -> None:
        """Append throughput: store_bench.bench_append if it is there, else a small version here."""
        sb = _module("store_bench")
        if sb is not None and hasattr(sb, "bench_append"):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    rows = sb.bench_append(Path(self.tmp), 2 if self.quick else 5, self.quick)
                self.store["append_rows"] = [dict(r, source="store_bench.bench_append") for r in rows]
                return
            except Exception as exc:
                self.notes.append(
                    f"store_bench.bench_append failed ({type(exc).__name__}: {exc}); the harness's own append figure is used"
                )
        self.store["append_rows"] = self._own_append()

    def _own_append(self) -> list[dict[str, Any]]:
        """Appends in the engine's pattern: a NodeCompleted/NodeStarted pair per transaction."""
        from flowscope.store.sqlite import SqliteEventStore

        events = _template_events(W.chain(49), 0)[0]
        pairs = [e for e in events if e.path.count("/") == 1]  # the leaves' NodeStarted/NodeCompleted
        rows = []
        n_txn = 300 if self.quick else 1500
        for durability in ("normal", "full"):
            store = SqliteEventStore(os.path.join(self.tmp, f"append-{durability}.db"), durability=durability)
            try:
                sid = "append"
                store.append(sid, _resession(events[:2], sid, 0), 0)
                prepared, seq = [], 2
                for i in range(n_txn):
                    j = (2 * i) % len(pairs)
                    prepared.append(_resession(pairs[j : j + 2], sid, seq, path_suffix=f"#{seq}"))
                    seq += 2
                gc.collect()
                t0 = time.perf_counter()
                last = 2
                for evs in prepared:
                    store.append(sid, evs, last)
                    last += 2
                dt = time.perf_counter() - t0
            finally:
                store.close()
            rows.append(
                dict(
                    name=f"append, 2 events/transaction, durability={durability}",
                    median=2 * n_txn / dt,
                    unit="events/s",
                    extra=f"{dt * 1e6 / n_txn:.0f} us/transaction",
                    source="harness",
                )
            )
        return rows

    def _resume(self) -> None:
        """Resume of a paused session with about 100,000 events (a 50,000-node chain paused at its end)."""
        target = 10_000 if self.quick else 100_000
        sb = _module("store_bench")
        if sb is not None and hasattr(sb, "bench_resume"):
            try:  # the store's side of a resume (open + read + fold), on store_bench's session shape
                with contextlib.redirect_stdout(io.StringIO()):
                    rows = sb.bench_resume(Path(self.tmp), 2 if self.quick else 5, target)
                self.store["resume_rows"] = [dict(r, source="store_bench.bench_resume") for r in rows]
            except Exception as exc:
                self.notes.append(f"store_bench.bench_resume failed ({type(exc).__name__}: {exc})")
        r = measure_resume(self.tmp, target, 3 if self.quick else 5)
        self.store["resume"] = {
            "events": r.events,
            "nodes": r.nodes,
            "median_s": r.median_s,
            "runs": r.runs,
            "read_s": r.read_s,
            "fold_s": r.fold_s,
            "target_events": target,
        }
        self._resume_case = (resume_workflow(r.nodes - 1), r.base, r.session_id, r.events)

    def _scrape(self) -> None:
        """A store of ~1,000,000 events in ~10,000 sessions of 100, 2% of them left open,
        scraped (:func:`limits.measure_scrape`). The store is built one session per
        transaction through the store's own ``append``, so the build is also an append
        throughput figure for 100-event batches."""
        target = 100_000 if self.quick else 1_000_000
        built_by = "metrics_bench.build_store (2% of sessions open)"
        sc = measure_scrape(self.tmp, target, 10)
        self.store["bulk_append"] = {
            "events": sc.events,
            "seconds": sc.build_s,
            "events_per_s": sc.events / sc.build_s,
            "sessions": sc.sessions,
            "built_by": built_by,
        }
        self.store["scrape"] = {
            "events": sc.events,
            "sessions": sc.sessions,
            "node_runs": sc.node_runs,
            "open_runs": sc.open_runs,
            "median_s": sc.median_s,
            "collect_s": sc.collect_s,
            "runs": sc.runs,
            "samples": sc.samples,
            "built_by": built_by,
        }
        self._scrape_case = (sc.path,)

    # ---------------------------------------------------------------- targets

    def targets(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def add(name: str, value: str, ok: bool | None, detail: str = "", profile: str | None = None) -> None:
            out.append({"target": name, "measured": value, "ok": ok, "detail": detail, "profile": profile})

        full = self.us("chain200", "fs_full")
        add(
            f"full stack ≤ {FULL_STACK_MAX_US:g} µs/node on the 200-chain",
            _fmt_us(full),
            None if full is None else full <= FULL_STACK_MAX_US,
            profile="fs_full",
        )
        eng = self.us("chain200", "fs_engine")
        add(
            f"engine alone ≤ {ENGINE_MAX_US:g} µs/node on the 200-chain",
            _fmt_us(eng),
            None if eng is None else eng <= ENGINE_MAX_US,
            profile="fs_engine",
        )
        for key in ("fs_engine", "fs_full"):
            vals = [self.us(f"chain{n}", key) for n in (20, 200, 2000)]
            if all(v is not None for v in vals):
                ratio = max(vals) / min(vals)  # type: ignore[type-var,arg-type]
                add(
                    f"{_short(key)}: per-node cost flat from 20 to 2,000 nodes (max/min ≤ {FLAT_MAX:g})",
                    f"{ratio:.2f}× ({' / '.join(_fmt_us(v) for v in vals)} µs at 20 / 200 / 2,000)",
                    ratio <= FLAT_MAX,
                    profile=key,
                )
            else:
                add(f"{_short(key)}: per-node cost flat from 20 to 2,000 nodes", "n/a", None)
        # against the peers, 200-chain
        pairs = [
            ("lg_sqlite", "fs_sqlite", VS_LANGGRAPH_MIN, "like for like: both on SQLite, no telemetry"),
            (
                "lg_sqlite",
                "fs_full",
                VS_LANGGRAPH_MIN,
                "stricter: flowscope's full stack with tracing and metrics",
            ),
            ("lg_sqlite_sync", "fs_sqlite", VS_LANGGRAPH_MIN, 'LangGraph durability="sync"'),
            (
                "lg_sqlite_sync",
                "fs_full",
                VS_LANGGRAPH_MIN,
                'LangGraph durability="sync", flowscope full stack',
            ),
            ("adk", "fs_engine", VS_ADK_MIN, "like for like: both in memory, no telemetry"),
            ("adk", "fs_full", VS_ADK_MIN, "stricter: flowscope's full stack against ADK in memory"),
        ]
        for peer, fs, need, note in pairs:
            p, f = self.case("chain200", peer), self.case("chain200", fs)
            if p is None or f is None or p.median is None or f.median is None:
                why = (p.na or p.error) if p and p.median is None else (f.na or f.error) if f else "missing"
                add(
                    f"≥ {need:g}× faster than {_short(peer)} ({_short(fs)}, 200-chain)",
                    "n/a",
                    None,
                    str(why or ""),
                )
                continue
            ratio = p.median / f.median
            add(
                f"≥ {need:g}× faster than {_short(peer)} ({_short(fs)}, 200-chain)",
                f"{ratio:.1f}×",
                ratio >= need,
                note,
                profile=fs,
            )
        r = self.store.get("resume")
        store_side = next(
            (x for x in self.store.get("resume_rows", []) if "rebuild" in x["name"] and "open" in x["name"]),
            None,
        )
        add(
            f"resume of a {('10,000' if self.quick else '100,000')}-event session < {RESUME_MAX_S:g} s",
            f"{r['median_s']:.3f} s ({r['events']:,} events)" if r else "n/a",
            None if not r or self.quick else r["median_s"] < RESUME_MAX_S,
            (
                "end to end through Runner.resume() in a new process"
                if r
                else str(self.store.get("resume_error") or self.store.get("na") or "")
            )
            + (
                f"; the store's part alone (open + read + rebuild, store_bench): {store_side['median']:.3f} s"
                if store_side
                else ""
            ),
            profile="resume",
        )
        s = self.store.get("scrape")
        if s and "median_s" in s:
            add(
                f"StoreCollector scrape over {s['events']:,} events < {SCRAPE_MAX_S * 1e3:g} ms",
                f"{s['median_s'] * 1e3:.1f} ms",
                None if self.quick else s["median_s"] < SCRAPE_MAX_S,
                profile="scrape",
            )
        else:
            add(
                f"StoreCollector scrape over 1,000,000 events < {SCRAPE_MAX_S * 1e3:g} ms",
                "n/a",
                None,
                (s or {}).get("na") or str(self.store.get("scrape_error") or self.store.get("na") or ""),
            )
        return out

    # ---------------------------------------------------------------- profiling

    def profile(self, targets: list[dict[str, Any]]) -> None:
        wanted: list[str] = []
        for t in targets:
            if (t["ok"] is False or self.args.profile) and t.get("profile") and t["profile"] not in wanted:
                wanted.append(t["profile"])
        for what in wanted:
            self.log(f"profiling {what}")
            try:
                if what == "resume":
                    text = self._profile_resume()
                elif what == "scrape":
                    text = self._profile_scrape()
                else:
                    text = self._profile_config(what)
            except Exception as exc:
                text = f"profiling failed: {type(exc).__name__}: {exc}"
            if text:
                self.profiles.append((what, text))

    def _profile_config(self, key: str) -> str:
        cfg = next(c for c in W.flowscope_configs() if c.key == key)
        wf = W.chain(200)
        runner, after_run, close = cfg.make(wf, self.tmp)
        loop = self.loop

        async def many(k: int) -> None:
            for _ in range(k):
                await runner.run(0)

        loop.run_until_complete(many(3))
        after_run()
        pr = cProfile.Profile()
        n = 20
        pr.enable()
        loop.run_until_complete(many(n))
        pr.disable()
        after_run()
        close()
        return _pstats(pr, f"{cfg.label}: {n} runs of the 200-chain ({n * 200} node runs)", per=n * 200)

    def _profile_resume(self) -> str:
        case = getattr(self, "_resume_case", None)
        if case is None:
            return ""
        from flowscope import Runner
        from flowscope.store.sqlite import SqliteEventStore

        wf, base, sid, n_events = case
        path = os.path.join(self.tmp, "resume-prof.db")
        shutil.copy(base, path)
        store = SqliteEventStore(path)
        runner = Runner(wf, store=store)
        pr = cProfile.Profile()
        pr.enable()
        self.loop.run_until_complete(runner.resume(sid, inputs={"approval": 1}))
        pr.disable()
        store.close()
        return _pstats(pr, f"resume of a {n_events:,}-event session (one resume)", per=None)

    def _profile_scrape(self) -> str:
        case = getattr(self, "_scrape_case", None)
        if case is None:
            return ""
        from prometheus_client import CollectorRegistry, generate_latest

        from flowscope.observability.store_collector import StoreCollector
        from flowscope.store.sqlite import SqliteEventStore

        store = SqliteEventStore(case[0])
        reg = CollectorRegistry()
        reg.register(StoreCollector(store, stale_after_s=60.0))
        generate_latest(reg)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            generate_latest(reg)
        pr.disable()
        store.close()
        return _pstats(pr, "StoreCollector: 5 scrapes", per=None)

    # ---------------------------------------------------------------- the report

    def report(self, targets: list[dict[str, Any]]) -> str:
        L: list[str] = []
        now = _dt.datetime.now(_dt.UTC)
        L.append("# flowscope benchmarks: side by side with LangGraph and the Agent Development Kit")
        L.append("")
        L.append(
            f"Written by `python bench/harness.py{' --quick' if self.quick else ''}` on "
            f"{now:%Y-%m-%d %H:%M} UTC in {time.time() - self.started:.0f} s; do not edit by hand, run it again. "
            "See [README.md](README.md) for the method."
        )
        if self.quick:
            L.append("")
            L.append(
                "**Quick smoke run: too few repetitions and scaled-down store figures; not the reference numbers.**"
            )
        L.append("")
        L.append("## Method")
        L.append("")
        L.append(
            "One process. Every repetition visits every workflow and, for each, runs every configuration once, "
            "starting from a rotating offset (interleaved: machine noise hits all configurations alike). The first "
            "repetition is a warm-up and calibrates: a configuration whose run takes under "
            f"{SHORT_S * 1e3:g} ms is measured warm, as a service running workflows back to back would see it: one "
            f"untimed run, then enough runs back to back to fill {INNER_TARGET_S * 1e3:g} ms, their mean being one "
            "measurement; longer runs are timed once per repetition. `gc.collect()` runs before each measurement, "
            "outside the timing. Medians of the measurements; µs/node = median / nodes; every ratio compares "
            "medians from this same run. Every run's output is checked."
        )
        L.append("")
        L.append("## Machine")
        L.append("")
        for k, v in _machine().items():
            L.append(f"- {k}: {v}")
        L.append(f"- load average (1, 5, 15 min) before the run: {self.load_before}; after: {_loadavg()}")
        L.append("")
        L.append("## Versions")
        L.append("")
        L.append("| package | version |")
        L.append("| --- | --- |")
        for k, v in _versions().items():
            L.append(f"| {k} | {v} |")
        L.append("")
        L.append("## Targets (DESIGN.md section 10)")
        L.append("")
        L.append("| target | measured | result | note |")
        L.append("| --- | --- | --- | --- |")
        for t in targets:
            res = "n/a" if t["ok"] is None else ("**pass**" if t["ok"] else "**FAIL**")
            L.append(f"| {t['target']} | {t['measured']} | {res} | {t['detail']} |")
        L.append("")
        L.append("## Per-node cost (µs per node, median)")
        L.append("")
        wfs = self.workflows()
        keys: list[tuple[str, str]] = []
        for c in self.cases:
            if (c.key, c.label) not in keys:
                keys.append((c.key, c.label))
        L.append("| configuration | " + " | ".join(w.key for w in wfs) + " |")
        L.append("| --- | " + " | ".join("---:" for _ in wfs) + " |")
        for key, label in keys:
            row = []
            for w in wfs:
                c = self.case(w.key, key)
                row.append(_fmt_us(c.us_per_node) if c and c.us_per_node is not None else "n/a")
            L.append(f"| {label} | " + " | ".join(row) + " |")
        L.append("")
        L.extend(self._breakdown_lines())
        L.append("## How many times faster flowscope is than each peer (peer median / flowscope median)")
        L.append("")
        peers = [(k, lab) for k, lab in keys if not k.startswith("fs_")]
        cols = [("fs_engine", "engine"), ("fs_sqlite", "SQLite"), ("fs_full", "full stack")]
        L.append("| workflow | peer | " + " | ".join(f"vs flowscope {n}" for _, n in cols) + " |")
        L.append("| --- | --- | " + " | ".join("---:" for _ in cols) + " |")
        for w in wfs:
            for pk, plab in peers:
                p = self.case(w.key, pk)
                cells = []
                for fk, _ in cols:
                    f = self.case(w.key, fk)
                    if p and f and p.median and f.median:
                        cells.append(f"{p.median / f.median:.1f}×")
                    else:
                        cells.append("n/a")
                L.append(f"| {w.key} | {plab} | " + " | ".join(cells) + " |")
        L.append("")
        for w in wfs:
            L.append(f"## {w.title}")
            L.append("")
            L.append(
                f"{w.description}. {self.reps_for(w)} measurements per configuration after a warm-up, interleaved; "
                "runs: measurements × runs per measurement (short runs are repeated back to back after an untimed one, "
                "and a measurement is their mean)."
            )
            L.append("")
            L.append("| configuration | median ms | µs/node | min–max ms | runs | × engine | × full stack |")
            L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            eng = self.case(w.key, "fs_engine")
            full = self.case(w.key, "fs_full")
            for key, label in keys:
                c = self.case(w.key, key)
                if c is None:
                    continue
                if c.median is None:
                    why = c.error or c.na or "not run"
                    L.append(f"| {label} | n/a | n/a | | | | {why} |")
                    continue
                re = f"{c.median / eng.median:.2f}" if eng and eng.median else "n/a"
                rf = f"{c.median / full.median:.2f}" if full and full.median else "n/a"
                L.append(
                    f"| {label} | {c.median * 1e3:.2f} | {_fmt_us(c.us_per_node)} | "
                    f"{min(c.times) * 1e3:.2f}–{max(c.times) * 1e3:.2f} | {len(c.times)}{f' × {c.inner}' if c.inner > 1 else ''} | {re} | {rf} |"
                )
            L.append("")
            L.append(
                "× engine / × full stack: this configuration's median divided by flowscope's (above 1: slower)."
            )
            L.append("")
        L.append("## Store figures")
        L.append("")
        L.extend(self._store_lines())
        na = [c for c in self.cases if c.median is None]
        L.append("## Not measured")
        L.append("")
        L.append(
            "- ADK with a durable session service (`DatabaseSessionService` over SQLite, which needs SQLAlchemy): the "
            "issue's reference is ADK's `Workflow` engine, measured here with its fastest session service "
            "(`InMemorySessionService`), so the ADK ratios favour ADK."
        )
        L.append(
            "- Telemetry in the peers: no global OpenTelemetry tracer provider is set and LangSmith tracing is off, so "
            "LangGraph and ADK run without spans; flowscope's tracing and full-stack rows carry an SDK span per node."
        )
        L.append(
            "- LangGraph's `ainvoke` and `AsyncSqliteSaver`: slower than the sync `invoke` on these graphs "
            "(about 350 against 210 µs/node on the 200-chain without a checkpointer when this harness was written), "
            "so the sync API is the one compared."
        )
        if True:
            seen = set()
            for c in na:
                why = c.error or c.na or "not run"
                if (c.key, why) in seen:
                    continue
                seen.add((c.key, why))
                wfs_na = [x.wf.key for x in na if x.key == c.key and (x.error or x.na or "not run") == why]
                L.append(f"- {c.label} — {', '.join(wfs_na)}: {why}")
            for n in self.notes:
                L.append(f"- {n}")
            L.append("")
        if self.profiles:
            L.append("## Profiles (cProfile) where a target is missed")
            L.append("")
            for what, text in self.profiles:
                L.append(f"### {what}")
                L.append("")
                L.append("```")
                L.append(text.rstrip())
                L.append("```")
                L.append("")
        return "\n".join(L) + "\n"

    def _breakdown_lines(self) -> list[str]:
        """Where a node's time goes on the 200-chain, from the medians of this run."""
        wf = "chain200"
        u = {k: self.us(wf, k) for k in ("fs_engine", "fs_sqlite", "fs_tracing", "fs_metrics", "fs_full")}
        if any(v is None for v in u.values()):
            return []
        eng = u["fs_engine"]
        parts = [
            ("the engine (memory store, no plugins)", eng),
            ("the SQLite store (SQLite − engine)", u["fs_sqlite"] - eng),  # type: ignore[operator]
            ("tracing with the OTel SDK (tracing − engine)", u["fs_tracing"] - eng),  # type: ignore[operator]
            ("metrics with prometheus-client (metrics − engine)", u["fs_metrics"] - eng),  # type: ignore[operator]
        ]
        total = sum(v for _, v in parts)  # type: ignore[misc]
        L = ["## Where a node's time goes (200-chain, µs per node)", ""]
        L.append("| part | µs/node | share of the sum |")
        L.append("| --- | ---: | ---: |")
        for name, v in parts:
            L.append(f"| {name} | {_fmt_us(v)} | {100 * v / total:.0f}% |")  # type: ignore[operator]
        L.append(f"| sum of the parts | {_fmt_us(total)} | |")
        L.append(f"| full stack, measured | {_fmt_us(u['fs_full'])} | |")
        need = []
        for peer, factor, what in (
            ("lg_sqlite", VS_LANGGRAPH_MIN, "LangGraph + SqliteSaver"),
            ("lg_sqlite_sync", VS_LANGGRAPH_MIN, 'LangGraph + SqliteSaver (durability="sync")'),
            ("adk", VS_ADK_MIN, "ADK"),
        ):
            p = self.us(wf, peer)
            if p is not None:
                need.append(
                    f"{factor:g}× faster than {what} ({_fmt_us(p)} µs/node) means at most {_fmt_us(p / factor)} µs/node"
                )
        L.append("")
        if need:
            L.append("In this run, " + "; ".join(need) + ".")
            L.append("")
        return L

    def _store_lines(self) -> list[str]:
        L: list[str] = []
        if "na" in self.store:
            return [f"n/a: {self.store['na']}", ""]
        L.append("| figure | median | detail | measured by |")
        L.append("| --- | ---: | --- | --- |")
        for row in self.store.get("append_rows", []):
            L.append(
                f"| {row['name']} | {_fmt_val(row.get('median'), row.get('unit', ''))} | {row.get('extra', '')} | {row.get('source', '')} |"
            )
        b = self.store.get("bulk_append")
        if b:
            L.append(
                f"| append, one ~100-event session per transaction | {b['events_per_s']:,.0f} events/s | "
                f"building the scrape store: {b['events']:,} events in {b['sessions']:,} sessions in {b['seconds']:.1f} s | {b['built_by']} |"
            )
        if "append_error" in self.store:
            L.append(f"| append | n/a | {self.store['append_error']} | |")
        r = self.store.get("resume")
        if r:
            L.append(
                f"| **resume of a {r['events']:,}-event session, end to end** | {r['median_s']:.3f} s | "
                f"`Runner.resume()` in a new process (timed inside it, after imports) on SQLite with the answer, until completed; the paused run saved a snapshot of the fold: a {r['nodes']:,}-node chain paused at its last node "
                f"(without the snapshot: reading the whole log {r['read_s']:.3f} s + folding it {r['fold_s']:.3f} s); median of {len(r['runs'])} | harness |"
            )
        elif "resume_error" in self.store:
            L.append(f"| resume of a 100,000-event session | n/a | {self.store['resume_error']} | |")
        for row in self.store.get("resume_rows", []):
            L.append(
                f"| {row['name']} | {_fmt_val(row.get('median'), row.get('unit', ''))} | {row.get('extra', '')} | {row.get('source', '')} |"
            )
        sc = self.store.get("scrape")
        if sc and "median_s" in sc:
            L.append(
                f"| **StoreCollector scrape over {sc['events']:,} events** | {sc['median_s'] * 1e3:.1f} ms | "
                f"`generate_latest()` on a registry holding only the collector ({sc['samples']} samples; "
                f"`collect()` alone {sc['collect_s'] * 1e3:.1f} ms); {sc['sessions']:,} sessions, {sc['node_runs']:,} node runs, "
                f"{sc['open_runs']:,} open; median of {len(sc['runs'])} | harness, store built by {sc['built_by']} |"
            )
        elif sc:
            L.append(f"| StoreCollector scrape over {sc['events']:,} events | n/a | {sc.get('na')} | |")
        elif "scrape_error" in self.store:
            L.append(f"| StoreCollector scrape | n/a | {self.store['scrape_error']} | |")
        L.append("")
        return L

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


# ------------------------------------------------------------------------- helpers


def _check(case: Case, out: Any) -> None:
    if out != case.wf.expected:
        raise AssertionError(f"{case.key} on {case.wf.key}: output {out!r}, expected {case.wf.expected!r}")


def _short(key: str) -> str:
    return {
        "fs_engine": "flowscope engine",
        "fs_sqlite": "flowscope + SQLite",
        "fs_tracing": "flowscope + tracing",
        "fs_metrics": "flowscope + metrics",
        "fs_full": "flowscope full stack",
        "lg_plain": "LangGraph",
        "lg_sqlite": "LangGraph + SqliteSaver",
        "lg_sqlite_sync": "LangGraph + SqliteSaver (sync)",
        "adk": "ADK Workflow",
    }.get(key, key)


def _fmt_us(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _fmt_val(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "s":
        return f"{v:.3f} s" if v >= 0.01 else f"{v * 1e3:.2f} ms"
    if unit == "events/s":
        return f"{v:,.0f} events/s"
    return f"{v:,.3g} {unit}"


def _module(name: str) -> Any:
    """Another bench module (store_bench, metrics_bench, ...) if it is there and imports."""
    try:
        return __import__(name)
    except Exception:
        return None


def _template_events(wf: Any, inp: Any) -> tuple[list[Any], str]:
    from flowscope import Runner

    runner = Runner(wf, heartbeat_interval=0)
    sid = "tmpl-" + uuid.uuid4().hex[:8]
    asyncio.new_event_loop().run_until_complete(runner.run(inp, session_id=sid))
    return runner.store.read(sid), sid


def _resession(events: list[Any], sid: str, seq0: int, path_suffix: str = "") -> list[Any]:
    """The events again, for session ``sid``, numbered from ``seq0 + 1``."""
    import dataclasses

    out = []
    for i, e in enumerate(events):
        kw: dict[str, Any] = {"session_id": sid, "seq": seq0 + i + 1}
        if path_suffix and e.path:
            kw["path"] = e.path + path_suffix
        out.append(dataclasses.replace(e, **kw))
    return out


def _pstats(pr: cProfile.Profile, title: str, per: int | None, top: int = 22) -> str:
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf)
    total = st.total_tt  # type: ignore[attr-defined]
    rows = []
    for (fn_file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((tt, ct, nc, f"{_shortpath(fn_file)}:{line}({fn})"))
    rows.sort(reverse=True)
    lines = [
        f"{title}; total {total:.3f} s"
        + (f", {total * 1e6 / per:.1f} µs per node run (profiler overhead included)" if per else "")
    ]
    lines.append(f"{'tottime':>8} {'%':>5} {'cumtime':>8} {'calls':>9}  function")
    for tt, ct, nc, name in rows[:top]:
        lines.append(f"{tt:8.3f} {100 * tt / total:5.1f} {ct:8.3f} {nc:9d}  {name}")
    lines.append("")
    lines.append("by cumulative time (flowscope functions only):")
    cum = sorted((r for r in rows if "flowscope" in r[3]), key=lambda r: -r[1])[:15]
    for tt, ct, nc, name in cum:
        lines.append(f"{tt:8.3f} {100 * ct / total:5.1f} {ct:8.3f} {nc:9d}  {name}")
    return "\n".join(lines)


def _shortpath(p: str) -> str:
    for marker in ("site-packages/", "/src/", "lib/python3"):
        i = p.find(marker)
        if i >= 0:
            return p[i + len(marker) :] if marker != "lib/python3" else "stdlib/" + p.rsplit("/", 1)[-1]
    return p


def _loadavg() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "unknown"
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    commit = ""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True, text=True
        ).stdout.strip()
        if dirty:
            commit += " (with uncommitted changes under src/)"
    except Exception:
        pass
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "OS": f"{platform.system()} {platform.release()}",
        "SQLite library": sqlite3.sqlite_version,
        "flowscope commit": commit or "unknown",
    }


def _versions() -> dict[str, str]:
    out = {}
    for p in (
        "flowscope",
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-sqlite",
        "langchain-core",
        "google-adk",
        "google-genai",
        "a2a-sdk",
        "opentelemetry-api",
        "opentelemetry-sdk",
        "prometheus-client",
        "sqlite-utils",
    ):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "not installed"
    return out


# ------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 repetitions, no 2,000-chain for the peers, small store figures",
    )
    ap.add_argument("--out", help="where to write the report (default: print it)")
    ap.add_argument("--reps", type=int, help="timed repetitions per case (default 7; 5 for the 2,000-chain)")
    ap.add_argument(
        "--only", help="comma-separated workflows: chain20,chain200,chain2000,fanout50,nested,pause200"
    )
    ap.add_argument("--no-peers", action="store_true", help="flowscope only")
    ap.add_argument("--no-store", action="store_true", help="skip the store figures")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile every flowscope configuration named by a target, missed or not",
    )
    ap.add_argument("--no-profile", action="store_true", help="never profile")
    args = ap.parse_args(argv)
    if args.reps is not None and args.reps < 5 and not args.quick:
        print("note: fewer than 5 repetitions; the issue asks for at least 5", file=sys.stderr)

    bench = Bench(args)
    try:
        bench.log("building the cases")
        bench.build()
        bench.measure()
        if not args.no_store:
            bench.store_figures()
        targets = bench.targets()
        if not args.no_profile:
            bench.profile(targets)
        text = bench.report(targets)
    finally:
        bench.cleanup()
    out = args.out  # RESULTS.md holds targets.py's run: the harness prints unless told where to write
    if out:
        Path(out).write_text(text)
        bench.log(f"wrote {out}")
    if not out or args.quick:
        print(text)
    else:
        for t in targets:
            res = "n/a " if t["ok"] is None else ("pass" if t["ok"] else "FAIL")
            print(f"{res}  {t['target']}: {t['measured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
