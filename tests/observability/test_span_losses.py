"""Spans a process ended and did not export are counted, by reason, in
``flowscope_spans_not_exported_total``: those a full backlog dropped (queue_full) and those
an exporter refused or raised on (export_failed). Each is counted once per registry or
meter, and a refused span is never kept pending, so a follower ships it from the log."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from test_otlp_export import clean_otel_env, free_port, otelsink  # noqa: F401  (clean_otel_env: autouse, without the machine's OTEL_*)
from test_span_backlog import _Slow, chain, flowscope, small_queue

from commands import cli_env, run_cli
from flowscope import Runner
from flowscope.observability import MetricsPlugin, TracingPlugin
from flowscope.observability import backlog as backlog_mod
from flowscope.observability.export import ExportError, ship_store
from flowscope.observability.shipping import Ledger, WatermarkExporter
from flowscope.observability.span_losses import SPAN_LOSSES, SpanLosses
from flowscope.store.sqlite import SqliteEventStore

NAME = "flowscope_spans_not_exported_total"


def scraped(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(NAME, {"reason": reason})
    assert value is not None, f"no {NAME}{{reason={reason!r}}} in the registry"
    return value


def observed(reader: InMemoryMetricReader, reason: str) -> float:
    data = reader.get_metrics_data()
    points = [
        dp
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "flowscope.spans.not_exported"
        for dp in m.data.data_points
        if dp.attributes.get("reason") == reason
    ]
    assert len(points) == 1, points
    return float(points[0].value)


class _Refusing(SpanExporter):
    """A backend that is down: every export fails (``FAILURE``) or raises."""

    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        if self.raises:
            raise ConnectionError("the collector is not listening")
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


async def test_spans_a_full_backlog_drops_are_counted_as_queue_full(tmp_path, monkeypatch):
    monkeypatch.setattr(backlog_mod, "BACKLOG_QUEUES", 2)  # queue 8 (limit 4) and a backlog of 16
    registry = CollectorRegistry()
    MetricsPlugin(registry)
    before = scraped(registry, "queue_full"), scraped(registry, "export_failed")
    gate = threading.Event()  # the exporter takes nothing until the runs are over
    provider = small_queue(WatermarkExporter(_Slow(gate=gate), Ledger()), size=8, batch=4)
    plugin = TracingPlugin(tracer_provider=provider)
    store = SqliteEventStore(tmp_path / "f.db")
    await asyncio.gather(
        *(Runner(chain(3), store=store, plugins=[plugin]).run(0, session_id=f"s{i}") for i in range(10))
    )
    backlog = backlog_mod.backlog_for(provider._active_span_processor)
    assert backlog is not None and backlog.dropped > 0
    gate.set()
    assert plugin.force_flush()
    assert scraped(registry, "queue_full") - before[0] == backlog.dropped
    assert scraped(registry, "export_failed") == before[1]  # what was handed over went out
    provider.shutdown()
    store.close()


@pytest.mark.parametrize("raises", [False, True], ids=["failure", "raises"])
async def test_spans_an_exporter_refuses_are_counted_as_export_failed_and_not_kept(tmp_path, raises):
    # An exporter that raises used to leave its spans pending in the ledger for the life of
    # the process, where a follower in that process never shipped them.
    registry, reader = CollectorRegistry(), InMemoryMetricReader()
    MetricsPlugin(registry, meter_provider=MeterProvider(metric_readers=[reader]))
    before = scraped(registry, "export_failed")
    before_otel = observed(reader, "export_failed")
    ledger = Ledger()
    refusing = _Refusing(raises=raises)
    provider = small_queue(WatermarkExporter(refusing, ledger), size=2048, batch=512)
    plugin = TracingPlugin(tracer_provider=provider)
    store = SqliteEventStore(tmp_path / "f.db")
    await Runner(chain(3), store=store, plugins=[plugin]).run(0, session_id="s")
    plugin.force_flush()
    assert refusing.calls >= 1
    assert scraped(registry, "export_failed") - before == 4  # the invocation's span and 3 nodes'
    assert observed(reader, "export_failed") - before_otel == 4
    assert ledger.pending == 0
    assert store.exported_seq("s") == 0  # the watermark stays before them
    follower = _Slow()
    assert ship_store(store, follower, handover_s=0.0) == 4  # shipped from the log instead
    assert store.exported_seq("s") == store.last_seq("s")
    provider.shutdown()
    store.close()


def test_each_registry_and_meter_reports_the_count_once_however_many_plugins_share_it():
    registry, reader = CollectorRegistry(), InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    for _ in range(3):
        MetricsPlugin(registry, meter_provider=meters)
    before = scraped(registry, "queue_full"), observed(reader, "queue_full")
    SPAN_LOSSES.add("queue_full", 5)
    assert scraped(registry, "queue_full") - before[0] == 5
    assert observed(reader, "queue_full") - before[1] == 5
    other = CollectorRegistry()  # a registry made later counts from the process's start too
    MetricsPlugin(other)
    assert scraped(other, "queue_full") == scraped(registry, "queue_full")


def test_a_registry_with_another_metric_of_that_name_is_refused_with_a_clear_error():
    registry = CollectorRegistry()
    Counter("flowscope_spans_not_exported", "someone else's", ["reason"], registry=registry)
    with pytest.raises(ValueError, match="give MetricsPlugin its own CollectorRegistry"):
        MetricsPlugin(registry)


def test_an_unknown_reason_is_refused():
    with pytest.raises(ValueError, match="unknown reason 'lost'"):
        SpanLosses().add("lost", 1)


class _RefusingReceiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that answers and refuses every export (a backend in trouble)."""

    def do_POST(self) -> None:  # noqa: N802 - the handler's protocol
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(500)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def refusing_endpoint():
    """The URL of a :class:`_RefusingReceiver` on a free 127.0.0.1 port, while it serves."""
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingReceiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{receiver.server_address[1]}"
    finally:
        receiver.shutdown()


def scrape_counts(proc: subprocess.Popen[str], port: int, enough) -> dict[str, float]:
    """``flowscope_spans_not_exported_total`` by reason, scraped from ``port`` until
    ``enough(counts)`` or 60 s (or the process ends)."""
    counts: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            body = ""  # not listening yet
        counts = {
            s.labels["reason"]: s.value
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name == NAME
        }
        if enough(counts):
            break
        time.sleep(0.2)
    return counts


@pytest.mark.slow
def test_a_worker_whose_trace_backend_refuses_its_spans_says_so_and_the_log_ships_them_later(
    tmp_path, monkeypatch
):
    flows = "from flowscope import START, Workflow, node\n" + (
        "traced = Workflow('traced', edges=[(START, node(lambda x: x + 1, name='one'), node(lambda x: x * 2, name='two'))])\n"
    )
    (tmp_path / "flows.py").write_text(flows)
    namespace: dict = {}
    exec(flows, namespace)
    db = tmp_path / "w.db"
    store = SqliteEventStore(str(db))
    for i in range(20):
        Runner(namespace["traced"], store=store).submit(i, session_id=f"t{i}")
    metrics_port = free_port()
    env = cli_env(OTEL_BSP_SCHEDULE_DELAY="50")
    with refusing_endpoint() as url:
        worker = flowscope(
            db, "worker", "flows:traced", "--poll", "50ms", "--metrics-port", str(metrics_port),
            "--otlp-endpoint", url, env=env, cwd=tmp_path,
        )  # fmt: skip
        try:
            counts = scrape_counts(worker, metrics_port, lambda c: c.get("export_failed", 0.0) >= 20 * 3)
            refused = counts.get("export_failed", 0.0)
            assert refused == 20 * 3, f"{refused} spans counted as refused of 60"  # 20 invocations, 40 nodes
            assert counts["queue_full"] == 0
        finally:
            worker.send_signal(signal.SIGTERM)
            _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    # said once in the worker's log, naming the counter and the way to ship them later
    assert err.count("spans could not be sent to") == 1 and NAME in err, err
    # the log still has every span: once the backend is back, the runbook's command ships
    # them all, each once, with the watermarks on record
    assert all(store.exported_seq(f"t{i}") == 0 < store.last_seq(f"t{i}") for i in range(20))
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        shipped = run_cli(
            *("--db", str(db), "export", "--follow", "--otlp-endpoint", endpoint),
            *("--interval", "0.05", "--rounds", "2"),
            env=env,
            timeout=120,
        )
        assert shipped.returncode == 0, shipped.stderr
        received = [s for _r, _sc, s in collected.spans()]
    assert len(received) == len({(s.trace_id, s.span_id) for s in received}) == 20 * 3
    assert all(store.exported_seq(f"t{i}") == store.last_seq(f"t{i}") for i in range(20))
    store.close()


@pytest.mark.parametrize("raises", [False, True], ids=["failure", "raises"])
async def test_a_followers_refused_requests_are_counted_as_export_failed_at_every_pass(tmp_path, raises):
    store = SqliteEventStore(tmp_path / "f.db")
    for i in range(3):
        await Runner(chain(3), store=store).run(0, session_id=f"s{i}")
    before = SPAN_LOSSES.counts()["export_failed"]
    for n in (1, 2):  # the same spans again at the next pass, counted again: still not out
        with pytest.raises(ExportError if not raises else ConnectionError):
            ship_store(store, _Refusing(raises=raises), handover_s=0.0)
        assert SPAN_LOSSES.counts()["export_failed"] - before == n * 3 * 4
    assert all(store.exported_seq(f"s{i}") == 0 for i in range(3))
    store.close()


@pytest.mark.slow
def test_serve_metrics_counts_the_spans_its_endpoint_refuses(tmp_path):
    db = tmp_path / "f.db"
    store = SqliteEventStore(str(db))
    for i in range(5):
        asyncio.run(Runner(chain(3), store=store).run(0, session_id=f"s{i}"))
    store.close()
    port = free_port()
    env = cli_env()
    with refusing_endpoint() as url:
        server = flowscope(
            db,
            "serve-metrics",
            "--port",
            str(port),
            "--ship-interval",
            "0.2",
            "--otlp-endpoint",
            url,
            env=env,
        )
        try:
            refused = scrape_counts(server, port, lambda c: c.get("export_failed", 0.0) >= 2 * 5 * 4).get(
                "export_failed", 0.0
            )
            # each pass offers the 20 spans again: two passes or more refused, counted each time
            assert refused >= 2 * 5 * 4 and refused % (5 * 4) == 0, refused
        finally:
            server.send_signal(signal.SIGTERM)
            _out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert "refused 20 spans" in err, err  # said once in its log


@pytest.mark.slow
def test_export_follow_to_an_endpoint_that_refuses_says_it_in_one_line(tmp_path):
    db = tmp_path / "f.db"
    with SqliteEventStore(db) as store:
        for i in range(2):
            asyncio.run(Runner(chain(2), store=store).run(0, session_id=f"s{i}"))
    with refusing_endpoint() as url:
        r = run_cli(
            *("--db", str(db), "export", "--follow", "--otlp-endpoint", url),
            *("--interval", "0.05", "--rounds", "1", "--timeout", "1"),
            timeout=120,
        )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr  # not the SDK's retry lines before it
    assert "refused" in lines[0] and "sent again next time" in lines[0]
