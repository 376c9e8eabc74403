"""Benchmarks of the SQLite event store (not a test: run ``python bench/store_bench.py``).

Measures, as medians of several runs after a warm-up:

* append throughput in events/s: one event per transaction (durability normal and full),
  and batches of 2 and of 50 events per transaction;
* resume of a session with 100,000 events: ``store.read()`` + ``rebuild()`` on a freshly
  opened store, as a new process would do it (target < 0.3 s);
* ``open_runs()`` over a store of 1,000,000 events in many sessions, with a realistic
  share of paused, waiting and crashed sessions (target < 50 ms).

The events have the shape the engine writes: ``NodeStarted``/``NodeCompleted`` pairs with
small outputs, retries, failures, input requests, jobs, several invocations.

Options: ``--quick`` (smaller sizes, for a smoke run), ``--runs N``, ``--dir DIR`` (keep the
databases there; the 1M-event store is reused when it already exists), ``--json FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flowscope.events import (
    Event,
    InputReceived,
    InputRequested,
    JobDispatched,
    NodeCompleted,
    NodeErrorEvent,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
    StateUpdated,
)
from flowscope.store import SqliteEventStore, rebuild

NODES = ("fetch_orders", "check", "send_email", "update_crm", "report", "enrich", "approve")
T0 = 1_700_000_000.0


# --------------------------------------------------------------------------- workloads


class SessionWriter:
    """Builds one session's events the way the runner writes them."""

    def __init__(self, sid: str, workflow: str = "orders", t0: float = T0, seed: int = 0) -> None:
        self.sid = sid
        self.workflow = workflow
        self.root = f"{workflow}@1"
        self.ts = t0
        self.rnd = random.Random(seed)
        self.inv = 0
        self.counts: dict[str, int] = {}
        self.events: list[Event] = []

    def _add(self, cls, **kw) -> None:
        self.ts += self.rnd.choice((0.0005, 0.002, 0.01))
        self.events.append(
            cls(session_id=self.sid, invocation_id=f"{self.sid}-inv{self.inv}", ts=self.ts, **kw)
        )

    def start_invocation(self, resumed: bool = False) -> None:
        self.inv += 1
        self._add(
            RunStarted,
            workflow=self.workflow,
            input={"since": "2024-01-01", "limit": 500},
            resumed=resumed,
            trace_context={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        )

    def next_path(self, name: str) -> str:
        k = self.counts[name] = self.counts.get(name, 0) + 1
        return f"{self.root}/{name}@{k}"

    def node(self, name: str | None = None, outcome: str | None = None) -> str:
        """One node run; ``outcome`` is completed (default), error, input, job or running."""
        rnd = self.rnd
        name = name or rnd.choice(NODES)
        path = self.next_path(name)
        kw = dict(path=path, node=name)
        self._add(NodeStarted, attempt=1, kind="function", parent_path=self.root, **kw)
        attempt = 1
        if outcome is None:
            r = rnd.random()
            if r < 0.05:
                self._add(
                    NodeRetrying,
                    attempt=1,
                    error_type="TimeoutError",
                    error_code="UPSTREAM_TIMEOUT",
                    error_message="upstream timed out after 2.0s",
                    delay_s=0.05,
                    **kw,
                )
                attempt = 2
            if r < 0.1:
                self._add(StateUpdated, values={"cursor": len(self.events)}, **kw)
            outcome = "completed"
        if outcome == "completed":
            if rnd.random() < 0.15:
                self._add(NodeCompleted, output=None, has_output=False, attempt_count=attempt, **kw)
            else:
                self._add(
                    NodeCompleted,
                    output={"rows": rnd.randint(0, 500), "ok": True, "id": f"ord-{len(self.events)}"},
                    attempt_count=attempt,
                    **kw,
                )
        elif outcome == "error":
            self._add(
                NodeErrorEvent,
                error_code="UNKNOWN_ERROR",
                error_message="invalid literal for int()",
                error_type="ValueError",
                attempt_count=attempt,
                **kw,
            )
        elif outcome == "input":
            self._add(
                InputRequested,
                interrupt_id=f"{path}#approve",
                prompt="Approve the refund?",
                payload={"amount": 120.5, "currency": "EUR"},
                **kw,
            )
        elif outcome == "job":
            self._add(
                JobDispatched,
                job_id=f"job-{self.sid}-{len(self.events)}",
                idempotency_key=f"idem-{len(self.events)}",
                deadline_s=3600.0,
                job_key=f"{name}#1",
                **kw,
            )
        return path

    def finish(self, status: str) -> None:
        self._add(
            RunFinished,
            status=status,
            output={"orders": len(self.events)} if status == "completed" else None,
            error_code="UNKNOWN_ERROR" if status == "failed" else None,
        )


def big_session(sid: str, n: int) -> list[Event]:
    """A long-running session of about ``n`` events: a loop over the nodes, three invocations
    (paused for input twice), ending paused so that a resume has work to do."""
    w = SessionWriter(sid, seed=1)
    w.start_invocation()
    third = n // 3
    for phase in range(3):
        while len(w.events) < third * (phase + 1) - 6:
            w.node()
        path = w.node("approve", outcome="input")
        w.finish("paused")
        if phase < 2:
            w.start_invocation(resumed=True)
            w._add(
                InputReceived,
                path=path,
                node="approve",
                interrupt_id=f"{path}#approve",
                value={"approved": True},
            )
            w._add(NodeStarted, path=path, node="approve", attempt=1, parent_path=w.root)
            w._add(NodeCompleted, path=path, node="approve", output={"approved": True})
    return w.events


def small_session(sid: str, rnd: random.Random, n: int, t0: float) -> list[Event]:
    """A typical session of about ``n`` events, most of them finished, some still open."""
    w = SessionWriter(sid, workflow=rnd.choice(("orders", "billing", "etl")), t0=t0, seed=rnd.random())
    w.start_invocation()
    r = rnd.random()
    end = (
        "completed"
        if r < 0.90
        else "error"
        if r < 0.94
        else "input"
        if r < 0.97
        else "job"
        if r < 0.99
        else "crash"
    )
    while len(w.events) < n - 4:
        w.node()
    if end == "completed":
        w.node()
        w.finish("completed")
    elif end == "error":
        w.node(outcome="error")
        w.finish("failed")
    elif end in ("input", "job"):
        w.node(outcome=end)
        w.finish("paused")
    else:  # the worker died with runs in flight: no terminal events, no RunFinished
        for _ in range(rnd.randint(1, 3)):
            w.node(outcome="running")
    return w.events


# --------------------------------------------------------------------------- measuring


def median_of(fn: Callable[[], float], runs: int, warmup: int = 1) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    samples = [fn() for _ in range(runs)]
    return statistics.median(samples), samples


def fresh_db(directory: Path, name: str) -> Path:
    p = directory / name
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(str(p) + suffix)
        except FileNotFoundError:
            pass
    return p


def bench_append(directory: Path, runs: int, quick: bool) -> list[dict]:
    rows = []
    cases = [
        ("append, 1 event/transaction", 1, "normal", 400 if quick else 2000),
        ("append, 1 event/transaction, durability=full", 1, "full", 200 if quick else 500),
        ("append, batches of 2", 2, "normal", 800 if quick else 4000),
        ("append, batches of 50", 50, "normal", 5000 if quick else 25000),
    ]
    for label, batch, durability, n in cases:
        path = fresh_db(directory, f"append-{batch}-{durability}.db")
        store = SqliteEventStore(path, durability=durability)
        counter = [0]

        def one_run() -> float:
            counter[0] += 1
            sid = f"append-{counter[0]}"
            w = SessionWriter(sid, seed=counter[0])
            w.start_invocation()
            while len(w.events) < n:
                w.node()
            events = w.events[:n]
            seq = 0
            t = time.perf_counter()
            for i in range(0, n, batch):
                seq = store.append(sid, events[i : i + batch], seq)[-1].seq
            return n / (time.perf_counter() - t)

        med, samples = median_of(one_run, runs)
        store.close()
        rows.append(
            dict(
                name=label,
                median=med,
                unit="events/s",
                samples=samples,
                target=None,
                extra=f"{1e6 / med * batch:.0f} us/transaction",
            )
        )
    return rows


def bench_resume(directory: Path, runs: int, n: int) -> list[dict]:
    path = fresh_db(directory, "resume.db")
    events = big_session("big", n)
    with SqliteEventStore(path) as store:
        for i in range(0, len(events), 1000):
            store.append("big", events[i : i + 1000], i)
    del events
    parts: dict[str, list[float]] = {"read": [], "rebuild": [], "total": [], "cpu": []}
    state_nodes = [0]

    def one_run() -> float:
        c0 = time.process_time()
        t0 = time.perf_counter()
        with SqliteEventStore(path) as store:  # a new process opens the file and resumes
            t1 = time.perf_counter()
            log = store.read("big")
            t2 = time.perf_counter()
            state = rebuild(log)
            t3 = time.perf_counter()
        assert state.last_seq == len(log) and state.status == "paused" and state.pending
        state_nodes[0] = len(state.nodes)
        parts["read"].append(t2 - t1)
        parts["rebuild"].append(t3 - t2)
        parts["total"].append(t3 - t0)
        parts["cpu"].append(time.process_time() - c0)
        return t3 - t0

    median_of(one_run, runs)
    for k in parts:
        parts[k] = parts[k][1:]  # drop the warm-up
    label = f"resume of a {n:,}-event session"
    return [
        dict(
            name=f"{label}: open + read + rebuild",
            median=statistics.median(parts["total"]),
            unit="s",
            samples=parts["total"],
            target=0.3,
            extra=f"{state_nodes[0]:,} node runs; CPU time {statistics.median(parts['cpu']) * 1000:.0f} ms",
        ),
        dict(
            name=f"{label}: read()",
            median=statistics.median(parts["read"]),
            unit="s",
            samples=parts["read"],
            target=None,
            extra=f"{statistics.median(parts['read']) / n * 1e6:.2f} us/event",
        ),
        dict(
            name=f"{label}: rebuild()",
            median=statistics.median(parts["rebuild"]),
            unit="s",
            samples=parts["rebuild"],
            target=None,
            extra="projection.rebuild",
        ),
    ]


def build_big_store(path: Path, total: int, per_session: int) -> tuple[float, int]:
    rnd = random.Random(42)
    t = time.perf_counter()
    written = 0
    k = 0
    with SqliteEventStore(path) as store:
        while written < total:
            k += 1
            sid = f"sess-{k:07d}"
            n = min(total - written, max(8, int(rnd.gauss(per_session, per_session / 4))))
            events = small_session(sid, rnd, n, t0=T0 + k * 5.0)
            store.append(sid, events, 0)
            written += len(events)
    return time.perf_counter() - t, k


def bench_open_runs(directory: Path, runs: int, total: int, per_session: int, reuse: bool) -> list[dict]:
    path = directory / f"open-runs-{total}.db"
    built = ""
    if not (reuse and path.exists()):
        path = fresh_db(directory, path.name)
        seconds, sessions = build_big_store(path, total, per_session)
        built = f"built in {seconds:.0f} s ({total / seconds:,.0f} events/s through append)"
    c = sqlite3.connect(path)
    n_events = c.execute("SELECT count(*) FROM events").fetchone()[0]
    n_sessions = c.execute("SELECT count(*) FROM sessions").fetchone()[0]
    n_runs = c.execute("SELECT count(*) FROM node_runs").fetchone()[0]
    c.close()
    store = SqliteEventStore(path)
    count = [0]

    def warm() -> float:
        t = time.perf_counter()
        count[0] = len(store.open_runs())
        return time.perf_counter() - t

    def cold() -> float:
        t = time.perf_counter()
        with SqliteEventStore(path, readonly=True) as s:
            s.open_runs()
        return time.perf_counter() - t

    med_warm, samples_warm = median_of(warm, max(runs, 10))
    med_cold, samples_cold = median_of(cold, runs)
    store.close()
    desc = f"{n_events:,} events, {n_sessions:,} sessions, {n_runs:,} node runs, {count[0]:,} open"
    rows = [
        dict(
            name=f"open_runs() over {n_events:,} events",
            median=med_warm,
            unit="s",
            samples=samples_warm,
            target=0.05,
            extra=desc,
        ),
        dict(
            name="open_runs() on a newly opened read-only store",
            median=med_cold,
            unit="s",
            samples=samples_cold,
            target=0.05,
            extra="open + query",
        ),
    ]
    if built:
        rows.append(
            dict(
                name="building that store (one run)",
                median=None,
                unit="",
                samples=[],
                target=None,
                extra=built,
            )
        )
    return rows


def bench_rebuild_projections(directory: Path, total: int) -> dict:
    path = directory / f"open-runs-{total}.db"
    with SqliteEventStore(path) as store:
        t = time.perf_counter()
        store.rebuild_projections()
        seconds = time.perf_counter() - t
    return dict(
        name=f"rebuild_projections() over {total:,} events (one run)",
        median=seconds,
        unit="s",
        samples=[seconds],
        target=None,
        extra=f"{total / seconds:,.0f} events/s",
    )


# --------------------------------------------------------------------------- report


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    if unit == "events/s":
        return f"{value:,.0f} ev/s"
    return f"{value:g} {unit}"


def print_table(rows: list[dict]) -> None:
    header = ("measurement", "median", "target", "ok", "runs", "notes")
    lines = []
    for r in rows:
        target = r["target"]
        ok = "" if target is None or r["median"] is None else ("yes" if r["median"] < target else "NO")
        lines.append(
            (
                r["name"],
                fmt(r["median"], r["unit"]),
                fmt(target, r["unit"]) if target else "",
                ok,
                str(len(r["samples"])) if r["samples"] else "",
                r.get("extra", ""),
            )
        )
    widths = [max(len(str(x[i])) for x in [header] + lines) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print(
            "  ".join(
                str(x).ljust(w) if i in (0, 5) else str(x).rjust(w)
                for i, (x, w) in enumerate(zip(line, widths))
            )
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument(
        "--runs", type=int, default=5, help="measured runs per case (after one warm-up), at least 5"
    )
    ap.add_argument(
        "--dir", type=Path, default=None, help="keep the databases here (the big store is reused)"
    )
    ap.add_argument(
        "--rebuild", action="store_true", help="also time rebuild_projections() over the big store"
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    args = ap.parse_args(argv)
    runs = max(args.runs, 1 if args.quick else 5)
    resume_n = 10_000 if args.quick else 100_000
    total = 50_000 if args.quick else 1_000_000
    directory = args.dir or Path(tempfile.mkdtemp(prefix="flowscope-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(
        f"flowscope store bench: python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, {runs} runs per case after a warm-up, files in {directory}",
        flush=True,
    )
    rows: list[dict] = []
    try:
        rows += bench_append(directory, runs, args.quick)
        rows += bench_resume(directory, runs, resume_n)
        rows += bench_open_runs(directory, runs, total, per_session=100, reuse=args.dir is not None)
        if args.rebuild:
            rows.append(bench_rebuild_projections(directory, total))
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    print()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    missed = [
        r["name"] for r in rows if r["target"] and r["median"] is not None and r["median"] >= r["target"]
    ]
    if missed:
        print("\nmissed targets: " + "; ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
