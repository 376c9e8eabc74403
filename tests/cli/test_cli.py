"""The `flowscope` command, driven with click's CliRunner and through the installed console
script in a subprocess: every command, every format, every error case."""

from __future__ import annotations

import csv
import functools
import io
import json
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from commands import cli_env, cli_ok, run_cli, start_cli
from flowscope import Runner
from flowscope.cli import cli, views
from flowscope.examples.demo import batch_input, order_fulfilment
from flowscope.examples.worker import kill_worker, start_worker, wait_until_running
from flowscope.export import load_otlp_json
from flowscope.store import SqliteEventStore
from prom_harness import free_port
from waiting import wait_for

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
STALE = "0.5s"


def invoke(*args: str, env: dict | None = None, input: str | None = None):
    """The click command in this process."""
    return CliRunner().invoke(cli, list(args), env=env, input=input, catch_exceptions=False)


def copy_db(src: Path, dst: Path) -> Path:
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    return dst


def assert_one_line_error(result, *fragments: str) -> str:
    """Exit code 2, one line on stderr naming the problem, never a traceback."""
    code = result.returncode if hasattr(result, "returncode") else result.exit_code
    out = result.stdout or ""
    err = result.stderr or ""
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("flowscope: error: ")
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    """A database filled by `flowscope demo` (run once)."""
    d = tmp_path_factory.mktemp("clidemo")
    db = d / "demo.db"
    result = invoke(
        "--db", str(db), "demo", "--stale-after", STALE
    )  # in this process: the console script has tests of its own
    assert result.exit_code == 0, result.output
    with SqliteEventStore(db, readonly=True) as store:
        sessions = {s.session_id: s for s in store.sessions()}
    ids = {
        "orders": next(s for s in sessions if s.endswith("-orders")),
        "declined": next(s for s in sessions if s.endswith("-declined")),
        "export": next(s for s in sessions if s.endswith("-export")),
        "lost": next(s for s in sessions if s.endswith("-lost")),
        "queued": next(s for s in sessions if s.endswith("-queued-later")),
    }
    time.sleep(0.6)  # the killed worker's heartbeat goes stale (--stale-after 0.5s)
    return db, ids


@pytest.fixture
def paused_db(tmp_path):
    """A session of the bundled workflow (named as `flowscope demo` names its sessions, so
    that its code runs it by name) waiting for its geocoding job."""
    db = tmp_path / "paused.db"
    with SqliteEventStore(db) as store:
        result = Runner(order_fulfilment, store=store).run_sync(
            batch_input("B-9"), session_id="demo-paused-1"
        )
    assert result.status == "paused"
    (job,) = result.pending
    return db, "demo-paused-1", job.job_id


def make_bad_db(tmp_path, kind):
    """One kind of database flowscope must refuse, and a fragment its error names."""
    if kind == "missing":
        return tmp_path / "nope" / "missing.db", "no flowscope database at"
    if kind == "text":
        text = tmp_path / "notes.txt"
        text.write_text("these are my notes, not a database\n")
        return text, "not a SQLite database"
    if kind == "empty":
        empty = tmp_path / "empty.db"
        empty.write_bytes(b"")
        return empty, "not a flowscope database"
    if kind == "other":
        other = tmp_path / "other-app.db"
        with sqlite3.connect(other) as c:
            c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        return other, "not a flowscope database"
    assert kind == "corrupt", kind
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(_corrupt_bytes())
    return corrupt, "corrupt"


@functools.lru_cache(maxsize=1)
def _corrupt_bytes() -> bytes:
    """A flowscope database with a run in it, every byte after the header's first 200
    overwritten (made once: the run takes its retries' delays)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "corrupt.db"
        with SqliteEventStore(path) as s:
            Runner(order_fulfilment, store=s).run_sync(batch_input("B-c"), session_id="c")
        raw = bytearray(path.read_bytes())
    raw[200:] = b"\xa5" * (len(raw) - 200)
    return bytes(raw)


@pytest.fixture
def bad_dbs(tmp_path):
    """``bad_dbs[kind]`` makes that kind of bad database (only the one a test asks for)."""

    class BadDbs:
        def __getitem__(self, kind):
            return make_bad_db(tmp_path, kind)

    return BadDbs()


# --------------------------------------------------------------------------- listing commands


def listing(ids):
    return {
        "runs": (["runs"], views.RUN_KEYS),
        "show": (["show", ids["declined"]], views.SHOW_KEYS),
        "audit": (["audit"], views.AUDIT_KEYS),
        "audit-by-run": (["audit", "--by", "run", "--session", ids["orders"]], views.AUDIT_RUN_KEYS),
        "stuck": (["stuck", "--older-than", "0s", "--stale-after", STALE], views.STUCK_KEYS),
    }


LISTINGS = ["runs", "show", "audit", "audit-by-run", "stuck"]


def check_listing(name, fmt, text, keys, ids):
    if fmt == "json":
        rows = json.loads(text)
        assert isinstance(rows, list) and rows
        assert all(list(r) == list(keys) for r in rows)
        return rows
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert rows and list(rows[0]) == list(keys)
        return rows
    # table
    expected = {
        "runs": ["SESSION", ids["orders"], "completed", "PAYMENT_DECLINED"],
        "show": ["NODE", "charge_card@2", "PAYMENT_DECLINED", "failed at"],
        "audit": ["WORKFLOW", "fetch_orders", "PAYMENT_DECLINED=1"],
        "audit-by-run": ["PATH", "order_fulfilment@1/fetch_orders@1"],
        "stuck": ["STATE", "orphaned", "nightly_export@1/export_rows@1"],
    }[name]
    for e in expected:
        assert e in text, (e, text)
    return None


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
@pytest.mark.parametrize("name", LISTINGS)
def test_listing_commands_in_process(demo_db, name, fmt):
    db, ids = demo_db
    args, keys = listing(ids)[name]
    result = invoke("--db", str(db), *args, "--format", fmt)
    assert result.exit_code == 0, result.output
    check_listing(name, fmt, result.stdout, keys, ids)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
@pytest.mark.parametrize("name", LISTINGS)
def test_listing_commands_through_the_console_script(demo_db, name, fmt):
    db, ids = demo_db
    args, keys = listing(ids)[name]
    proc = run_cli(*args, "--db", str(db), "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    check_listing(name, fmt, proc.stdout, keys, ids)


def test_json_keys_are_documented():
    text = DOCS.read_text()
    for keys in (views.RUN_KEYS, views.SHOW_KEYS, views.AUDIT_KEYS, views.AUDIT_RUN_KEYS, views.STUCK_KEYS):
        for key in keys:
            assert f"`{key}`" in text, key


def test_the_audit_keys_are_documented_in_their_json_order():
    """cli.md says a listing's JSON keys come "always all of them, in that order": the
    audit table's rows name them in the order ``--format json`` prints them."""
    text = DOCS.read_text()
    section = text[text.index("## `flowscope audit`") :]
    table = section[section.index("| key | meaning |") : section.index("With `--by run`")]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    documented = [k for line in rows for k in re.findall(r"`([a-z_]+)`", line.split("|")[1])]
    assert documented == list(views.AUDIT_KEYS)


def test_show_json_has_the_timeline_of_the_failed_run(demo_db):
    db, ids = demo_db
    rows = json.loads(invoke("--db", str(db), "show", ids["declined"], "--format", "json").stdout)
    by_path = {r["path"]: r for r in rows}
    bad = by_path["order_fulfilment@1/ship@1/charge_card@2"]
    assert (bad["status"], bad["error_code"], bad["error_type"]) == (
        "failed",
        "PAYMENT_DECLINED",
        "PaymentDeclined",
    )
    assert "declined" in bad["error_message"] and bad["depth"] == 2
    ship = by_path["order_fulfilment@1/ship@1"]
    assert ship["status"] == "failed" and ship["origin_path"] == bad["path"]
    assert by_path["order_fulfilment@1/fetch_orders@1"]["attempts"] == 2
    assert by_path["order_fulfilment@1/fetch_orders@1"]["retries"] == 1
    assert by_path["order_fulfilment@1/approve@1"]["interrupts"] == ["approval"]
    jobs = by_path["order_fulfilment@1/enrich_addresses@1"]["jobs"]
    assert [j["result"] for j in jobs] == ["empty", "success"]
    assert [r["path"] for r in rows][0] == "order_fulfilment@1"
    assert all(r["start_offset_s"] >= 0 for r in rows)


def test_runs_filters(demo_db):
    db, ids = demo_db
    rows = json.loads(invoke("--db", str(db), "runs", "--status", "failed", "--format", "json").stdout)
    assert [r["session_id"] for r in rows] == [ids["declined"]]
    assert rows[0]["error_code"] == "PAYMENT_DECLINED" and rows[0]["failed_runs"] == 1
    rows = json.loads(
        invoke("--db", str(db), "runs", "--workflow", "nightly_export", "--format", "json").stdout
    )
    # the killed worker's session and the demo's queue (two served, one left queued)
    assert ids["export"] in [r["session_id"] for r in rows] and {r["workflow"] for r in rows} == {
        "nightly_export"
    }
    assert sorted(r["status"] for r in rows) == ["completed", "completed", "queued", "running"]
    assert [r["open_runs"] for r in rows if r["session_id"] == ids["export"]] == [
        1
    ]  # export_rows, not its workflow
    rows = json.loads(invoke("--db", str(db), "runs", "--limit", "1", "--format", "json").stdout)
    assert len(rows) == 1


def test_stuck_thresholds_and_states(demo_db):
    db, ids = demo_db
    result = invoke("--db", str(db), "stuck", "--format", "json")  # default: older than 15m, orphans at once
    assert [(r["session_id"], r["state"]) for r in json.loads(result.stdout)] == [(ids["export"], "orphaned")]
    assert "nothing stuck" in invoke("--db", str(db), "stuck", "--state", "waiting_job").stdout
    rows = json.loads(
        invoke(
            "--db", str(db), "stuck", "--older-than", "0s", "--stale-after", "1h", "--format", "json"
        ).stdout
    )
    # the killed worker's owner process is gone, so its run is orphaned at once,
    # whatever --stale-after says (that threshold is only for sessions without an owner)
    assert {r["session_id"]: r["state"] for r in rows} == {
        ids["export"]: "orphaned",
        ids["lost"]: "overdue",
        ids["queued"]: "queued",
    }  # the demo's queue: no worker serves it
    rows = json.loads(
        invoke(
            "--db", str(db), "stuck", "--older-than", "0", "--stale-after", STALE, "--all", "--format", "json"
        ).stdout
    )
    assert {r["path"] for r in rows} == {
        "",  # the queued session: no run yet
        "nightly_export@1",
        "nightly_export@1/export_rows@1",
        "order_fulfilment@1",
        "order_fulfilment@1/enrich_addresses@1",
    }
    rows = json.loads(
        invoke(
            "--db",
            str(db),
            "stuck",
            "--older-than",
            "0",
            "--stale-after",
            STALE,
            "--state",
            "orphaned",
            "--format",
            "json",
        ).stdout
    )
    assert [(r["session_id"], r["path"]) for r in rows] == [(ids["export"], "nightly_export@1/export_rows@1")]
    rows = json.loads(
        invoke(
            "--db",
            str(db),
            "stuck",
            "--older-than",
            "0",
            "--stale-after",
            STALE,
            "--state",
            "waiting_input",
            "--format",
            "json",
        ).stdout
    )
    assert rows == []


def test_stuck_reports_waiting_jobs_with_their_ids(paused_db):
    db, sid, job_id = paused_db
    rows = json.loads(invoke("--db", str(db), "stuck", "--older-than", "0s", "--format", "json").stdout)
    (row,) = rows
    assert (row["state"], row["session_id"], row["waiting_on"]) == ("waiting_job", sid, [job_id])
    assert f"--job '{job_id}=" + '{"success": true, "count": 1, "data": {}}' + "'" in row["action"]


# --------------------------------------------------------------------------- --db resolution


@pytest.mark.slow
def test_db_from_option_env_and_default(demo_db, tmp_path):
    db, ids = demo_db
    # per-command option, global option, environment, ./flowscope.db
    assert ids["orders"] in invoke("runs", "--db", str(db)).stdout
    assert ids["orders"] in invoke("--db", str(db), "runs").stdout
    assert ids["orders"] in invoke("runs", env={"FLOWSCOPE_DB": str(db)}).stdout
    copy_db(db, tmp_path / "flowscope.db")
    proc = run_cli("runs", cwd=tmp_path)
    assert proc.returncode == 0 and ids["orders"] in proc.stdout
    proc = run_cli("runs", cwd=tmp_path / ".", env=cli_env(FLOWSCOPE_DB=str(tmp_path / "absent.db")))
    assert_one_line_error(proc, "absent.db")


# --------------------------------------------------------------------------- errors


READ_COMMANDS = [
    ["runs"],
    ["show", "s1"],
    ["audit"],
    ["stuck"],
    ["export", "s1"],
    ["resume", "s1", "--input", "approval=true"],
]


@pytest.mark.parametrize("kind", ["missing", "text", "empty", "other", "corrupt"])
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_bad_databases_give_one_line_and_exit_2(bad_dbs, kind, command):
    path, fragment = bad_dbs[kind]
    result = invoke("--db", str(path), *command)
    assert_one_line_error(result, fragment, str(path.name))
    assert not (kind == "missing" and path.exists())  # a read command never creates the file


@pytest.mark.slow
def test_serve_metrics_waits_for_an_empty_file_a_worker_is_creating_beside_it(tmp_path):
    """SQLite's file is empty until its creator writes the header: a server started at the
    same moment as the first worker waits for it (up to 2 s) rather than refuse it."""
    db = tmp_path / "fresh.db"
    db.write_bytes(b"")
    port = free_port()
    proc = start_cli("--db", str(db), "serve-metrics", "--port", str(port))
    try:
        time.sleep(0.5)
        SqliteEventStore(db).close()  # the worker's first open: the schema
        wait_for(lambda: _metrics_up(port), 20, "serve-metrics to answer")
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _metrics_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return b"flowscope_store_up 1.0" in r.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["missing", "text", "other", "corrupt"])
def test_bad_databases_through_the_console_script(bad_dbs, kind):
    path, fragment = bad_dbs[kind]
    for command in (["runs"], ["stuck", "--format", "json"], ["show", "x"], ["serve-metrics", "--port", "0"]):
        assert_one_line_error(run_cli("--db", str(path), *command), fragment)
    if kind != "missing":  # demo creates a missing file, but never writes into a foreign one
        assert_one_line_error(run_cli("--db", str(path), "demo"), fragment)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["show", "no-such-session"],
        ["export", "no-such-session"],
        ["resume", "no-such-session"],
        ["audit", "--session", "no-such-session"],
    ],
    ids=lambda c: c[0],
)
def test_unknown_session(demo_db, command):
    db, _ = demo_db
    assert_one_line_error(invoke("--db", str(db), *command), "no-such-session", "flowscope runs")
    assert_one_line_error(run_cli("--db", str(db), *command), "no-such-session")


@pytest.mark.slow
def test_resume_argument_errors(paused_db):
    db, sid, job_id = paused_db
    d = str(db)
    assert_one_line_error(
        run_cli("--db", d, "resume", sid, "--input", "approval=yes"), "not valid JSON", 'approval="yes"'
    )
    assert_one_line_error(
        invoke("--db", d, "resume", sid, "--job", f"{job_id}={{success: true}}"), "not valid JSON"
    )
    assert_one_line_error(invoke("--db", d, "resume", sid, "--input", "approval"), "expects ID=JSON")
    assert_one_line_error(
        invoke("--db", d, "resume", sid, "--input", "nope=1"), "no open input request 'nope'"
    )
    assert_one_line_error(
        run_cli("--db", d, "resume", sid, "--job", "job-unknown={}"), "no dispatched job 'job-unknown'"
    )
    assert_one_line_error(invoke("--db", d, "resume", sid), "waiting for job " + job_id, "--job")
    assert_one_line_error(
        invoke("--db", d, "resume", sid, "--job", f"{job_id}={{}}", "--workflow", "nosuchmodule:wf"),
        "cannot import",
    )
    assert_one_line_error(
        invoke(
            "--db",
            d,
            "resume",
            sid,
            "--job",
            f"{job_id}={{}}",
            "--workflow",
            "flowscope.examples.worker:nightly_export",
        ),
        "order_fulfilment",
    )
    with SqliteEventStore(db, readonly=True) as store:
        assert [e.type for e in store.read(sid)][-1] == "run_finished"  # nothing was appended
        assert len(store.read(sid)) == store.last_seq(sid)


@pytest.mark.slow
def test_resume_walks_a_session_to_the_end_through_every_pause(paused_db):
    db, sid, job_id = paused_db
    d = str(db)
    out = cli_ok("--db", d, "resume", sid, "--job", f'{job_id}={{"success": true, "count": 0}}')
    assert "paused again" in out and "retry or abort" in out
    iid = re.search(r"--input '([^=]+)=\"retry\"'", out).group(
        1
    )  # a failed job's pause: the hint is valid as printed
    result = invoke("--db", d, "resume", sid, "--input", f'{iid}="retry"')
    assert result.exit_code == 0, result.output
    new_job = re.search(r"--job '(job-[0-9a-f]+)=", result.stdout).group(1)
    assert new_job != job_id
    result = invoke(
        "--db",
        d,
        "resume",
        sid,
        "--job",
        f'{new_job}={{"success": true, "count": 3, "data": {{"geocoded": [1, 2, 3]}}}}',
    )
    assert result.exit_code == 0 and "'approval'" in result.stdout
    before = copy_db(Path(d), Path(d).with_name("before.db"))
    out = cli_ok("--db", d, "resume", sid, "--input", "approval=true")
    # the answer and the output are payloads: sizes only, unless --show-payloads
    assert "completed" in out and "'approval' = <redacted: 4 bytes>" in out
    assert '"status"' not in out and re.search(r"0 recovered\): <redacted: \d+ bytes>", out), out
    shown = cli_ok("--db", str(before), "resume", sid, "--input", "approval=true", "--show-payloads")
    assert "'approval' = True" in shown and '"status": "shipped"' in shown
    assert_one_line_error(invoke("--db", d, "resume", sid), "already completed")


@pytest.mark.slow
def test_resume_of_a_failing_session_exits_1(demo_db, tmp_path):
    db, ids = demo_db
    copy = copy_db(db, tmp_path / "copy.db")
    proc = run_cli("--db", str(copy), "resume", ids["declined"])
    assert proc.returncode == 1, proc.stderr
    assert "PAYMENT_DECLINED" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    rows = json.loads(invoke("--db", str(copy), "show", ids["declined"], "--format", "json").stdout)
    (bad,) = [r for r in rows if r["path"].endswith("charge_card@2")]
    assert bad["attempts"] == 2  # numbering continues after an operator's resume (R9)


@pytest.mark.slow
def test_resume_recovers_a_killed_worker(tmp_path):
    db = tmp_path / "worker.db"
    with SqliteEventStore(db) as store:
        proc = start_worker(str(db), "demo-crash-1", hang_s=30, heartbeat_s=0.2)
        try:
            assert wait_until_running(store, "demo-crash-1", proc)
            # the database is in its environment, not its command line (any local user reads
            # that: a URL's password would be there for anyone)
            assert str(db) not in Path(f"/proc/{proc.pid}/cmdline").read_text()
        finally:
            kill_worker(proc)
    # its owner's process is gone (same host), so it is orphaned at once and a
    # plain resume takes it over, without --force and without waiting for its heartbeat
    out = cli_ok("--db", str(db), "resume", "demo-crash-1")
    assert "completed" in out and "recovered" in out
    rows = json.loads(
        invoke(
            "--db", str(db), "audit", "--session", "demo-crash-1", "--by", "run", "--format", "json"
        ).stdout
    )
    (export_rows,) = [r for r in rows if r["node"] == "export_rows"]
    assert (export_rows["status"], export_rows["attempts"], export_rows["recoveries"]) == ("completed", 2, 1)
    (snapshot,) = [r for r in rows if r["node"] == "snapshot"]
    assert snapshot["attempts"] == 1  # finished before the crash: not run again


@pytest.mark.slow
def test_usage_errors_exit_2_without_traceback(demo_db):
    db, _ = demo_db
    for args in (["stuck", "--older-than", "5 parsecs"], ["runs", "--format", "xml"], ["nonsense"], ["show"]):
        proc = run_cli("--db", str(db), *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stdout + proc.stderr


def test_an_unexpected_error_is_one_line_too(demo_db, monkeypatch):
    db, _ = demo_db

    def broken(*a, **k):
        raise RuntimeError("boom\nwith a second line")

    monkeypatch.setattr(views, "runs_rows", broken)
    line = assert_one_line_error(
        invoke("--db", str(db), "runs"), "unexpected RuntimeError", "boom with a second line"
    )
    assert "FLOWSCOPE_DEBUG" in line


@pytest.mark.slow
def test_help_and_version():
    for command in (
        [],
        ["demo"],
        ["runs"],
        ["show"],
        ["audit"],
        ["stuck"],
        ["resume"],
        ["serve-metrics"],
        ["export"],
    ):
        result = invoke(*command, "--help")
        assert result.exit_code == 0 and "Usage:" in result.stdout
    proc = run_cli("--version")
    assert proc.returncode == 0 and "0.1.0" in proc.stdout


# --------------------------------------------------------------------------- export


@pytest.mark.slow
def test_export_stdout_file_and_determinism(demo_db, tmp_path):
    db, ids = demo_db
    exported = cli_ok("--db", str(db), "export", ids["orders"])
    req = load_otlp_json(exported)
    names = [s.name for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert "invoke_workflow order_fulfilment" in names and "invoke_node send_confirmations" in names
    out = tmp_path / "spans.json"
    result = invoke("--db", str(db), "export", ids["orders"], "-o", str(out))
    assert result.exit_code == 0
    assert out.read_text() == exported  # a second export is byte-identical
    proc2 = run_cli("--db", str(db), "export", ids["orders"], "--output", str(tmp_path / "again.json"))
    assert proc2.returncode == 0 and (tmp_path / "again.json").read_bytes() == out.read_bytes()


def test_export_of_the_killed_workers_session_marks_the_crashed_runs(demo_db):
    db, ids = demo_db
    req = load_otlp_json(invoke("--db", str(db), "export", ids["export"]).stdout)
    spans = {s.name: s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
    attrs = {kv.key: kv.value.bool_value for kv in spans["invoke_node export_rows"].attributes}
    assert attrs.get("flowscope.export.incomplete") is True


@pytest.mark.slow
def test_export_to_an_otlp_endpoint(demo_db):
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received = []

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            req = ExportTraceServiceRequest()
            req.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, req))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        db, ids = demo_db
        proc = run_cli(
            "--db",
            str(db),
            "export",
            ids["declined"],
            "--otlp-endpoint",
            f"http://127.0.0.1:{server.server_port}",
        )
        assert proc.returncode == 0, proc.stderr
        assert "sent" in proc.stderr + proc.stdout
    finally:
        server.shutdown()
        server.server_close()
    ((path, req),) = received
    assert path == "/v1/traces"
    stdout_json = load_otlp_json(invoke("--db", str(db), "export", ids["declined"]).stdout)
    assert req == stdout_json  # what was sent is exactly what the JSON export says


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_export_to_an_unreachable_endpoint_is_one_line(demo_db):
    db, ids = demo_db
    port = _free_port()
    proc = run_cli(
        "--db",
        str(db),
        "export",
        ids["orders"],
        "--otlp-endpoint",
        f"http://127.0.0.1:{port}",
        "--timeout",
        "1",
    )
    assert_one_line_error(proc, "could not send", f"127.0.0.1:{port}")


# --------------------------------------------------------------------------- serve-metrics


def _read_url(proc: subprocess.Popen, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"(http://\S+/metrics)", line)
        if m:
            return m.group(1)
    raise AssertionError("no metrics URL printed: " + (proc.stderr.read() if proc.poll() is not None else ""))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_metrics_serves_the_store_until_signalled(demo_db, sig):
    db, _ = demo_db
    proc = start_cli("--db", str(db), "serve-metrics", "--port", "0", "--stale-after", STALE)
    try:
        url = _read_url(proc)
        assert url.startswith("http://127.0.0.1:")
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert re.search(
            r'flowscope_store_orphaned_runs\{node="export_rows",workflow="nightly_export"\} 1\.0', body
        ), body
        assert (
            'flowscope_store_open_runs{node="export_rows",state="running",workflow="nightly_export"} 1.0'
            in body
        )
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_serve_metrics_port_in_use(demo_db):
    db, _ = demo_db
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert_one_line_error(
            run_cli("--db", str(db), "serve-metrics", "--port", str(port)), f"127.0.0.1:{port}"
        )


def test_stuck_classifies_waiting_input_waiting_job_and_overdue(tmp_path):
    from flowscope import START, Workflow, node

    @node
    async def ask(ctx, x):
        return await ctx.request_input("go?", interrupt_id="go")

    def job_workflow(name, deadline):
        @node(name=f"{name}_job")
        async def wait_for_job(ctx, x):
            return await ctx.await_job(dispatch=lambda job: None, payload=x, deadline_s=deadline)

        return Workflow(name, edges=[(START, wait_for_job)])

    db = tmp_path / "open.db"
    with SqliteEventStore(db) as store:
        Runner(Workflow("asks", edges=[(START, ask)]), store=store).run_sync(1, session_id="s-input")
        Runner(job_workflow("slowjob", 3600), store=store).run_sync(1, session_id="s-job")
        Runner(job_workflow("latejob", 0.01), store=store).run_sync(1, session_id="s-late")
    time.sleep(0.05)
    rows = json.loads(invoke("--db", str(db), "stuck", "--older-than", "0s", "--format", "json").stdout)
    by_session = {r["session_id"]: r for r in rows}
    assert set(by_session) == {"s-input", "s-job", "s-late"}
    assert (by_session["s-input"]["state"], by_session["s-input"]["waiting_on"]) == ("waiting_input", ["go"])
    prefix = f"flowscope --db {shlex.quote(str(db))}"  # the database the hint was printed for
    assert by_session["s-input"]["action"] == f"{prefix} resume s-input --input 'go=JSON'"
    assert (
        by_session["s-job"]["state"] == "waiting_job" and by_session["s-job"]["job_deadline_at"] is not None
    )
    assert by_session["s-late"]["state"] == "overdue"
    only = json.loads(
        invoke(
            "--db", str(db), "stuck", "--older-than", "0s", "--state", "overdue", "--format", "json"
        ).stdout
    )
    assert [r["session_id"] for r in only] == ["s-late"]
    table = invoke("--db", str(db), "show", "s-input").stdout
    assert "WAITING for go" in table and f"{prefix} resume s-input --input 'go=JSON'" in table


def test_stuck_ages_a_resumed_run_from_its_restart_not_its_first_start(tmp_path):
    from flowscope.events import InputReceived, InputRequested, NodeStarted, RunFinished, RunStarted
    from flowscope.store.testing import ev, node_ev

    now = time.time()
    p = "w@1/n@1"
    db = tmp_path / "resumed.db"
    with SqliteEventStore(db) as store:  # asked an hour ago, answered a minute ago: running again since
        store.append(
            "s-resumed",
            [
                ev(RunStarted, sid="s-resumed", workflow="w", ts=now - 3600),
                node_ev(NodeStarted, "w@1", ts=now - 3600, sid="s-resumed", kind="workflow"),
                node_ev(NodeStarted, p, ts=now - 3600, sid="s-resumed", parent_path="w@1"),
                node_ev(InputRequested, p, ts=now - 3599, sid="s-resumed", interrupt_id="ok"),
                ev(RunFinished, sid="s-resumed", ts=now - 3599, status="waiting_input"),
                ev(RunStarted, sid="s-resumed", workflow="w", ts=now - 60, invocation_id="i2", resumed=True),
                node_ev(
                    NodeStarted, "w@1", ts=now - 60, sid="s-resumed", kind="workflow", invocation_id="i2"
                ),
                node_ev(
                    InputReceived, p, ts=now - 60, sid="s-resumed", interrupt_id="ok", invocation_id="i2"
                ),
                node_ev(NodeStarted, p, ts=now - 60, sid="s-resumed", parent_path="w@1", invocation_id="i2"),
            ],
            0,
        )
    stuck = ("--db", str(db), "stuck", "--stale-after", "1h", "--format", "json")
    assert json.loads(invoke(*stuck, "--older-than", "15m").stdout) == []
    [row] = json.loads(invoke(*stuck, "--older-than", "30s").stdout)
    assert (row["path"], row["state"]) == (p, "running")
    assert (row["started_at"], row["restarted_at"]) == (now - 3600, now - 60)
    assert 59 <= row["age_s"] < 120


def test_parse_duration():
    assert views.parse_duration("15m") == 900
    assert views.parse_duration("1h30m") == 5400
    assert views.parse_duration("500ms") == 0.5
    assert views.parse_duration("2d") == 172800
    assert views.parse_duration("0.5") == 0.5
    assert views.parse_duration("90s") == 90
    assert views.parse_duration("36500d") == views.MAX_DURATION_S  # a century: the longest
    for bad in ("", "soon", "5x", "-1s", "1h30", "1.5.5s", "36501d", "99999999999999999999d"):
        with pytest.raises(ValueError):
            views.parse_duration(bad)


def test_a_duration_longer_than_a_century_is_one_usage_line_not_a_flood_of_tracebacks(tmp_path):
    # a sleep or a timer of it overflowed: thousands of tracebacks a second from a worker
    r = invoke(
        "--db",
        str(tmp_path / "w.db"),
        "worker",
        "flowscope.examples.worker:nightly_export",
        "--poll",
        "99999999999999999999d",
    )
    assert r.exit_code == 2 and "longer than a century" in r.output and "Traceback" not in r.output, r.output


# --------------------------------------------------------------------------- store errors, by class

from flowscope import errors as fs_errors  # noqa: E402

#: What each typed store error must say after its own message, for `runs` on PATH.
STORE_ERROR_ADVICE = {
    fs_errors.StoreLocked: "retry in a moment",
    fs_errors.StoreCorrupt: "restore it from a backup (or try `sqlite3 {path} .recover`)",
    fs_errors.NotAFlowscopeDatabase: "point --db (or FLOWSCOPE_DB) at a flowscope database",
    fs_errors.StoreSchemaTooNew: "upgrade flowscope",
    fs_errors.StoreReadOnly: "permissions",
    fs_errors.StoreDiskFull: "free disk space",
    fs_errors.StoreUnavailable: "point --db (or FLOWSCOPE_DB) at a flowscope database",
}


def raising_store(exc: BaseException, *, on: str = "open"):
    """A store class that raises ``exc`` when opened, or from ``sessions()``/``read()``.

    The SQLite adapter of this tree still raises plain StoreError with a message; this fake
    stands in for an adapter that raises the typed subclasses, at the one place the CLI
    opens a store (flowscope.store.sqlite.SqliteEventStore).
    """

    class RaisingStore:
        def __init__(self, path, readonly=False):
            if on == "open":
                raise exc
            self.path = path

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.close()

        def close(self):
            pass

        def sessions(self, *a, **k):
            raise exc

        def read(self, *a, **k):
            raise exc

    return RaisingStore


@pytest.mark.parametrize("klass", list(STORE_ERROR_ADVICE), ids=lambda k: k.__name__)
@pytest.mark.parametrize("on", ["open", "read"])
def test_each_store_error_class_gives_its_line_and_exit_2(tmp_path, monkeypatch, klass, on):
    db = tmp_path / "flows.db"
    with SqliteEventStore(db):
        pass
    monkeypatch.setattr(
        "flowscope.store.sqlite.SqliteEventStore", raising_store(klass(f"{db} said no"), on=on)
    )
    command = ["runs"] if on == "open" else ["show", "s1"]
    advice = STORE_ERROR_ADVICE[klass].format(path=db)
    line = assert_one_line_error(invoke("--db", str(db), *command), f"{db} said no: ", advice)
    if klass is not fs_errors.StoreCorrupt:
        assert "backup" not in line


def test_a_plain_store_error_prints_its_own_message(tmp_path, monkeypatch):
    db = tmp_path / "corrupt" / "flows.db"
    db.parent.mkdir()
    with SqliteEventStore(db):
        pass
    message = f"{db} is corrupt, malformed and not a flowscope database (words, not a class)"
    monkeypatch.setattr(
        "flowscope.store.sqlite.SqliteEventStore", raising_store(fs_errors.StoreError(message))
    )
    line = assert_one_line_error(invoke("--db", str(db), "runs"))
    assert line == f"flowscope: error: {message}"


@pytest.mark.slow
def test_a_folder_named_corrupt_gets_no_corruption_advice(tmp_path):
    folder = tmp_path / "corrupt"
    folder.mkdir()
    good = folder / "flows.db"
    with SqliteEventStore(good) as store:
        Runner(order_fulfilment, store=store).run_sync(batch_input("B-ok"), session_id="fine-1")
    assert [r["session_id"] for r in json.loads(cli_ok("--db", str(good), "runs", "--format", "json"))] == [
        "fine-1"
    ]
    # a valid flowscope database written by a newer flowscope: not corrupt either
    newer = folder / "newer.db"
    copy_db(good, newer)
    with sqlite3.connect(newer) as c:
        c.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    line = assert_one_line_error(run_cli("--db", str(newer), "runs"), "newer flowscope", "newer.db")
    assert "backup" not in line and ".recover" not in line
    # a missing file under such a folder, for a read command and for the demo (which creates it)
    missing = folder / "missing.db"
    line = assert_one_line_error(
        run_cli("--db", str(missing), "runs"), "no flowscope database at", "missing.db"
    )
    assert "backup" not in line and ".recover" not in line
    nowhere = tmp_path / "gone" / "corrupt" / "flows.db"
    line = assert_one_line_error(run_cli("--db", str(nowhere), "demo"), "flows.db")
    assert "backup" not in line and ".recover" not in line
    assert not nowhere.parent.exists()


@pytest.mark.parametrize("cmd", [["serve-metrics", "--port", "0"], ["export", "--follow"]])
@pytest.mark.parametrize(
    "endpoint, says", [("ftp://x", "is http(s)://host[:port] or host:port"), ("http://:x", "not a URL")]
)
def test_a_span_followers_bad_otlp_endpoint_is_one_line_and_exit_2(demo_db, cmd, endpoint, says):
    db, _sessions = demo_db
    r = invoke("--db", str(db), *cmd, "--otlp-endpoint", endpoint)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.output, r.output


def test_durability_full_syncs_a_writing_commands_sqlite_commits_from_the_option_or_the_variable(
    demo_db, tmp_path, monkeypatch
):
    """A writing command opens its SQLite file at ``durability="normal"`` unless told
    ``--durability full`` (or ``FLOWSCOPE_DURABILITY=full``): an fsync at every commit. A
    PostgreSQL URL is refused the option (its commits follow synchronous_commit), in one line."""
    import flowscope.store.sqlite as sqlite_pkg

    db = copy_db(demo_db[0], tmp_path / "copy.db")
    opened: list[int] = []

    class Recording(sqlite_pkg.SqliteEventStore):  # the real store; it notes its connection's setting
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not self.readonly:
                opened.append(self._conn.execute("PRAGMA synchronous").fetchone()[0])

    monkeypatch.setattr(sqlite_pkg, "SqliteEventStore", Recording)
    prune = ("prune", "--older-than", "3650d")  # writes, deletes nothing here
    for args, env, setting in (
        ((), None, 1),  # NORMAL
        (("--durability", "full"), None, 2),  # FULL
        ((), {"FLOWSCOPE_DURABILITY": "full"}, 2),
        (("--durability", "normal"), {"FLOWSCOPE_DURABILITY": "full"}, 1),  # the option wins
    ):
        opened.clear()
        result = invoke("--db", str(db), *args, *prune, env=env)
        assert result.exit_code == 0, result.output
        assert opened == [setting], (args, env, opened)
    assert_one_line_error(
        invoke("--db", "postgresql://flowscope@127.0.0.1:1/x", "--durability", "full", "runs"),
        "--durability",
        "synchronous_commit",
    )
    bad = run_cli("--db", str(db), "--durability", "paranoid", *prune)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "'paranoid' is not one of 'normal', 'full'" in bad.stderr


@pytest.mark.parametrize(
    "db",
    [
        "postgresql://bob:correct horse@127.0.0.1:1/db",  # a space in the password, unencoded
        "host=db.example user=bob password=correct-horse dbname=x",  # libpq's keyword/value form
        "dbname=x password='correct horse'",
    ],
)
@pytest.mark.parametrize("command", [("runs",), ("start", "nightly_export", "--input", "1")])
def test_a_database_string_with_a_password_never_prints_it_nor_becomes_a_file(
    tmp_path, monkeypatch, db, command
):
    monkeypatch.chdir(tmp_path)
    for how in ("--db", "env"):
        args, env = (("--db", db, *command), None) if how == "--db" else (command, {"FLOWSCOPE_DB": db})
        r = invoke(*args, env=env)
        assert r.exit_code == 2, (how, r.output)
        assert "correct" not in r.output and "horse" not in r.output, (how, r.output)
        assert len(r.output.strip().splitlines()) == 1, r.output
    assert list(tmp_path.iterdir()) == []  # no SQLite file named after the string
