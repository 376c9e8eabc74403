"""StoreCollector across processes on a SqliteEventStore file, and a real HTTP scrape of
serve_metrics (docs/design.md). Real processes, real SIGKILL, real waiting:
no timestamp is faked."""

from __future__ import annotations

import gzip
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from flowscope import START, Runner, Workflow, node
from flowscope.errors import StoreError
from flowscope.observability.metrics import MetricsPlugin
from flowscope.observability.serve import serve_metrics
from flowscope.observability.store_collector import OpenRunGroup, StoreCollector, summarize_open_runs
from flowscope.store import MemoryEventStore, SqliteEventStore
from waiting import wait_for

OPEN = "flowscope_store_open_runs"
OLDEST = "flowscope_store_oldest_open_run_start_timestamp_seconds"
ORPHANED = "flowscope_store_orphaned_runs"
OVERDUE = "flowscope_store_overdue_jobs"
UP = "flowscope_store_up"
QUEUED = "flowscope_store_queued_sessions"
OLDEST_QUEUED = "flowscope_store_oldest_queued_timestamp_seconds"


def scrape(collector: StoreCollector) -> dict[tuple[str, tuple], float]:
    """One scrape, as {(name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def sample(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "flowscope.db")


# ------------------------------------------------------------------ a worker killed with SIGKILL

WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from flowscope import START, Runner, Workflow, node
    from flowscope.store import SqliteEventStore

    @node
    def fetch(x):
        return x

    @node
    async def crunch(x):
        print("crunching", flush=True)
        await asyncio.sleep(600)

    wf = Workflow("nightly", edges=[(START, fetch, crunch)])
    runner = Runner(wf, store=SqliteEventStore(sys.argv[1]), heartbeat_interval=0.05)
    asyncio.run(runner.run(1, session_id="worker-session"))
    """
)


@pytest.mark.slow
def test_a_killed_worker_leaves_a_running_run_that_becomes_orphaned(db, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    SqliteEventStore(db).close()  # the schema exists before two processes open the file
    proc = subprocess.Popen(
        [sys.executable, str(script), db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "crunching", proc.stderr.read()
        store = SqliteEventStore(db)
        collector = StoreCollector(store, stale_after_s=0.5)

        # alive: running, heartbeats fresh, not orphaned
        alive = scrape(collector)
        assert sample(alive, UP) == 1
        assert sample(alive, OPEN, workflow="nightly", node="crunch", state="running") == 1
        # its workflow run is a container of the running node: not a second open run
        assert sample(alive, OPEN, workflow="nightly", node="nightly", state="running") is None
        assert sample(alive, ORPHANED, workflow="nightly", node="crunch") == 0
        started = {r.node: r.started_at for r in store.open_runs()}
        assert sample(alive, OLDEST, workflow="nightly", node="crunch", state="running") == started["crunch"]
        assert sample(alive, OPEN, workflow="nightly", node="fetch", state="running") is None  # it completed
        time.sleep(0.7)  # longer than stale_after_s: a live worker's heartbeat keeps it fresh
        assert sample(scrape(collector), ORPHANED, workflow="nightly", node="crunch") == 0

        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        killed_at = time.time()

        # still "running" in the store: nobody wrote a terminal event
        dead = scrape(collector)
        assert sample(dead, OPEN, workflow="nightly", node="crunch", state="running") == 1
        orphaned = wait_for(
            lambda: (
                (s := scrape(collector)) and sample(s, ORPHANED, workflow="nightly", node="crunch") == 1 and s
            ),
            timeout=10,
            what="the run to become orphaned",
        )
        assert time.time() - killed_at < 5
        # its owner is a dead process on this host, so it is orphaned at once,
        # without waiting for its heartbeat to go stale
        assert sample(dead, ORPHANED, workflow="nightly", node="crunch") == 1
        # counted once, at the deepest path: its workflow run is no second orphan
        assert sample(orphaned, ORPHANED, workflow="nightly", node="nightly") is None
        assert sum(v for (name, _), v in orphaned.items() if name == ORPHANED) == 1
        assert sample(orphaned, OPEN, workflow="nightly", node="crunch", state="running") == 1
        store.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


# ------------------------------------------------------------------ pauses and jobs, seen from another process


def run_in_subprocess(tmp_path, db, body: str) -> str:
    script = tmp_path / "run.py"
    script.write_text(
        "import asyncio, sys\n"
        "from flowscope import START, Runner, Workflow, node\n"
        "from flowscope.store import SqliteEventStore\n" + textwrap.dedent(body)
    )
    out = subprocess.run([sys.executable, str(script), db], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.slow
def test_a_paused_run_is_waiting_input_and_reports_zero_once_answered(db, tmp_path):
    run_in_subprocess(
        tmp_path,
        db,
        """
        @node
        async def approve(ctx, x):
            return await ctx.request_input("ship it?")

        wf = Workflow("release", edges=[(START, approve)])
        r = asyncio.run(Runner(wf, store=SqliteEventStore(sys.argv[1])).run(1, session_id="p1"))
        assert r.status == "paused"
        """,
    )
    store = SqliteEventStore(db)
    collector = StoreCollector(store, stale_after_s=0.5)
    paused = scrape(collector)
    assert sample(paused, OPEN, workflow="release", node="approve", state="waiting_input") == 1
    # one paused session is one open run: its workflow run waits only because approve does
    assert sample(paused, OPEN, workflow="release", node="release", state="waiting_input") is None
    assert sum(v for (name, _), v in paused.items() if name == OPEN) == 1
    started = {r.node: r.started_at for r in store.open_runs()}
    assert (
        sample(paused, OLDEST, workflow="release", node="approve", state="waiting_input")
        == started["approve"]
    )
    time.sleep(0.6)  # waiting for a human is not orphaned, however long it takes
    later = scrape(collector)
    assert sample(later, ORPHANED, workflow="release", node="approve") is None
    assert sample(later, OPEN, workflow="release", node="approve", state="waiting_input") == 1

    @node
    async def approve(ctx, x):
        return await ctx.request_input("ship it?")

    import asyncio

    wf = Workflow("release", edges=[(START, approve)])
    done = asyncio.run(Runner(wf, store=store).resume("p1", inputs={paused_iid(store): True}))
    assert done.status == "completed"
    closed = scrape(collector)
    # seen before: reported as 0, not dropped
    assert sample(closed, OPEN, workflow="release", node="approve", state="waiting_input") == 0
    assert sample(closed, OLDEST, workflow="release", node="approve", state="waiting_input") == 0

    assert sample(closed, UP) == 1
    store.close()


def paused_iid(store) -> str:
    [s] = store.sessions()
    events = store.read(s.session_id)
    return [e for e in events if e.type == "input_requested"][-1].interrupt_id


@pytest.mark.slow
def test_a_job_past_its_deadline_is_overdue(db, tmp_path):
    run_in_subprocess(
        tmp_path,
        db,
        """
        @node
        async def enrich(ctx, rows):
            return await ctx.await_job(dispatch=lambda job: None, payload=rows, deadline_s=0.6)

        wf = Workflow("etl", edges=[(START, enrich)])
        r = asyncio.run(Runner(wf, store=SqliteEventStore(sys.argv[1])).run([1, 2], session_id="j1"))
        assert r.status == "paused"
        print(r.pending[0].job_id)
        """,
    )
    store = SqliteEventStore(db)
    collector = StoreCollector(store, stale_after_s=0.5)
    [run] = [r for r in store.open_runs() if r.node == "enrich"]
    assert run.status == "waiting_job" and run.job_deadline_at == pytest.approx(run.started_at + 0.6, abs=0.5)
    first = scrape(collector)
    assert sample(first, OPEN, workflow="etl", node="enrich", state="waiting_job") == 1
    if time.time() < run.job_deadline_at:  # within its deadline: not overdue yet
        assert sample(first, OVERDUE, workflow="etl", node="enrich") == 0
    wait_for(lambda: time.time() > run.job_deadline_at + 0.01, what="the deadline")
    late = scrape(collector)
    assert sample(late, OVERDUE, workflow="etl", node="enrich") == 1
    assert sample(late, OPEN, workflow="etl", node="enrich", state="waiting_job") == 1
    assert sample(late, OVERDUE, workflow="etl", node="etl") is None  # the enclosing run is a container
    assert sample(late, OPEN, workflow="etl", node="etl", state="waiting_job") is None
    assert sample(late, ORPHANED, workflow="etl", node="enrich") is None  # waiting is not running
    store.close()


# ------------------------------------------------------------------ describe, errors, the fast path


class ExplodingStore:
    """Every method raises: describe() must not call any, collect() must survive."""

    def __getattr__(self, name):
        def boom(*args, **kwargs):
            raise StoreError(f"database is locked ({name})")

        return boom


def test_describe_does_not_touch_the_store():
    collector = StoreCollector(ExplodingStore())
    families = list(collector.describe())
    assert [f.name for f in families] == [
        OPEN,
        OLDEST,
        ORPHANED,
        OVERDUE,
        QUEUED,
        OLDEST_QUEUED,
        UP,
        "flowscope_job_results",
    ]
    assert all(f.samples == [] for f in families)
    registry = CollectorRegistry()  # registering calls describe()
    registry.register(collector)
    # a failing store at scrape time: logged, up 0, nothing else
    assert registry.get_sample_value(UP) == 0
    assert [s for f in registry.collect() for s in f.samples] == [
        s for f in registry.collect() for s in f.samples if s.name == UP
    ]
    assert isinstance(collector.last_error, StoreError)


def test_a_store_that_fails_then_recovers(caplog):
    runs = [
        _run("w", "a", "running", started_at=100.0, heartbeat_at=time.time()),
    ]

    class Flaky(MemoryEventStore):
        fail = False

        def open_runs(self):
            if self.fail:
                raise StoreError("disk I/O error")
            return runs

    store = Flaky()
    collector = StoreCollector(store, stale_after_s=60)
    ok = scrape(collector)
    assert sample(ok, UP) == 1 and sample(ok, OPEN, workflow="w", node="a", state="running") == 1
    store.fail = True
    with caplog.at_level("WARNING"):
        bad = scrape(collector)
    assert bad == {(UP, ()): 0.0}
    assert "disk I/O error" in caplog.text
    store.fail = False
    again = scrape(collector)
    assert sample(again, UP) == 1 and sample(again, OPEN, workflow="w", node="a", state="running") == 1


def _run(workflow, node_name, status, started_at, heartbeat_at=None, job_deadline_at=None, path=None):
    from flowscope.store.base import NodeRun

    return NodeRun(
        session_id="sid-secret", workflow=workflow, node=node_name, path=path or f"{workflow}@1/{node_name}@1",
        kind="function", status=status, attempt=1, retries=0, recoveries=0, started_at=started_at,
        ended_at=None, heartbeat_at=heartbeat_at, error_code=None, error_type=None, job_deadline_at=job_deadline_at,
    )  # fmt: skip


def test_summary_of_open_runs():
    now = 1_000.0
    runs = [
        _run("w", "a", "running", 10.0, heartbeat_at=now - 5),  # fresh
        _run("w", "a", "running", 5.0, heartbeat_at=now - 61),  # stale
        _run("w", "a", "running", 7.0, heartbeat_at=None),  # never beat: its start counts
        _run("w", "b", "waiting_input", 20.0),
        _run("w", "c", "waiting_job", 30.0, job_deadline_at=now - 1),
        _run("w", "c", "waiting_job", 31.0, job_deadline_at=now + 1),
        _run("w", "c", "waiting_job", 32.0, job_deadline_at=None),
        _run("w", "d", "completed", 1.0),  # not open
    ]
    groups = {(g.workflow, g.node, g.state): g for g in summarize_open_runs(runs, now, 60.0)}
    assert groups == {
        ("w", "a", "running"): OpenRunGroup("w", "a", "running", 3, 5.0, orphaned=2, overdue=0),
        ("w", "b", "waiting_input"): OpenRunGroup("w", "b", "waiting_input", 1, 20.0),
        ("w", "c", "waiting_job"): OpenRunGroup("w", "c", "waiting_job", 3, 30.0, orphaned=0, overdue=1),
    }
    samples = scrape(StoreCollector(_ListStore(runs), stale_after_s=60.0, clock=lambda: now))
    assert sample(samples, OPEN, workflow="w", node="a", state="running") == 3
    assert sample(samples, OLDEST, workflow="w", node="a", state="running") == 5.0
    assert sample(samples, ORPHANED, workflow="w", node="a") == 2
    assert sample(samples, OVERDUE, workflow="w", node="c") == 1
    assert sample(samples, ORPHANED, workflow="w", node="b") is None
    labels = {v for (_name, ls) in samples for _k, v in ls}
    assert "sid-secret" not in labels and not any("@" in v or "/" in v for v in labels)


class _ListStore(MemoryEventStore):
    """A store whose open runs are given: open_run_summary is the port's default."""

    def __init__(self, runs):
        super().__init__()
        self.runs = runs

    def open_runs(self):
        return list(self.runs)


def test_the_store_aggregate_is_used_when_the_store_has_one():
    calls = []

    class SummarisingStore(MemoryEventStore):
        def open_runs(self):
            raise AssertionError("the aggregate should have been used")

        def open_run_summary(self, now, stale_after_s):
            calls.append((now, stale_after_s))
            return [
                ("w", "a", "running", 2, 50.0, 1, 0),
                OpenRunGroup("w", "j", "waiting_job", 1, 60.0, 0, 1),
            ]

    samples = scrape(StoreCollector(SummarisingStore(), stale_after_s=30, clock=lambda: 123.0))
    assert calls == [(123.0, 30.0)]
    assert sample(samples, OPEN, workflow="w", node="a", state="running") == 2
    assert sample(samples, OLDEST, workflow="w", node="a", state="running") == 50.0
    assert sample(samples, ORPHANED, workflow="w", node="a") == 1
    assert sample(samples, OVERDUE, workflow="w", node="j") == 1


def test_series_seen_before_report_zero(db):
    store = SqliteEventStore(db)

    @node
    async def wait(ctx, x):
        return await ctx.request_input("go?")

    import asyncio

    runner = Runner(Workflow("w", edges=[(START, wait)]), store=store)
    paused = asyncio.run(runner.run(1, session_id="z"))
    collector = StoreCollector(store)
    assert sample(scrape(collector), OPEN, workflow="w", node="wait", state="waiting_input") == 1
    asyncio.run(runner.resume("z", inputs={paused.pending[0].interrupt_id: "yes"}))
    for _ in range(2):  # and it stays
        s = scrape(collector)
        assert sample(s, OPEN, workflow="w", node="wait", state="waiting_input") == 0
        assert sample(s, OLDEST, workflow="w", node="wait", state="waiting_input") == 0
    # a fresh collector never saw it: nothing to report
    assert (
        sample(scrape(StoreCollector(store)), OPEN, workflow="w", node="wait", state="waiting_input") is None
    )
    store.close()


# ------------------------------------------------------------------ a real HTTP scrape


def _get(url, accept=None, gzip_ok=False):
    headers = {}
    if accept:
        headers["Accept"] = accept
    if gzip_ok:
        headers["Accept-Encoding"] = "gzip"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
        body = resp.read()
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return resp.headers.get("Content-Type"), body.decode()


@pytest.mark.slow
def test_serve_metrics_over_http(db):
    store = SqliteEventStore(db)
    registry = CollectorRegistry()
    tracer = TracerProvider(sampler=ALWAYS_ON).get_tracer("test")

    @node
    def fetch(x):
        return x

    @node
    async def approve(ctx, x):
        return await ctx.request_input("ok?")

    import asyncio

    runner = Runner(
        Workflow("shop", edges=[(START, fetch, approve)]), store=store, plugins=[MetricsPlugin(registry)]
    )
    with tracer.start_as_current_span("caller") as span:
        asyncio.run(runner.run(1, session_id="http-session"))
    trace_id = format(span.get_span_context().trace_id, "032x")

    server = serve_metrics(store=store, registry=registry, port=0, stale_after_s=60)
    try:
        assert server.port > 0 and server.host == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        assert server._server.socket.getsockname()[0] == "127.0.0.1"

        ctype, text = _get(server.url)
        assert ctype.startswith("text/plain")
        families = {f.name: f for f in parse_text(text)}
        assert "flowscope_node_runs" in families and "flowscope_store_open_runs" in families
        runs = {
            (s.labels["node"], s.labels["outcome"]): s.value
            for s in families["flowscope_node_runs"].samples
            if s.name == "flowscope_node_runs_total" and s.value
        }  # fmt: skip (the series at 0 aside)
        assert runs == {("fetch", "success"): 1, ("approve", "waiting"): 1}  # one pause, at the deepest path
        open_runs = {
            (s.labels["node"], s.labels["state"]): s.value
            for s in families["flowscope_store_open_runs"].samples
        }
        assert open_runs == {("approve", "waiting_input"): 1}  # the workflow run is its container
        assert [s.value for s in families["flowscope_store_up"].samples] == [1]
        assert "trace_id" not in text  # no exemplars in the classic format

        ctype, om = _get(
            server.url, accept="application/openmetrics-text; version=1.0.0; charset=utf-8", gzip_ok=True
        )
        assert ctype.startswith("application/openmetrics-text")
        assert om.endswith("# EOF\n")
        om_families = {f.name: f for f in parse_openmetrics(om)}
        exemplars = [s.exemplar for s in om_families["flowscope_node_duration_seconds"].samples if s.exemplar]
        assert exemplars and {e.labels["trace_id"] for e in exemplars} == {trace_id}
        assert om_families["flowscope_store_open_runs"].type == "gauge"

        # the caller's registry was not touched: the store collector lives on a private one
        assert registry.get_sample_value(UP) is None
        for family in om_families.values():
            for s in family.samples:
                for value in s.labels.values():
                    assert value != "http-session" and "@" not in value
    finally:
        server.shutdown()
    server.shutdown()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)
    store.close()


@pytest.mark.slow
def test_serve_metrics_without_a_store_serves_the_registry_and_survives_a_broken_store():
    registry = CollectorRegistry()
    import asyncio

    asyncio.run(
        Runner(
            Workflow("w", edges=[(START, node(lambda x: x, name="a"))]), plugins=[MetricsPlugin(registry)]
        ).run(1)
    )
    with serve_metrics(registry=registry, port=0) as server:
        assert server.store_collector is None
        _, text = _get(server.url)
        assert 'flowscope_node_runs_total{node="a",outcome="success",workflow="w"} 1.0' in text
        assert "flowscope_store_up" not in text
    with serve_metrics(store=ExplodingStore(), registry=registry, port=0) as server:
        for _ in range(2):
            _, text = _get(server.url)
            families = {f.name: f for f in parse_text(text)}
            assert [s.value for s in families["flowscope_store_up"].samples] == [0]
            assert "flowscope_node_runs" in families


def test_stale_after_must_be_positive():
    with pytest.raises(ValueError):
        StoreCollector(MemoryEventStore(), stale_after_s=-1)


def test_memory_store_works_too():
    import asyncio

    store = MemoryEventStore()

    @node
    async def wait(ctx, x):
        return await ctx.request_input("go?")

    asyncio.run(Runner(Workflow("w", edges=[(START, wait)]), store=store).run(1))
    s = scrape(StoreCollector(store))
    assert sample(s, OPEN, workflow="w", node="wait", state="waiting_input") == 1


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_the_metrics_server_queues_a_burst_of_scrapes_and_drops_idle_connections(monkeypatch):
    """A listen backlog for a burst of concurrent scrapes (prometheus-client's own server
    keeps 5), and a read timeout so that idle connections do not each hold a thread."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from prometheus_client import CollectorRegistry

    from flowscope.observability import serve

    monkeypatch.setattr(serve._Handler, "timeout", 0.5)
    with serve.serve_metrics(registry=CollectorRegistry(), port=0) as srv:
        assert srv._server.request_queue_size == serve.LISTEN_BACKLOG >= 128

        def scrape(_i: int) -> int:
            with urllib.request.urlopen(srv.url, timeout=20) as r:
                return r.status

        with ThreadPoolExecutor(max_workers=200) as pool:
            assert list(pool.map(scrape, range(200))) == [200] * 200
        idle = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        started = time.monotonic()
        assert idle.recv(1) == b""  # the server closed it: the read timed out
        assert time.monotonic() - started < 4
        idle.close()


def test_queued_and_open_series_are_bounded_like_the_metrics_plugin_and_add_up(tmp_path):
    """Workflow names come from whoever calls ``start``: past ``max_series`` label sets,
    new ones report together under ``_other``, and the counts still add up."""
    from flowscope.events import RunSubmitted
    from flowscope.store.testing import ev

    store = SqliteEventStore(tmp_path / "q.db")
    for i in range(120):
        store.append(f"s{i}", [ev(RunSubmitted, f"s{i}", workflow=f"wf{i:03d}", input=1, ts=1000.0 + i)], 0)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, max_series=50))
    for _scrape in range(2):  # the second scrape keeps the same sets: nothing grows past the budget
        samples = [
            s for m in registry.collect() if m.name == "flowscope_store_queued_sessions" for s in m.samples
        ]
        assert len(samples) == 51
        assert sum(s.value for s in samples) == 120
        other = [s for s in samples if s.labels["workflow"] == "_other"]
        assert len(other) == 1 and other[0].value == 70
    oldest = {
        s.labels["workflow"]: s.value
        for m in registry.collect()
        if m.name == "flowscope_store_oldest_queued_timestamp_seconds"
        for s in m.samples
    }
    assert oldest["_other"] == 1050.0
    store.close()


# ------------------------------------------------------------------ job results, counted from the log

JOB_RESULTS = "flowscope_job_results_total"


def _paused_on_a_job(store, sid: str) -> str:
    """Run a nested workflow whose node waits for an external job; its job id."""
    import asyncio

    @node
    async def geocode(ctx, x):
        return await ctx.await_job(lambda job: None, payload=x, expect_count=True)

    wf = Workflow("etl", edges=[(START, Workflow("enrich", edges=[(START, geocode)]))])
    paused = asyncio.run(Runner(wf, store=store).run([1], session_id=sid))
    assert paused.status == "paused"
    [job] = paused.pending
    return job.job_id


def test_job_results_are_counted_from_the_store_whoever_recorded_them(tmp_path):
    """A result answered by another process (here: another connection, as
    ``flowscope resume --job`` has) reaches the collector's counter; the results already
    in the log when it starts are its baseline, and a log that shrinks (a prune) is no
    decrease."""
    from flowscope import answer

    db = str(tmp_path / "jobs.db")
    writer = SqliteEventStore(db)
    old = _paused_on_a_job(writer, "old")
    answer(writer, "old", jobs={old: {"success": True, "count": 0}})  # before the collector started
    job = _paused_on_a_job(writer, "s1")
    reader = SqliteEventStore(db)
    collector = StoreCollector(reader)
    collector.count_job_results_from_now()
    assert sample(scrape(collector), JOB_RESULTS, workflow="etl", node="geocode", result="empty") == 0

    other = SqliteEventStore(db)  # the answering process
    answer(other, "s1", jobs={job: {"success": True, "count": 0}})
    other.close()
    counted = scrape(collector)
    assert sample(counted, JOB_RESULTS, workflow="etl", node="geocode", result="empty") == 1
    assert [k for k in counted if k[0] == JOB_RESULTS] == [
        (JOB_RESULTS, (("node", "geocode"), ("result", "empty"), ("workflow", "etl")))
    ]

    with writer._op("delete a session") as conn:  # what prune does to an old session's log
        conn.execute("DELETE FROM events WHERE session_id = 'old'")
    assert sample(scrape(collector), JOB_RESULTS, workflow="etl", node="geocode", result="empty") == 1
    for store in (writer, reader):
        store.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_serve_metrics_exposes_one_job_results_family_the_stores(tmp_path):
    """A MetricsPlugin that counts job results in process beside the endpoint's
    StoreCollector: the endpoint exposes the store's count only, never both."""
    db = str(tmp_path / "jobs.db")
    store = SqliteEventStore(db)
    registry = CollectorRegistry()
    plugin = MetricsPlugin(registry)  # job_results=True: counts what this process records
    job = _paused_on_a_job(store, "s1")
    server = serve_metrics(store=store, registry=registry, port=0)
    try:
        import asyncio

        @node
        async def geocode(ctx, x):
            return await ctx.await_job(lambda job: None, payload=x, expect_count=True)

        wf = Workflow("etl", edges=[(START, Workflow("enrich", edges=[(START, geocode)]))])
        resumed = asyncio.run(
            Runner(wf, store=store, plugins=[plugin]).resume("s1", jobs={job: {"success": True, "count": 0}})
        )
        assert resumed.status == "paused"  # the empty result is an actionable pause
        assert (
            registry.get_sample_value(JOB_RESULTS, {"workflow": "etl", "node": "geocode", "result": "empty"})
            == 1
        )
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            text = resp.read().decode()
        families = [f for f in parse_text(text) if f.name == "flowscope_job_results"]
        assert len(families) == 1, [f.name for f in parse_text(text)]
        values = {
            tuple(sorted(s.labels.items())): s.value for s in families[0].samples if s.name == JOB_RESULTS
        }
        assert values == {(("node", "geocode"), ("result", "empty"), ("workflow", "etl")): 1.0}
    finally:
        server.shutdown()
        store.close()


def test_stuck_runs_audit_and_the_collector_count_the_same_runs(tmp_path):
    """Counted once, at the deepest path, everywhere: a dead worker inside a nested
    workflow and a paused session are one orphan and one waiting run in ``flowscope
    stuck``, ``runs``, ``audit`` and the StoreCollector alike (docs/design.md)."""
    from flowscope.cli.views import audit_rows, runs_rows, stuck_rows
    from flowscope.store.testing import nested_logs

    store = SqliteEventStore(str(tmp_path / "nested.db"))
    for sid, events in nested_logs(time.time() - 3600).items():
        store.append(sid, events, 0)
    stuck = {
        (r["session_id"], r["node"], r["state"]) for r in stuck_rows(store, 0.0, 60.0, prefix="flowscope")
    }
    assert stuck == {
        ("crashed", "leaf", "orphaned"),
        ("crashed", "inner", "orphaned"),  # inner@10, inner@1-b
        ("paused", "ask", "waiting_input"),
        ("between", "bw", "orphaned"),
    }
    samples = scrape(StoreCollector(store, stale_after_s=60.0))
    orphaned = {k: v for k, v in samples.items() if k[0] == ORPHANED and v}
    assert orphaned == {
        (ORPHANED, (("node", "bw"), ("workflow", "bw"))): 1,
        (ORPHANED, (("node", "inner"), ("workflow", "wf"))): 2,
        (ORPHANED, (("node", "leaf"), ("workflow", "wf"))): 1,
    }
    open_runs = sum(v for k, v in samples.items() if k[0] == OPEN)
    assert open_runs == 5 == sum(r["open_runs"] for r in runs_rows(store))
    assert sum(r["open"] for r in audit_rows(store.node_runs())) == 5
    assert (
        len(stuck_rows(store, 0.0, 60.0, include_parents=True, prefix="flowscope")) == 8
    )  # the containers, on request
    store.close()
