"""The operator's CLI as a new user tries it: every defect found, every command
and flag added, through the console script in a subprocess on a real SQLite file."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from commands import FLOWSCOPE, cli_env, run_cli
from flowscope.actions import operator
from flowscope.cli.demo_cmd import WORKER_HANG_S
from flowscope.errors import LeaseLost
from flowscope.events import RunFinished
from flowscope.ownership import this_process
from flowscope.store import SqliteEventStore

#: Workflows of a user's own, saved as ``flows.py`` in the test's folder (the current
#: directory of every command, so ``--workflow flows:NAME`` must find it).
FLOWS = textwrap.dedent(
    """
    import sys, time
    from flowscope import RetryConfig, Runner, START, Workflow, node
    from flowscope.store import SqliteEventStore

    class Flaky(Exception):
        error_code = "FLAKY_UPSTREAM"

    _calls = {"n": 0}

    @node(retry=RetryConfig(max_attempts=3, initial_delay=0.01, jitter=0.0))
    def fetch(x):
        _calls["n"] += 1
        if _calls["n"] == 1:
            raise Flaky("upstream timed out")
        return x

    @node
    def slow(x):
        raise ValueError("first line of the failure\\nsecond line\\nthird line")

    @node
    def prep(x):
        return x

    @node
    def prep2(x):
        return x

    @node
    async def approve(ctx, x):
        return await ctx.request_input("ship it?", interrupt_id="approval")

    @node
    async def wait_a_bit(ctx, x):
        import asyncio
        await asyncio.sleep(1.5)
        return x

    @node
    async def wait_more(ctx, x):
        import asyncio
        await asyncio.sleep(1.5)
        return x

    inner = Workflow("inner", edges=[(START, prep, prep2)])
    slowwf = Workflow("slow", edges=[(START, slow)])
    orders = Workflow("orders", edges=[(START, fetch, inner, approve)])
    stepper = Workflow("stepper", edges=[(START, wait_a_bit, prep, wait_more)])

    def run(db, which, session, *args):
        wf = {"slow": slowwf, "orders": orders, "stepper": stepper}[which]
        runner = Runner(wf, store=SqliteEventStore(db))
        try:
            return runner.run_sync(1, session_id=session)
        except Exception:
            return None

    if __name__ == "__main__":
        db, which, session = sys.argv[1:4]
        r = run(db, which, session)
        if "--resume-later" in sys.argv:  # the operator answers 46 s later
            real = time.time
            time.time = lambda: real() + 46.0
            Runner(orders, store=SqliteEventStore(db)).resume_sync(session, inputs={"approval": True})
    """
)


def flowscope(*args: str, cwd: Path, env: dict | None = None, timeout: float = 60, stdin=subprocess.DEVNULL):
    """``flowscope ARGS`` in ``cwd``; ``env`` adds to :func:`~commands.cli_env`, which
    here also leaves out ``FLOWSCOPE_UTC`` (the tests of ``--utc`` set it)."""
    return run_cli(
        *args, cwd=cwd, env=cli_env(drop=("FLOWSCOPE_UTC",), **(env or {})), timeout=timeout, stdin=stdin
    )


def one_line_error(proc, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("flowscope: error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.fixture
def work(tmp_path):
    (tmp_path / "flows.py").write_text(FLOWS)
    return tmp_path


def run_flow(work: Path, which: str, session: str, *extra: str, db: str = "ops.db") -> None:
    proc = subprocess.run(
        [sys.executable, "flows.py", db, which, session, *extra],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def as_json(proc) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One `flowscope demo` run: (folder, session ids by suffix)."""
    d = tmp_path_factory.mktemp("opsdemo")
    proc = flowscope("demo", "--stale-after", "0.5s", cwd=d)
    assert proc.returncode == 0, proc.stderr
    with SqliteEventStore(d / "flowscope.db", readonly=True) as store:
        ids = {s.session_id.rsplit("-", 1)[-1]: s.session_id for s in store.sessions()}
    return d, ids


def copy_demo(demo, dst: Path) -> Path:
    d, _ = demo
    with sqlite3.connect(d / "flowscope.db") as a, sqlite3.connect(dst / "flowscope.db") as b:
        a.backup(b)
    return dst


# --------------------------------------------------------------------------- defects


@pytest.mark.slow  # over a second: several console-script runs
def test_audit_keeps_a_root_run_and_a_node_of_the_same_name_apart(work):
    run_flow(work, "slow", "s1")
    rows = as_json(flowscope("--db", "ops.db", "audit", "--format", "json", cwd=work))
    slow = sorted((r["kind"], r["root"], r["runs"], r["failed"]) for r in rows if r["node"] == "slow")
    assert slow == [("function", False, 1, 1), ("workflow", True, 1, 1)]
    table = flowscope("--db", "ops.db", "audit", cwd=work).stdout.splitlines()
    assert sum(1 for line in table if line.split()[:2] == ["slow", "slow"]) == 2


def test_the_audit_of_a_whole_store_is_counted_by_the_store_and_equals_the_audit_of_its_runs(tmp_path):
    from flowscope.cli import views
    from flowscope.cli.history import retry_reasons
    from flowscope.store.testing.helpers import varied_sessions

    class NoFullRead(SqliteEventStore):
        def node_runs(self, session_id=None):
            assert session_id is not None, "the audit read every node run"
            return super().node_runs(session_id)

    with SqliteEventStore(tmp_path / "a.db") as store:
        varied_sessions(store, seed=5, sessions=4, events=100)
        runs = store.node_runs()
        want = views.audit_rows(runs, retry_reasons(store, runs))
        workflows = sorted({r.workflow for r in runs})
    assert (
        any(r["errors"] for r in want)
        and any(r["open"] for r in want)
        and any(r["retry_errors"] for r in want)
    )
    with NoFullRead(tmp_path / "a.db", readonly=True) as store:
        assert views.store_audit_rows(store) == want
        for wf in workflows:
            assert views.store_audit_rows(store, wf) == [r for r in want if r["workflow"] == wf]
    from click.testing import CliRunner

    from flowscope.cli import cli

    r = CliRunner().invoke(cli, ["--db", str(tmp_path / "a.db"), "audit", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == json.loads(json.dumps(want))


@pytest.mark.slow  # over a second: several console-script runs
def test_a_multi_line_error_message_keeps_show_on_one_line_per_run(work):
    run_flow(work, "slow", "s1")
    proc = flowscope("--db", "ops.db", "show", "s1", cwd=work)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert not any(line.startswith(("second line", "third line")) for line in lines), proc.stdout
    header = next(line for line in lines if line.startswith("failed at"))
    assert "first line of the failure second line third line" in header
    table = lines[lines.index(next(line for line in lines if line.startswith("NODE"))) :]
    assert len(table) == 3  # the heading, slow@1 (the root) and its node


@pytest.mark.slow  # over a second: several console-script runs
def test_a_run_resumed_46s_later_is_drawn_as_segments_with_the_pause_as_a_gap(work):
    run_flow(work, "orders", "o1", "--resume-later")
    proc = flowscope("--db", "ops.db", "show", "o1", cwd=work)
    assert proc.returncode == 0, proc.stderr
    bars = {
        line.split()[0]: re.search(r"\|([^|]*)\|", line).group(1)
        for line in proc.stdout.splitlines()
        if "|" in line
    }
    assert ":" in bars["approve@1"] and ":" in bars["orders@1"]
    # the root's bar: two pieces around the one-column gap, not one 46 s bar
    before, _, after = bars["orders@1"].partition(":")
    assert "=" in before and "=" in after
    # the runs before the pause keep their proportions instead of shrinking to one '='
    assert bars["fetch@1"].count("=") >= 3, proc.stdout
    rows = as_json(flowscope("--db", "ops.db", "show", "o1", "--format", "json", cwd=work))
    approve = next(r for r in rows if r["node"] == "approve")
    assert len(approve["segments"]) == 2
    assert approve["segments"][1]["started_at"] - approve["segments"][0]["ended_at"] > 45


@pytest.mark.slow
def test_one_resume_prints_one_kept_count(work):
    run_flow(work, "orders", "o2")
    proc = flowscope(
        "--db", "ops.db", "resume", "o2", "--input", "approval=true", "--workflow", "flows:orders", cwd=work
    )
    assert proc.returncode == 0, proc.stderr
    started = re.search(r"(\d+) finished run\(s\) kept from the log", proc.stdout)
    finished = re.search(r"completed \(o2, (\d+) finished run\(s\) kept", proc.stdout)
    assert started and finished, proc.stdout
    assert started.group(1) == finished.group(1) == "4"  # fetch, inner, prep, prep2


@pytest.mark.slow
def test_resume_finds_the_workflow_module_in_the_current_directory(work):
    run_flow(work, "orders", "o3")
    proc = flowscope(
        "--db", "ops.db", "resume", "o3", "--input", "approval=true", "--workflow", "flows:orders", cwd=work
    )
    assert proc.returncode == 0 and "completed" in proc.stdout, proc.stderr


@pytest.mark.slow  # over a second: several console-script runs
def test_messages_say_what_is_true(demo, tmp_path):
    d, ids = demo
    proc = flowscope("runs", "--status", "cancelled", cwd=d)
    assert proc.returncode == 0
    assert "no sessions match --status cancelled" in proc.stdout and "flowscope demo" not in proc.stdout
    line = one_line_error(
        flowscope("resume", ids["lost"], "--input", "wrongid=true", cwd=d), "no open input request 'wrongid'"
    )
    assert "(open: none)" not in line and "job job-" in line
    line = one_line_error(flowscope("--db", str(tmp_path), "demo", cwd=tmp_path), "is a directory")
    assert "flowscope demo" not in line and str(tmp_path / "flowscope.db") in line


@pytest.mark.slow  # over a second: several console-script runs
def test_a_job_result_must_be_an_object_with_the_documented_keys(demo, tmp_path):
    d = copy_demo(demo, tmp_path)
    sid = demo[1]["lost"]
    job = next(
        r
        for r in as_json(flowscope("stuck", "--older-than", "0s", "--format", "json", cwd=d))
        if r["session_id"] == sid
    )["waiting_on"][0]
    with SqliteEventStore(d / "flowscope.db", readonly=True) as store:
        before = store.last_seq(sid)
    one_line_error(
        flowscope("resume", sid, "--job", f"{job}=[1,2]", cwd=d), "a job result is a JSON object", "list"
    )
    one_line_error(
        flowscope("resume", sid, "--job", f'{job}={{"succes": true}}', cwd=d), "unknown key(s) succes"
    )
    with SqliteEventStore(d / "flowscope.db", readonly=True) as store:
        assert store.last_seq(sid) == before  # nothing consumed


@pytest.mark.slow
def test_usage_errors_are_one_line_and_bare_flowscope_is_help(tmp_path):
    for args, fragment in (
        (["nonsense"], "No such command 'nonsense'"),
        (["show"], "Missing argument 'SESSION'"),
        (["runs", "--bogus"], "--bogus"),
    ):
        one_line_error(flowscope(*args, cwd=tmp_path), fragment, "--help`")
    proc = flowscope(cwd=tmp_path)
    assert proc.returncode == 0 and "Commands:" in proc.stdout and "prune" in proc.stdout


@pytest.mark.slow
def test_demo_audit_heading_matches_the_table_and_covers_every_repeat(tmp_path):
    proc = flowscope("demo", "--repeat", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    heading = next(line for line in proc.stdout.splitlines() if "attempt audit" in line)
    assert "audit --format json)" not in heading and "all 2 repeats" in heading
    audit = proc.stdout[proc.stdout.index(heading) :]
    fetch = next(line for line in audit.splitlines() if line.split()[1:2] == ["fetch_orders"])
    assert fetch.split()[3] == "5"  # 2 repeats x 2 batches + the lost batch


@pytest.mark.slow
def test_an_unreachable_otlp_endpoint_is_said_once_and_does_not_stall_the_demo(tmp_path):
    proc = flowscope("demo", "--otlp-endpoint", "http://127.0.0.1:9", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "Transient error" not in out and "HTTPConnectionPool" not in out
    assert sum("warning" in line and "127.0.0.1:9" in line for line in out.splitlines()) == 1
    took = float(re.search(r"done in ([\d.]+)s", proc.stdout).group(1))
    assert took < 2.5, took  # the SDK's retries took 3.5 s here


def _read_until(proc: subprocess.Popen, marker: bytes, timeout: float = 30) -> bytes:
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    deadline = time.monotonic() + timeout
    while marker not in buf and time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
        time.sleep(0.05)
    assert marker in buf, buf[-400:]
    return buf


def _sessions(db: Path) -> dict[str, str]:
    with SqliteEventStore(db, readonly=True) as store:
        return {s.session_id: s.status for s in store.sessions()}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-d", "ctrl-c"])
def test_ctrl_c_or_ctrl_d_at_an_interactive_prompt_stops_the_demo_at_once(tmp_path, how):
    proc = subprocess.Popen(
        [FLOWSCOPE, "demo", "--interactive"],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen = _read_until(proc, b"retry or abort?")
        if how == "ctrl-d":
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGINT)  # once
        proc.wait(timeout=15)
        out = seen + (proc.stdout.read() or b"")
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert b"failed (as intended)" not in out and b"Abort" not in out + err
    assert b"stays paused" in err
    statuses = _sessions(tmp_path / "flowscope.db")
    orders = [s for s in statuses if s.endswith("-orders")]
    assert [statuses[s] for s in orders] == ["paused"]
    assert not any(s.endswith("-declined") for s in statuses)  # the next batch never started
    assert "cancelled" not in statuses.values()


@pytest.mark.slow
def test_a_demo_with_a_slow_operator_still_kills_its_worker_mid_run(tmp_path):
    # The doomed worker's node once hung 30 s: an operator who took longer at a prompt
    # found it finished and nothing orphaned. It hangs for a day now; the run below pauses
    # a few seconds at the prompt (the suite's time is not an operator's).
    assert WORKER_HANG_S >= 3600
    proc = subprocess.Popen(
        [FLOWSCOPE, "demo", "--interactive", "--stale-after", "0.5s"],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _read_until(proc, b"retry or abort?")
        time.sleep(3)  # the operator takes their time: the worker's node still hangs
        out, err = proc.communicate(b"retry\ny\nretry\ny\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert b"killed with SIGKILL inside nightly_export@1/export_rows@1" in out, out[-1500:]
    assert b"did not reach" not in out
    rows = as_json(
        flowscope(
            "stuck",
            "--older-than",
            "0s",
            "--stale-after",
            "0.5s",
            "--state",
            "orphaned",
            "--format",
            "json",
            cwd=tmp_path,
        )
    )
    assert [r["path"] for r in rows] == ["nightly_export@1/export_rows@1"]


# --------------------------------------------------------------------------- show and audit say more


@pytest.mark.slow  # over a second: several console-script runs
def test_show_and_audit_list_the_type_and_code_of_every_retried_attempt(work):
    run_flow(work, "orders", "o4")
    rows = as_json(flowscope("--db", "ops.db", "show", "o4", "--format", "json", cwd=work))
    fetch = next(r for r in rows if r["node"] == "fetch")
    assert fetch["retried"] == [{"attempt": 1, "error_type": "Flaky", "error_code": "FLAKY_UPSTREAM"}]
    assert "1: Flaky [FLAKY_UPSTREAM]" in flowscope("--db", "ops.db", "show", "o4", cwd=work).stdout
    audit = as_json(flowscope("--db", "ops.db", "audit", "--format", "json", cwd=work))
    assert next(r for r in audit if r["node"] == "fetch")["retry_errors"] == {"Flaky [FLAKY_UPSTREAM]": 1}
    by_run = as_json(flowscope("--db", "ops.db", "audit", "--by", "run", "--format", "json", cwd=work))
    assert next(r for r in by_run if r["node"] == "fetch")["retried"][0]["error_code"] == "FLAKY_UPSTREAM"


@pytest.mark.slow  # over a second: several console-script runs
def test_show_gives_the_heartbeat_the_idempotency_key_and_the_fix(demo):
    d, ids = demo
    export = as_json(flowscope("show", ids["export"], "--format", "json", cwd=d))
    running = next(r for r in export if r["path"] == "nightly_export@1/export_rows@1")
    assert running["heartbeat_at"] and running["heartbeat_at"] >= running["started_at"]
    assert "last heartbeat" in flowscope("show", ids["export"], cwd=d).stdout
    lost = as_json(flowscope("show", ids["lost"], "--format", "json", cwd=d))
    job = next(j for r in lost for j in r["jobs"])
    assert job["idempotency_key"]
    assert f"idempotency key {job['idempotency_key']}" in flowscope("show", ids["lost"], cwd=d).stdout


@pytest.mark.slow  # over a second: several console-script runs
def test_show_prints_the_fix_of_a_failed_jobs_pause(demo, tmp_path):
    d = copy_demo(demo, tmp_path)
    sid = demo[1]["lost"]
    job = next(j for r in as_json(flowscope("show", sid, "--format", "json", cwd=d)) for j in r["jobs"])[
        "job_id"
    ]
    proc = flowscope("resume", sid, "--job", f'{job}={{"success": true, "count": 0}}', cwd=d)
    assert proc.returncode == 0 and "paused again" in proc.stdout, proc.stderr
    rows = as_json(flowscope("show", sid, "--format", "json", cwd=d))
    request = next(q for r in rows for q in r["requests"])
    assert request["fix"] and request["problem"]
    assert "fix: " + request["fix"] in flowscope("show", sid, cwd=d).stdout


# --------------------------------------------------------------------------- new commands and flags


@pytest.mark.slow  # over a second: several console-script runs
def test_events_prints_the_log_with_payloads_redacted_unless_asked(demo):
    d, ids = demo
    rows = as_json(flowscope("events", ids["orders"], "--format", "json", cwd=d))
    with SqliteEventStore(d / "flowscope.db", readonly=True) as store:
        log = store.read(ids["orders"])
    assert [r["seq"] for r in rows] == [e.seq for e in log] and [r["type"] for r in rows] == [
        e.type for e in log
    ]
    completed = next(
        r for r in rows if r["type"] == "node_completed" and r["path"].endswith("fetch_orders@1")
    )
    assert re.fullmatch(r"<redacted: \d+ bytes>", completed["fields"]["output"])
    assert completed["fields"]["attempt_count"] == 2  # the other fields as written
    table = flowscope("events", ids["orders"], cwd=d).stdout
    assert "shipped" not in table and "<redacted:" in table  # the batch's outcome lives in payloads only
    shown = as_json(flowscope("events", ids["orders"], "--show-payloads", "--format", "json", cwd=d))
    assert shown[-1]["fields"]["output"]["status"] == "shipped"
    csv_out = flowscope("events", ids["orders"], "--format", "csv", cwd=d).stdout
    assert csv_out.splitlines()[0] == "session_id,seq,ts,type,invocation_id,path,node,fields"
    one_line_error(flowscope("events", "nope", cwd=d), "no session 'nope'")


@pytest.mark.slow  # over a second: several console-script runs
def test_cancel_ends_a_paused_session_for_good(demo, tmp_path):
    d = copy_demo(demo, tmp_path)
    sid = demo[1]["lost"]
    proc = flowscope("cancel", sid, "--reason", "the batch was withdrawn", cwd=d)
    assert proc.returncode == 0 and "2 open run(s) cancelled" in proc.stdout, proc.stderr
    events = as_json(flowscope("events", sid, "--format", "json", cwd=d))
    assert [e["type"] for e in events[-4:]] == [
        "run_started",
        "node_cancelled",
        "node_cancelled",
        "run_finished",
    ]
    assert events[-1]["fields"]["status"] == "cancelled"
    assert {e["fields"]["reason"] for e in events[-3:-1]} == {
        f"the batch was withdrawn (asked by {operator()})"
    }
    assert _sessions(d / "flowscope.db")[sid] == "cancelled"
    assert not [
        r
        for r in as_json(flowscope("stuck", "--older-than", "0s", "--format", "json", cwd=d))
        if r["session_id"] == sid
    ]
    one_line_error(flowscope("resume", sid, "--job", "x={}", cwd=d), "was cancelled")
    one_line_error(flowscope("cancel", sid, cwd=d), "already cancelled")
    one_line_error(flowscope("cancel", demo[1]["orders"], cwd=d), "already completed")


@pytest.mark.slow  # over a second: several console-script runs
def test_cancel_asks_a_live_owner_to_stop_and_force_fences_it(demo, tmp_path):
    d = copy_demo(demo, tmp_path)
    sid = demo[1]["export"]  # the killed worker's session; a live owner (this process) takes its lease
    alive = this_process("w-alive")
    with SqliteEventStore(d / "flowscope.db") as store:
        taken = store.acquire(sid, alive, 60.0, force=True)
        before = store.last_seq(sid)
    proc = flowscope("cancel", sid, cwd=d)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"asked w-alive on {alive.host} pid {alive.pid}" in proc.stdout
        and "next lease renewal" in proc.stdout
    )
    with SqliteEventStore(
        d / "flowscope.db"
    ) as store:  # sent to its inbox: nothing appended, the owner keeps its epoch
        info = store.session_info(sid)
        assert (
            store.last_seq(sid) == before
            and info is not None
            and (info.owner, info.epoch) == (alive, taken.epoch)
        )
        assert [m.kind for m in store.inbox(sid)] == ["cancel"]
    proc = flowscope("cancel", sid, "--force", cwd=d)
    assert proc.returncode == 0, proc.stderr
    assert "--force: took the session from" in proc.stderr
    assert _sessions(d / "flowscope.db")[sid] == "cancelled"
    with SqliteEventStore(
        d / "flowscope.db"
    ) as store:  # the live owner is fenced off, the cancel's lease released
        info = store.session_info(sid)
        assert info is not None and info.epoch == taken.epoch + 1 and info.lease_expires_at == 0
        with pytest.raises(LeaseLost):
            store.append(
                sid,
                [RunFinished(session_id=sid, invocation_id="late", ts=time.time(), status="completed")],
                store.last_seq(sid),
                epoch=taken.epoch,
            )
        assert store.inbox(sid) == []  # the forced cancel took the request in with it


@pytest.mark.slow  # over a second: several console-script runs
def test_prune_deletes_old_finished_sessions_only_and_says_what_it_freed(demo, tmp_path):
    d = copy_demo(demo, tmp_path)
    ids = demo[1]
    dry = as_json(flowscope("prune", "--older-than", "0s", "--dry-run", "--format", "json", cwd=d))
    # never the open ones (nor the queued one); the two the demo's worker served from the queue
    assert sorted(r["session_id"] for r in dry) == sorted(
        [ids["orders"], ids["declined"], ids["1"], ids["2"]]
    )
    assert len(_sessions(d / "flowscope.db")) == 7  # a dry run deletes nothing
    assert "nothing deleted" in flowscope("prune", "--older-than", "0s", "--dry-run", cwd=d).stdout
    kept = flowscope("prune", "--older-than", "1h", cwd=d)
    assert kept.returncode == 0 and "deleted 0 session(s)" in kept.stdout
    proc = flowscope("prune", "--older-than", "0s", "--status", "failed", cwd=d)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"deleted 1 session\(s\), 55 event\(s\).*freed \d+ KiB of \d+ KiB", proc.stdout), (
        proc.stdout
    )
    left = _sessions(d / "flowscope.db")
    assert ids["declined"] not in left
    assert set(left) == {ids["orders"], ids["lost"], ids["export"], ids["1"], ids["2"], ids["later"]}
    with SqliteEventStore(d / "flowscope.db", readonly=True) as store:
        assert store.read(ids["declined"]) == [] and store.node_runs(ids["declined"]) == []


@pytest.mark.slow  # over a second: several console-script runs
def test_stuck_fail_if_any_exits_1_when_something_is_listed(demo):
    d, _ = demo
    proc = flowscope("stuck", "--older-than", "0s", "--stale-after", "0.5s", "--fail-if-any", cwd=d)
    assert proc.returncode == 1 and "orphaned" in proc.stdout
    proc = flowscope("stuck", "--older-than", "1h", "--fail-if-any", cwd=d)  # an orphan is listed at once
    assert proc.returncode == 1 and "orphaned" in proc.stdout and "overdue" not in proc.stdout
    proc = flowscope("stuck", "--older-than", "1h", "--state", "overdue", "--fail-if-any", cwd=d)
    assert proc.returncode == 0 and "nothing stuck" in proc.stdout


@pytest.mark.slow
def test_show_follow_redraws_until_the_session_ends(work):
    runner = subprocess.Popen([sys.executable, "flows.py", "ops.db", "stepper", "f1"], cwd=work)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if "f1" in _sessions(work / "ops.db"):
                    break
            except Exception:  # not created yet, or its schema half-way: look again
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc = flowscope(
            "--db", "ops.db", "show", "f1", "--follow", "--interval", "0.1s", cwd=work, timeout=30
        )
    finally:
        runner.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    draws = [line for line in proc.stdout.splitlines() if line.startswith("-- ")]
    assert len(draws) >= 2 and draws[-1].split(": ")[1].startswith("completed"), proc.stdout
    assert "running" in " ".join(draws[:-1])
    one_line_error(
        flowscope("--db", "ops.db", "show", "f1", "--follow", "--format", "json", cwd=work), "--follow"
    )


@pytest.mark.slow  # over a second: several console-script runs
def test_utc_prints_every_time_in_utc_and_tables_name_the_zone(demo):
    d, ids = demo
    tokyo = {"TZ": "Asia/Tokyo"}
    with SqliteEventStore(d / "flowscope.db", readonly=True) as store:
        started = next(s.started_at for s in store.sessions() if s.session_id == ids["orders"])
    utc_text = time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))
    local = flowscope("runs", cwd=d, env=tokyo).stdout
    assert "STARTED (JST)" in local
    for proc in (
        flowscope("--utc", "runs", cwd=d, env=tokyo),
        flowscope("runs", cwd=d, env={**tokyo, "FLOWSCOPE_UTC": "1"}),
    ):
        assert "STARTED (UTC)" in proc.stdout and utc_text in proc.stdout
    show = flowscope("--utc", "show", ids["orders"], cwd=d, env=tokyo).stdout
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", show)
    assert "TIME (UTC)" in flowscope("--utc", "events", ids["orders"], cwd=d, env=tokyo).stdout


def test_cancel_session_of_an_orphan_goes_through_the_fence():
    """An orphaned session (its owner's process is gone) is cancelled without --force:
    the cancel takes the lease (epoch + 1), appends under it and releases it, so the dead
    owner, were it to wake up, writes nothing more."""
    from flowscope.cli.session_ops import SessionFinished, SessionOwned, cancel_session, live_owner
    from flowscope.events import NodeStarted, RunStarted
    from flowscope.fold import rebuild
    from flowscope.store import MemoryEventStore
    from flowscope.store.testing import dead_owner

    store = MemoryEventStore()
    gone = dead_owner()
    lease = store.acquire("s", gone, 3600.0)
    store.append(
        "s",
        [
            RunStarted(session_id="s", invocation_id="i", ts=1.0, workflow="w"),
            NodeStarted(session_id="s", invocation_id="i", ts=2.0, path="w@1/a@1", node="a"),
        ],
        0,
        epoch=lease.epoch,
    )
    assert live_owner(store, "s") is None  # the lease is current but its process is gone
    ws, events = cancel_session(store, rebuild(store.read("s")), "withdrawn")
    assert [e.type for e in events] == ["run_started", "node_cancelled", "run_finished"]
    info = store.session_info("s")
    assert info is not None and info.status == "cancelled" and info.epoch == lease.epoch + 1
    assert info.lease_expires_at == 0 and info.owner != gone
    with pytest.raises(LeaseLost):
        store.append(
            "s",
            [RunFinished(session_id="s", invocation_id="i", ts=3.0, status="completed")],
            4,
            epoch=lease.epoch,
        )
    with pytest.raises(SessionFinished):
        cancel_session(store, rebuild(store.read("s")), "again")
    # a live owner (this process) is refused, naming it, and keeps its epoch
    me = this_process("w-me")
    held = store.acquire("t", me, 60.0)
    store.append(
        "t", [RunStarted(session_id="t", invocation_id="j", ts=1.0, workflow="w")], 0, epoch=held.epoch
    )
    assert live_owner(store, "t") is not None
    with pytest.raises(SessionOwned, match=f"{me.host} pid {me.pid}"):
        cancel_session(store, rebuild(store.read("t")), "no")
    assert store.session_info("t").epoch == held.epoch and store.last_seq("t") == 1
