"""Tracing as it runs in production: ``flowscope worker`` and ``flowscope demo`` processes
started through the CLI, a real OTLP receiver (otelsink, tests/observability/test_otlp_export.py), a real
HTTP server and a real instrumented HTTP client (``opentelemetry-instrumentation-urllib``)
inside a node body, and a worker killed with SIGKILL (docs/telemetry.md, "Spans").
"""

from __future__ import annotations

import http.server
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_otlp_export import attrs, clean_otel_env, otelsink  # noqa: F401  (the real OTLP receiver and its fixture)

from commands import cli_env, run_cli, start_cli
from flowscope.store.sqlite import SqliteEventStore
from waiting import wait_for

pytestmark = pytest.mark.slow


FLOWS_PY = """
import asyncio
import os
import urllib.request

from opentelemetry.instrumentation.urllib import URLLibInstrumentor

from flowscope import START, Workflow, node

URLLibInstrumentor().instrument()  # what an application does at import: its clients trace themselves


@node
def reserve(x):
    with urllib.request.urlopen(os.environ["INVENTORY_URL"] + "/reserve/" + str(x), timeout=10) as reply:
        return reply.read().decode()


@node
async def export_rows(ctx, x):
    if not ctx.recovered and os.environ.get("HUNG_FILE"):
        await asyncio.sleep(0.2)
        ctx.heartbeat()  # a sign of life after the run's last event
        open(os.environ["HUNG_FILE"], "w").close()
        await asyncio.sleep(3600)  # killed here
    return x


orders = Workflow("orders", edges=[(START, Workflow("stock", edges=[(START, reserve)]))])
nightly = Workflow("nightly", edges=[(START, Workflow("dump", edges=[(START, export_rows)]))])
"""


class Inventory(http.server.BaseHTTPRequestHandler):
    """The real HTTP server the node body calls; keeps the traceparent each request carried."""

    seen: list[str | None] = []

    def do_GET(self):  # noqa: N802
        Inventory.seen.append(self.headers.get("traceparent"))
        body = b"reserved"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def inventory():
    Inventory.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Inventory)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def base_env(**extra: str) -> dict[str, str]:
    return cli_env(OTEL_BSP_SCHEDULE_DELAY="50", **extra)


def start_session(tmp_path: Path, db: Path, workflow: str, session: str, env: dict[str, str]) -> None:
    r = run_cli(
        "--db", str(db), "start", workflow, "--input", "7", "--session", session, cwd=tmp_path, env=env
    )
    assert r.returncode == 0, r.stderr


def status(db: Path, session: str) -> str | None:
    with SqliteEventStore(str(db)) as store:
        info = store.session_info(session)
    return info.status if info else None


def serve(tmp_path: Path, db: Path, spec: str, env: dict[str, str], *options: str) -> subprocess.Popen:
    return start_cli("--db", str(db), "worker", spec, "--poll", "50ms", *options, cwd=tmp_path, env=env)


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def spans_of(collected) -> list:
    return [s for _res, _scope, s in collected.spans()]


def a(span, key):
    return attrs(span.attributes).get(key)


# -- every span reaches the backend -----------------------------------------------------------------


def test_an_instrumented_http_clients_span_in_a_node_body_is_a_child_of_the_node_span_under_flowscope_worker(
    tmp_path, monkeypatch, inventory
):
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    db = tmp_path / "w.db"
    with (
        otelsink("http/protobuf", monkeypatch) as (endpoint, collected),
        otelsink("http/protobuf", monkeypatch) as (other, elsewhere),
    ):
        # --otlp-endpoint wins over the variable, which points at another receiver
        env = base_env(INVENTORY_URL=inventory, OTEL_EXPORTER_OTLP_ENDPOINT=other)
        start_session(tmp_path, db, "orders", "o1", env)
        w = serve(tmp_path, db, "flows:orders", env, "--otlp-endpoint", endpoint)
        try:
            wait_for(
                lambda: len(collected.spans()) >= 4,
                60,
                "the invocation, stock, reserve and the client's span",
            )
        finally:
            stop(w)
        spans = spans_of(collected)
        assert spans_of(elsewhere) == []
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"invoke_workflow orders", "invoke_workflow stock", "invoke_node reserve", "GET"}
    client, reserve = by_name["GET"], by_name["invoke_node reserve"]
    assert client.kind == client.SPAN_KIND_CLIENT
    assert a(client, "http.request.method") == "GET" or a(client, "http.method") == "GET"
    assert client.trace_id == reserve.trace_id and client.parent_span_id == reserve.span_id
    # and the server was called in that trace: the client propagated its own span's context
    assert Inventory.seen == [f"00-{client.trace_id.hex()}-{client.span_id.hex()}-01"]
    # the flowscope spans say what they are by convention
    assert (a(reserve, "gen_ai.operation.name"), a(reserve, "gen_ai.conversation.id")) == (
        "invoke_node",
        "o1",
    )
    stock = by_name["invoke_workflow stock"]
    assert (
        a(stock, "gen_ai.operation.name"),
        a(stock, "gen_ai.workflow.name"),
        a(stock, "gen_ai.conversation.id"),
    ) == ("invoke_workflow", "stock", "o1")


def test_flowscope_worker_with_only_the_otel_variables_sends_its_spans_where_they_say(
    tmp_path, monkeypatch, inventory
):
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    db = tmp_path / "w.db"
    with otelsink("grpc", monkeypatch) as (endpoint, collected):
        env = base_env(
            INVENTORY_URL=inventory,
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_HEADERS="x-tenant=blue",
            OTEL_SERVICE_NAME="orders-svc",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=test",
        )
        start_session(tmp_path, db, "orders", "o1", env)
        w = serve(tmp_path, db, "flows:orders", env)
        try:
            wait_for(lambda: len(collected.spans()) >= 4, 60, "4 spans over gRPC")
        finally:
            stop(w)
        received = collected.spans()
        headers = collected.headers
    assert {s.name for _r, _sc, s in received} == {
        "invoke_workflow orders",
        "invoke_workflow stock",
        "invoke_node reserve",
        "GET",
    }
    assert {(r["service.name"], r["deployment.environment.name"]) for r, _sc, _s in received} == {
        ("orders-svc", "test")
    }
    assert all(dict(h).get("x-tenant") == "blue" for h in headers)


def test_flowscope_demo_with_only_otel_exporter_otlp_endpoint_sends_its_spans(tmp_path, monkeypatch):
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        r = run_cli(
            "--db",
            str(tmp_path / "d.db"),
            "demo",
            "--stale-after",
            "0.3s",
            cwd=tmp_path,
            env=base_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint),
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        received = collected.spans()
    names = {s.name for _r, _sc, s in received}
    assert {
        "invoke_workflow order_fulfilment",
        "invoke_node fetch_orders",
        "invoke_workflow reserve_stock",
    } <= names
    assert {res["service.name"] for res, _sc, _s in received} == {"flowscope-demo"}
    assert f"spans to otlp http/protobuf {endpoint}" in r.stdout


def test_otel_sdk_disabled_sends_no_span_even_to_an_otlp_endpoint_and_says_so(
    tmp_path, monkeypatch, inventory
):
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    db = tmp_path / "w.db"
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        env = base_env(
            INVENTORY_URL=inventory, OTEL_SDK_DISABLED="true", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint
        )
        start_session(tmp_path, db, "orders", "o1", env)
        w = serve(tmp_path, db, "flows:orders", env, "--otlp-endpoint", endpoint)
        try:
            wait_for(lambda: status(db, "o1") == "completed", 60, "the session to complete")
            time.sleep(0.5)  # three batch-processor delays: anything sent has arrived
        finally:
            err = stop(w)
        assert collected.spans() == []
    assert "OTEL_SDK_DISABLED=true: tracing is off, no spans are sent" in err


# -- a crash is visible in the trace ----------------------------------------------------------------


def test_a_sigkilled_workers_cut_off_run_arrives_as_a_worker_lost_error_ending_at_its_last_heartbeat(
    tmp_path, monkeypatch
):
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    db = tmp_path / "w.db"
    hung = tmp_path / "hung"
    path = "nightly@1/dump@1/export_rows@1"
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        start_session(tmp_path, db, "nightly", "n1", base_env())
        first = serve(
            tmp_path,
            db,
            "flows:nightly",
            base_env(HUNG_FILE=str(hung), OTEL_SERVICE_NAME="nightly-a"),
            "--otlp-endpoint",
            endpoint,
        )
        try:
            wait_for(hung.exists, 60, "the node to hang")
            time.sleep(0.3)  # the batch processor ships what ended before the hang
        finally:
            first.kill()
            first.communicate(timeout=30)
        with SqliteEventStore(str(db)) as store:
            (run,) = [r for r in store.node_runs("n1") if r.path == path]
            first_invocation = store.read("n1")[-1].invocation_id
        assert run.status == "running" and run.heartbeat_at is not None
        # the next worker recovers the session: it ships what the dead one did not, then reruns the node
        second = serve(
            tmp_path,
            db,
            "flows:nightly",
            base_env(OTEL_SERVICE_NAME="nightly-b"),
            "--otlp-endpoint",
            endpoint,
        )
        try:
            wait_for(lambda: status(db, "n1") == "completed", 60, "the recovered session to complete")
            wait_for(lambda: len(collected.spans()) >= 6, 30, "both invocations' spans")
        finally:
            stop(second)
        received = collected.spans()
    from flowscope.observability.log_spans import trace_id_for

    cut_trace = trace_id_for("n1", first_invocation).to_bytes(16, "big")
    cut = {a(s, "flowscope.node.path"): (res, s) for res, _sc, s in received if s.trace_id == cut_trace}
    assert set(cut) == {"nightly@1", "nightly@1/dump@1", path}
    for p, (res, span) in cut.items():
        assert span.status.code == span.status.STATUS_CODE_ERROR, p
        assert a(span, "error.type") == "flowscope.WorkerLost", p
        assert span.end_time_unix_nano == int(round(run.heartbeat_at * 1e9)), (
            p
        )  # its last sign of life, not its last event
        assert res["service.name"] == "nightly-a", (
            p
        )  # the dead process's resource, though nightly-b shipped it
    assert cut[path][1].end_time_unix_nano - cut[path][1].start_time_unix_nano >= 0.2e9
    rerun = [s for res, _sc, s in received if s.trace_id != cut_trace and a(s, "flowscope.node.path") == path]
    assert len(rerun) == 1 and rerun[0].status.code != rerun[0].status.STATUS_CODE_ERROR
    assert {res["service.name"] for res, _sc, s in received if s.trace_id != cut_trace} == {"nightly-b"}
