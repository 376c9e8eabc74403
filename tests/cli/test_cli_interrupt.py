"""Ctrl-C of ``flowscope resume`` stops the run without ending the session: it is recorded
cancelled but not final, so ``flowscope resume`` continues it; only an operator's
``flowscope cancel`` ends a session for good (the rule ``Runner.resume`` applies)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from commands import FLOWSCOPE, ROOT, cli_env, run_cli
from flowscope.fold import rebuild
from flowscope.store import SqliteEventStore
from waiting import wait_for

pytestmark = pytest.mark.slow  # console-script processes


def test_ctrl_c_of_resume_leaves_the_session_resumable_by_the_cli(tmp_path: Path):
    db, log = tmp_path / "ops.db", tmp_path / "effects.jsonl"
    env = cli_env(paths=(ROOT,), CHAOS_LOG=str(log))
    assert run_cli("--db", str(db), "start", "ops_long", "--session", "L1").returncode == 0
    resume = ("--db", str(db), "resume", "L1", "--workflow", "tests.ops_workflows:long")
    # SIGINT as a terminal delivers it: a background job of a non-interactive shell (CI)
    # starts with SIGINT ignored, and a child inherits that
    proc = subprocess.Popen(
        [FLOWSCOPE, *resume],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for(lambda: log.exists() and "l_wait started" in log.read_text(), 30, "l_wait to run")
        proc.send_signal(signal.SIGINT)  # the operator's Ctrl-C
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()  # a no-op once it has exited
    with SqliteEventStore(db, readonly=True) as store:
        ws = rebuild(store.read("L1"))
    assert ws.status == "cancelled" and not ws.final

    refused = run_cli("--db", str(db), "retry", "L1")  # not failed: resume it, not "over for good"
    assert refused.returncode == 2 and "over for good" not in refused.stderr, refused.stderr
    again = run_cli(*resume, cwd=ROOT, env={**env, "OPS_WAIT_S": "0"})
    assert again.returncode == 0, again.stderr
    with SqliteEventStore(db, readonly=True) as store:
        ws = rebuild(store.read("L1"))
    assert ws.status == "completed" and ws.nodes["ops_long@1/l_wait@1"].attempt == 2
    assert log.read_text().count('"what": "l_first"') == 1  # the finished run was kept


def test_an_operators_cancel_is_final_for_the_cli(tmp_path: Path):
    db = tmp_path / "ops.db"
    assert run_cli("--db", str(db), "start", "ops_long", "--session", "L2").returncode == 0
    assert run_cli("--db", str(db), "cancel", "L2", "--reason", "withdrawn").returncode == 0
    for args in (("resume", "L2", "--workflow", "tests.ops_workflows:long"), ("retry", "L2")):
        r = run_cli("--db", str(db), *args, cwd=ROOT, env=cli_env(paths=(ROOT,)))
        assert r.returncode == 2 and "over for good" in r.stderr, (args, r.stderr)
