"""Where the full stack's time goes beside SQLite alone: cProfile of both, and the difference.

    PYTHONPATH=src python bench/profile_stack.py [--runs 20] [--sessions 1000] [--top 25]

Profiles ``--runs`` 200-chains and one run of ``--sessions`` concurrent 10-chains, on the
full stack (SQLite + tracing + metrics, the spans flushed to a no-op exporter) and on
SQLite alone (``targets.Flow``, so the configurations are those of ``targets.py``), and
prints, per workload, the functions whose own time (tottime) grew most from SQLite alone
to the full stack, in µs per node run, with file:line. The profiler inflates small
functions; read the ranking, not the absolute figures. The export thread's work is not in
the profile (cProfile sees the thread it runs in), only its effect on the loop thread.
The clock is the loop thread's CPU time (``time.thread_time``), so a loaded machine's
other processes do not count; waits for the disk do not count either.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workflows as W  # noqa: E402
from flowscope.store.sqlite import SqliteEventStore  # noqa: E402
from targets import Flow  # noqa: E402


def profile(flow: Flow, runs: int, sessions: int, loop: asyncio.AbstractEventLoop) -> pstats.Stats:
    loop.run_until_complete(flow.once(sessions))  # warm
    prof = cProfile.Profile(time.thread_time)  # CPU time of this thread: other processes' load does not count
    prof.enable()
    for _ in range(runs):
        loop.run_until_complete(flow.once(sessions))
    prof.disable()
    return pstats.Stats(prof)


def own_times(stats: pstats.Stats) -> dict[tuple[str, int, str], tuple[float, int]]:
    # gc.collect() runs before each run, outside targets.py's timing: left out here too
    return {k: (v[2], v[1]) for k, v in stats.stats.items() if k[2] != "<built-in method gc.collect>"}  # type: ignore[attr-defined]


def short(key: tuple[str, int, str]) -> str:
    path, line, name = key
    for marker in ("/src/flowscope/", "site-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{line} {name}" if line else name


#: Which part of the stack a function belongs to, by its file (first match wins).
PARTS = (
    (
        "tracing: the span walk and ids (log_spans.py, spans.py)",
        ("observability/log_spans.py", "observability/spans.py", "_hashlib"),
    ),
    (
        "tracing: the plugin and shipping (tracing.py, shipping.py)",
        ("observability/tracing.py", "observability/shipping.py"),
    ),
    ("tracing: the OpenTelemetry SDK and API", ("opentelemetry/", "contextvars")),
    ("metrics (metrics.py, lean_prom.py)", ("observability/metrics.py", "observability/lean_prom.py")),
    ("the hook port (engine/hooks.py)", ("engine/hooks.py",)),
    ("the store (store/)", ("store/", "sqlite3")),
    ("the engine and the rest", ("",)),
)


def part(key: tuple[str, int, str]) -> str:
    text = key[0] + " " + key[2]
    return next(name for name, marks in PARTS if any(m in text for m in marks))


def diff(title: str, full: pstats.Stats, bare: pstats.Stats, node_runs: int, top: int) -> None:
    f, b = own_times(full), own_times(bare)
    rows = []
    for key in set(f) | set(b):
        tf, cf = f.get(key, (0.0, 0))
        tb, _cb = b.get(key, (0.0, 0))
        rows.append(((tf - tb) * 1e6 / node_runs, tf * 1e6 / node_runs, cf / node_runs, key))
    rows.sort(reverse=True)
    by_part: dict[str, float] = {}
    for added, _own, _calls, key in rows:
        by_part[part(key)] = by_part.get(part(key), 0.0) + added
    total_f = sum(v[0] for v in f.values()) * 1e6 / node_runs
    total_b = sum(v[0] for v in b.values()) * 1e6 / node_runs
    print(
        f"\n### {title}: profiled {total_f:.1f} µs per node run (full stack) against {total_b:.1f} (SQLite alone)\n"
    )
    print("| part | added µs/node run (profiled) |\n| --- | ---: |")
    for name, _marks in PARTS:
        print(f"| {name} | {by_part.get(name, 0.0):.1f} |")
    print()
    print(
        "| function (file:line) | added µs/node run | full stack µs/node run | calls per node run |\n| --- | ---: | ---: | ---: |"
    )
    for added, own, calls, key in rows[:top]:
        print(f"| `{short(key)}` | {added:.2f} | {own:.2f} | {calls:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    tmp = tempfile.mkdtemp(prefix="flowscope-profile-")

    def store() -> SqliteEventStore:
        return SqliteEventStore(os.path.join(tmp, f"{len(os.listdir(tmp))}.db"))

    wf = W.chain(200)
    full = profile(Flow(wf, store(), True), args.runs, 1, loop)
    bare = profile(Flow(wf, store(), False), args.runs, 1, loop)
    diff("200-chain", full, bare, 200 * args.runs, args.top)
    wf10 = W.chain(10)
    full = profile(Flow(wf10, store(), True), 2, args.sessions, loop)
    bare = profile(Flow(wf10, store(), False), 2, args.sessions, loop)
    diff(f"{args.sessions:,} sessions x 10-chain", full, bare, 2 * 10 * args.sessions, args.top)


if __name__ == "__main__":
    main()
