"""Worker chaos: three ``flowscope worker`` processes on one SQLite
file, 100 submitted sessions, one worker SIGKILLed and restarted every half second.

Sessions are chains, fan-outs with a join, a node retried after a failure, input pauses
answered with ``flowscope resume SESSION --input go=true`` and jobs reported with
``flowscope resume SESSION --job ID=JSON`` (neither has the workflow's code), submitted
with ``Runner.submit`` and ``flowscope start``. Every node appends a line (session, path,
attempt) to a file after its work (tests/chaos_workflows.py). At the end:

- every session completed, with the output its workflow computes;
- every node run that completed has exactly one line at its completed attempt, and any
  other line of it is at a lower attempt: a retried attempt (its NodeRetrying is in the
  log) or one cut off by a kill; no attempt ran twice; attempts never go back, in the
  side effects or in the log;
- nothing is left open: ``flowscope stuck --format json`` is empty.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from commands import ROOT, cli_env, run_cli, start_cli
from flowscope import Runner
from flowscope.answers import AnswerReceipt, answer
from flowscope.store import SqliteEventStore, rebuild

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chaos_workflows as cw  # noqa: E402

N_WORKERS = 3
LEASE = "2s"
#: A kill every half second: the sessions take ~6 s, so a dozen kills, half of them aimed at
#: a worker with a node in flight (with one a second, a fast run saw 4, and none mid-flight).
KILL_EVERY_S = 0.5

pytestmark = pytest.mark.slow


def env_for(log: Path) -> dict[str, str]:
    return cli_env(paths=(ROOT,), CHAOS_LOG=str(log))


def start_worker(db: Path, env: dict[str, str], out: Path) -> subprocess.Popen[str]:
    return start_cli(
        "--db",
        str(db),
        "worker",
        "tests.chaos_workflows:ALL",
        "--lease",
        LEASE,
        "--poll",
        "50ms",
        "--concurrency",
        "16",
        "--max-recoveries",
        "100",
        "--drain",
        "5s",
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(out, "ab"),
    )


def mark_killed(log: Path, pid: int) -> None:
    """Append a line saying PID is dead, in one O_APPEND write like the nodes' effects."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps({"killed": pid}) + "\n").encode())
    finally:
        os.close(fd)


def cli(db: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--db", str(db), *args, cwd=ROOT, env=env)


def answer_now(db: Path, sid: str) -> AnswerReceipt:
    """Answer ``go`` through the API, at once: the session's other branch is still running."""
    with SqliteEventStore(db) as store:
        return answer(store, sid, inputs={"go": True})


def busy_worker(store: SqliteEventStore, workers: list[subprocess.Popen[str]]) -> int | None:
    """The index of a worker that owns a session with a node running right now, if any:
    every other kill aims at one, so that kills cut nodes off mid-flight, not idle workers."""
    pids = {w.pid: i for i, w in enumerate(workers)}
    for run in store.open_runs():
        if run.status != "running" or run.kind != "function":
            continue
        info = store.session_info(run.session_id)
        if info is not None and info.owner is not None and info.owner.pid in pids:
            return pids[info.owner.pid]
    return None


def test_three_workers_one_killed_every_half_second_complete_every_session_once(tmp_path):
    db, log, wlog = tmp_path / "chaos.db", tmp_path / "effects.jsonl", tmp_path / "workers.log"
    env = env_for(log)
    os.environ["CHAOS_LOG"] = str(log)  # Runner.submit below runs nothing, but be safe
    # -- 100 sessions: 95 with Runner.submit, 5 with `flowscope start` (by name, no code)
    plan = (
        [cw.chain] * 30
        + [cw.fanout] * 20
        + [cw.retrying] * 20
        + [cw.asking] * 15
        + [cw.racing] * 10
        + [cw.job] * 15
    )
    expected: dict[str, object] = {}
    with SqliteEventStore(db) as store:
        for i, wf in enumerate(plan[:-5]):
            sid = Runner(wf, store).submit(i, session_id=f"s{i:03d}-{wf.name}")
            expected[sid] = wf
    for i, wf in enumerate(plan[-5:], start=len(plan) - 5):
        sid = f"s{i:03d}-{wf.name}"
        r = cli(db, env, "start", wf.name, "--input", str(i), "--session", sid)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == sid
        expected[sid] = wf
    assert len(expected) == 110

    workers = [start_worker(db, env, wlog) for _ in range(N_WORKERS)]
    answered: set[str] = set()
    answer_results: list[subprocess.CompletedProcess[str]] = []
    race_results: list[AnswerReceipt] = []
    race_futures = []
    kills = 0
    t0 = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=3)  # `flowscope resume` processes, a second or so each when loaded
    # The in-process answers to running sessions get threads of their own: queued behind the
    # CLI's processes they arrived after race_slow's 0.4 s, when the session had paused.
    race_pool = ThreadPoolExecutor(max_workers=2)
    futures = []
    try:
        next_kill = time.monotonic() + KILL_EVERY_S
        with SqliteEventStore(db, readonly=True) as store:
            while True:
                statuses = {s.session_id: s.status for s in store.sessions()}
                if all(statuses.get(sid) == "completed" for sid in expected):
                    break
                assert time.monotonic() - t0 < 75, (
                    f"not done after 75s: {sorted((s, st) for s, st in statuses.items() if st != 'completed')[:10]}\n"
                    + wlog.read_text()[-3000:]
                )
                for sid, status in statuses.items():
                    if sid in answered or expected.get(sid) is not cw.racing or status != "running":
                        continue
                    # answered while the session runs (race_slow still at work): its inbox
                    if any(
                        ns.node == "race_ask" and ns.status == "waiting_input"
                        for ns in rebuild(store.read(sid)).nodes.values()
                    ):
                        answered.add(sid)
                        race_futures.append(race_pool.submit(answer_now, db, sid))
                for sid, status in statuses.items():
                    if status != "paused" or sid in answered:
                        continue
                    args = cw.resume_args(rebuild(store.read(sid)).pending)
                    if args:
                        answered.add(sid)
                        futures.append(pool.submit(cli, db, env, "resume", sid, *args))
                if time.monotonic() >= next_kill:
                    victim = busy_worker(store, workers) if kills % 2 == 0 else None
                    if victim is None:
                        victim = kills % N_WORKERS
                    workers[victim].send_signal(signal.SIGKILL)
                    workers[victim].wait(10)
                    # the kill goes in the effects file itself, after the process is reaped:
                    # the file's order is causal, where clocks read in two processes need not be
                    mark_killed(log, workers[victim].pid)
                    kills += 1
                    workers[victim] = start_worker(db, env, wlog)
                    next_kill += KILL_EVERY_S
                time.sleep(0.1)
        answer_results = [f.result(timeout=60) for f in futures]
        race_results = [f.result(timeout=60) for f in race_futures]
        elapsed = time.monotonic() - t0
        # SIGTERM only workers that are serving (a worker still importing has no handler yet)
        with SqliteEventStore(db, readonly=True) as store:
            deadline = time.monotonic() + 20
            while {w.pid for w in workers} - {info.pid for info in store.workers()}:
                assert time.monotonic() < deadline, "a restarted worker never recorded itself"
                time.sleep(0.1)
    finally:
        pool.shutdown(wait=False)
        race_pool.shutdown(wait=False)
        cw.stop_workers(workers)

    # the workers still alive drain and exit 0 on SIGTERM
    assert all(w.returncode == 0 for w in workers), [w.returncode for w in workers]
    assert kills >= 8, f"only {kills} kills: the sessions finished too fast to test anything"
    # every answer went through the store, without the code, and said so
    assert len(answer_results) + len(race_results) == 40
    for r in answer_results:  # recorded, or sent to an owner that had not released it yet
        assert r.returncode == 0, r.stderr
        assert ("recorded" in r.stdout and "worker" in r.stdout) or "still running it" in r.stdout, r.stdout
    # an answer while the session runs goes to its owner's inbox (or straight in, when the
    # owner was just killed); most found the owner running
    pending = sum(r.pending for r in race_results)
    assert pending >= 3, f"only {pending} of {len(race_results)} answers found a live owner: no race tested"

    records = [json.loads(x) for x in log.read_text().splitlines()]
    lines = [x for x in records if "killed" not in x]
    kill_lines: dict[int, list[int]] = defaultdict(list)  # pid -> where in the file it was reaped
    by_run: dict[tuple[str, str], list[int]] = defaultdict(list)
    effect: dict[tuple[str, str, int], int] = {}  # -> where in the file the effect is
    for at, x in enumerate(records):
        if "killed" in x:
            kill_lines[x["killed"]].append(at)
            continue
        by_run[(x["session"], x["path"])].append(x["attempt"])
        effect[(x["session"], x["path"], x["attempt"])] = at
    assert sum(len(v) for v in kill_lines.values()) == kills
    re_executed = retried = checked_runs = cut_after_effect = flaky_runs = 0
    with SqliteEventStore(db, readonly=True) as store:
        for sid in expected:
            events = store.read(sid)
            ws = rebuild(events)
            assert ws.status == "completed", (sid, ws.status)
            assert ws.output is not None
            # attempts in the log never go back, per node run
            last: dict[str, int] = {}
            for e in events:
                attempt = getattr(e, "attempt", None)
                if e.type in ("node_started", "node_retrying", "node_completed") and attempt is not None:
                    assert attempt >= last.get(e.path, 0), (sid, e.path, e.type, attempt, last.get(e.path))
                    last[e.path] = attempt
            retry_attempts = {(e.path, e.attempt) for e in events if e.type == "node_retrying"}
            checked = 0
            for path, ns in ws.nodes.items():
                if ns.kind != "function":
                    continue
                checked += 1
                assert (sid, path) in by_run, (sid, path, "completed without its side effect")
                attempts = by_run[(sid, path)]
                assert ns.status == "completed", (sid, path, ns.status)
                # no attempt executed twice; attempts only go up; the last is the completed one
                assert len(set(attempts)) == len(attempts), (sid, path, attempts)
                assert attempts == sorted(attempts), (sid, path, attempts)
                assert attempts[-1] == ns.attempt, (sid, path, attempts, ns.attempt)
                if ns.node == "flaky":  # its first attempt always fails (retried) or was cut off
                    assert ns.attempt >= 2, (sid, path, attempts)
                    flaky_runs += 1
                for a in attempts[:-1]:
                    if (path, a) in retry_attempts:
                        retried += 1
                    else:
                        cut_after_effect += 1  # killed between its side effect and its completion
                        # a double side effect only where SIGKILL cut the run off: its worker
                        # was killed after the effect and before the next attempt's; never
                        # because an answer or anything else made a live worker drop its work
                        done, again = (
                            effect[(sid, path, a)],
                            effect[(sid, path, attempts[attempts.index(a) + 1])],
                        )
                        pid = records[done]["pid"]
                        assert any(done < k < again for k in kill_lines.get(pid, [])), (
                            sid,
                            path,
                            attempts,
                            "run again although its worker lived",
                        )
                # attempts that neither completed nor were retried: cut off by a kill, run again
                re_executed += sum(1 for a in range(1, ns.attempt) if (path, a) not in retry_attempts)
            assert checked >= 3, (sid, checked)  # every workflow has three nodes or more
            checked_runs += checked

    stuck = cli(db, env, "stuck", "--older-than", "0s", "--format", "json")
    assert stuck.returncode == 0, stuck.stderr
    assert json.loads(stuck.stdout) == []
    # every retrying session's flaky node got past its failing attempt 1: retried, or cut off
    # by a kill (before or after its side effect) and run again at a higher attempt
    assert flaky_runs == 20
    assert checked_runs == len(by_run)  # no side effect of a run the log does not have
    print(
        f"\nchaos: 110 sessions, {kills} kills, {len(lines)} side effects, {retried} retried attempts, "
        f"{re_executed} attempts cut off by a kill and run again ({cut_after_effect} after their side effect), "
        f"{checked_runs} node runs checked, {pending} answers taken in by a running owner, {elapsed:.1f}s"
    )
    assert re_executed > 0, "no kill cut a node off mid-flight: the test proved nothing about recovery"
