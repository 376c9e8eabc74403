"""An earlier commit's SQLite store against this tree's, each beside LangGraph in the same
process: a baseline measured again today.

    python bench/baseline_bench.py                  # REV defaults to fccc125^ (version 1's main)
    python bench/baseline_bench.py --rev REV --procs 3

The first ratio targets (8x LangGraph + SqliteSaver per node, 25x at 1,000 sessions) were
set from figures taken on version 1's main: its SQLite store alone at 82 µs/node against
LangGraph's 970-1,050, "about 12x like for like". Those absolute figures belong to the
machine of that hour. This script tells what the same code does on this machine now: it
extracts ``REV``'s ``src/`` with ``git archive`` and runs child processes alternately on
that tree and on this one. Each child times, interleaved in one process, flowscope on SQLite
without plugins and LangGraph with its SQLite checkpointers (the graphs of
``peers_langgraph.py``), so each ratio comes from one process's minutes:

1. a chain of 200 trivial nodes, µs per node, against ``SqliteSaver``;
2. 1,000 concurrent sessions of a 10-node chain, node runs per second, against
   ``AsyncSqliteSaver`` running 1,000 sessions at once.

LangGraph's connections run ``synchronous=NORMAL``, the store's durability (SQLite's own
default, FULL, adds an fsync at every commit that the store does not pay), so the ratios
read lower than the "about 12x" above, which set the two defaults side by side.

Prints a Markdown table of the medians over the children of each tree. A child takes ~3
minutes here (LangGraph runs 1,000 sessions at ~300 node runs/s), the default run ~18.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from flowscope.engine.ids import new_id

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


# ---------------------------------------------------------------- one child: one tree


async def _child(reps: int, sessions: int) -> dict[str, float]:
    """Runs in a child whose ``PYTHONPATH`` picks the tree: only the public API that every
    version has (``Runner``, ``SqliteEventStore``, ``Runner.run``)."""
    import gc

    from flowscope import Runner
    from flowscope.store.sqlite import SqliteEventStore
    from peers_langgraph import SAME_AS_STORE, async_sqlite_chain, sqlite_chain
    from workflows import chain

    tmp = tempfile.mkdtemp(prefix="flowscope-baseline-")
    chain_runner = Runner(chain(200), store=SqliteEventStore(os.path.join(tmp, "chain.db")))
    many_runner = Runner(chain(10), store=SqliteEventStore(os.path.join(tmp, "many.db")))
    lg_chain, lg_close = sqlite_chain(200, tmp, SAME_AS_STORE)
    lg_many = await async_sqlite_chain(10, sessions, tmp, SAME_AS_STORE)

    async def fs_chain() -> float:
        t0 = time.perf_counter()
        for _ in range(3):
            await chain_runner.run(0, session_id=new_id())
        return (time.perf_counter() - t0) / 600 * 1e6

    def lg_chain_once() -> float:
        t0 = time.perf_counter()
        lg_chain()
        return (time.perf_counter() - t0) / 200 * 1e6

    async def fs_many(k: int = sessions) -> float:
        gc.collect()
        t0 = time.perf_counter()
        await asyncio.gather(*(many_runner.run(0, session_id=new_id()) for _ in range(k)))
        return k * 10 / (time.perf_counter() - t0)

    await fs_chain()  # warm-up (LangGraph's 1,000 sessions take ~35 s a run here: a tenth of them)
    lg_chain_once()
    await fs_many(sessions // 10)
    await lg_many(sessions // 10)
    got: dict[str, list[float]] = {"fs_chain": [], "lg_chain": [], "fs_many": [], "lg_many": []}
    for rep in range(reps):
        got["fs_chain"].append(await fs_chain())
        got["lg_chain"].append(lg_chain_once())
        if rep % 3 == 0:  # the 1,000-session runs take seconds each: a third as many
            got["fs_many"].append(await fs_many())
            got["lg_many"].append(sessions * 10 / await lg_many())
    lg_close()
    return {k: statistics.median(v) for k, v in got.items()}


# ---------------------------------------------------------------- the parent: alternate trees


def _extract(rev: str, into: Path) -> Path:
    """``REV``'s ``src/`` in a folder of its own (``git archive``: no worktree left behind)."""
    archive = into / "src.tar"
    with open(archive, "wb") as out:
        subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"], stdout=out, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _run_child(src: Path, reps: int, sessions: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)]), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--reps",
        str(reps),
        "--sessions",
        str(sessions),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="fccc125^", help="the earlier commit (default: version 1's main)")
    ap.add_argument("--procs", type=int, default=3, help="child processes per tree, alternated")
    ap.add_argument("--reps", type=int, default=9, help="200-chain repetitions per child")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.reps, args.sessions))))
        return
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    trees = {
        f"{rev} ({args.rev})": _extract(args.rev, Path(tempfile.mkdtemp(prefix="flowscope-rev-"))),
        "this tree": REPO / "src",
    }
    results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    for _ in range(args.procs):
        for label, src in trees.items():
            results[label].append(_run_child(src, args.reps, args.sessions))
            print(f"{label}: {results[label][-1]}", file=sys.stderr)
    print(
        "| tree | flowscope SQLite alone, µs/node | LangGraph + SqliteSaver, µs/node | ratio "
        f"| {args.sessions:,} sessions: flowscope SQLite alone, node runs/s | LangGraph + AsyncSqliteSaver | ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, runs in results.items():
        m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        chain_ratio = statistics.median(r["lg_chain"] / r["fs_chain"] for r in runs)
        many_ratio = statistics.median(r["fs_many"] / r["lg_many"] for r in runs)
        print(
            f"| {label} | {m['fs_chain']:.1f} | {m['lg_chain']:.1f} | {chain_ratio:.2f}x "
            f"| {m['fs_many']:,.0f} | {m['lg_many']:,.0f} | {many_ratio:.1f}x |"
        )
    # The children ran in turn (REV's, this tree's, REV's, ...): each adjacent pair saw the
    # same phase of the machine, so their ratio is steadier than a ratio of medians.
    old, new = results.values()
    chain_speedup = statistics.median(o["fs_chain"] / n["fs_chain"] for o, n in zip(old, new))
    many_speedup = statistics.median(n["fs_many"] / o["fs_many"] for o, n in zip(old, new))
    print(
        f"\nThis tree's speed over {rev}'s, flowscope SQLite alone, median over the adjacent pairs of "
        f"children: 200-chain {chain_speedup:.2f}x, {args.sessions:,} sessions {many_speedup:.2f}x."
    )
    print(
        f"\n{args.procs} child processes per tree, alternated; each ratio is the median of the children's "
        "own ratios (flowscope and LangGraph timed in the same process)."
    )


if __name__ == "__main__":
    main()
