"""Snapshots: a cache of the fold that lets a long session resume without reading its whole log."""

from __future__ import annotations

import json
import logging

import pytest

from flowscope import START, Runner, Workflow, node
from flowscope.fold import restore_state, snapshot_state
from flowscope.store import MemoryEventStore, SqliteEventStore, rebuild
from fuzz_workflows import Effects, build_workflow, drive

#: The first seeds run in the fast loop, all forty in the full suite.
FAST_SEEDS = 12


@pytest.mark.parametrize(
    "seed", [s if s < FAST_SEEDS else pytest.param(s, marks=pytest.mark.slow) for s in range(40)]
)
async def test_a_snapshot_restores_exactly_the_fold_at_every_point(seed):
    store = MemoryEventStore()
    wf = build_workflow(5000 + seed, Effects())
    await drive(lambda: Runner(wf, store=store, heartbeat_interval=0, seed=1), "s", 3)
    events = store.read("s")
    for cut in sorted({1, len(events) // 3, len(events) // 2, len(events) - 1, len(events)}):
        expected = rebuild(events[:cut])
        restored = restore_state(json.dumps(snapshot_state(expected)))
        assert restored == expected, f"seed {seed}, cut at {cut}"
        assert restored.pending == expected.pending


def _long_paused_workflow(n):
    steps = [node(lambda x: x + 1, name=f"n{i}") for i in range(n)]

    @node
    async def ask(ctx, x):
        return x + await ctx.request_input("?", interrupt_id="approval")

    return Workflow("long", edges=[(START, *steps, ask)], max_steps=n + 10)


async def test_resume_reads_the_snapshot_and_only_the_events_after_it(tmp_path, monkeypatch):
    wf = _long_paused_workflow(300)
    store = SqliteEventStore(tmp_path / "s.db")
    assert (await Runner(wf, store=store, snapshot_every=100).run(0, session_id="s")).status == "paused"
    seq, _data = store.load_snapshot("s")
    assert seq == store.last_seq("s")

    reads = []
    original = SqliteEventStore.read

    def spy(self, session_id, after_seq=0):
        reads.append(after_seq)
        return original(self, session_id, after_seq)

    monkeypatch.setattr(SqliteEventStore, "read", spy)
    result = await Runner(wf, store=SqliteEventStore(tmp_path / "s.db")).resume("s", inputs={"approval": 5})
    assert result.output == 305
    assert reads == [seq]  # never the whole log


async def test_a_small_session_writes_no_snapshot(tmp_path):
    wf = _long_paused_workflow(3)
    store = SqliteEventStore(tmp_path / "s.db")
    await Runner(wf, store=store).run(0, session_id="s")
    assert store.load_snapshot("s") is None  # fewer than snapshot_every events


@pytest.mark.parametrize("bad", ["{not json", '{"format": 99}', "[]"])
async def test_an_unusable_snapshot_is_ignored_and_the_log_folded(tmp_path, caplog, bad):
    wf = _long_paused_workflow(20)
    path = tmp_path / "s.db"
    store = SqliteEventStore(path)
    await Runner(wf, store=store, snapshot_every=1).run(0, session_id="s")
    store.save_snapshot("s", store.last_seq("s"), bad)
    with caplog.at_level(logging.WARNING):
        result = await Runner(wf, store=SqliteEventStore(path)).resume("s", inputs={"approval": 1})
    assert result.output == 21
    assert "ignoring the snapshot" in caplog.text


async def test_a_snapshot_behind_the_log_is_completed_by_the_tail(tmp_path):
    """A later invocation that died before writing its snapshot: the tail carries the rest."""
    wf = _long_paused_workflow(10)
    path = tmp_path / "s.db"
    store = SqliteEventStore(path)
    await Runner(wf, store=store, snapshot_every=1).run(0, session_id="s")
    old_seq, old = store.load_snapshot("s")
    second = await Runner(wf, store=store, snapshot_every=1).resume("s")  # nothing answered: pauses again
    assert second.status == "paused" and store.load_snapshot("s")[0] > old_seq
    store.save_snapshot("s", old_seq, old)  # as if the second invocation had not saved one
    assert (await Runner(wf, store=SqliteEventStore(path)).resume("s", inputs={"approval": 2})).output == 12


def test_a_snapshot_ahead_of_the_log_is_refused(tmp_path):
    from flowscope.errors import StoreError

    store = SqliteEventStore(tmp_path / "s.db")
    with pytest.raises(StoreError, match="ahead of its log"):
        store.save_snapshot("nope", 5, "{}")
