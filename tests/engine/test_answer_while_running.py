"""One writer per session, through the CLI: an answer given while another branch runs.

``chaos_race`` (tests/chaos_workflows.py) asks for input in one branch while its other branch works for eight seconds. The
operator does what ``flowscope stuck`` says (``flowscope resume SESSION --input q=...``)
while the slow branch runs under a real ``flowscope worker``. The answer waits in the
session's inbox; the worker takes it in when its invocation pauses, so its appends never
conflict: the slow branch runs once, the session completes, no recovery is spent. On
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commands import ROOT, cli_env, run_cli, start_cli
from flowscope.engine.submit import submit_run
from flowscope.fold import rebuild
from flowscope.store import SqliteEventStore
from waiting import wait_for

SESSIONS = 3

pytestmark = pytest.mark.slow


def _env(log: Path) -> dict[str, str]:
    # RACE_SLOW_S: long enough for three answers through the CLI
    return cli_env(paths=(ROOT,), CHAOS_LOG=str(log), RACE_SLOW_S="6.0")


def _cli(db: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--db", db, *args, cwd=ROOT, env=env)


def _race(db: str, open_store: Callable[[bool], Any], tmp_path: Path) -> None:
    """``open_store(readonly)``: the database as a store."""
    log = tmp_path / "effects.jsonl"
    env = _env(log)
    err = tmp_path / "worker.err"
    worker = start_cli(
        *("--db", db, "worker", "tests.chaos_workflows:ALL", "--lease", "5s", "--poll", "50ms"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(err, "wb"),
    )
    try:
        sids = [f"race-{i}" for i in range(SESSIONS)]
        said: list[str] = []
        with open_store(False) as store:  # what `flowscope start chaos_race --session ...` records
            for sid in sids:
                submit_run(store, "chaos_race", session_id=sid)
        with open_store(True) as store:

            def asked(sid: str) -> bool:
                ws = rebuild(store.read(sid))
                return any(ns.status == "waiting_input" for ns in ws.nodes.values()) and any(
                    ns.node == "race_slow" and ns.status == "running" for ns in ws.nodes.values()
                )

            for sid in sids:
                wait_for(lambda: asked(sid), timeout=30, what=f"{sid} to ask while race_slow runs")
                # what `flowscope stuck` tells the operator to do, done while race_slow works
                r = _cli(db, env, "resume", sid, "--input", "go=true")
                assert r.returncode == 0, (r.stdout, r.stderr)
                said.append(r.stdout)
            for sid in sids:
                wait_for(
                    lambda: rebuild(store.read(sid)).status == "completed",
                    timeout=60,
                    what=f"{sid} to complete",
                )
            for sid in sids:
                events = store.read(sid)
                assert [e.type for e in events].count("input_received") == 1
                assert all(getattr(e, "recovered", 0) == 0 for e in events if e.type == "run_started")
                assert store.inbox(sid) == []
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    stderr = err.read_text()
    assert "ConcurrencyConflict" not in stderr and "lease lost" not in stderr, stderr[-2000:]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for sid in sids:
        mine = [(line["what"], line["attempt"]) for line in lines if line["session"] == sid]
        assert sorted(mine) == [("race_ask", 1), ("race_fin", 1), ("race_slow", 1)], mine
    for out in said:  # the CLI said what happened: the owner takes the answer in
        assert "sent input go" in out and "still running it" in out, out


def test_an_answer_while_another_branch_runs_runs_nothing_twice_on_sqlite(tmp_path: Path):
    db = tmp_path / "race.db"
    SqliteEventStore(db).close()
    _race(str(db), lambda readonly: SqliteEventStore(db, readonly=readonly), tmp_path)


def test_an_answer_while_another_branch_runs_runs_nothing_twice_on_postgresql(
    pg_cluster: Any, tmp_path: Path
):
    from flowscope.store.postgres import PostgresEventStore

    url = pg_cluster.new_database("race")
    _race(url, lambda readonly: PostgresEventStore(url, readonly=readonly), tmp_path)
