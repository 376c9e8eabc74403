"""Checks once: ``start``, ``resume``, ``answer()``, ``Runner.submit`` and a worker's claim
apply the same checks to ids and inputs; a bad value is one line, exit 2, nothing appended;
a session no worker can ever run ends failed with the reason instead of being claimed at
every poll."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from commands import run_cli
from flowscope import START, Plugin, Runner, Worker, Workflow, answer, node
from flowscope.cli import main
from flowscope.errors import OutputNotSerializableError, ResumeError
from flowscope.events import RunSubmitted
from flowscope.store import SqliteEventStore, rebuild

LONG_ID = "s" * 300


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def invoke(capsys):
    """The console script's entry point (``flowscope.cli.main``) in this process: usage
    errors folded to one line as the installed script prints them."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit:
            main(list(args))
        out, err = capsys.readouterr()
        return Result(int(exit.value.code or 0), out, err)

    return run


def assert_one_line_error(result, *fragments: str) -> str:
    """Exit 2, one ``flowscope: error:`` line on stderr, never a traceback or "a bug"."""
    err = result.stderr or ""
    assert result.exit_code == 2, (result.exit_code, result.stdout, err)
    assert "Traceback" not in result.stdout + err and "bug in flowscope" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("flowscope: error: ")
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@node
async def ask(ctx, x):
    return await ctx.request_input("ok?", interrupt_id="go")


@node
async def enrich(ctx, x):
    return await ctx.await_job(lambda job: None, payload=x, expect_count=True)


asking = Workflow("asking", edges=[(START, ask)])
enriching = Workflow("enriching", edges=[(START, enrich)])

#: The user's module (a unique name: imported once per test process), with a node, a
#: workflow, and a sibling module that raises at import with a secret in its message.
FLOWS = """
from flowscope import START, Workflow, node

@node
def a_node(x):
    return x

wf = Workflow("wf", edges=[(START, a_node)])
"""
BOOM = 'raise RuntimeError("cannot reach db with password=hunter2 at /srv/secret/conf.yml")\n'
#: A module that exits at import (argparse does on bad arguments), with a secret in its message.
EXITS = 'import sys\nsys.exit("cannot reach db with password=hunter2 at /srv/secret/conf.yml")\n'


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A database with a session paused on an input and one waiting for a job, and the
    user's modules importable from the current directory."""
    tag = uuid.uuid4().hex[:8]
    (tmp_path / f"flows_{tag}.py").write_text(FLOWS)
    (tmp_path / f"boom_{tag}.py").write_text(BOOM)
    (tmp_path / f"exits_{tag}.py").write_text(EXITS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "checks.db"
    with SqliteEventStore(db) as store:
        Runner(asking, store).run_sync(None, session_id="p-input")
        Runner(enriching, store).run_sync(None, session_id="p-job")
        (job_id,) = rebuild(store.read("p-job")).nodes["enriching@1/enrich@1"].jobs
    return db, tag, job_id


def everything(db: Path) -> dict[str, int]:
    """Every session and its last seq: what "nothing appended" compares."""
    with SqliteEventStore(db, readonly=True) as store:
        return {s.session_id: s.last_seq for s in store.sessions()}


BAD = {
    "start_nan_input": (["start", "wf", "--input", "NaN"], ["--input", "NaN is not a JSON number"]),
    "start_infinite_input": (
        ["start", "wf", "--input", "[1, -Infinity]"],
        ["--input", "-Infinity is not a JSON number"],
    ),
    "start_long_session_id": (
        ["start", "wf", "--session", LONG_ID],
        ["--session", "300 characters long; at most 256"],
    ),
    "start_empty_session_id": (["start", "wf", "--session", ""], ["--session", "must not be empty"]),
    "start_control_in_session_id": (["start", "wf", "--session", "a\tb"], ["--session", "control character"]),
    "start_empty_workflow": (["start", ""], ["WORKFLOW", "workflow name must not be empty"]),
    "start_control_in_workflow": (["start", "a\tb"], ["WORKFLOW", "control character"]),
    "start_path_as_workflow": (  # no Workflow has it: never served, and a metric label
        ["start", "/home/alice/.aws/credentials"],
        ["WORKFLOW", "invalid workflow name", "without '/' or '@'"],
    ),
    "ui_stale_after_nan": (["ui", "--stale-after", "nan"], ["--stale-after", "'nan' is not a duration"]),
    "ui_queued_after_zero": (["ui", "--queued-after", "0"], ["--queued-after", "not a positive duration"]),
    "export_timeout_negative": (["export", "p-input", "--timeout", "-5"], ["--timeout", "is not a duration"]),
    "resume_nan_answer": (
        ["resume", "p-input", "--input", "go=NaN"],
        ["--input go", "NaN is not a JSON number"],
    ),
    "resume_lone_surrogate_answer": (
        ["resume", "p-input", "--input", 'go="\\ud800"'],
        ["--input go", "lone surrogate, not Unicode text"],
    ),
    "start_lone_surrogate_input": (["start", "wf", "--input", '["\\udc80"]'], ["--input", "lone surrogate"]),
    "resume_count_as_text": (
        ["resume", "p-job", "--job", '{job}={{"success": true, "count": "3"}}'],
        ["'count' is \"3\" (str); it must be a number"],
    ),
    "worker_lease_zero": (
        ["worker", "flows_{tag}:wf", "--lease", "0s"],
        ["--lease", "not a positive duration"],
    ),
    "worker_poll_zero": (["worker", "flows_{tag}:wf", "--poll", "0"], ["--poll", "not a positive duration"]),
    "worker_spec_names_a_node": (["worker", "flows_{tag}:a_node"], ["is a node ('a_node'), not a workflow"]),
    "worker_module_raises_at_import": (
        ["worker", "boom_{tag}:wf"],
        ["importing module 'boom_", "raised RuntimeError: cannot reach db with password=*** at <path>"],
    ),
    "worker_module_exits_at_import": (
        ["worker", "exits_{tag}:wf"],
        ["importing module 'exits_", "raised SystemExit: cannot reach db with password=*** at <path>"],
    ),
    "resume_workflow_module_exits_at_import": (
        ["resume", "p-input", "--input", "go=1", "--workflow", "exits_{tag}:wf"],
        ["importing module 'exits_", "raised SystemExit"],
    ),
    "resume_workflow_names_a_node": (
        ["resume", "p-input", "--input", "go=1", "--workflow", "flows_{tag}:a_node"],
        ["is a node"],
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_each_bad_value_is_one_line_exit_2_and_appends_nothing(setup, invoke, case):
    db, tag, job_id = setup
    args, fragments = BAD[case]
    args = [a.format(tag=tag, job=job_id) for a in args]
    before = everything(db)
    line = assert_one_line_error(invoke("--db", str(db), *args), *fragments)
    assert "hunter2" not in line and "/srv/secret" not in line
    assert everything(db) == before


def test_start_and_runner_submit_refuse_the_same_values(tmp_path, invoke):
    """One rule: what `start` refuses, Runner.submit refuses, and nothing is recorded."""
    db = tmp_path / "same.db"
    with SqliteEventStore(db) as store:
        runner = Runner(Workflow("wf", edges=[(START, ask)]), store)
        with pytest.raises(OutputNotSerializableError, match="not JSON-serialisable"):
            runner.submit(math.nan)
        with pytest.raises(ValueError, match="300 characters long; at most 256"):
            runner.submit(1, session_id=LONG_ID)
        assert store.sessions() == []
    assert_one_line_error(
        invoke("--db", str(db), "start", "wf", "--session", LONG_ID), "300 characters long; at most 256"
    )
    assert everything(db) == {}


def test_answer_refuses_a_count_that_is_not_a_number(setup):
    db, _tag, job_id = setup
    with SqliteEventStore(db) as store:
        before = store.last_seq("p-job")
        with pytest.raises(ResumeError, match=r"'count' is \"3\" \(str\); it must be a number"):
            answer(store, "p-job", jobs={job_id: {"success": True, "count": "3"}})
        with pytest.raises(ValueError, match="300 characters long"):
            answer(store, LONG_ID, inputs={"go": 1})
        assert store.last_seq("p-job") == before and store.inbox("p-job") == []


def test_runner_given_a_path_instead_of_a_store_says_what_to_pass():
    import flowscope

    says = r"not str 'x.db': pass one, e.g. SqliteEventStore"
    with pytest.raises(TypeError, match=r"Runner\(store=...\) takes an EventStore, " + says):
        Runner(asking, store="x.db")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Worker\(store, workflows\) takes an EventStore, " + says):
        flowscope.Worker("x.db", [asking])  # type: ignore[arg-type]
    for act in (flowscope.answer, flowscope.retry, flowscope.cancel):
        with pytest.raises(TypeError, match=says):
            act("x.db", "s")  # type: ignore[operator]


def test_a_sync_call_inside_a_running_loop_says_to_await_instead():
    async def inside() -> None:
        with pytest.raises(RuntimeError, match=r"await runner.run\(...\)"):
            Runner(asking).run_sync(None)
        with pytest.raises(RuntimeError, match=r"await runner.resume\(...\)"):
            Runner(asking).resume_sync("s")

    asyncio.run(inside())


def test_an_empty_session_id_is_refused_not_replaced_by_a_new_one():
    from flowscope.store import MemoryEventStore

    store = MemoryEventStore()
    with pytest.raises(ValueError, match="session id"):
        Runner(asking, store=store).run_sync(None, session_id="")
    assert store.sessions() == []


def test_start_of_a_workflow_no_live_worker_serves_warns_and_names_what_they_serve(tmp_path, invoke):
    """The decision documented in docs/cli.md: `start` queues the run (exit 0) and warns;
    with live workers that serve other workflows it names those, so a typo shows at once."""
    from flowscope.ownership import this_process

    db = tmp_path / "w.db"
    with SqliteEventStore(db) as store:
        store.workers_seen(this_process("w-live"), ["invoice_pipeline"])  # this process: alive
    result = invoke("--db", str(db), "start", "invoice_pipline", "--session", "typo")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "typo"
    assert (
        "warning: queued invoice_pipline as session typo, but no worker serves 'invoice_pipline'"
        in result.stderr
    )
    assert "the live workers serve invoice_pipeline; check the name" in result.stderr


def _submit_raw(store: SqliteEventStore, sid: str, workflow: str, input: object) -> None:
    """A RunSubmitted written without submit()'s checks (an older flowscope, another tool)."""
    event = RunSubmitted(
        session_id=sid, invocation_id="submit-raw", seq=1, ts=time.time(), workflow=workflow, input=input
    )
    store.append(sid, [event], 0)


async def _serve_for(worker: Worker, seconds: float) -> None:
    task = asyncio.ensure_future(worker.run())
    await asyncio.sleep(seconds)
    worker.stop()
    await task


def _claims_in(store: SqliteEventStore, seconds: float, max_check_failures: int) -> tuple[Worker, list[str]]:
    """A worker of ``asking`` (0.3 s leases, 50 ms polls) served for ``seconds``, and the
    session ids it claimed, in order."""
    claims: list[str] = []

    class Claims(Plugin):
        def on_worker_claim(self, claim):
            claims.append(claim.session_id)

    worker = Worker(
        store, [asking], [Claims()], lease_s=0.3, poll_s=0.05, max_check_failures=max_check_failures
    )
    asyncio.run(_serve_for(worker, seconds))
    return worker, claims


@pytest.mark.slow
def test_a_worker_marks_a_session_it_can_never_run_failed_and_backs_off_one_that_fails_its_checks(
    tmp_path, invoke
):
    """A 300-character id (the engine refuses it) ends failed at its first claim; a queued
    session whose input is NaN fails its resume checks: held for lease_s, then twice that,
    and marked failed at the third failure, with the reason: three claims in two seconds of
    50 ms polls, not forty."""
    from flowscope.engine.submit import CANNOT_RUN

    db = tmp_path / "never.db"
    with SqliteEventStore(db) as store:
        _submit_raw(store, LONG_ID, "asking", None)
        _submit_raw(store, "nan-input", "asking", math.nan)
        worker, claims = _claims_in(store, 2.0, max_check_failures=3)
        long = rebuild(store.read(LONG_ID))
        nan = rebuild(store.read("nan-input"))
    assert claims.count(LONG_ID) == 1
    assert claims.count("nan-input") == 3
    assert worker.outcomes == {"failed": 2, "backed_off": 2}
    for ws, reason in ((long, "300 characters long"), (nan, "not JSON-serialisable")):
        assert ws.status == "failed" and ws.error_code == CANNOT_RUN
        root = ws.nodes[ws.error_path]
        assert reason in root.error_message and root.error_message.startswith("the session cannot run: ")
    shown = invoke("--db", str(db), "show", "nan-input")
    assert f"failed at asking@1: {CANNOT_RUN}: the session cannot run" in shown.stdout
    assert json.loads(invoke("--db", str(db), "runs", "--status", "queued", "--format", "json").stdout) == []


@pytest.mark.slow
def test_a_worker_holds_a_session_whose_log_cannot_be_read_instead_of_claiming_it_again_at_once(tmp_path):
    """A corrupt row (a damaged page, a bad write by another tool): its session's log cannot
    be read. Claimed, backed off for lease_s, then twice that: three claims in two seconds
    of 50 ms polls, not one per poll; the other sessions are served meanwhile."""
    import sqlite3

    db = tmp_path / "corrupt.db"
    with SqliteEventStore(db) as store:
        _submit_raw(store, "broken", "asking", 1)
        _submit_raw(store, "fine", "asking", 2)
        with sqlite3.connect(db) as c:
            c.execute("UPDATE events SET payload = '{not json' WHERE session_id = 'broken'")
        worker, claims = _claims_in(store, 2.0, max_check_failures=9)
        fine = rebuild(store.read("fine"))
        epoch = store.session_info("broken").epoch
    assert 2 <= claims.count("broken") <= 4, claims.count("broken")
    assert fine.status == "paused" and claims.count("fine") == 1
    assert worker.outcomes.get("failed") is None and worker.outcomes["backed_off"] == claims.count("broken")
    assert epoch < 10


@pytest.mark.parametrize(
    "args",
    [
        ["--db", "", "runs"],
        ["runs", "--db", ""],
        ["ui", "--host", ""],
        ["serve-metrics", "--host", " "],
        ["worker", "x:y", "--metrics-port", "0", "--metrics-host", ""],
        ["deploy-files", ""],
    ],
)
def test_an_empty_value_is_refused_not_taken_for_the_current_folder_or_every_interface(
    tmp_path, monkeypatch, invoke, args
):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke(*args), "is empty: give ")
    assert list(tmp_path.iterdir()) == []  # no ./flowscope.db, no dashboards/ here


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["runs", "--limit", str(2**63)], "'--limit'"),
        (["worker", "x:y", "--concurrency", str(10**23)], "'--concurrency'"),
        (["worker", "x:y", "--max-recoveries", str(10**23)], "'--max-recoveries'"),
        (["worker", "x:y", "--worker-id", "forged\nline"], "control character"),
        (["worker", "x:y", "--worker-id", "w" * 300], "300 characters long"),
    ],
)
def test_a_number_past_what_a_store_holds_or_a_worker_id_a_log_line_cannot_is_refused_in_one_line(
    tmp_path, invoke, args, says
):
    db = tmp_path / "x.db"
    SqliteEventStore(db).close()
    assert_one_line_error(invoke("--db", str(db), *args), says)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


#: ``--db`` values with a password no message may print any piece of ("cret" is in each).
SECRET_URLS = {
    "hash_in_password_with_durability": (
        ["--durability", "full", "--db", "postgresql://bob:se#cretpw@127.0.0.1:1/db", "runs"],
        ["postgresql://bob:***@127.0.0.1:1/db is PostgreSQL"],
    ),
    "question_mark_in_password": (
        ["--db", "postgresql://bob:se?cretpw@127.0.0.1:1/db", "runs"],
        ["cannot reach PostgreSQL at 127.0.0.1:1/db"],
    ),
    "at_in_password": (
        ["--db", "postgresql://bob:se@cretpw@127.0.0.1:1/db", "runs"],
        ["postgresql://bob:***@127.0.0.1:1/db", "write '@' as %40"],
    ),
    "slash_in_password": (
        ["--db", "postgresql://bob:se/cretpw@127.0.0.1:1/db", "runs"],
        ["postgresql://bob:***@127.0.0.1:1/db", "'/' as %2F"],
    ),
    "port_not_a_number": (
        ["--db", "postgresql://bob:secretpw@127.0.0.1:abc/db", "runs"],
        ["is not a number: 'abc'"],
    ),
    "sqlalchemy_style_url": (
        ["--db", "postgresql+psycopg://bob:secretpw@127.0.0.1:1/db", "runs"],
        ["postgresql+psycopg://bob:***@", "a SQLite file or a postgresql://"],
    ),
    "another_databases_url": (
        ["--db", "mysql://bob:secretpw@h/db", "demo"],
        ["mysql://bob:***@h/db", "a SQLite file or a postgresql://"],
    ),
    "ssl_password_in_the_query": (
        ["--db", "postgresql://bob@127.0.0.1:1/db?sslpassword=secretpw", "start", "wf"],
        ["cannot reach PostgreSQL at 127.0.0.1:1/db"],
    ),
    "credentials_in_an_option_value": (
        ["runs", "--format", "http://bob:secretpw@h"],
        ["http://bob:***@h"],
    ),
}


@pytest.mark.parametrize("case", list(SECRET_URLS))
def test_no_message_prints_a_piece_of_a_urls_password(invoke, case):
    args, fragments = SECRET_URLS[case]
    result = invoke(*args)
    line = assert_one_line_error(result, *fragments)
    assert "cret" not in line and "cret" not in result.stdout


@pytest.mark.slow  # the exporter retries the refused endpoint for a few seconds
def test_export_to_an_endpoint_with_credentials_never_prints_them(setup, invoke):
    db, _tag, _job = setup
    line = assert_one_line_error(
        invoke(
            "--db",
            str(db),
            "export",
            "p-input",
            "--otlp-endpoint",
            "http://bob:s3cretpw@127.0.0.1:1",
            "--timeout",
            "1",
        ),
        "http://bob:***@127.0.0.1:1",
    )
    assert "s3cret" not in line


@pytest.mark.slow  # a console-script run: the output streams are the script's own
def test_text_a_log_holds_that_no_terminal_can_show_is_printed_escaped(tmp_path):
    @node
    def odd(x):
        return "\ud800"  # a node's output is not checked on the node path: older logs hold such text too

    db = tmp_path / "odd.db"
    with SqliteEventStore(db) as store:
        Runner(Workflow("odd", edges=[(START, odd)]), store).run_sync(None, session_id="o")
    r = run_cli("--db", str(db), "events", "o", "--show-payloads")
    assert r.returncode == 0 and "\\ud800" in r.stdout, (r.returncode, r.stderr)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["export", "s1", "--follow", "--otlp-endpoint", "http://127.0.0.1:9"], "drop 's1'"),
        (["export", "--follow", "-o", "spans.json", "--otlp-endpoint", "http://127.0.0.1:9"], "drop -o"),
        (["show", "s1", "--follow", "--interval", "0s"], "'--interval'"),
    ],
)
def test_an_option_a_follower_would_drop_or_spin_on_is_refused_in_one_line(
    tmp_path, monkeypatch, invoke, args, says
):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "x.db"
    with SqliteEventStore(db) as store:
        Runner(asking, store).run_sync(None, session_id="s1")
    assert_one_line_error(invoke("--db", str(db), *args), says)
    assert not (tmp_path / "spans.json").exists()


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_a_reason_with_a_byte_that_is_not_utf8_is_refused_and_records_nothing(tmp_path, invoke, action):
    from flowscope import actions

    db = tmp_path / "x.db"
    with SqliteEventStore(db) as store:
        Runner(asking, store).run_sync(None, session_id="s1")
        before = store.last_seq("s1")
    assert_one_line_error(invoke("--db", str(db), action, "s1", "--reason", "why \udcff"), "not UTF-8")
    with SqliteEventStore(db) as store:
        if action == "cancel":  # (a retry of a paused session is refused before its reason is read)
            with pytest.raises(ValueError, match="undecodable byte"):
                actions.cancel(store, "s1", reason="why \udcff")
        assert store.last_seq("s1") == before and store.inbox("s1") == []


def test_a_database_in_a_folder_that_does_not_exist_gets_one_piece_of_advice(tmp_path, invoke):
    nowhere = tmp_path / "gone" / "x.db"
    line = assert_one_line_error(invoke("--db", str(nowhere), "start", "nightly_export"), "create it first")
    assert "flowscope demo" not in line and "point --db" not in line, line
    assert not nowhere.parent.exists()
