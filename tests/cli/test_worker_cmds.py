"""``flowscope worker`` tunes the garbage collector of its own process: what it loaded is
frozen, generation 0 is collected by the sessions it may hold, and a host that runs the
command in-process (a test) gets its settings back."""

from __future__ import annotations

import gc
import signal

import pytest

from commands import cli_ok, start_cli
from flowscope.cli.worker_cmds import (
    WORKER_GC_THRESHOLDS,
    WORKER_GC_YOUNG_PER_SESSION,
    tune_gc,
    untune_gc,
    worker_gc_thresholds,
)
from flowscope.fold import WorkflowState
from flowscope.store import SqliteEventStore, rebuild
from waiting import wait_for

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
    cli_ok("--db", str(db), "start", "gcflow", "--session", "g1", cwd=tmp_path)
    w = start_cli(
        "--db",
        str(db),
        "worker",
        "flows:gcflow",
        "--poll",
        "50ms",
        "--concurrency",
        str(concurrency),
        cwd=tmp_path,
    )
    try:
        with SqliteEventStore(db, readonly=True) as store:

            def completed() -> WorkflowState | None:
                assert w.poll() is None, "the worker stopped"
                state = rebuild(store.read("g1"))
                return state if state.status == "completed" else None

            state = wait_for(completed, 30, "the worker to run g1")
    finally:
        w.send_signal(signal.SIGTERM)
        _out, err = w.communicate(timeout=30)
    assert w.returncode == 0, err
    seen = state.output
    assert seen["threshold"] == [young, *WORKER_GC_THRESHOLDS[1:]]
    assert seen["frozen"] > 0


def test_a_worker_started_under_the_id_of_a_live_worker_says_so(tmp_path, capsys):
    from flowscope.cli.worker_cmds import _warn_if_twin
    from flowscope.ownership import this_process

    with SqliteEventStore(tmp_path / "w.db") as store:
        twin = this_process("orders")  # a live process (this one) records itself as "orders"
        store.workers_seen(twin, ["checkout"])
        _warn_if_twin(store, "orders", twin.host, twin.pid + 1)
        err = capsys.readouterr().err
        assert f"worker id orders is in use by a live worker on {twin.host} pid {twin.pid}" in err
        assert "give each worker its own --worker-id" in err and err.count("\n") == 1
        _warn_if_twin(store, "orders", twin.host, twin.pid)  # itself, restarted in place
        _warn_if_twin(store, "billing", twin.host, twin.pid + 1)  # another id
        assert capsys.readouterr().err == ""
