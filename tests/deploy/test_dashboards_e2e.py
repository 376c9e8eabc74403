"""End to end: the shipped dashboard and alert rules against the real
``flowscope demo`` and a real Prometheus.

One test, in real processes, with real waiting:

- a real Prometheus (tests/prom_harness.py, Debian's ``prometheus``) scraping every second
  ``flowscope demo --metrics-port`` (its in-process MetricsPlugin registry and the store
  collector) and ``flowscope serve-metrics`` over the same SQLite file (what production
  scrapes: collectors/prometheus.yml), with the alert rules loaded;
- the demo sends its spans to a small OTLP/HTTP receiver in this process, so that the
  exemplars of the duration panel can be followed to traces that were really exported;
- through Prometheus' HTTP API: every panel query of the dashboard (variables rendered to
  "All") returns at least one series; every alert expression evaluates, and every metric it
  reads exists in the scrape (``/api/v1/label/__name__/values``); the server evaluates every
  rule without error; the dashboard's template variables resolve;
- the orphaned-run alert expression is true for the run the demo's SIGKILLed worker leaves,
  and only once its last heartbeat (read from the store) is older than ``--stale-after``:
  Prometheus holds samples of the run open but not yet orphaned before that, and the
  expression evaluated at that time is false; the alert is then pending in the server;
- SIGTERM stops the demo and serve-metrics with exit code 0 within seconds, the port is
  closed and no process of the test is left;
- the processes run as on the README's install (psycopg unimportable), and every panel has
  data, the queue and worker ones included; the dead worker is one orphan, at its node.

A missing prometheus binary fails, never skips. About 20 s (30 s on a busy 2-core machine).
"""

from __future__ import annotations

import gzip
import math
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_dashboards import ALERTS, DASHBOARD, alert_rules, promql_metric_names

from commands import FLOWSCOPE, cli_env, start_cli
from prom_harness import PrometheusServer, dashboard_queries, find_prometheus, free_port

# Every test here starts processes or servers, or runs the demo end to end.
pytestmark = pytest.mark.slow


#: --stale-after of the demo and serve-metrics: small, but long enough for Prometheus (one
#: scrape a second) to see the dead worker's run open and not yet orphaned before it.
STALE_AFTER = 4.0
#: A scrape is stamped when it starts; the collector reads the clock a little later.
SCRAPE_SLACK = 0.5
#: Demo repetitions: the workflows run for a few seconds while Prometheus scrapes, so the
#: rate() and histogram_quantile() panels have increases to show, not just series.
REPEAT = 10

DEMO_JOB = "flowscope-demo"
STORE_JOB = "flowscope-serve-metrics"

# What the demo does not produce, listed rather than skipped. DEMO_GAPS is asserted
# exactly: when the demo starts producing one of these, this test fails until the entry is
# removed here. Empty: the demo runs a queue served by an in-process Worker and leaves one
# session queued, so the "Workers and the queue" row has data too.
DEMO_GAPS: dict = {"panels": set(), "alert_metrics": {}}
# DEMO_MAYBE: present or not depending on timing, so allowed either way (a subset check).
DEMO_MAYBE: dict = {"panels": set(), "alert_metrics": {}}

#: The README's install (`pip install -e '.[test]'`) has no psycopg: the processes of this
#: test run with it unimportable, so nothing the demo does on a SQLite file may need it.
NO_POSTGRES_SITE = "import sys\nfor _name in ('psycopg', 'psycopg_pool'):\n    sys.modules[_name] = None\n"

#: Panels whose value is a rate, ratio or quantile of the demo's traffic: they must show a
#: number, not only a series of NaN.
FINITE_PANELS = {
    ("Node duration p50 / p95 by node", "A"),
    ("Node duration p50 / p95 by node", "B"),
    ("Workflow duration p95", "A"),
    ("Attempts per finished run", "A"),
    ("Attempts per finished run", "B"),
    ("Node failure ratio", "A"),
}


# ---------------------------------------------------------------------- an OTLP/HTTP receiver
class _OtlpHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.server.lock:  # type: ignore[attr-defined]
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.server.trace_ids.add(span.trace_id.hex())  # type: ignore[attr-defined]
                        self.server.spans += 1  # type: ignore[attr-defined]
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


class OtlpSink(ThreadingHTTPServer):
    """``POST /v1/traces`` on 127.0.0.1: keeps the trace ids of the spans it receives."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.lock = threading.Lock()
        self.trace_ids: set[str] = set()
        self.spans = 0
        self.thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-sink", daemon=True
        )
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


# ---------------------------------------------------------------------- helpers
def child_env(cwd: Path | None = None) -> dict[str, str]:
    """The environment of the test's processes: no OTEL_* or FLOWSCOPE_DB of the caller's;
    with ``cwd``, psycopg unimportable (a sitecustomize there), as on the README's install."""
    paths: list[Path] = []
    if cwd is not None:
        site = cwd / "readme-install"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(NO_POSTGRES_SITE)
        paths.append(site)
    # PYTHONUNBUFFERED: progress lines reach the log file as they are printed
    return cli_env(paths=paths, PYTHONUNBUFFERED="1", NO_COLOR="1")


def start(args: list[str], log: Path, cwd: Path) -> subprocess.Popen[str]:
    with open(log, "wb") as out:
        return start_cli(
            *args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=child_env(cwd),
            start_new_session=True,
        )


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def scraped_samples(text: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> label sets, from a scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample.labels)
    return found


def processes_using(marker: str) -> dict[int, str]:
    """Processes whose command line contains ``marker`` (the test's unique database path)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                (line for line in (entry / "status").read_text().splitlines() if line.startswith("State:")),
                "",
            )
        except OSError:
            continue
        if marker in cmdline and "zombie" not in state:
            found[int(entry.name)] = cmdline.strip()
    return found


def tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def stop(proc: subprocess.Popen[str], log: Path, what: str) -> None:
    """SIGTERM: the process must say so and exit 0 within a few seconds."""
    assert proc.poll() is None, f"{what} exited early ({proc.returncode}):\n{tail(log)}"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=8)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} still running 8s after SIGTERM:\n{tail(log)}") from None
    assert rc == 0, f"{what} exited {rc} on SIGTERM:\n{tail(log)}"
    assert time.monotonic() - t0 < 5, f"{what} took {time.monotonic() - t0:.1f}s to stop"
    assert "stopped" in tail(log, 3), tail(log)


def port_closed(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def key(q: Any) -> tuple[str, str]:
    return (q.panel, q.ref_id)


# ---------------------------------------------------------------------- the test
def test_demo_scraped_by_a_real_prometheus_fills_the_dashboard_and_fires_the_orphan_alert(tmp_path):
    find_prometheus()  # fails (never skips) with the install hint
    assert Path(FLOWSCOPE).exists(), f"{FLOWSCOPE}: pip install -e '.[test]' installs the console script"
    db = tmp_path / "demo.db"
    demo_log, store_log = tmp_path / "demo.log", tmp_path / "serve-metrics.log"
    demo_port, store_port = free_port(), free_port()
    rules = alert_rules(yaml.safe_load(ALERTS.read_text()))
    by_alert = {r["alert"]: r["expr"] for r in rules}
    queries = dashboard_queries(DASHBOARD)
    assert len(queries) >= 15 and rules

    sink = OtlpSink()
    prom = PrometheusServer(
        {DEMO_JOB: [f"127.0.0.1:{demo_port}"], STORE_JOB: [f"127.0.0.1:{store_port}"]}, rule_files=[ALERTS]
    )
    demo = serve = None
    t0 = time.monotonic()
    try:
        # Prometheus first: it sees the demo from its first second, the dead worker included.
        # Its first scrape comes seconds after it is ready (target discovery is throttled):
        # wait for it, or the demo's traffic is over before anyone looks.
        prom.start()
        prom.wait_for(f'up{{job="{DEMO_JOB}"}}', timeout=30)
        demo = start(
            [
                "demo",
                "--db",
                str(db),
                "--metrics-port",
                str(demo_port),
                "--stale-after",
                f"{STALE_AFTER:g}s",
                "--repeat",
                str(REPEAT),
                "--otlp-endpoint",
                sink.endpoint,
            ],
            demo_log,
            tmp_path,
        )

        # serve-metrics reads the store the demo writes (it refuses a missing database)
        deadline = time.monotonic() + 30
        while not (db.exists() and scrape(demo_port)):
            assert demo.poll() is None, f"demo exited {demo.returncode}:\n{tail(demo_log)}"
            assert time.monotonic() < deadline, f"demo endpoint not up after 30s:\n{tail(demo_log)}"
            time.sleep(0.1)
        serve = start(
            [
                "serve-metrics",
                "--db",
                str(db),
                "--port",
                str(store_port),
                "--stale-after",
                f"{STALE_AFTER:g}s",
            ],
            store_log,
            tmp_path,
        )

        # the demo is done: it says so, and its endpoint has the workflow runs and the orphan
        deadline = time.monotonic() + 40
        while True:
            assert demo.poll() is None, f"demo exited {demo.returncode}:\n{tail(demo_log)}"
            text = scrape(demo_port) or ""
            found = scraped_samples(text) if text else {}
            outcomes = {labels.get("outcome") for labels in found.get("flowscope_workflow_runs_total", [])}
            orphan_series = {
                (labels["workflow"], labels["node"])
                for labels in found.get("flowscope_store_orphaned_runs", [])
            }
            if (
                "serving metrics at" in demo_log.read_text()
                and {"completed", "failed"} <= outcomes
                and ("nightly_export", "export_rows") in orphan_series
            ):
                break
            assert time.monotonic() < deadline, (
                f"demo not done after 40s: outcomes {outcomes}, orphan series {orphan_series}\n"
                f"{tail(demo_log)}"
            )
            time.sleep(0.2)
        assert "killed with SIGKILL" in demo_log.read_text(), tail(demo_log)  # without psycopg
        assert "ModuleNotFoundError" not in demo_log.read_text(), tail(demo_log)
        assert serve.poll() is None, f"serve-metrics exited {serve.returncode}:\n{tail(store_log)}"

        # ------------------------------------------------------------ the orphaned run
        orphan_expr = by_alert["FlowscopeRunOrphaned"]

        def dead_worker(result: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
            return [
                s
                for s in result
                if s["metric"].get("job") == job
                and s["metric"].get("workflow") == "nightly_export"
                and s["metric"].get("node") == "export_rows"
            ]

        result = prom.wait_for(
            orphan_expr,
            timeout=STALE_AFTER + 20,
            predicate=lambda r: all(dead_worker(r, j) for j in (DEMO_JOB, STORE_JOB)),
        )
        for job in (DEMO_JOB, STORE_JOB):
            assert [s["value"][1] for s in dead_worker(result, job)] == ["1"], result
        # one dead worker, one orphan per endpoint: export_rows, at the deepest path (its
        # workflow run is the container of it, not a second orphan)
        assert sorted((s["metric"]["job"], s["metric"]["node"]) for s in result) == [
            (DEMO_JOB, "export_rows"),
            (STORE_JOB, "export_rows"),
        ], result

        from flowscope.store import SqliteEventStore

        store = SqliteEventStore(db, readonly=True)
        try:
            open_runs = [r for r in store.open_runs() if r.status == "running"]
        finally:
            store.close()
        killed = [r for r in open_runs if (r.workflow, r.node) == ("nightly_export", "export_rows")]
        assert len(killed) == 1, open_runs
        last_beat = killed[0].heartbeat_at or killed[0].started_at
        assert last_beat is not None
        threshold = last_beat + STALE_AFTER

        # Prometheus' samples, from both endpoints: orphaned only from the threshold on; and the
        # demo's shows the run open but not yet orphaned before it (serve-metrics may start late)
        for job in (DEMO_JOB, STORE_JOB):
            selector = (
                f'flowscope_store_orphaned_runs{{workflow="nightly_export", node="export_rows", job="{job}"}}'
            )
            raw = prom.query(f"{selector}[5m]")
            assert len(raw) == 1, raw
            samples = [(float(ts), float(v)) for ts, v in raw[0]["values"]]
            # the owner's process is gone (same host), so the run is orphaned from the
            # first scrape after the kill, not once its heartbeat is --stale-after old
            early = [(ts, v) for ts, v in samples if v > 0 and ts < last_beat - SCRAPE_SLACK]
            assert not early, f"{job}: orphaned before the worker was killed: {early}"
            first = min((ts for ts, v in samples if v == 1), default=None)
            assert first is not None and all(v == 1 for ts, v in samples if ts >= first), (job, samples)
            if job == DEMO_JOB:
                assert first < threshold - SCRAPE_SLACK, (
                    f"orphaned only at {first}, after the heartbeat threshold {threshold}: it waited for staleness"
                )
        assert dead_worker(prom.query(orphan_expr), DEMO_JOB)
        # the server evaluates the rule: the alert is pending (its `for` is minutes)
        prom.wait_for(
            'ALERTS{alertname="FlowscopeRunOrphaned", alertstate="pending", '
            'workflow="nightly_export", node="export_rows"}',
            timeout=10,
        )

        # ------------------------------------------------------------ the dashboard
        scraped = set(prom.api("label/__name__/values"))
        deadline = time.monotonic() + 15
        while True:  # a scrape may lag on a loaded machine: retry a little before failing
            results = {key(q): prom.query(q.rendered()) for q in queries}
            empty = {k for k, r in results.items() if not r}
            not_finite = {
                k for k in FINITE_PANELS if not any(math.isfinite(float(s["value"][1])) for s in results[k])
            }
            if (
                empty - DEMO_MAYBE["panels"] == DEMO_GAPS["panels"]
                and not not_finite
                or time.monotonic() > deadline
            ):
                break
            time.sleep(0.5)
        unexpected = empty - DEMO_GAPS["panels"] - DEMO_MAYBE["panels"]
        assert not unexpected, "panel queries without data:\n" + "\n".join(
            f"{q.panel} [{q.ref_id}]: {q.rendered()}" for q in queries if key(q) in unexpected
        )
        assert DEMO_GAPS["panels"] <= empty, (
            f"the demo now fills {sorted(DEMO_GAPS['panels'] - empty)}: remove them from DEMO_GAPS"
        )
        assert not not_finite, {k: results[k] for k in not_finite}
        panel_names = set().union(*(promql_metric_names(q.rendered()) for q in queries))
        gap_names = set().union(*DEMO_GAPS["alert_metrics"].values())
        maybe_names = set().union(*DEMO_MAYBE["alert_metrics"].values())
        assert gap_names <= panel_names - scraped <= gap_names | maybe_names, sorted(panel_names - scraped)
        # panels read both in-process series and store series, from the two endpoints
        jobs = {s["metric"]["job"] for s in prom.query('count by (job) ({__name__=~"flowscope_store_.+"})')}
        assert jobs == {DEMO_JOB, STORE_JOB}, jobs
        assert prom.query(f'flowscope_node_runs_total{{job="{DEMO_JOB}"}}')
        assert not prom.query(f'flowscope_node_runs_total{{job="{STORE_JOB}"}}')

        # template variables: workflow and node resolve to the demo's workflows and nodes
        match = '{__name__=~"flowscope_node_runs_total|flowscope_store_open_runs"}'
        workflows = set(prom.api("label/workflow/values", {"match[]": match}))
        assert {"order_fulfilment", "nightly_export"} <= workflows, workflows
        nodes = set(prom.api("label/node/values", {"match[]": match}))
        assert {"fetch_orders", "charge_card", "enrich_addresses", "export_rows"} <= nodes, nodes
        for wf in ("order_fulfilment", "nightly_export"):  # one workflow picked, node "All"
            picked = [q for q in queries if "$workflow" in q.expr and key(q) not in empty]
            assert any(prom.query(q.rendered({"workflow": wf})) for q in picked), wf

        # exemplars of the p95 duration panel link to traces the demo really exported
        exemplar_queries = [q for q in queries if q.exemplar]
        assert exemplar_queries
        now = time.time()
        for q in exemplar_queries:
            found = prom.query_exemplars(q.rendered(), now - 600, now + 60)
            trace_ids = {e["labels"].get("trace_id") for s in found for e in s["exemplars"]}
            assert trace_ids, f"{q.panel} [{q.ref_id}]: no exemplar"
            with sink.lock:
                exported = set(sink.trace_ids)
            assert trace_ids <= exported, (
                f"exemplar trace ids not exported: {sorted(trace_ids - exported)[:5]} "
                f"({sink.spans} spans received)"
            )

        # ------------------------------------------------------------ the alert rules
        scraped = set(prom.api("label/__name__/values"))
        for rule in rules:
            prom.query(rule["expr"])  # parses and evaluates (raises PrometheusQueryError)
            used = promql_metric_names(rule["expr"])
            assert used, rule["alert"]
            missing = used - scraped
            gaps = DEMO_GAPS["alert_metrics"].get(rule["alert"], set())
            maybe = DEMO_MAYBE["alert_metrics"].get(rule["alert"], set())
            assert gaps <= missing <= gaps | maybe, (
                f"{rule['alert']} reads {sorted(missing)}, which the demo does not expose "
                "(or no longer misses: update DEMO_GAPS)"
            )
        loaded = {r["name"]: r for r in prom.rules()}
        assert set(by_alert) <= set(loaded), sorted(loaded)
        assert all(r["health"] == "ok" for r in loaded.values()), [
            (n, r.get("lastError")) for n, r in loaded.items() if r["health"] != "ok"
        ]

        # ------------------------------------------------------------ stop
        stop(demo, demo_log, "flowscope demo")
        stop(serve, store_log, "flowscope serve-metrics")
        assert port_closed(demo_port) and port_closed(store_port)
        assert processes_using(str(db)) == {}, processes_using(str(db))
        assert time.monotonic() - t0 < 60, f"the test took {time.monotonic() - t0:.0f}s"
    finally:
        for proc in (demo, serve):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for pid in processes_using(str(db)):  # a worker the demo could not kill
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        prom.stop()
        sink.stop()
