"""The console's targets (not a test: run ``python bench/console_bench.py``): the session list
over 100,000 sessions (``--sessions``) and a session of 10,000 node runs, each usable in
under 2 s; exits 1 when a figure is over.

In one run, on one SQLite file: the server's time (``flowscope.console.api``, in process:
the first list request, one after a change, a later one, filtered ones), then
``flowscope ui`` started as a process and Debian's Chromium (Playwright) opening each page:
first contentful paint and navigation-to-drawn (the page's ``flowscope-ready`` mark, set
once the rows are in the page), medians of ``--runs`` loads.

Options: ``--sessions N`` (100,000), ``--runs N`` (5), ``--dir DIR`` (keep the database
there and reuse it), ``--json FILE``. Needs the ``ui`` extra, playwright and chromium.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from console_workflows import make_big_session  # noqa: E402
from flowscope.console import api  # noqa: E402
from flowscope.console.live import ChangeFeed  # noqa: E402
from flowscope.store import SqliteEventStore  # noqa: E402
from limits import CONSOLE_MAX_S as TARGET_S  # noqa: E402
from store_bench import small_session  # noqa: E402

CHROMIUM = os.environ.get("FLOWSCOPE_CHROMIUM", "/usr/lib/chromium/chromium")
BIG = "big-10k"


def build(db: Path, sessions: int) -> None:
    """``sessions`` small sessions (most completed; some failed, waiting, crashed) and the
    10,000-run session, unless the file has them already."""
    store = SqliteEventStore(db)
    try:
        have = sum(store.status_counts().values())
        if have < sessions:
            rnd = random.Random(7)
            t0 = time.time() - 86400.0
            batch = []
            for i in range(have, sessions):
                events = small_session(f"s{i:06d}", rnd, 6, t0 + i * 0.5)
                batch.append((f"s{i:06d}", events, 0, None))
                if len(batch) == 500:
                    store.append_many(batch)
                    batch = []
            if batch:
                store.append_many(batch)
        if not store.has_session(BIG):
            make_big_session(store, BIG)
    finally:
        store.close()


def server_times(db: Path) -> dict[str, float]:
    """The list's requests in process: after a change (the attention tabs counted again,
    the page and its total selected by the store), again in the same store version, with
    filters, and an attention tab; then the big session's waterfall."""
    out = {}
    with SqliteEventStore(db, readonly=True) as store:
        feed = ChangeFeed(store)

        def timed(name: str, f: api.SessionFilter, changed: bool = False) -> None:
            if changed:
                feed.changed()
            t = time.perf_counter()
            api.list_sessions(feed, f)
            out[name] = time.perf_counter() - t

        timed("list, first request", api.SessionFilter())
        timed("list, after a change (the tabs counted again)", api.SessionFilter(), changed=True)
        timed("list, next request", api.SessionFilter())
        timed("list, filtered (status, workflow)", api.SessionFilter(status="failed", workflow="orders"))
        timed("list, a tab (waiting for a person)", api.SessionFilter(attention="waiting_input"))
        timed(
            "list, by error code (after a change)",
            api.SessionFilter(error_code="UNKNOWN_ERROR"),
            changed=True,
        )
        t = time.perf_counter()
        api.session_waterfall(store, BIG)
        out["session of 10,000 runs"] = time.perf_counter() - t
    return out


async def browser_times(url: str, base: str, runs: int) -> dict[str, float]:
    from playwright.async_api import async_playwright

    out: dict[str, float] = {}
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=["--disable-dev-shm-usage"])
        page = await (await b.new_context(viewport={"width": 1400, "height": 900})).new_page()
        await page.goto(url)
        await page.wait_for_selector("body[data-ready='1']")
        for name, target in (
            ("the session list", base + "/"),
            ("session of 10,000 runs", f"{base}/sessions/{BIG}"),
        ):
            paints, drawn = [], []
            for _ in range(runs):
                await page.goto(target)
                await page.wait_for_selector("body[data-ready='1']", timeout=30_000)
                drawn.append(
                    await page.evaluate("performance.getEntriesByName('flowscope-ready')[0].startTime") / 1000
                )
                paints.append(
                    await page.evaluate(
                        "(performance.getEntriesByName('first-contentful-paint')[0] || {startTime: 0}).startTime"
                    )
                    / 1000
                )
            out[f"{name}: first paint"] = statistics.median(paints)
            out[f"{name}: navigation to drawn"] = statistics.median(drawn)
        await b.close()
    return out


def measure(db: Path, runs: int) -> dict[str, float]:
    """Every figure, in seconds: :func:`server_times`, then ``flowscope ui --read-only`` as a
    process and :func:`browser_times` against it."""
    results = server_times(db)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flowscope.cli import main; main()",
            "ui",
            "--db",
            str(db),
            "--port",
            "0",
            "--read-only",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        results.update(asyncio.run(browser_times(url, url.split("/?")[0], runs)))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="flowscope-console-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / "console.db"
    t = time.perf_counter()
    build(db, args.sessions)
    print(
        f"database: {args.sessions:,} sessions and a session of 10,000 runs ({time.perf_counter() - t:.0f}s to build or check)"
    )
    results = measure(db, args.runs)
    width = max(len(k) for k in results)
    print(f"{'what':<{width}}  seconds  target")
    missed = 0
    for k, v in results.items():
        mark = "" if "first paint" in k else ("pass" if v < TARGET_S else "FAIL")
        missed += mark == "FAIL"
        print(f"{k:<{width}}  {v:7.3f}  {('< 2 s ' + mark) if mark else ''}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
