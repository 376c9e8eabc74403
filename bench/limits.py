"""The targets that are a time under a fixed limit (the last line of the spec's targets): a
resume of a 100,000-event session, a ``StoreCollector`` scrape over 1,000,000 events, and
the console's session list over 100,000 sessions and a session of 10,000 node runs.

``targets.py`` runs them as its ``resume``, ``scrape`` and ``console`` sections, beside the
ratios; ``harness.py`` reports the first two as well. Each function builds its own store in
``folder`` and returns what it measured; none asserts a limit (the caller compares).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import workflows as W

__all__ = [
    "RESUME_MAX_S",
    "SCRAPE_MAX_S",
    "CONSOLE_MAX_S",
    "ResumeFigures",
    "ScrapeFigures",
    "resume_workflow",
    "paused_session",
    "resume_in_new_process",
    "measure_resume",
    "measure_scrape",
    "measure_console",
]

RESUME_MAX_S = 0.3  # resume of a 100,000-event session
SCRAPE_MAX_S = 0.050  # StoreCollector scrape over 1,000,000 events
CONSOLE_MAX_S = 2.0  # the session list over 100,000 sessions, a session of 10,000 node runs

HERE = Path(__file__).resolve().parent


def resume_workflow(n: int) -> Any:
    """A chain of ``n`` trivial nodes, then a node that asks for input (the session pauses there)."""
    from flowscope import START, Workflow, node

    steps = [node(W._inc, name=f"n{i}") for i in range(n)]
    steps.append(node(W._ask, name="ask"))
    return Workflow("resume", edges=[(START, *steps)], max_steps=n + 100)


_RESUME_SCRIPT = """
import asyncio, sys, time
sys.path.insert(0, {bench!r})
from limits import resume_workflow
from flowscope import Runner
from flowscope.store import SqliteEventStore
wf = resume_workflow({n})
runner = Runner(wf, store=SqliteEventStore({path!r}))
async def main():
    t0 = time.perf_counter()
    res = await runner.resume({sid!r}, inputs={{"approval": 1}})
    dt = time.perf_counter() - t0
    assert res.status == "completed", res.status
    print(dt)
asyncio.run(main())
"""


def resume_in_new_process(path: str, sid: str, n: int) -> float:
    """Seconds ``Runner.resume()`` takes in a new interpreter (imports and setup excluded)."""
    script = _RESUME_SCRIPT.format(bench=str(HERE), n=n, path=path, sid=sid)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"resume in a new process failed: {out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def paused_session(wf: Any, store: Any = None) -> tuple[list[Any], str]:
    """Run ``wf`` (a :func:`resume_workflow`) to its pause; its events and session id."""
    from flowscope import Runner

    runner = Runner(wf, store=store, heartbeat_interval=0)
    sid = "resume-" + uuid.uuid4().hex[:8]
    res = asyncio.new_event_loop().run_until_complete(runner.run(0, session_id=sid))
    if res.status != "paused":
        raise AssertionError(f"expected a pause, got {res.status}")
    return runner.store.read(sid), sid


@dataclass(frozen=True)
class ResumeFigures:
    """A resume of a paused session, end to end in a new process, and the store's parts of it."""

    base: str  # the recorded store, paused (every timed resume ran on a copy)
    session_id: str
    events: int
    nodes: int
    runs: list[float]  # seconds of each timed resume
    read_s: float  # reading the whole log (what a resume without the snapshot reads)
    fold_s: float  # folding it

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs)


def measure_resume(folder: str, target_events: int, reps: int) -> ResumeFigures:
    """``Runner.resume()`` of a session of about ``target_events`` events (a chain paused at
    its last node, recorded on SQLite by a real run, which kept a snapshot of the fold), in
    a fresh interpreter each time, as a new process resumes it; ``reps`` timed after a
    warm-up, each on a fresh copy of the file."""
    from flowscope.fold import rebuild
    from flowscope.store.sqlite import SqliteEventStore

    n = (target_events - 7) // 2  # 2 events per node, 7 for the run, the root and the pause
    wf = resume_workflow(n)
    base = os.path.join(folder, "resume-base.db")
    s = SqliteEventStore(base)
    events, sid = paused_session(wf, store=s)
    s.close()
    total: list[float] = []
    reads: list[float] = []
    folds: list[float] = []
    for i in range(reps + 1):
        path = os.path.join(folder, f"resume-{i}.db")
        for ext in ("", "-wal", "-shm"):
            if os.path.exists(base + ext):
                shutil.copy(base + ext, path + ext)
        dt = resume_in_new_process(path, sid, n)
        store = SqliteEventStore(path)
        if rebuild(store.read(sid)).status != "completed":
            raise AssertionError("the resume did not complete the session")
        gc.collect()
        t1 = time.perf_counter()
        evs = store.read(sid)
        t2 = time.perf_counter()
        rebuild(evs[: len(events)])
        t3 = time.perf_counter()
        store.close()
        for ext in ("", "-wal", "-shm"):
            if os.path.exists(path + ext):
                os.remove(path + ext)
        if i:  # the first is a warm-up
            total.append(dt)
            reads.append(t2 - t1)
            folds.append(t3 - t2)
    return ResumeFigures(
        base, sid, len(events), n + 1, total, statistics.median(reads), statistics.median(folds)
    )


@dataclass(frozen=True)
class ScrapeFigures:
    """Scrapes of a registry holding only a ``StoreCollector`` over a large store."""

    path: str
    events: int
    sessions: int
    node_runs: int
    open_runs: int
    build_s: float
    runs: list[float]  # seconds of each timed ``generate_latest``
    collect_s: float  # the collector's ``collect()`` alone (median)
    samples: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs)


def measure_scrape(folder: str, target_events: int, reps: int) -> ScrapeFigures:
    """A store of ``target_events`` events in sessions of 100, 2% of them left open (running
    with a stale heartbeat, waiting for input, waiting for an overdue job), built by
    ``metrics_bench.build_store`` through the store's own ``append``; then ``reps``
    ``generate_latest()`` scrapes after a warm-up."""
    from prometheus_client import CollectorRegistry, generate_latest

    import metrics_bench
    from flowscope.observability.store_collector import StoreCollector
    from flowscope.store.sqlite import SqliteEventStore

    path = os.path.join(folder, "scrape.db")
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        metrics_bench.build_store(path, target_events, 0.02)
    build_s = time.perf_counter() - t0
    c = sqlite3.connect(path)
    n_events, sessions, n_runs, n_open = c.execute(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM sessions), (SELECT count(*) FROM node_runs), "
        "(SELECT count(*) FROM node_runs WHERE status IN ('running', 'waiting_input', 'waiting_job'))"
    ).fetchone()
    c.close()
    store = SqliteEventStore(path)
    try:
        reg = CollectorRegistry()
        collector = StoreCollector(store, stale_after_s=300.0)
        reg.register(collector)
        times: list[float] = []
        collects: list[float] = []
        text = b""
        for i in range(reps + 1):
            gc.collect()
            t1 = time.perf_counter()
            text = generate_latest(reg)
            t2 = time.perf_counter()
            for family in collector.collect():
                for _sample in family.samples:
                    pass
            t3 = time.perf_counter()
            if i:  # the first is a warm-up
                times.append(t2 - t1)
                collects.append(t3 - t2)
    finally:
        store.close()
    samples = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    return ScrapeFigures(
        path, n_events, sessions, n_runs, n_open, build_s, times, statistics.median(collects), samples
    )


def measure_console(folder: str, sessions: int, runs: int) -> dict[str, float]:
    """``console_bench``'s figures, in seconds: the list's and the big session's server
    times in process, then ``flowscope ui`` and Debian's Chromium (Playwright) loading each
    page ``runs`` times (first paint, navigation to drawn); over ``sessions`` small
    sessions and a session of 10,000 node runs built in ``folder``."""
    import console_bench

    db = Path(folder) / "console.db"
    console_bench.build(db, sessions)
    return console_bench.measure(db, runs)
