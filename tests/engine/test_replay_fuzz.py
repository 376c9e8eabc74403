"""Replay fuzzer: random workflows interrupted at a random event, then resumed.

Each case builds a seeded random workflow, runs it uninterrupted (answering every input
request and job as the outside world would), then runs it again with one interruption —
a crash (the store stops taking writes, the process's later side effects never happen)
or an abort — at a random event, and resumes it with fresh runners until it completes.

It checks: the same final output; every run that had completed (its ``NodeCompleted``
on record) before the interruption performed its side effect exactly once; a run cut off
mid-flight at most twice; the same set of completed runs; a gap-free log.

``FLOWSCOPE_FUZZ_CASES`` sets the number of cases (default 200); a failing case prints
its seed and the command to reproduce it.
"""

from __future__ import annotations

import os
import random

import pytest

from flowscope import Plugin, Runner
from flowscope.store import MemoryEventStore, rebuild
from fuzz_workflows import CrashingStore, Effects, build_workflow, drive

CASES = int(os.environ.get("FLOWSCOPE_FUZZ_CASES", "200"))
SQLITE_EVERY = 5  # every fifth case runs over a real SQLite file
POSTGRES_EVERY = 10  # and every tenth (case % 10 == 3) over PostgreSQL (the session's cluster)


def _completed_paths(events):
    return {e.path for e in events if e.type == "node_completed"}


class AbortAt(Plugin):
    """Aborts the invocation when the log reaches a given seq."""

    def __init__(self, seq):
        self.seq = seq
        self.runner = None
        self.fired = False

    def on_event(self, event):
        if not self.fired and event.seq >= self.seq and self.runner is not None:
            self.fired = True
            self.runner.abort(event.session_id)


def _on_postgres(case: int) -> bool:
    return case % POSTGRES_EVERY == 3


def _store(case, tmp_path, request=None):
    if request is not None and _on_postgres(case):
        from flowscope.store import PostgresEventStore

        pg = request.getfixturevalue("pg_cluster")  # started on the first Postgres case only
        return PostgresEventStore(pg.url(), schema=pg.new_schema("fuzz"), max_size=4)
    if case % SQLITE_EVERY == 0:
        from flowscope.store import SqliteEventStore

        return SqliteEventStore(tmp_path / f"case{case}.db")
    return MemoryEventStore()


async def _one_case(case: int, tmp_path, request=None) -> None:
    seed = 1000 + case
    rng = random.Random(seed * 7919)

    # -- the uninterrupted run --------------------------------------------------------------
    base_effects = Effects()
    base_wf = build_workflow(seed, base_effects)
    base_store = MemoryEventStore()
    expected = await drive(lambda: Runner(base_wf, store=base_store, heartbeat_interval=0, seed=1), "s", 3)
    base_events = base_store.read("s")
    assert all(n == 1 for n in base_effects.counts.values())

    # -- the interrupted run ------------------------------------------------------------------
    effects = Effects()
    wf = build_workflow(seed, effects)
    inner = _store(case, tmp_path, request)
    point = rng.randint(1, len(base_events))
    mode = rng.choice(["crash", "crash", "abort"])
    info = f"case={case} seed={seed} mode={mode} point={point} (FLOWSCOPE_FUZZ_ONLY={case} pytest tests/engine/test_replay_fuzz.py)"

    if mode == "crash":
        crashing = CrashingStore(inner, crash_at=point, commit_last=rng.random() < 0.5, effects=effects)
        stores = iter([crashing])

        def make_runner():
            store = next(stores, inner)  # the first "process" crashes; the next ones run on
            return Runner(wf, store=store, heartbeat_interval=0, snapshot_every=1, seed=1)

        effects_dead_reset = crashing
    else:
        aborter = AbortAt(point)
        first = [True]

        def make_runner():
            plugins = [aborter] if first[0] else []
            first[0] = False
            runner = Runner(wf, store=inner, plugins=plugins, heartbeat_interval=0, snapshot_every=1, seed=1)
            aborter.runner = runner
            return runner

        effects_dead_reset = None

    # a crashed process performs no more side effects; the next process does
    def make_runner_reviving():
        runner = make_runner()
        if effects_dead_reset is not None and runner.store is inner and effects_dead_reset.dead:
            effects.dead = False
        return runner

    output = await drive(make_runner_reviving, "s", 3)
    events = inner.read("s")

    assert output == expected, f"different final output: {info}"
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), f"log has gaps: {info}"
    assert _completed_paths(events) == _completed_paths(base_events), f"different completed runs: {info}"
    cut = (
        effects_dead_reset.crashed_at_seq if mode == "crash" and effects_dead_reset.crashed_at_seq else point
    )
    done_before = _completed_paths(events[:cut]) & set(base_effects.counts)  # runs with a side effect
    for path in done_before:
        assert effects.counts[path] == 1, (
            f"{path} completed before the interruption but ran {effects.counts[path]}x: {info}"
        )
    for path, n in effects.counts.items():
        assert n <= 2, f"{path} ran {n} times: {info}"
    assert rebuild(events).status == "completed", info
    if hasattr(inner, "close"):
        inner.close()


ONLY = os.environ.get("FLOWSCOPE_FUZZ_ONLY")
# The first FAST_CASES run in the fast loop (but those over PostgreSQL, which need the
# session's cluster); the rest with the full suite.
FAST_CASES = 6


def _case(c: int) -> object:
    fast = c < FAST_CASES and not _on_postgres(c)
    return c if fast else pytest.param(c, marks=pytest.mark.slow)


CASE_IDS = [int(ONLY)] if ONLY else [_case(c) for c in range(CASES)]


@pytest.mark.parametrize("case", CASE_IDS)
async def test_replay_fuzz(case, tmp_path, request):
    await _one_case(case, tmp_path, request)
