"""The operator's actions without the code, through the console script, with a real
``flowscope worker``: ``retry`` of a failed session, ``retry --from`` of a completed one,
and ``cancel`` of a live run. The commands run from a folder where the workflows cannot
be imported; the worker carries the actions out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from commands import ROOT, SRC, cli_env, run_cli, start_cli
from flowscope.fold import rebuild
from flowscope.store import SqliteEventStore
from waiting import wait_for

LEASE_S = 3.0

pytestmark = pytest.mark.slow


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A database served by one ``flowscope worker`` of tests.ops_workflows; yields (db, side
    effects, the flag file g_gate waits for)."""
    db, log, flag = tmp_path / "ops.db", tmp_path / "effects.jsonl", tmp_path / "flag"
    SqliteEventStore(db).close()
    worker = start_cli(
        "--db",
        str(db),
        "worker",
        "tests.ops_workflows:ALL",
        "--lease",
        f"{LEASE_S:g}s",
        "--poll",
        "50ms",
        cwd=ROOT,
        env=cli_env(paths=(ROOT,), CHAOS_LOG=str(log), OPS_FLAG=str(flag)),
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "worker.err", "wb"),
    )
    try:
        yield db, log, flag
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)


def operator_cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A command from a shell that cannot import the workflows: another folder, no ROOT on the path."""
    return run_cli("--db", str(db), *args, cwd=db.parent, env=cli_env(drop=("PYTHONPATH",)))


def status(db: Path, sid: str) -> str:
    with SqliteEventStore(db, readonly=True) as store:
        return rebuild(store.read(sid)).status


def wait(what: str, done: Callable[[], bool], timeout: float = 30.0) -> float:
    """:func:`~waiting.wait_for` ``done``; how long it took."""
    t0 = time.monotonic()
    wait_for(done, timeout, what)
    return time.monotonic() - t0


def effects(log: Path, sid: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        x = json.loads(line)
        if x["session"] == sid:
            out[x["what"]].append(x["attempt"])
    return dict(out)


def events(db: Path, sid: str) -> list[Any]:
    with SqliteEventStore(db, readonly=True) as store:
        return store.read(sid)


def test_a_failed_session_is_retried_without_its_code_and_completes_keeping_its_finished_runs(served):
    db, log, flag = served
    r = operator_cli(db, "start", "ops_gated", "--input", "1", "--session", "g")
    assert r.returncode == 0, r.stderr
    wait("g to fail", lambda: status(db, "g") == "failed")
    probe = subprocess.run(
        [sys.executable, "-c", "import tests.ops_workflows"],
        cwd=db.parent,
        env={"PYTHONPATH": SRC, "PATH": os.environ["PATH"]},
        capture_output=True,
    )
    assert probe.returncode != 0  # the operator's shell cannot import the workflow
    flag.touch()
    r = operator_cli(db, "retry", "g", "--reason", "flag file created")
    assert r.returncode == 0, r.stderr
    assert (
        "queued g (ops_gated, was failed) to run again" in r.stdout and "a worker will pick it up" in r.stdout
    )
    wait("g to complete", lambda: status(db, "g") == "completed")
    assert effects(log, "g") == {
        "g_first": [1],
        "g_gate": [1, 2],
        "g_last": [1],
    }  # attempts continue, g_first kept
    submitted = [e for e in events(db, "g") if e.type == "run_submitted"]
    assert submitted[-1].reason.startswith("flag file created (retry, asked by ")
    assert [e.type for e in events(db, "g")].count("node_error") == 1  # the one failure before the retry
    with SqliteEventStore(db, readonly=True) as store:
        assert store.inbox("g") == []


def test_retry_from_a_middle_node_runs_it_and_what_follows_again_and_nothing_before_it(served):
    db, log, _flag = served
    assert operator_cli(db, "start", "ops_steps", "--input", "1", "--session", "st").returncode == 0
    wait("st to complete", lambda: status(db, "st") == "completed")
    r = operator_cli(db, "retry", "st", "--from", "s2")
    assert r.returncode == 0, r.stderr
    wait(
        "st to run again and complete",
        lambda: (
            status(db, "st") == "completed"
            and "s3" in effects(log, "st")
            and len(effects(log, "st")["s3"]) == 2
        ),
    )
    assert effects(log, "st") == {"s1": [1], "s2": [1, 2], "s3": [1, 2]}
    ws = rebuild(events(db, "st"))
    assert (
        ws.output == 4
        and ws.nodes["ops_steps@1/s1@1"].attempt == 1
        and ws.nodes["ops_steps@1/s2@1"].attempt == 2
    )
    # a completed session needs a path; a running or unknown one is refused; nothing appended
    n = len(events(db, "st"))
    for args, says in (
        (["retry", "st"], "give a path"),
        (["retry", "st", "--from", "nope"], "has no run at 'nope'"),
        (["retry", "missing"], "no session 'missing'"),
    ):
        r = operator_cli(db, *args)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (
            args,
            r.stderr,
        )
    assert len(events(db, "st")) == n


def test_cancel_of_a_live_run_ends_it_cancelled_within_one_lease_without_a_failure(served):
    db, log, _flag = served
    assert operator_cli(db, "start", "ops_long", "--session", "lg").returncode == 0
    wait("l_wait to run", lambda: "l_wait started" in effects(log, "lg") if log.exists() else False)
    r = operator_cli(db, "cancel", "lg", "--reason", "not needed any more")
    assert r.returncode == 0, r.stderr
    assert "to stop it" in r.stdout, r.stdout
    took = wait("lg to end cancelled", lambda: status(db, "lg") == "cancelled", timeout=LEASE_S + 5)
    assert took <= LEASE_S, took  # within one lease of the request
    evs = events(db, "lg")
    assert "node_error" not in [e.type for e in evs]
    cancelled = [e for e in evs if e.type == "node_cancelled" and e.node == "l_wait"]
    assert cancelled and cancelled[0].reason.startswith("not needed any more (asked by ")
    assert "l_wait finished" not in effects(log, "lg")
    r = operator_cli(db, "resume", "lg")
    assert r.returncode == 2 and "cancelled" in r.stderr
