"""Snapshots: a cache of the fold that lets a long session resume without reading its whole log."""

from __future__ import annotations

import json
import logging
import math

import pytest

from flowscope import START, Runner, Workflow, node
from flowscope.snapshot import restore_state, snapshot_state
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


def _format_2_as_version_1_wrote_it(ws, restarts=True):
    """The snapshot writer of format 2 (every version before format 3), kept here as it
    was: rows of every scalar field in JSON, the extras last, invocation ids by index; and,
    with ``restarts``, the runs' restarts as this version adds them."""
    from dataclasses import fields

    from flowscope.events import to_dict
    from flowscope.fold import NodeState, WorkflowState

    names = [f.name for f in fields(NodeState)]
    scalars = names[: names.index("inputs")]
    invocations, rows = {}, []
    for ns in ws.nodes.values():
        row = [getattr(ns, f) for f in scalars]
        row[scalars.index("invocation_id")] = invocations.setdefault(ns.invocation_id, len(invocations))
        if ns.inputs or ns.requests or ns.jobs or ns.job_results:
            row.append(
                [
                    ns.inputs,
                    [to_dict(e) for e in ns.requests.values()],
                    [to_dict(e) for e in ns.jobs.values()],
                    [to_dict(e) for e in ns.job_results.values()],
                ]
            )
        rows.append(row)
    d = {
        f.name: getattr(ws, f.name) for f in fields(WorkflowState) if f.name not in ("nodes", "snapshot_seq")
    }
    d["format"] = 2
    d["invocation_ids"] = list(invocations)
    d["nodes"] = rows
    if restarts:  # since the runs' restarts are kept: those that started more than once
        d["restarted"] = [[i, ns.restarted_at] for i, ns in enumerate(ws.nodes.values()) if ns.restarted_at]
    return json.dumps(d)


async def test_a_format_2_snapshot_of_an_earlier_version_restores_exactly():
    """Snapshots already in a store keep their use: format 2 reads back as it always did,
    the runs' inputs, requests, jobs and job results with it."""
    with_extras = 0
    for seed in range(8):
        store = MemoryEventStore()
        wf = build_workflow(5000 + seed, Effects())
        await drive(lambda: Runner(wf, store=store, heartbeat_interval=0, seed=1), "s", 3)
        events = store.read("s")
        for cut in (len(events) // 2, len(events)):
            expected = rebuild(events[:cut])
            with_extras += any(ns.requests or ns.jobs or ns.inputs for ns in expected.nodes.values())
            restored = restore_state(_format_2_as_version_1_wrote_it(expected))
            assert restored == expected and restored.pending == expected.pending, (seed, cut)
    assert with_extras  # the extras' path was taken


async def test_a_snapshot_without_the_runs_restarts_is_not_used_and_the_log_is_folded(tmp_path, caplog):
    """A snapshot of an earlier version did not keep which runs started again (a resumed
    run's ``restarted_at``): not used, rather than restored without them."""
    from flowscope.engine.snapshots import load_snapshot

    store = SqliteEventStore(tmp_path / "s.db")
    wf = build_workflow(5003, Effects())
    await drive(lambda: Runner(wf, store=store, heartbeat_interval=0, seed=1), "s", 3)
    expected = rebuild(store.read("s"))
    assert any(ns.restarted_at is not None for ns in expected.nodes.values())  # a run resumed
    old = _format_2_as_version_1_wrote_it(expected, restarts=False)
    with pytest.raises(ValueError, match="earlier version"):
        restore_state(old)
    store.save_snapshot("s", expected.last_seq, old)
    caplog.set_level("WARNING", logger="flowscope.engine")
    assert load_snapshot(store, "s") is None  # the caller folds the whole log
    assert "ignoring the snapshot of session s" in caplog.text
    store.save_snapshot("s", expected.last_seq, _format_2_as_version_1_wrote_it(expected))
    assert load_snapshot(store, "s") == expected


def test_a_runs_times_restore_bit_for_bit_and_a_nan_time_falls_back_to_rows():
    """Format 3 keeps the four times as IEEE doubles (None as NaN): every double comes back
    exactly, -0.0 and the smallest subnormal too; a NaN time, which the clock never gives,
    is written in format 2 and still restores."""
    from flowscope.fold import NodeState, WorkflowState

    odd = [0.0, -0.0, 5e-324, 1e308, math.inf, -math.inf, 1796536990.4337113, None]
    ws = WorkflowState(session_id="s", workflow="w", last_seq=9)
    for i, t in enumerate(odd):
        path = f"w@1/n@{i + 1}"
        ws.nodes[path] = NodeState(
            path,
            "n",
            started_at=t,
            ended_at=odd[-1 - i],
            heartbeat_at=None,
            job_deadline_at=t,
            invocation_id=f"i{i % 3}",
        )
    snap = snapshot_state(ws)
    assert snap["format"] == 3
    restored = restore_state(json.dumps(snap))
    assert [
        [
            repr(getattr(ns, f))
            for f in ("started_at", "ended_at", "heartbeat_at", "job_deadline_at", "invocation_id")
        ]
        for ns in restored.nodes.values()
    ] == [
        [
            repr(getattr(ns, f))
            for f in ("started_at", "ended_at", "heartbeat_at", "job_deadline_at", "invocation_id")
        ]
        for ns in ws.nodes.values()
    ]
    assert restored == ws
    ws.nodes["w@1/n@1"].heartbeat_at = math.nan
    snap = snapshot_state(ws)
    assert snap["format"] == 2
    back = restore_state(json.dumps(snap))
    assert math.isnan(back.nodes["w@1/n@1"].heartbeat_at)
    back.nodes["w@1/n@1"].heartbeat_at = ws.nodes["w@1/n@1"].heartbeat_at = None
    assert back == ws


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


def _one_run_snapshot(fmt):
    """A snapshot of one run whose invocation id, and whose extras in format 3, point past
    what the snapshot holds: it parses, and cannot be used."""
    from flowscope.fold import NodeState, WorkflowState

    ws = WorkflowState(session_id="s", workflow="long", last_seq=3)
    ws.nodes["long@1"] = NodeState("long@1", "long", invocation_id="i1", inputs={"a": 1})
    ws.nodes["long@1"].started_at = 1.0 if fmt == 3 else math.nan
    d = snapshot_state(ws)
    assert d["format"] == fmt
    d["invocation_ids"] = []
    if fmt == 3:
        d["extras"][0][0] = 7
    return json.dumps(d)


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        '{"format": 99}',
        "[]",
        '{"format": 3, "invocation_ids": [], "columns": [[]], "times": "", "extras": []}',
        '{"format": 3, "invocation_ids": [], "columns": '
        + json.dumps([["w@1"]] + [[0]] * 16)
        + ', "times": "AAAA", "extras": []}',
        _one_run_snapshot(2),
        _one_run_snapshot(3),
        "[" * 100_000,  # nested past the JSON parser's depth: RecursionError, not ValueError
    ],
)
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


async def test_another_sessions_snapshot_or_one_ahead_of_the_log_is_never_used(tmp_path, caplog):
    """A store whose rows got mixed up (an adapter's bug, a restored backup): a snapshot of
    another session, or of events its log does not hold, is ignored and the log folded."""
    import sqlite3

    wf = _long_paused_workflow(10)
    path = tmp_path / "s.db"
    store = SqliteEventStore(path)
    await Runner(wf, store=store, snapshot_every=1).run(1, session_id="a")
    await Runner(wf, store=store, snapshot_every=1).run(2, session_id="b")
    seq_a, data_a = store.load_snapshot("a")
    assert store.load_snapshot("b")[0] == seq_a  # the same shape: only the session differs
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE snapshots SET data = ? WHERE session_id = 'b'", (data_a,))
        raw.execute("UPDATE snapshots SET seq = seq + 50 WHERE session_id = 'a'")
    with caplog.at_level(logging.WARNING):
        b = await Runner(wf, store=SqliteEventStore(path)).resume("b", inputs={"approval": 1})
        a = await Runner(wf, store=SqliteEventStore(path)).resume("a", inputs={"approval": 1})
    assert (a.output, b.output) == (12, 13)  # each from its own log: its own input (1 and 2)
    started = [e.input for e in store.read("b") if e.type == "run_started"]
    assert started == [2, 2]
    assert "it is the fold of session 'a'" in caplog.text and "the log at" in caplog.text


def test_a_snapshot_ahead_of_the_log_is_refused(tmp_path):
    from flowscope.errors import StoreError

    store = SqliteEventStore(tmp_path / "s.db")
    with pytest.raises(StoreError, match="ahead of its log"):
        store.save_snapshot("nope", 5, "{}")


async def test_a_snapshot_holds_a_recorded_value_as_recorded_not_as_a_later_node_changed_it(tmp_path):
    # the live fold kept the objects a node returned: the next node's in-place edit of its
    # input reached the fold, and so the snapshot a resume starts from
    seen = []

    @node
    def produce(x):
        return {"n": 0}

    @node
    async def edit(ctx, inp):
        seen.append(dict(inp))
        inp["n"] += 1
        await ctx.request_input("go?", interrupt_id="go")
        return inp

    wf = Workflow("w", edges=[(START, produce, edit)])
    store = SqliteEventStore(tmp_path / "s.db")  # the memory store keeps no snapshot
    await Runner(wf, store=store, snapshot_every=1).run(0, session_id="s")
    assert store.load_snapshot("s") is not None
    result = await Runner(wf, store=store, snapshot_every=1).resume("s", inputs={"go": True})
    assert seen == [{"n": 0}, {"n": 0}]  # live, then after resume from the snapshot: the same
    assert result.output == {"n": 1}
