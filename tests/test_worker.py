"""The worker: SIGTERM drains, two claimers never share a session, and the CLI's
``worker``, ``start`` and code-less ``resume`` (real processes, real SQLite files)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from commands import cli_env, run_cli, start_cli
from flowscope import START, NodeContext, Runner, Worker, Workflow, node
from flowscope.store import SqliteEventStore, rebuild
from waiting import wait_for

WORKFLOWS_PY = """
import asyncio, os, json
from flowscope import START, Workflow, node

def effect(ctx, what):
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(json.dumps({"session": ctx.run.session_id, "what": what, "attempt": ctx.attempt, "pid": os.getpid()}) + "\\n")

@node
async def slow(ctx, x):
    effect(ctx, "slow-start")
    await asyncio.sleep(float(os.environ.get("SLOW_S", "2")))
    effect(ctx, "slow-end")
    return x

@node
async def tail(ctx, x):
    effect(ctx, "tail")
    return x

@node
async def ask(ctx, x):
    return await ctx.request_input("ok?", interrupt_id="ok")

drainable = Workflow("drainable", edges=[(START, slow, tail)])
asking = Workflow("asking", edges=[(START, ask)])
ALL = [drainable, asking]
"""


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return cli_env(**{"EFFECTS": str(tmp_path / "effects.jsonl"), **extra})


def cli(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--db", str(tmp_path / "w.db"), *args, cwd=tmp_path, env=env(tmp_path, **extra))


def worker(tmp_path: Path, *args: str, **extra: str) -> subprocess.Popen[str]:
    return start_cli(
        "--db",
        str(tmp_path / "w.db"),
        "worker",
        "flows:ALL",
        "--poll",
        "50ms",
        *args,
        cwd=tmp_path,
        env=env(tmp_path, **extra),
    )


def effects(tmp_path: Path) -> list[dict]:
    path = tmp_path / "effects.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def flows(tmp_path):
    (tmp_path / "flows.py").write_text(WORKFLOWS_PY)
    return tmp_path


# --------------------------------------------------------------------------- CLI: start, resume, worker


@pytest.mark.slow
def test_start_and_resume_without_code_and_a_worker_from_the_cwd(flows):
    tmp = flows
    # start by name: no code, the session id on stdout, the hint on stderr
    r = cli(tmp, "start", "asking", "--input", "1", "--session", "q1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "q1"
    assert "no worker for 'asking' seen in the last 15s: start one with" in r.stderr
    assert "show q1" in r.stderr
    # the same session again, and bad JSON: one line, exit 2
    again = cli(tmp, "start", "asking", "--session", "q1")
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    bad = cli(tmp, "start", "asking", "--input", "{nope")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr
    runs = json.loads(cli(tmp, "runs", "--format", "json").stdout)
    assert [(x["session_id"], x["status"]) for x in runs] == [("q1", "queued")]

    # a worker started in the directory of flows.py (the cwd importable, as python -m)
    w = worker(tmp)
    try:
        with SqliteEventStore(tmp / "w.db", readonly=True) as store:
            wait_for(lambda: rebuild(store.read("q1")).status == "paused", what="q1 to pause")
        # resume without --workflow records the answer and says a worker was seen
        ok = cli(tmp, "resume", "q1", "--input", "ok=42")
        assert ok.returncode == 0, ok.stderr
        if "its owner" in ok.stdout:
            # The answer is in the inbox before the CLI takes it in (so a live owner about
            # to let go sees it): the polling worker claimed the session in between, and
            # takes the answer in itself.
            assert ok.stdout.startswith("sent input ok to q1 (asking): its owner, ")
            assert f"pid {w.pid}" in ok.stdout
        else:
            assert "recorded input ok for q1 (asking)" in ok.stdout
            assert "a worker will pick it up" in ok.stdout and "serves 'asking'" in ok.stdout
        with SqliteEventStore(tmp / "w.db", readonly=True) as store:
            wait_for(lambda: rebuild(store.read("q1")).status == "completed", what="q1 to complete")
            assert rebuild(store.read("q1")).output == 42
        # answering it again: nothing appended, exit 2
        with SqliteEventStore(tmp / "w.db", readonly=True) as store:
            before = store.last_seq("q1")
        twice = cli(tmp, "resume", "q1", "--input", "ok=1")
        assert twice.returncode == 2 and "Traceback" not in twice.stderr
        with SqliteEventStore(tmp / "w.db", readonly=True) as store:
            assert store.last_seq("q1") == before
    finally:
        w.send_signal(signal.SIGTERM)
        out, err = w.communicate(timeout=30)
    assert w.returncode == 0, err
    assert "serving asking, drainable" in err and "stopped" in err

    # a bad spec is one line
    bad_spec = cli(tmp, "worker", "flows:nothing")
    assert bad_spec.returncode == 2 and "has no attribute" in bad_spec.stderr


async def _ask_body(ctx: NodeContext, x):
    return await ctx.request_input("ok?", interrupt_id="ok")


_ask = node(_ask_body, name="ask")  # the node of flows.py's `asking`, same path


@pytest.mark.slow
def test_resume_without_code_says_no_worker_was_seen(flows):
    tmp = flows
    cli(tmp, "start", "asking", "--session", "p1")
    with SqliteEventStore(tmp / "w.db") as store:
        Runner(Workflow("asking", edges=[(START, _ask)]), store).resume_sync("p1")
    r = cli(tmp, "resume", "p1", "--input", "ok=true")
    assert r.returncode == 0, r.stderr
    assert "recorded input ok for p1 (asking)" in r.stdout
    assert "no worker for 'asking' seen in the last 15s: start one with flowscope --db" in r.stdout
    assert "worker MODULE:ATTR" in r.stdout
    with SqliteEventStore(tmp / "w.db", readonly=True) as store:
        assert store.session_info("p1").status == "answered"
    # nothing to record and no code: exit 2, saying how to run it
    r = cli(tmp, "resume", "p1")
    assert r.returncode == 2
    assert "--workflow MODULE:ATTR" in r.stderr and "worker" in r.stderr
    # with --workflow it still runs inline, consuming the recorded answer
    inline = cli(tmp, "resume", "p1", "--workflow", "flows:asking")
    assert inline.returncode == 0, inline.stderr
    assert "completed" in inline.stdout
    with SqliteEventStore(tmp / "w.db", readonly=True) as store:
        assert rebuild(store.read("p1")).output is True


# --------------------------------------------------------------------------- SIGTERM drains


@pytest.mark.slow
def test_sigterm_drains_a_running_node_keeps_pauses_and_releases_leases(flows):
    tmp = flows
    assert cli(tmp, "start", "drainable", "--input", "7", "--session", "d1").returncode == 0
    assert cli(tmp, "start", "asking", "--session", "p1").returncode == 0
    a = worker(tmp, "--drain", "10s", SLOW_S="1.5")
    try:
        wait_for(lambda: any(e["what"] == "slow-start" for e in effects(tmp)), what="slow to start")
        with SqliteEventStore(tmp / "w.db", readonly=True) as store:
            wait_for(lambda: rebuild(store.read("p1")).status == "paused", what="p1 to pause")
        t_term = time.monotonic()
        a.send_signal(signal.SIGTERM)
        # submitted after SIGTERM: the draining worker claims nothing more
        assert cli(tmp, "start", "drainable", "--input", "8", "--session", "d2").returncode == 0
        _out, err = a.communicate(timeout=30)
        took = time.monotonic() - t_term
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, err
    done = [e["what"] for e in effects(tmp) if e["session"] == "d1"]
    assert done == ["slow-start", "slow-end", "tail"]  # the running node finished, once
    assert took < 8
    with SqliteEventStore(tmp / "w.db", readonly=True) as store:
        assert rebuild(store.read("d1")).status == "completed"
        assert rebuild(store.read("p1")).status == "paused"  # pauses stay paused
        assert store.session_info("d2").status == "queued"  # not claimed while draining
        for sid in ("d1", "p1"):
            assert store.session_info(sid).lease_expires_at == 0  # released

    # a drain that runs out of time hands the session back: another worker takes it at once
    assert cli(tmp, "start", "drainable", "--input", "9", "--session", "d3").returncode == 0
    b = worker(tmp, "--drain", "200ms", SLOW_S="30")
    try:
        wait_for(
            lambda: any(e["what"] == "slow-start" and e["session"] in ("d2", "d3") for e in effects(tmp)),
            what="b to start a slow node",
        )
        wait_for(lambda: sum(e["what"] == "slow-start" for e in effects(tmp)) >= 3, what="both slow nodes")
        b.send_signal(signal.SIGTERM)
        _out, err = b.communicate(timeout=30)
    finally:
        if b.poll() is None:
            b.kill()
    assert b.returncode == 0, err
    assert "lease lost" not in err and "WARNING" not in err, err  # a planned hand-back, not a fault
    with SqliteEventStore(tmp / "w.db", readonly=True) as store:
        for sid in ("d2", "d3"):
            info = store.session_info(sid)
            assert info.status == "running" and info.lease_expires_at <= time.time(), info
    c = worker(tmp, SLOW_S="0.1")
    t0 = time.monotonic()
    try:
        with SqliteEventStore(tmp / "w.db", readonly=True) as store:
            wait_for(
                lambda: all(rebuild(store.read(s)).status == "completed" for s in ("d2", "d3")),
                timeout=20,
                what="c to finish the handed-back sessions",
            )
        picked_up = time.monotonic() - t0
    finally:
        c.send_signal(signal.SIGTERM)
        c.communicate(timeout=30)
    assert c.returncode == 0
    assert picked_up < 10  # not a lease later: the sessions were handed back
    with SqliteEventStore(tmp / "w.db", readonly=True) as store:
        for sid in ("d2", "d3"):
            ws = rebuild(store.read(sid))
            slow = ws.nodes["drainable@1/slow@1"]
            assert slow.attempt == 2  # cut off, run again higher
            # handed back, not crashed: no recovery (enough drains would fail it RECOVERY_LIMIT)
            assert (slow.recoveries, ws.nodes["drainable@1"].recoveries) == (0, 0)


# --------------------------------------------------------------------------- two claimers


@node
async def _one(ctx: NodeContext, x):
    return x


@pytest.mark.slow
def test_sigterm_ends_an_idle_worker_at_once_whatever_its_poll_interval(flows):
    proc = worker(flows, "--poll", "60s")  # the last --poll wins: a minute between claims
    assert proc.stderr is not None and "serving" in proc.stderr.readline()
    time.sleep(0.5)  # into its wait for work
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()  # a no-op once it has exited
    took = time.monotonic() - t0
    assert took < 5, f"the worker exited {took:.1f}s after SIGTERM: it slept out its poll interval"


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_two_workers_claiming_the_same_queued_session_one_wins(tmp_path):
    """Two Workers, each in its own thread with its own connection, claim at the same
    instant; the store gives the session to one: the other appends nothing."""
    wf = Workflow("race", edges=[(START, _one)])
    db = tmp_path / "race.db"
    for round_ in range(10):
        with SqliteEventStore(db) as store:
            sid = Runner(wf, store).submit(round_, session_id=f"r{round_}")
        barrier = threading.Barrier(2)
        results: dict[str, list] = {}

        def claim(name: str) -> None:
            with SqliteEventStore(db) as store:
                w = Worker(store, [wf], worker_id=name, lease_s=5.0)
                barrier.wait()
                results[name] = store.claim(w.owner, ["race"], 5.0, limit=10)
                for c in results[name]:
                    asyncio.run(w.runners["race"].resume(c.session_id, lease=c.lease))

        threads = [threading.Thread(target=claim, args=(n,)) for n in ("wa", "wb")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        winners = [n for n, cs in results.items() if any(c.session_id == sid for c in cs)]
        assert len(winners) == 1, results
        with SqliteEventStore(db, readonly=True) as store:
            events = store.read(sid)
            info = store.session_info(sid)
        assert rebuild(events).status == "completed"
        assert {e.type for e in events}.isdisjoint({"node_cancelled"})
        assert len([e for e in events if e.type == "run_started"]) == 1
        assert info.owner.worker_id == winners[0]
