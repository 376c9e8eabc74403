"""Real OTLP export: the real exporters (opentelemetry-exporter-otlp, HTTP/protobuf
and gRPC), set up by ``configure_tracing``, sending to a real receiver written by someone
else, in this process on 127.0.0.1.

The receiver is ``otelsink`` from the ``oteltest`` package (PyPI, by an OpenTelemetry Python
maintainer): a gRPC server implementing the OTLP ``TraceService`` and an HTTP server for
``POST /v1/traces``, each handing the decoded ``ExportTraceServiceRequest`` to a handler.
It binds all interfaces by default; the fixture below makes it bind 127.0.0.1 only.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import contextmanager

import oteltest.sink as oteltest_sink  # the OTLP receiver: the "oteltest" test dependency
import pytest
from oteltest.sink.handler import RequestHandler  # noqa: E402

from flowscope import START, RetryConfig, Runner, Workflow, node  # noqa: E402
from flowscope.observability import TracingPlugin, configure_tracing  # noqa: E402
from flowscope.store import MemoryEventStore  # noqa: E402

# Every test here starts processes or servers, or runs the demo end to end.
pytestmark = pytest.mark.slow

PROTOCOLS = ["http/protobuf", "grpc"]
SERVICE = "flowscope-otlp-test"

_OTEL_ENV = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_INSECURE",
)


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch):
    for name in _OTEL_ENV:
        monkeypatch.delenv(name, raising=False)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collected(RequestHandler):
    """Keeps every ExportTraceServiceRequest the receiver decoded."""

    def __init__(self) -> None:
        self.requests: list = []
        self.headers: list = []
        self._lock = threading.Lock()

    def handle_trace(self, request, headers):
        with self._lock:
            self.requests.append(request)
            self.headers.append(headers)

    def handle_metrics(self, request, headers):
        pass

    def handle_logs(self, request, headers):
        pass

    def spans(self):
        """(resource attributes, scope name, span) for every received span."""
        out = []
        for req in self.requests:
            for rs in req.resource_spans:
                res = attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append((res, ss.scope.name, span))
        return out


class _LoopbackGrpc:
    """The ``grpc`` module as otelsink sees it, but its server binds 127.0.0.1 instead of 0.0.0.0."""

    def __init__(self, grpc_module):
        self._grpc = grpc_module

    def __getattr__(self, name):
        return getattr(self._grpc, name)

    def server(self, *args, **kwargs):
        svr = self._grpc.server(*args, **kwargs)
        bind = svr.add_insecure_port
        svr.add_insecure_port = lambda address: bind(address.replace("0.0.0.0:", "127.0.0.1:", 1))
        return svr


@contextmanager
def otelsink(protocol, monkeypatch):
    """Run otelsink for ``protocol`` on a free 127.0.0.1 port; yield (endpoint, collected)."""
    from http.server import HTTPServer

    class LoopbackHTTPServer(HTTPServer):
        def __init__(self, address, handler, *args, **kwargs):
            super().__init__(("127.0.0.1", address[1]), handler, *args, **kwargs)

        def log_message(self, *args):  # pragma: no cover - quiet
            pass

    monkeypatch.setattr(oteltest_sink, "HTTPServer", LoopbackHTTPServer)
    monkeypatch.setattr(oteltest_sink, "grpc", _LoopbackGrpc(oteltest_sink.grpc))
    logger = logging.getLogger("otelsink")
    collected = Collected()
    port = free_port()
    if protocol == "grpc":
        sink = oteltest_sink.GrpcSink(collected, logger, port=port)
    else:
        sink = oteltest_sink.HttpSink(collected, logger, port=port)
    sink.start()
    try:
        if protocol != "grpc":  # the HTTP sink binds in its own thread: wait until it listens
            deadline = time.monotonic() + 10
            while sink.httpd is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sink.httpd is not None, "otelsink's HTTP server did not start"
        yield f"http://127.0.0.1:{port}", collected
    finally:
        sink.stop()


def attrs(kvs) -> dict:
    """OTLP KeyValue list -> plain dict."""
    out = {}
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        out[kv.key] = getattr(v, which) if which else None
    return out


def order_workflow():
    calls = []

    @node(retry=RetryConfig(max_attempts=2, initial_delay=0.001))
    def fetch(x):
        calls.append(x)
        if len(calls) == 1:
            raise ConnectionError("refused")
        return x

    @node
    async def approve(ctx, x):
        return await ctx.request_input("ship?", interrupt_id="ship")

    @node
    def explode(x):
        raise ValueError("the ledger does not balance")

    inner = Workflow("billing", edges=[(START, node(lambda x: x, name="charge"), approve)])
    ok = Workflow("orders", edges=[(START, fetch, inner)])
    bad = Workflow("broken", edges=[(START, Workflow("inner", edges=[(START, explode)]))])
    return ok, bad


async def run_scenario(provider):
    """A paused run resumed (a link), a nested workflow, a retry, and a failed run."""
    ok, bad = order_workflow()
    store = MemoryEventStore()
    runner = Runner(ok, store=store, plugins=[TracingPlugin(tracer_provider=provider)])
    assert (await runner.run(1, session_id="s1")).status == "paused"
    assert (await runner.resume("s1", inputs={"ship": "yes"})).output == "yes"
    with pytest.raises(ValueError):
        await Runner(bad, store=store, plugins=[TracingPlugin(tracer_provider=provider)]).run(
            1, session_id="s2"
        )


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_spans_reach_a_real_otlp_receiver(protocol, monkeypatch):
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    with otelsink(protocol, monkeypatch) as (endpoint, collected):
        handle = configure_tracing(SERVICE, otlp_endpoint=endpoint, protocol=protocol, timeout=5)
        assert handle.exporters == [f"otlp {protocol} {endpoint}"]
        with handle:
            await run_scenario(handle.provider)
        received = collected.spans()

    assert received, "the receiver got nothing"
    assert {res.get("service.name") for res, _scope, _s in received} == {SERVICE}
    assert {scope for _res, scope, _s in received} == {"flowscope"}
    spans = [s for _r, _sc, s in received]
    by_id = {s.span_id: s for s in spans}
    # paused (5), resumed (3), failed (3): the top workflow's run and its invocation are one span
    assert len(by_id) == len(spans) == 11

    def span_attrs(s):
        return attrs(s.attributes)

    invocations = [s for s in spans if "flowscope.invocation.id" in span_attrs(s)]
    assert sorted((s.name, span_attrs(s)["flowscope.run.outcome"]) for s in invocations) == [
        ("invoke_workflow broken", "failed"),
        ("invoke_workflow orders", "completed"),
        ("invoke_workflow orders", "paused"),
    ]
    for inv in invocations:
        assert inv.parent_span_id == b""
        assert inv.kind == Span.SPAN_KIND_INTERNAL
    paused = next(s for s in invocations if span_attrs(s)["flowscope.run.outcome"] == "paused")
    resumed = next(s for s in invocations if span_attrs(s)["flowscope.run.outcome"] == "completed")
    assert span_attrs(resumed)["flowscope.run.resumed"] is True
    assert [(link.trace_id, link.span_id) for link in resumed.links] == [(paused.trace_id, paused.span_id)]

    # every node span's parent is the span of its enclosing run (or the invocation for the root)
    nodes = [s for s in spans if "flowscope.node.path" in span_attrs(s)]
    assert len(nodes) == 11
    for s in nodes:
        path = span_attrs(s)["flowscope.node.path"]
        if "/" not in path:  # the top workflow's run: the invocation's own span
            assert s in invocations and s.parent_span_id == b""
            continue
        parent = by_id[s.parent_span_id]
        assert parent.trace_id == s.trace_id
        if "/" in path:
            assert span_attrs(parent)["flowscope.node.path"] == path.rsplit("/", 1)[0]
        else:
            assert span_attrs(parent)["gen_ai.operation.name"] == "invoke_workflow"
        expected = (
            "invoke_workflow " if span_attrs(s)["flowscope.node.kind"] == "workflow" else "invoke_node "
        )
        assert s.name == expected + span_attrs(s)["flowscope.node.name"]

    def only(name, trace_of):
        (found,) = [s for s in spans if s.name == name and s.trace_id == trace_of.trace_id]
        return found

    fetch = only("invoke_node fetch", paused)
    assert span_attrs(fetch)["flowscope.node.attempt_count"] == 2
    assert span_attrs(fetch)["flowscope.node.completed"] is True
    (retry,) = fetch.events
    assert retry.name == "node.retry"
    assert attrs(retry.attributes)["flowscope.node.attempt"] == 1
    assert attrs(retry.attributes)["error.type"] == "ConnectionError"
    assert isinstance(attrs(retry.attributes)["flowscope.retry.delay_s"], float)
    assert fetch.status.code == Status.STATUS_CODE_UNSET

    approve_waiting = only("invoke_node approve", paused)
    assert span_attrs(approve_waiting)["flowscope.node.outcome"] == "waiting"
    assert span_attrs(approve_waiting)["flowscope.interrupt.id"] == "ship"
    approve_done = only("invoke_node approve", resumed)
    assert span_attrs(approve_done)["flowscope.node.outcome"] == "success"

    failed_inv = next(s for s in invocations if s.name == "invoke_workflow broken")
    explode = only("invoke_node explode", failed_inv)
    assert explode.status.code == Status.STATUS_CODE_ERROR
    assert explode.status.message == "the ledger does not balance"
    assert span_attrs(explode)["error.type"] == "ValueError"
    assert span_attrs(explode)["flowscope.error.code"] == "UNKNOWN_ERROR"
    (exc,) = explode.events
    assert exc.name == "exception" and "exception.stacktrace" not in attrs(exc.attributes)
    for name in ("invoke_workflow inner", "invoke_workflow broken"):
        for s in [s for s in spans if s.name == name and s.trace_id == failed_inv.trace_id]:
            assert s.status.code == Status.STATUS_CODE_ERROR
            assert span_attrs(s)["flowscope.error.origin_path"] == "broken@1/inner@1/explode@1"
            assert len(s.events) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_endpoint_and_protocol_from_the_standard_environment(protocol, monkeypatch):
    with otelsink(protocol, monkeypatch) as (endpoint, collected):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "renamed-by-operator")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        with configure_tracing(SERVICE) as handle:
            wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"))])
            await Runner(wf, plugins=[handle.plugin()]).run(1)
        received = collected.spans()
    assert len(received) == 2  # the invocation (one span with its top workflow's run) and node a
    res = received[0][0]
    assert res["service.name"] == "renamed-by-operator"
    assert res["deployment.environment"] == "test"


def closed_port() -> int:
    port = free_port()  # bound then released: nothing listens there now
    return port


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_unreachable_collector_does_not_fail_or_stall_the_run(protocol, caplog):
    timeout = 1.0
    endpoint = f"http://127.0.0.1:{closed_port()}"
    caplog.set_level(logging.WARNING)
    handle = configure_tracing(SERVICE, otlp_endpoint=endpoint, protocol=protocol, timeout=timeout)
    wf = Workflow("w", edges=[(START, node(lambda x: x + 1, name="a"), node(lambda x: x * 2, name="b"))])
    t0 = time.monotonic()
    result = await Runner(wf, plugins=[handle.plugin()]).run(1)
    run_s = time.monotonic() - t0
    assert result.status == "completed" and result.output == 4
    assert run_s < timeout  # the export happens off the run's path (batch processor thread)

    t0 = time.monotonic()
    handle.shutdown()
    shutdown_s = time.monotonic() - t0
    # bounded by the exporter's own timeout (plus its last backoff step and thread joins), generously
    assert shutdown_s < 3 * timeout + 5, shutdown_s
    failures = [
        r
        for r in caplog.records
        if r.name.startswith("opentelemetry.exporter") and r.levelno >= logging.WARNING
    ]
    assert failures, caplog.text
    assert any("export" in r.getMessage().lower() for r in failures), caplog.text
    handle.shutdown()  # idempotent


def test_configure_tracing_defaults_and_validation(monkeypatch):
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    handle = configure_tracing(SERVICE)  # no endpoint, nothing in the environment: no exporter
    assert handle.exporters == []
    assert handle.provider.resource.attributes["service.name"] == SERVICE
    assert trace.get_tracer_provider() is before  # the global provider is left alone
    handle.shutdown()
    handle.shutdown()
    assert handle.force_flush() is False

    with configure_tracing(SERVICE, console=True) as handle:
        assert handle.exporters == ["console"]
        assert handle.force_flush() is True

    # what an endpoint from the environment says of itself is printable: its password masked
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://bob:s3cretpw@127.0.0.1:1")
    handle = configure_tracing(SERVICE, timeout=1)
    assert handle.exporters == ["otlp http/protobuf http://bob:***@127.0.0.1:1"]
    assert "s3cret" not in repr(handle)
    handle.provider.shutdown()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    with configure_tracing(SERVICE) as handle:
        assert handle.exporters == ["console"]

    with pytest.raises(ValueError, match="protocol"):
        configure_tracing(SERVICE, otlp_endpoint="http://127.0.0.1:1", protocol="thrift")
