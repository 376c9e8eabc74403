"""Crash recovery across real processes: SIGKILL at many points, resume in a new process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from flowscope.events import TERMINAL_TYPES
from flowscope.store import SqliteEventStore, rebuild

# Every test here starts processes or servers, or runs the demo end to end.
pytestmark = pytest.mark.slow

WORKER = str(Path(__file__).resolve().parents[1] / "crash_worker.py")


def worker(*args, check=True):
    proc = subprocess.run(
        [sys.executable, WORKER, *map(str, args)], capture_output=True, text=True, timeout=60
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"worker {args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def effects_of(path: Path) -> Counter:
    return Counter(path.read_text().split()) if path.exists() else Counter()


def finish(db, effects, session):
    """Resume in fresh processes until the session completes (it pauses once for approval)."""
    for _ in range(5):
        if rebuild(SqliteEventStore(db).read(session)).status == "completed":
            return  # killed right after its RunFinished: nothing left to do
        out = worker(db, effects, session, "resume").stdout.strip()
        if out == "completed":
            return
    raise AssertionError("session did not complete")


def uninterrupted(tmp_path):
    db, effects = tmp_path / "base.db", tmp_path / "base.effects"
    assert worker(db, effects, "s", "run").stdout.strip() == "paused"
    appends_before_pause = SqliteEventStore(db).last_seq("s")
    finish(db, effects, "s")
    return db, effects, appends_before_pause


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The uninterrupted run, once for the module: its effects are the reference."""
    return uninterrupted(tmp_path_factory.mktemp("base"))


def test_uninterrupted_run_does_every_effect_once(base):
    db, effects, _ = base
    counts = effects_of(effects)
    assert counts and all(n == 1 for n in counts.values())
    assert rebuild(SqliteEventStore(db).read("s")).status == "completed"


def _appends_per_invocation() -> tuple[int, int]:
    """How many transactions the worker's first run and its resume append (counted once,
    at collection, so that every one of them is a kill point whatever group commit does)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        counts = []
        for mode in ("run", "resume"):
            proc = subprocess.run(
                [sys.executable, WORKER, f"{d}/c.db", f"{d}/c.eff", "s", mode],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, proc.stderr
            counts.append(int(proc.stderr.split()[-1]))
    return counts[0], counts[1]


# Killing after each append of the first run (it pauses for the approval) and of the
# resume (the last of each kills it right after its RunFinished), and the kills from
# outside inside node bodies (below), give at least 20 points (checked below).
RUN_APPENDS, RESUME_APPENDS = _appends_per_invocation()
KILL_POINTS = list(range(1, RUN_APPENDS + 1))
RESUME_KILL_POINTS = list(range(1, RESUME_APPENDS + 1))


def test_there_are_at_least_twenty_kill_points():
    assert len(KILL_POINTS) + len(RESUME_KILL_POINTS) + len(IN_BODY_KILLS) >= 20


def _check(db, effects, base_effects, killed_events):
    store = SqliteEventStore(db)
    events = store.read("s")
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "the log has a gap"
    state = rebuild(events)
    assert state.status == "completed"
    counts = effects_of(effects)
    assert set(counts) == set(effects_of(base_effects)), "a different set of runs did work"
    done_before_kill = {e.path for e in killed_events if e.type == "node_completed"}
    for path in done_before_kill & set(counts):
        assert counts[path] == 1, f"{path} completed before the kill but ran {counts[path]} times"
    for path, n in counts.items():
        assert n <= 2, f"{path} ran {n} times"
    # every NodeStarted of an invocation that was not killed has its terminal event
    killed_invocations = {e.invocation_id for e in killed_events}
    for s in (e for e in events if e.type == "node_started" and e.invocation_id not in killed_invocations):
        assert any(
            t.path == s.path and t.invocation_id == s.invocation_id and t.type in TERMINAL_TYPES
            for t in events
        )
    return state


@pytest.mark.parametrize("kill_after", KILL_POINTS)
def test_sigkill_during_the_first_run_then_resume_in_a_new_process(tmp_path, kill_after, base):
    _base_db, base_effects, _ = base
    db, effects = tmp_path / "crash.db", tmp_path / "crash.effects"
    proc = worker(db, effects, "s", "run", kill_after, check=False)
    assert proc.returncode == -signal.SIGKILL
    killed_events = SqliteEventStore(db).read("s")
    assert len(killed_events) > 0
    finish(db, effects, "s")
    state = _check(db, effects, base_effects, killed_events)
    started = [e for e in SqliteEventStore(db).read("s") if e.type == "run_started"]
    if any(ns.recoveries for ns in state.nodes.values()):
        assert started[1].recovered >= 1  # the resume audit record counts what it recovered


@pytest.mark.parametrize("kill_after", RESUME_KILL_POINTS)
def test_sigkill_during_the_resume_then_resume_again(tmp_path, kill_after, base):
    _base_db, base_effects, _ = base
    db, effects = tmp_path / "crash.db", tmp_path / "crash.effects"
    assert worker(db, effects, "s", "run").stdout.strip() == "paused"
    proc = worker(db, effects, "s", "resume", kill_after, check=False)
    assert proc.returncode == -signal.SIGKILL
    killed_events = SqliteEventStore(db).read("s")
    finish(db, effects, "s")
    _check(db, effects, base_effects, killed_events)


def test_recovered_attempt_numbers_continue_after_a_crash(tmp_path):
    # kill right after fetch's attempt 2 started (retrying is appended, then attempt 2 begins)
    for k in KILL_POINTS:
        db, effects = tmp_path / f"crash{k}.db", tmp_path / f"crash{k}.effects"
        worker(db, effects, "s", "run", k, check=False)
        state = rebuild(SqliteEventStore(db).read("s"))
        fetch = state.nodes.get("orders@1/fetch@1")
        if fetch is not None and fetch.status == "running" and fetch.attempt == 2:
            break
    else:
        pytest.fail("no kill point left fetch running in attempt 2")
    finish(db, effects, "s")
    events = SqliteEventStore(db).read("s")
    starts = [e for e in events if e.type == "node_started" and e.path == "orders@1/fetch@1"]
    assert [s.attempt for s in starts] == [1, 3] and starts[1].recovered is True
    done = [e for e in events if e.type == "node_completed" and e.path == "orders@1/fetch@1"]
    assert done[0].attempt_count == 3


IN_BODY_KILLS = [
    "orders@1/pack@1",
    "orders@1/notify@1",
    "orders@1/bill@1/charge@1",
    "orders@1/ship@1/label@1",
    "orders@1/ship@1/dispatch@1",
]


def kill_inside(db, effects, node_path):
    """Run the worker until it holds inside ``node_path``'s body, SIGKILL it from outside,
    and return what the log held then."""
    env = dict(os.environ, CRASH_WORKER_HOLD=node_path)
    proc = subprocess.Popen(
        [sys.executable, WORKER, str(db), str(effects), "s", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    hold = Path(str(effects) + ".holding")
    import time

    deadline = time.monotonic() + 30
    while not hold.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    return SqliteEventStore(db).read("s")


@pytest.mark.parametrize("node_path", IN_BODY_KILLS)
def test_sigkill_inside_a_node_body_from_outside(tmp_path, node_path, base):
    """A kill from another process while a node body runs (not at an append boundary)."""
    _base_db, base_effects, _ = base
    db, effects = tmp_path / "crash.db", tmp_path / "crash.effects"
    killed_events = kill_inside(db, effects, node_path)
    state = rebuild(killed_events)
    assert state.nodes[node_path].status == "running"  # started, never finished
    finish(db, effects, "s")
    final = _check(db, effects, base_effects, killed_events)
    assert final.nodes[node_path].recoveries == 1


def test_two_processes_resume_the_same_session_at_once(tmp_path, base):
    """R10: exactly one completes it, the other gets ConcurrencyConflict; nothing doubled or lost."""
    db, effects = tmp_path / "race.db", tmp_path / "race.effects"
    assert worker(db, effects, "s", "run").stdout.strip() == "paused"
    before = effects_of(effects)
    go = tmp_path / "go"
    env = dict(os.environ, CRASH_WORKER_GO=str(go), CRASH_WORKER_LINGER="1.5")
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(db), str(effects), "s", "resume"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    import time

    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("go.ready*"))) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    go.touch()
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(o.split()[0] for o in outs) == ["completed", "conflict"], outs
    events = SqliteEventStore(db).read("s")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len([e for e in events if e.type == "input_received"]) == 1
    assert len([e for e in events if e.type == "run_started"]) == 2  # the paused run and the winner
    assert [e.status for e in events if e.type == "run_finished"] == ["paused", "completed"]
    after = effects_of(effects) - before
    assert after and all(n == 1 for n in after.values())  # the winner's work, once


async def test_a_session_whose_process_died_a_moment_ago_resumes_without_force(tmp_path):
    """The owner is a fact in the store, not a guess from a recent heartbeat: a
    process killed a moment ago is dead, so its session is taken over at once. (A live
    owner is refused: tests/engine/test_ownership_engine.py.)"""
    from flowscope import Runner

    sys.path.insert(0, str(Path(WORKER).parent))
    import crash_worker

    db, effects = tmp_path / "live.db", tmp_path / "live.effects"
    worker(db, effects, "s", "run", 4, check=False)  # SIGKILLed at its 4th append, just now
    runner = Runner(crash_worker.build(str(effects)), store=SqliteEventStore(db), heartbeat_interval=5)
    assert (await runner.resume("s")).status == "paused"


def test_a_dynamic_child_that_completed_never_runs_again_when_its_parent_is_killed(tmp_path, base):
    """The child's completion is on record before its parent gets its output (R8): a kill
    while the parent goes on after ``ctx.run_node`` re-runs the parent, not the child."""
    _base_db, base_effects, _ = base
    db, effects = tmp_path / "crash.db", tmp_path / "crash.effects"
    killed_events = kill_inside(db, effects, "orders@1/bill@1")  # held after run_node returned
    child = "orders@1/bill@1/charge@1"
    assert child in {e.path for e in killed_events if e.type == "node_completed"}
    finish(db, effects, "s")
    final = _check(db, effects, base_effects, killed_events)
    assert effects_of(effects)[child] == 1
    assert final.nodes[child].attempt == 1 and final.nodes[child].recoveries == 0
    assert final.nodes["orders@1/bill@1"].recoveries == 1
