"""``flowscope worker`` tunes the garbage collector of its own process: what it loaded is
frozen, generation 0 is collected by the sessions it may hold, and a host that runs the
command in-process (a test) gets its settings back."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from commands import FLOWSCOPE
from flowscope.cli.worker_cmds import (
    WORKER_GC_THRESHOLDS,
    WORKER_GC_YOUNG_PER_SESSION,
    tune_gc,
    untune_gc,
    worker_gc_thresholds,
)
from flowscope.store import SqliteEventStore, rebuild

ROOT = Path(__file__).resolve().parents[2]

FLOWS_PY = """
import gc
from flowscope import START, Workflow, node

@node
async def collector(ctx, x):
    return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}

gcflow = Workflow("gcflow", edges=[(START, collector)])
"""


def test_generation_0_grows_with_the_sessions_a_worker_may_hold():
    assert worker_gc_thresholds(1) == WORKER_GC_THRESHOLDS
    assert worker_gc_thresholds(64) == WORKER_GC_THRESHOLDS  # the default --concurrency
    assert worker_gc_thresholds(10_000) == (300_000, *WORKER_GC_THRESHOLDS[1:])
    young = [worker_gc_thresholds(c)[0] for c in (1, 100, 1_000, 10_000, 100_000)]
    assert young == sorted(young) and young[-1] == WORKER_GC_YOUNG_PER_SESSION * 100_000


def test_a_host_gets_its_collector_back_when_the_worker_stops():
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    saved = tune_gc(5_000)
    try:
        assert gc.get_threshold() == (150_000, *WORKER_GC_THRESHOLDS[1:])
        assert gc.get_freeze_count() > 0  # what was loaded is out of the collector's walks
    finally:
        untune_gc(saved)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
@pytest.mark.parametrize(("concurrency", "young"), [(5_000, 150_000), (64, WORKER_GC_THRESHOLDS[0])])
def test_a_worker_process_collects_generation_0_by_its_concurrency(tmp_path, concurrency, young):
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    db = tmp_path / "w.db"
    env = {k: v for k, v in os.environ.items() if k != "FLOWSCOPE_DB"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    started = subprocess.run(
        [FLOWSCOPE, "--db", str(db), "start", "gcflow", "--session", "g1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    w = subprocess.Popen(
        [
            FLOWSCOPE,
            "--db",
            str(db),
            "worker",
            "flows:gcflow",
            "--poll",
            "50ms",
            "--concurrency",
            str(concurrency),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        with SqliteEventStore(db, readonly=True) as store:
            while (state := rebuild(store.read("g1"))).status != "completed":
                assert time.monotonic() < deadline and w.poll() is None, "the worker did not run g1"
                time.sleep(0.05)
    finally:
        w.send_signal(signal.SIGTERM)
        _out, err = w.communicate(timeout=30)
    assert w.returncode == 0, err
    seen = state.output
    assert seen["threshold"] == [young, *WORKER_GC_THRESHOLDS[1:]]
    assert seen["frozen"] > 0
