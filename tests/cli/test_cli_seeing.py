"""Seeing what is wrong at once: ``stuck`` lists an orphaned run whatever ``--older-than``
says and queued sessions nobody starts; ``runs --status`` takes every status; a worker is
named alive only by the one liveness rule, so no command says a killed worker will pick a
session up. Through the console script, with a real ``flowscope worker`` SIGKILLed."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from commands import run_cli, start_cli
from flowscope import START, Runner, Workflow, answer, node
from flowscope.cli import cli
from flowscope.store import SqliteEventStore, rebuild
from flowscope.store.testing import dead_owner
from waiting import wait_for

SESSION_STATUSES = ("queued", "running", "paused", "answered", "completed", "failed", "cancelled")

INVOICES = """
import asyncio
from flowscope import START, Workflow, node

@node
async def charge(ctx, x):
    await asyncio.sleep(60)
    return x

invoice_pipeline = Workflow("invoice_pipeline", edges=[(START, charge)])
"""


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def console(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--db", str(tmp / "ops.db"), *args, cwd=tmp)


@pytest.mark.slow
def test_right_after_the_only_worker_is_sigkilled_stuck_fails_and_resume_names_no_worker(tmp_path):
    (tmp_path / "invoices.py").write_text(INVOICES)
    assert console(tmp_path, "start", "invoice_pipeline", "--session", "inv-1").returncode == 0
    worker = start_cli(
        "--db",
        str(tmp_path / "ops.db"),
        "worker",
        "invoices:invoice_pipeline",
        "--poll",
        "50ms",
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with SqliteEventStore(tmp_path / "ops.db", readonly=True) as store:
            wait_for(
                lambda: "invoice_pipeline@1/charge@1" in rebuild(store.read("inv-1")).nodes,
                what="the charge to start",
            )
        alive = json.loads(console(tmp_path, "runs", "--format", "json").stdout)
        assert alive[0]["owner"]["alive"] is True and alive[0]["owner"]["pid"] == worker.pid
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    # at once: the default --older-than (15m) does not hide an orphan
    stuck = console(tmp_path, "stuck", "--fail-if-any")
    assert stuck.returncode == 1, (stuck.stdout, stuck.stderr)
    assert "inv-1" in stuck.stdout and "orphaned" in stuck.stdout
    rows = json.loads(console(tmp_path, "stuck", "--format", "json").stdout)
    assert [(r["session_id"], r["state"], r["owner"]["alive"]) for r in rows] == [
        ("inv-1", "orphaned", False)
    ]
    # the next action stuck printed: no worker will pick it up, and it says which one is gone
    resume = console(tmp_path, "resume", "inv-1")
    assert "a worker will pick it up" not in resume.stdout + resume.stderr
    assert f"pid {worker.pid} (seen" in resume.stderr and "is gone; start one with" in resume.stderr
    # a run queued now is queued for nobody, and start says so
    start = console(tmp_path, "start", "invoice_pipeline", "--session", "inv-2")
    assert start.returncode == 0 and "a worker will pick it up" not in start.stderr
    assert (
        "warning: queued invoice_pipeline as session inv-2, but no live worker for 'invoice_pipeline'"
        in start.stderr
    )


def test_stuck_lists_queued_sessions_older_than_the_threshold(tmp_path):
    db = tmp_path / "q.db"
    with SqliteEventStore(db) as store:
        Runner(Workflow("nobody_serves", edges=[(START, node(lambda x: x, name="n"))]), store).submit(
            1, session_id="q-1"
        )
    assert "nothing stuck" in invoke("--db", str(db), "stuck", "--older-than", "1h").stdout
    result = invoke("--db", str(db), "stuck", "--older-than", "0s", "--fail-if-any", "--format", "json")
    assert result.exit_code == 1
    (row,) = json.loads(result.stdout)
    assert (row["session_id"], row["state"], row["status"]) == ("q-1", "queued", "queued")
    # a worker of this database: a bare `flowscope worker` would serve ./flowscope.db
    assert row["action"] == f"no live worker serves 'nobody_serves': flowscope --db {db} worker MODULE:ATTR"
    assert (
        json.loads(
            invoke(
                "--db", str(db), "stuck", "--older-than", "0s", "--state", "orphaned", "--format", "json"
            ).stdout
        )
        == []
    )
    assert [
        r["session_id"]
        for r in json.loads(
            invoke(
                "--db", str(db), "stuck", "--older-than", "0s", "--state", "queued", "--format", "json"
            ).stdout
        )
    ] == ["q-1"]


@node
async def ask(ctx, x):
    return await ctx.request_input("ok?", interrupt_id="go")


@node
def boom(x):
    raise ValueError("declined")


@pytest.fixture(scope="module")
def every_status(tmp_path_factory):
    """A database with a session in every status the store gives but running."""
    db = tmp_path_factory.mktemp("statuses") / "s.db"
    asking = Workflow("asking", edges=[(START, ask)])
    with SqliteEventStore(db) as store:
        Runner(asking, store).submit(None, session_id="queued")
        for sid in ("paused", "answered", "cancelled"):
            Runner(asking, store).run_sync(None, session_id=sid)
        answer(store, "answered", {"go": 1})
        Runner(Workflow("plain", edges=[(START, node(lambda x: x, name="ok"))]), store).run_sync(
            1, session_id="completed"
        )
        with pytest.raises(ValueError):
            Runner(Workflow("failing", edges=[(START, boom)]), store).run_sync(1, session_id="failed")
    assert invoke("--db", str(db), "cancel", "cancelled").exit_code == 0
    return db


@pytest.mark.parametrize("status", SESSION_STATUSES)
def test_runs_filters_on_every_status_the_store_has(every_status, status):
    result = invoke("--db", str(every_status), "runs", "--status", status, "--format", "json")
    assert result.exit_code == 0, result.output
    expected = [] if status == "running" else [status]
    assert [r["session_id"] for r in json.loads(result.stdout)] == expected


def test_runs_asks_the_store_for_the_sessions_it_lists_not_for_every_session(tmp_path, monkeypatch):
    # Beside a million sessions `runs` took 7 s and half a gigabyte to print fifty: it
    # listed every session and cut the list in Python.
    db = tmp_path / "many.db"
    plain = Workflow("plain", edges=[(START, node(lambda x: x, name="ok"))])
    with SqliteEventStore(db) as store:
        for i in range(8):
            Runner(plain, store).run_sync(i, session_id=f"s{i}")
        with pytest.raises(ValueError):
            Runner(Workflow("failing", edges=[(START, boom)]), store).run_sync(1, session_id="f")
        newest_first = [s.session_id for s in store.sessions()]

    def every_session(self):
        raise AssertionError("runs read every session")

    monkeypatch.setattr(SqliteEventStore, "sessions", every_session)
    result = invoke("--db", str(db), "runs", "--limit", "3", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [r["session_id"] for r in json.loads(result.stdout)] == newest_first[:3]
    failed = invoke(
        "--db", str(db), "runs", "--status", "failed", "--workflow", "failing", "--format", "json"
    )
    assert [r["session_id"] for r in json.loads(failed.stdout)] == ["f"]


def test_a_worker_record_whose_process_is_gone_is_not_a_worker_that_will_pick_it_up(tmp_path):
    """Seen a second ago, but its process is gone on this host: start and resume name it gone."""
    db = tmp_path / "w.db"
    gone = dead_owner("w-killed")
    with SqliteEventStore(db) as store:
        store.workers_seen(gone, ["asking"])
        Runner(Workflow("asking", edges=[(START, ask)]), store).run_sync(None, session_id="p")
    started = invoke("--db", str(db), "start", "asking", "--session", "q")
    assert "a worker will pick it up" not in started.stderr
    assert f"no live worker for 'asking': w-killed on {gone.host} pid {gone.pid} (seen" in started.stderr
    resumed = invoke("--db", str(db), "resume", "p", "--input", "go=1")
    assert resumed.exit_code == 0, resumed.output
    assert (
        "a worker will pick it up" not in resumed.stdout
        and "w-killed" in resumed.stdout
        and "is gone" in resumed.stdout
    )
