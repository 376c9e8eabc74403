"""`flowscope demo`: what it shows, and what its database holds afterwards."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from commands import cli_env, cli_ok, run_cli, start_cli
from flowscope.cli import cli
from flowscope.store import SqliteEventStore, rebuild

# Every test here starts processes or servers, or runs the demo end to end.
pytestmark = pytest.mark.slow


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def sessions_of(db: Path) -> dict[str, str]:
    with SqliteEventStore(db, readonly=True) as store:
        ids = [s.session_id for s in store.sessions()]
    out = {}
    for suffix in ("orders", "declined", "lost", "export"):
        out[suffix] = next(s for s in ids if s.endswith("-" + suffix))
    return out


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`flowscope demo` through the console script, in a fresh directory (default ./flowscope.db)."""
    d = tmp_path_factory.mktemp("demo")
    t0 = time.monotonic()
    proc = run_cli("demo", "--stale-after", "0.3s", cwd=d)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    db = d / "flowscope.db"
    assert db.exists()
    time.sleep(0.4)  # the killed worker's heartbeat goes stale
    return db, proc.stdout, sessions_of(db), elapsed


def test_the_demo_is_quick_and_says_what_happened(demo):
    db, out, ids, elapsed = demo
    assert elapsed < 20
    for text in (
        f"session {ids['orders']}",
        "retry",
        "INVENTORY_UNAVAILABLE",
        "returned nothing: completion marker",
        "count=0: empty",
        "retry or abort",
        "approval",
        "PAYMENT_DECLINED",
        "killed with SIGKILL",
        # the waterfall of the main run, the audit, the next commands
        "TIMELINE",
        "  fetch_orders@1",
        "    check_stock@1",
        "ATTEMPTS",
        f"flowscope show {ids['orders']}",
        "flowscope stuck --older-than 0s --stale-after 0.3s",
        f"flowscope resume {ids['export']}",
        f"flowscope resume {ids['lost']} --job 'job-",
        f"flowscope export {ids['orders']}",
        "flowscope serve-metrics",
        "flowscope demo --otlp-endpoint http://localhost:4318",
        "--otlp-endpoint http://localhost:4318",
    ):
        assert text in out, text
    assert "Traceback" not in out
    with SqliteEventStore(db, readonly=True) as store:  # the invocations it says are the log's
        for key, said in (("orders", "=> completed after"), ("declined", "=> failed (as intended) after")):
            started = sum(e.type == "run_started" for e in store.read(ids[key]))
            assert f"{said} {started} invocation(s)" in out


def test_the_demo_database_holds_everything_it_promises(demo):
    db, _out, ids, _ = demo
    with SqliteEventStore(db, readonly=True) as store:
        main = store.read(ids["orders"])
        declined = store.read(ids["declined"])
        crashed = store.read(ids["export"])
        ws = rebuild(main)
    types = [e.type for e in main]
    # a flaky node that succeeds on a retry
    (retry,) = [e for e in main if e.type == "node_retrying"]
    assert retry.node == "fetch_orders" and retry.error_code == "INVENTORY_UNAVAILABLE"
    assert ws.nodes["order_fulfilment@1/fetch_orders@1"].status == "completed"
    assert ws.nodes["order_fulfilment@1/fetch_orders@1"].attempt == 2
    # the completion marker
    (marker,) = [e for e in main if e.type == "node_completed" and e.node == "send_confirmations"]
    assert marker.has_output is False
    # parallel branches, a join and a nested workflow
    assert ws.nodes["order_fulfilment@1/reserve_stock@1"].kind == "workflow"
    assert ws.nodes["order_fulfilment@1/reserve_stock@1/hold_items@1"].status == "completed"
    assert ws.nodes["order_fulfilment@1/ready@1"].kind == "join"
    # the job: empty first, the actionable pause answered "retry", then a second dispatch that succeeds
    dispatched = [e for e in main if e.type == "job_dispatched"]
    assert [d.dispatch_attempt for d in dispatched] == [1, 2]
    assert [r.result for r in main if r.type == "job_result"] == ["empty", "success"]
    (failed_job,) = [e for e in main if e.type == "input_requested" and e.payload.get("kind") == "job_failed"]
    assert failed_job.payload["actions"] == ["retry", "abort"]
    answers = {e.interrupt_id: e.value for e in main if e.type == "input_received"}
    assert answers == {failed_job.interrupt_id: "retry", "approval": True}
    # pauses and resumes: five invocations
    assert [e.resumed for e in main if e.type == "run_started"] == [False, True, True, True, True]
    assert types[-1] == "run_finished" and ws.status == "completed"
    # a node that fails with a coded error, in a second session
    (err,) = [e for e in declined if e.type == "node_error"]
    assert (err.node, err.error_code, err.error_type) == (
        "charge_card",
        "PAYMENT_DECLINED",
        "PaymentDeclined",
    )
    assert rebuild(declined).status == "failed"
    # a job the worker never reports: the session waits on it
    with SqliteEventStore(db, readonly=True) as store:
        lost = rebuild(store.read(ids["lost"]))
    assert lost.status == "paused" and [p.type for p in lost.pending] == ["job_dispatched"]
    assert lost.pending[0].deadline_s == 0.3
    # a worker that died mid-run
    state = rebuild(crashed)
    assert state.status == "running"
    assert state.nodes["nightly_export@1/export_rows@1"].status == "running"
    assert state.nodes["nightly_export@1/snapshot@1"].status == "completed"


def test_audit_and_stuck_json_report_them(demo):
    db, _out, ids, _ = demo
    audit = json.loads(run_cli("--db", str(db), "audit", "--format", "json").stdout)
    by_node = {(r["workflow"], r["node"]): r for r in audit}
    fetch = by_node[("order_fulfilment", "fetch_orders")]
    assert fetch["retries"] == 3 and fetch["attempts"] == 6 and fetch["max_attempt"] == 2  # three batches
    charge = by_node[("order_fulfilment", "charge_card")]
    assert charge["errors"] == 1 and charge["error_codes"] == {"PAYMENT_DECLINED": 1}
    assert (
        by_node[("order_fulfilment", "ship")]["failed"] == 1
        and by_node[("order_fulfilment", "ship")]["errors"] == 0
    )
    assert by_node[("nightly_export", "export_rows")]["open"] == 1
    # its workflow run is the container of that run: no second open run (the deepest path counts)
    assert [r["open"] for r in audit if r["node"] == "nightly_export" and r["root"]] == [0]
    assert by_node[("order_fulfilment", "send_confirmations")]["completed"] == 1
    stuck = json.loads(
        run_cli(
            "--db", str(db), "stuck", "--older-than", "0s", "--stale-after", "0.3s", "--format", "json"
        ).stdout
    )
    by_state = {r["state"]: r for r in stuck}
    assert set(by_state) == {
        "orphaned",
        "overdue",
        "queued",
    }  # the demo leaves one run queued, no worker serves it
    assert by_state["queued"]["session_id"].endswith("-queued-later")
    orphan, overdue = by_state["orphaned"], by_state["overdue"]
    assert (orphan["session_id"], orphan["path"]) == (ids["export"], "nightly_export@1/export_rows@1")
    assert orphan["heartbeat_age_s"] >= 0.3
    assert (overdue["session_id"], overdue["path"]) == (ids["lost"], "order_fulfilment@1/enrich_addresses@1")
    assert overdue["waiting_on"] and overdue["waiting_on"][0].startswith("job-")
    assert by_node[("order_fulfilment", "enrich_addresses")]["open"] == 1


def test_the_killed_worker_is_orphaned_at_once_and_every_hint_runs_as_printed(tmp_path):
    """No --stale-after wait for the dead worker; each `flowscope ...` line the
    demo prints under "next, try" (but serve-metrics, which serves until stopped) exits 0."""
    out = cli_ok("demo", cwd=tmp_path)  # the default --stale-after (5s): not waited for
    ids = sessions_of(tmp_path / "flowscope.db")
    assert "orphaned at once" in out
    stuck = json.loads(run_cli("stuck", "--older-than", "0s", "--format", "json", cwd=tmp_path).stdout)
    assert {r["session_id"]: r["state"] for r in stuck if r["state"] == "orphaned"} == {
        ids["export"]: "orphaned"
    }
    hints = [line.strip().split("   #")[0].strip() for line in out.split("next, try")[1].splitlines()]
    commands = [
        h
        for h in hints
        if h.startswith("flowscope ") and "serve-metrics" not in h and "--otlp-endpoint" not in h
    ]
    assert any(f"resume {ids['export']}" in c for c in commands) and any("--job" in c for c in commands)
    # The hints are shell lines: run them with this interpreter's console script first on PATH.
    env = cli_env()
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    for command in commands:
        result = subprocess.run(
            command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
        )
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr


def test_the_demo_in_process_with_interactive_answers(tmp_path):
    db = tmp_path / "i.db"
    # per batch: the failed job (retry or abort?), then the approval (y/n)
    result = invoke("--db", str(db), "demo", "--interactive", input="retry\ny\nretry\nn\n")
    assert result.exit_code == 0, result.output
    assert "retry or abort?" in result.stdout and "Ship 3 orders" in result.stdout
    ids = sessions_of(db)
    with SqliteEventStore(db, readonly=True) as store:
        rejected = rebuild(store.read(ids["declined"]))
    # the second batch was rejected by the operator: it never reached the declined card
    assert rejected.status == "completed" and rejected.output["status"] == "cancelled"


def test_repeat_runs_the_workflows_again(tmp_path):
    db = tmp_path / "r.db"
    result = invoke("--db", str(db), "demo", "--repeat", "3")
    assert result.exit_code == 0, result.output
    with SqliteEventStore(db, readonly=True) as store:
        sessions = store.sessions()
    by_workflow = {}
    for s in sessions:
        by_workflow.setdefault(s.workflow, []).append(s.status)
    assert sorted(by_workflow["order_fulfilment"]) == ["completed"] * 3 + ["failed"] * 3 + ["paused"]
    # the queue the worker served (twice completed), the session left queued, the killed worker's
    assert sorted(by_workflow["nightly_export"]) == ["completed", "completed", "queued", "running"]
    assert "run 3/3" in result.stdout


def test_the_demo_sends_spans_to_an_otlp_endpoint(tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received = []

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            req = ExportTraceServiceRequest()
            req.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(req)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        # In its own process: the demo makes its tracer provider the global one, once per process.
        result = run_cli(
            "--db",
            str(tmp_path / "o.db"),
            "demo",
            "--otlp-endpoint",
            f"http://127.0.0.1:{server.server_port}",
        )
        assert result.returncode == 0, result.stderr
    finally:
        server.shutdown()
        server.server_close()
    spans = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    services = {
        kv.value.string_value
        for r in received
        for rs in r.resource_spans
        for kv in rs.resource.attributes
        if kv.key == "service.name"
    }
    names = {s.name for s in spans}
    assert services == {"flowscope-demo"}
    assert {
        "invoke_workflow order_fulfilment",
        "invoke_node fetch_orders",
        "invoke_workflow reserve_stock",
    } <= names
    assert any(s.status.code == 2 and s.name == "invoke_node charge_card" for s in spans)


def test_metrics_port_serves_during_and_after_the_run_until_sigterm(tmp_path):
    db = tmp_path / "m.db"
    proc = start_cli("--db", str(db), "demo", "--metrics-port", "0", "--stale-after", "0.2s", "--repeat", "2")
    try:
        url = None
        serving = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not serving:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
            if m and url is None:
                url = m.group(1)
            serving = "until Ctrl-C or SIGTERM" in line
        assert url and serving, proc.stderr.read() if proc.poll() is not None else "no URL"
        time.sleep(0.3)
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        # the in-process metrics of the runs ...
        # (2 repeats x 2 batches, and the batch whose job is lost)
        assert re.search(
            r'flowscope_node_runs_total\{node="fetch_orders",outcome="success",workflow="order_fulfilment"\} 5\.0',
            body,
        )
        assert re.search(
            r'flowscope_node_retries_total\{error_type="InventoryUnavailable",node="fetch_orders",workflow="order_fulfilment"\} 5\.0',
            body,
        )
        assert (
            'flowscope_node_errors_total{error_code="PAYMENT_DECLINED",error_type="PaymentDeclined",node="charge_card",workflow="order_fulfilment"} 2.0'
            in body
        )
        assert re.search(
            r'flowscope_job_results_total\{node="enrich_addresses",result="empty",workflow="order_fulfilment"\} 4\.0',
            body,
        )
        # ... and the store collector, which sees the killed worker's orphaned run
        assert 'flowscope_store_orphaned_runs{node="export_rows",workflow="nightly_export"} 1.0' in body
        assert 'flowscope_store_overdue_jobs{node="enrich_addresses",workflow="order_fulfilment"} 1.0' in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_demo_refuses_a_foreign_database(tmp_path):
    import sqlite3

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t (x)")
    proc = run_cli("--db", str(other), "demo")
    assert proc.returncode == 2 and "not a flowscope database" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_store_that_refuses_writes_stops_a_batch_rather_than_read_as_its_failure():
    import asyncio

    from flowscope.errors import StoreReadOnly
    from flowscope.examples.demo import DemoDriver, batch_input
    from flowscope.store import MemoryEventStore

    class ReadOnly(MemoryEventStore):  # a role that may read, not write
        def acquire_new_many(self, session_ids, owner, lease_s):
            raise StoreReadOnly("this role may not acquire sessions (42501): grant it the privileges")

        def acquire(self, session_id, owner, lease_s, *, force=False, now=None):
            raise StoreReadOnly("this role may not acquire sessions (42501): grant it the privileges")

    driver = DemoDriver(ReadOnly(), [], echo=lambda _line: None)
    with pytest.raises(StoreReadOnly):  # not a report of a batch that "failed (as intended)"
        asyncio.run(driver.run_batch("demo-x-orders", batch_input("B-x", "normal")))
