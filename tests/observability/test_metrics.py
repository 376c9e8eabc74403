"""MetricsPlugin: exact sample values on a fresh registry per test, the same numbers through
the OpenTelemetry backend, exemplars, bounded labels (docs/design.md, "Metrics")."""

from __future__ import annotations

import asyncio
import math
import re

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.utils import floatToGoString

from flowscope import START, Plugin, RetryConfig, Runner, Workflow, node
from flowscope.errors import StoreDiskFull
from flowscope.events import UNKNOWN_ERROR
from flowscope.observability.catalog import READ_INSTRUMENTS, SPECS
from flowscope.observability.metrics import (
    ATTEMPT_BUCKETS,
    DURATION_BUCKETS,
    INSTRUMENTS,
    MetricsPlugin,
)
from flowscope.store import MemoryEventStore

NO_RETRY_DELAY = dict(initial_delay=0.001, jitter=0.0)


# -------------------------------------------------------------------------- the harness


def otel_as_prometheus(reader: InMemoryMetricReader) -> dict[tuple[str, tuple], float]:
    """The OTel reader's data points, named and shaped as the Prometheus samples would be."""
    by_otel = {s.otel_name: s for s in INSTRUMENTS + READ_INSTRUMENTS}
    out: dict[tuple[str, tuple], float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                spec = by_otel[m.name]
                for dp in m.data.data_points:
                    labels = tuple(sorted((k, str(v)) for k, v in dp.attributes.items()))
                    if spec.kind == "histogram":
                        out[(spec.prom_name + "_count", labels)] = dp.count
                        out[(spec.prom_name + "_sum", labels)] = dp.sum
                        cumulative = 0
                        bounds = list(dp.explicit_bounds) + [math.inf]
                        for bound, n in zip(bounds, dp.bucket_counts):
                            cumulative += n
                            le = tuple(sorted(labels + (("le", floatToGoString(bound)),)))
                            out[(spec.prom_name + "_bucket", le)] = cumulative
                    else:
                        out[(spec.prom_name, labels)] = dp.value
    return out


def prometheus_samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class Metrics:
    """A MetricsPlugin on a fresh registry and an OTel MeterProvider at once."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.plugin = MetricsPlugin(registry=self.registry, meter_provider=self.provider)
        self.store = MemoryEventStore()

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def total(self, name: str, **match: str) -> float:
        """Sum of every sample of ``name`` whose labels include ``match``."""
        return sum(
            s.value
            for f in self.registry.collect()
            for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in match.items())
        )

    def series(self, name: str) -> list[dict[str, str]]:
        return [s.labels for f in self.registry.collect() for s in f.samples if s.name == name]

    def runner(self, wf: Workflow, *plugins: Plugin, **kwargs) -> Runner:
        return Runner(wf, store=self.store, plugins=[*plugins, self.plugin], **kwargs)

    def check_invariants(self) -> None:
        """After every test: bounded labels, nothing left running, the same numbers in OTel."""
        ids, paths = set(), set()
        for info in self.store.sessions():
            ids.add(info.session_id)
            for e in self.store.read(info.session_id):
                ids.add(e.invocation_id)
                if e.path:
                    paths.add(e.path)
                for attr in ("job_id", "interrupt_id", "idempotency_key"):
                    if getattr(e, attr, ""):
                        ids.add(getattr(e, attr))
        assert ids and paths, "the test ran nothing"
        samples = prometheus_samples(self.registry)
        for (name, labels), value in samples.items():
            for key, v in labels:
                assert v not in ids, f"{name} has an id as label {key}={v!r}"
                assert v not in paths and "@" not in v and "/" not in v, (
                    f"{name} has a path as label {key}={v!r}"
                )
            if name == "flowscope_nodes_running":
                assert value == 0, f"{dict(labels)} still running"
        otel = otel_as_prometheus(self.reader)
        assert set(otel) == set(samples)
        for key, value in samples.items():
            assert otel[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.fixture
def m():
    metrics = Metrics()
    yield metrics
    metrics.check_invariants()


def chain(name: str, *nodes, **kwargs) -> Workflow:
    return Workflow(name, edges=[(START, *nodes)], **kwargs)


@node
def ok(x):
    return x


# -------------------------------------------------------------------------- outcomes


async def test_success(m):
    @node
    def first(x):
        return x + 1

    @node
    def second(x):
        return x * 2

    result = await m.runner(chain("orders", first, second)).run(1)
    assert result.output == 4
    # the workflow's own run is its own series, not a node's
    assert m.total("flowscope_node_runs_total", node="orders") == 0
    assert m.value("flowscope_nodes_running", workflow="orders", node="orders") is None
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="completed") == 1
    for n in ("first", "second"):
        assert m.value("flowscope_node_runs_total", workflow="orders", node=n, outcome="success") == 1
        assert (
            m.value("flowscope_node_duration_seconds_count", workflow="orders", node=n, outcome="success")
            == 1
        )
        assert m.value("flowscope_node_attempts_count", workflow="orders", node=n) == 1
        assert m.value("flowscope_node_attempts_sum", workflow="orders", node=n) == 1
        assert m.value("flowscope_node_attempts_bucket", workflow="orders", node=n, le="1.0") == 1
        assert m.value("flowscope_nodes_running", workflow="orders", node=n) == 0
    assert m.total("flowscope_node_runs_total") == 2
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="completed") == 1
    assert m.value("flowscope_workflow_duration_seconds_count", workflow="orders", outcome="completed") == 1
    assert m.total("flowscope_node_errors_total") == 0
    assert m.total("flowscope_node_retries_total") == 0
    assert m.total("flowscope_plugin_errors_total") == 0


async def test_duration_is_measured():
    m = Metrics()

    @node
    async def slow(x):
        await asyncio.sleep(0.03)
        return x

    await m.runner(chain("w", slow)).run(1)
    total = m.value("flowscope_node_duration_seconds_sum", workflow="w", node="slow", outcome="success")
    assert 0.03 <= total < 1.0
    assert (
        m.value(
            "flowscope_node_duration_seconds_bucket", workflow="w", node="slow", outcome="success", le="0.025"
        )
        == 0
    )
    assert (
        m.value(
            "flowscope_node_duration_seconds_bucket", workflow="w", node="slow", outcome="success", le="1.0"
        )
        == 1
    )
    m.check_invariants()


async def test_failure_without_a_code(m):
    @node
    def charge(x):
        raise ValueError("card declined")

    with pytest.raises(ValueError):
        await m.runner(chain("orders", ok, charge)).run(1)
    assert (
        m.value(
            "flowscope_node_errors_total",
            workflow="orders",
            node="charge",
            error_code=UNKNOWN_ERROR,
            error_type="ValueError",
        )
        == 1
    )
    assert m.total("flowscope_node_errors_total") == 1
    assert m.value("flowscope_node_runs_total", workflow="orders", node="charge", outcome="failure") == 1
    assert m.value("flowscope_node_runs_total", workflow="orders", node="ok", outcome="success") == 1
    assert m.value("flowscope_node_attempts_sum", workflow="orders", node="charge") == 1
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="failed") == 1
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="completed") == 0


async def test_a_nodes_error_rate_series_and_a_workflows_outcomes_start_at_0_with_its_first_run(m):
    """A series born at 1 has no increase() for Prometheus: the outcomes an error rate
    reads exist at 0 from a node's first run, before its first failure; not the rarer ones."""
    gate = asyncio.Event()
    seen: dict[str, float | None] = {}

    @node
    async def pay(x):
        for outcome in ("success", "failure", "timeout", "waiting", "cancellation"):
            seen[outcome] = m.value(
                "flowscope_node_runs_total", workflow="orders", node="pay", outcome=outcome
            )
        for outcome in ("completed", "failed", "paused", "cancelled"):
            seen[outcome] = m.value("flowscope_workflow_runs_total", workflow="orders", outcome=outcome)
        gate.set()
        return x

    await m.runner(chain("orders", pay)).run(1)
    assert gate.is_set()
    assert seen == {
        "success": 0, "failure": 0, "timeout": 0, "waiting": None, "cancellation": None,
        "completed": 0, "failed": 0, "paused": 0, "cancelled": 0,
    }  # fmt: skip


class PaymentDeclined(Exception):
    error_code = "PAYMENT_DECLINED"


async def test_failure_with_a_code(m):
    @node
    def charge(x):
        raise PaymentDeclined("insufficient funds")

    with pytest.raises(PaymentDeclined):
        await m.runner(chain("orders", charge)).run(1)
    assert (
        m.value(
            "flowscope_node_errors_total",
            workflow="orders",
            node="charge",
            error_code="PAYMENT_DECLINED",
            error_type="PaymentDeclined",
        )
        == 1
    )
    assert m.total("flowscope_node_errors_total") == 1


async def test_mapped_exception_type(m):
    @node
    def fetch(x):
        raise TimeoutError("upstream did not answer")

    runner = m.runner(chain("orders", fetch), error_codes={TimeoutError: "UPSTREAM_TIMEOUT"})
    with pytest.raises(TimeoutError):
        await runner.run(1)
    assert (
        m.value(
            "flowscope_node_errors_total",
            workflow="orders",
            node="fetch",
            error_code="UPSTREAM_TIMEOUT",
            error_type="TimeoutError",
        )
        == 1
    )
    assert m.total("flowscope_node_errors_total") == 1
    # a mapped TimeoutError is a failure; "timeout" is the node's own timeout only
    assert m.value("flowscope_node_runs_total", workflow="orders", node="fetch", outcome="failure") == 1


async def test_retries_then_success(m):
    calls = []

    @node(retry=RetryConfig(max_attempts=4, **NO_RETRY_DELAY))
    def flaky(x):
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError("reset")
        return x

    await m.runner(chain("orders", flaky)).run(1)
    assert len(calls) == 3
    assert (
        m.value("flowscope_node_retries_total", workflow="orders", node="flaky", error_type="ConnectionError")
        == 2
    )
    assert m.total("flowscope_node_errors_total") == 0
    assert m.value("flowscope_node_runs_total", workflow="orders", node="flaky", outcome="success") == 1
    assert m.value("flowscope_node_attempts_count", workflow="orders", node="flaky") == 1
    assert m.value("flowscope_node_attempts_sum", workflow="orders", node="flaky") == 3
    assert m.value("flowscope_node_attempts_bucket", workflow="orders", node="flaky", le="2.0") == 0
    assert m.value("flowscope_node_attempts_bucket", workflow="orders", node="flaky", le="3.0") == 1


async def test_retries_exhausted(m):
    @node(retry=RetryConfig(max_attempts=3, **NO_RETRY_DELAY))
    def broken(x):
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError):
        await m.runner(chain("orders", broken)).run(1)
    assert (
        m.value(
            "flowscope_node_retries_total", workflow="orders", node="broken", error_type="ConnectionError"
        )
        == 2
    )
    assert (
        m.value(
            "flowscope_node_errors_total",
            workflow="orders",
            node="broken",
            error_code=UNKNOWN_ERROR,
            error_type="ConnectionError",
        )
        == 1
    )
    assert m.total("flowscope_node_errors_total") == 1
    assert m.value("flowscope_node_runs_total", workflow="orders", node="broken", outcome="failure") == 1
    # the attempts histogram sees every attempt of the run
    assert m.value("flowscope_node_attempts_count", workflow="orders", node="broken") == 1
    assert m.value("flowscope_node_attempts_sum", workflow="orders", node="broken") == 3
    assert m.value("flowscope_node_attempts_bucket", workflow="orders", node="broken", le="2.0") == 0
    assert m.value("flowscope_node_attempts_bucket", workflow="orders", node="broken", le="3.0") == 1


async def test_timeout(m):
    @node(timeout=0.01)
    async def sleepy(x):
        await asyncio.sleep(5)

    from flowscope.errors import NodeTimeoutError

    with pytest.raises(NodeTimeoutError):
        await m.runner(chain("orders", sleepy)).run(1)
    assert (
        m.value(
            "flowscope_node_errors_total",
            workflow="orders",
            node="sleepy",
            error_code="NODE_TIMEOUT",
            error_type="NodeTimeoutError",
        )
        == 1
    )
    assert m.total("flowscope_node_errors_total") == 1
    assert m.value("flowscope_node_runs_total", workflow="orders", node="sleepy", outcome="timeout") == 1
    assert m.value("flowscope_node_runs_total", workflow="orders", node="sleepy", outcome="failure") == 0
    assert m.value("flowscope_node_attempts_sum", workflow="orders", node="sleepy") == 1


async def test_cancelled_sibling_is_not_an_error(m):
    started = asyncio.Event()

    @node
    async def slow(x):
        started.set()
        await asyncio.sleep(10)

    @node
    async def fails(x):
        await started.wait()
        raise KeyError("missing")

    with pytest.raises(KeyError):
        await m.runner(Workflow("orders", edges=[(START, (slow, fails))])).run(1)
    assert m.value("flowscope_node_runs_total", workflow="orders", node="slow", outcome="cancellation") == 1
    assert (
        m.value(
            "flowscope_node_duration_seconds_count", workflow="orders", node="slow", outcome="cancellation"
        )
        == 1
    )
    assert m.value("flowscope_node_runs_total", workflow="orders", node="fails", outcome="failure") == 1
    assert (
        m.value(
            "flowscope_node_errors_total",
            workflow="orders",
            node="fails",
            error_code=UNKNOWN_ERROR,
            error_type="KeyError",
        )
        == 1
    )
    assert m.total("flowscope_node_errors_total") == 1
    assert m.total("flowscope_node_errors_total", node="slow") == 0
    # a cancelled run has no attempt count to report
    assert m.value("flowscope_node_attempts_count", workflow="orders", node="slow") is None
    assert m.value("flowscope_nodes_running", workflow="orders", node="slow") == 0


async def test_nested_failure_is_counted_once(m):
    @node
    def deep(x):
        raise ValueError("deep")

    inner = chain("inner", deep)
    outer = chain("outer", ok, inner)
    with pytest.raises(ValueError):
        await m.runner(outer).run(1)
    assert m.total("flowscope_node_errors_total") == 1
    assert (
        m.value(
            "flowscope_node_errors_total",
            workflow="outer",
            node="deep",
            error_code=UNKNOWN_ERROR,
            error_type="ValueError",
        )
        == 1
    )
    # one failure, at the deepest path: the enclosing runs are containers of it
    assert m.value("flowscope_node_runs_total", workflow="outer", node="deep", outcome="failure") == 1
    assert m.total("flowscope_node_runs_total", outcome="failure") == 1
    for n in ("inner", "outer"):
        assert m.total("flowscope_node_runs_total", node=n) == 0
    assert m.total("flowscope_node_runs_total", workflow="inner") == 0
    assert m.value("flowscope_workflow_runs_total", workflow="outer", outcome="failed") == 1


async def test_paused_run_then_resumed(m):
    @node
    async def approve(ctx, x):
        answer = await ctx.request_input("approve?")
        return {"x": x, "approved": answer}

    runner = m.runner(chain("orders", ok, approve))
    paused = await runner.run(1, session_id="s-pause")
    assert paused.status == "paused"
    assert m.value("flowscope_node_runs_total", workflow="orders", node="approve", outcome="waiting") == 1
    assert m.total("flowscope_node_runs_total", node="orders") == 0  # one pause, at the deepest path
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="paused") == 1
    # a pause is no finished run: no attempt count yet
    assert m.value("flowscope_node_attempts_count", workflow="orders", node="approve") is None
    assert m.value("flowscope_nodes_running", workflow="orders", node="approve") == 0

    done = await runner.resume("s-pause", inputs={paused.pending[0].interrupt_id: True})
    assert done.status == "completed"
    assert m.value("flowscope_node_runs_total", workflow="orders", node="approve", outcome="success") == 1
    assert m.value("flowscope_node_runs_total", workflow="orders", node="approve", outcome="waiting") == 1
    assert (
        m.value("flowscope_node_runs_total", workflow="orders", node="ok", outcome="success") == 1
    )  # not re-run
    assert m.value("flowscope_node_attempts_sum", workflow="orders", node="approve") == 1  # the same attempt
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="completed") == 1
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="paused") == 1


class _FullOnce(MemoryEventStore):
    """Refuses, once, the append that carries ``node``'s completion (a full disk)."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node: str | None = node

    def append(self, session_id, events, expected_last_seq, *, epoch=None):
        if any(e.type == "node_completed" and e.node == self.node for e in events):
            self.node = None
            raise StoreDiskFull("database or disk is full (injected)")
        return super().append(session_id, events, expected_last_seq, epoch=epoch)


async def test_a_run_is_counted_once_its_end_is_in_the_log_so_a_run_a_store_fault_cut_off_counts_once(m):
    bodies: dict[str, int] = {}

    @node
    def first(x):
        bodies["first"] = bodies.get("first", 0) + 1
        return x + 1

    @node
    def second(x):
        bodies["second"] = bodies.get("second", 0) + 1
        return x * 2

    m.store = _FullOnce("first")
    runner = m.runner(chain("orders", first, second))
    with pytest.raises(StoreDiskFull):
        await runner.run(1, session_id="s")
    assert bodies == {"first": 1}
    # the body ran, its completion is not in the log: it is no outcome (yet)
    assert m.total("flowscope_node_runs_total") == 0
    assert m.total("flowscope_node_duration_seconds_count") == 0
    assert m.value("flowscope_node_attempts_count", workflow="orders", node="first") is None
    assert m.value("flowscope_nodes_running", workflow="orders", node="first") == 0

    assert (await runner.resume("s")).output == 4
    assert bodies == {"first": 2, "second": 1}  # the cut-off run ran again
    for n in ("first", "second"):  # one run each in the log, one outcome each
        assert m.value("flowscope_node_runs_total", workflow="orders", node=n, outcome="success") == 1
        assert (
            m.value("flowscope_node_duration_seconds_count", workflow="orders", node=n, outcome="success")
            == 1
        )
        assert m.value("flowscope_node_attempts_count", workflow="orders", node=n) == 1
    assert m.total("flowscope_node_runs_total") == 2
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="completed") == 1
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="failed") == 0


async def test_raising_plugin_is_counted(m):
    class Broken(Plugin):
        name = "broken"

        def before_run(self, run):
            raise RuntimeError("before_run")

        async def after_node(self, ctx, outcome):
            raise RuntimeError("after_node")

    result = await m.runner(chain("orders", ok, node(lambda x: x, name="two")), Broken()).run(1)
    assert result.status == "completed"
    assert m.value("flowscope_plugin_errors_total", plugin="broken", hook="before_run") == 1
    assert (
        m.value("flowscope_plugin_errors_total", plugin="broken", hook="after_node") == 3
    )  # ok, two, orders
    assert m.total("flowscope_plugin_errors_total") == 4
    assert m.total("flowscope_node_runs_total", outcome="success") == 2  # ok, two: the workflow's is its own


async def test_job_results_by_verdict(m):
    @node
    async def enrich(ctx, x):
        return await ctx.await_job(dispatch=lambda job: None, payload=x, expect_count=True)

    runner = m.runner(chain("orders", enrich))
    verdicts = {
        "s-ok": {"success": True, "count": 2, "data": "rows"},
        "s-failed": {"success": False, "error": "quota"},
        "s-empty": {"success": True, "count": 0},
    }
    for sid, report in verdicts.items():
        paused = await runner.run(1, session_id=sid)
        job_id = paused.pending[0].job_id
        await runner.resume(sid, jobs={job_id: report})
    assert m.value("flowscope_job_results_total", workflow="orders", node="enrich", result="success") == 1
    assert m.value("flowscope_job_results_total", workflow="orders", node="enrich", result="failed") == 1
    assert m.value("flowscope_job_results_total", workflow="orders", node="enrich", result="empty") == 1
    assert m.total("flowscope_job_results_total") == 3
    # waiting for the job, then (after a good result) done; failed/empty results pause again
    assert m.value("flowscope_node_runs_total", workflow="orders", node="enrich", outcome="waiting") == 5
    assert m.value("flowscope_node_runs_total", workflow="orders", node="enrich", outcome="success") == 1
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="paused") == 5


async def test_failing_dispatch_counts_a_failed_job_result(m):
    def dispatch(job):
        raise PermissionError("HTTP 401")

    @node
    async def enrich(ctx, x):
        return await ctx.await_job(dispatch=dispatch, payload=x)

    paused = await m.runner(chain("orders", enrich)).run(1)
    assert paused.status == "paused"
    assert m.value("flowscope_job_results_total", workflow="orders", node="enrich", result="failed") == 1


async def test_nodes_running_while_running(m):
    seen = {}

    @node
    async def probe(x):
        seen["probe"] = m.value("flowscope_nodes_running", workflow="orders", node="probe")
        seen["orders"] = m.value("flowscope_nodes_running", workflow="orders", node="orders")
        return x

    await m.runner(chain("orders", probe)).run(1)
    assert seen == {"probe": 1, "orders": None}  # the invocation's own run is no node in progress
    assert m.value("flowscope_nodes_running", workflow="orders", node="probe") == 0


async def test_a_nested_workflow_is_no_node_running_and_its_cancellation_is_its_childs(m):
    """One hung node two workflows deep is one node running, as the store's open runs say,
    and one cancel of it is one cancellation: the nested workflows are its containers."""
    started = asyncio.Event()

    @node
    async def hang(x):
        started.set()
        await asyncio.sleep(60)

    outer = chain("outer", chain("mid", chain("inner", hang)))
    task = asyncio.ensure_future(m.runner(outer).run(1))
    await started.wait()
    assert m.total("flowscope_nodes_running") == 1
    assert m.value("flowscope_nodes_running", workflow="outer", node="hang") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert m.total("flowscope_node_runs_total", outcome="cancellation") == 1
    assert m.value("flowscope_node_runs_total", workflow="outer", node="hang", outcome="cancellation") == 1
    assert m.total("flowscope_nodes_running") == 0


async def test_a_run_cancelled_with_its_dynamic_child_is_one_cancellation_the_childs(m):
    """A node's dynamic child is cancelled with it (and one inside a nested workflow it
    runs): one cancellation, at the deepest path, as a nested workflow's is."""
    started = asyncio.Event()

    @node
    async def hang(x):
        started.set()
        await asyncio.sleep(60)

    @node
    async def parent(ctx, x):
        return await ctx.run_node(hang, x)

    @node
    async def calls_a_workflow(ctx, x):
        return await ctx.run_node(chain("inner", hang), x)

    for n in (parent, calls_a_workflow):
        started.clear()
        task = asyncio.ensure_future(m.runner(chain(f"via_{n.name}", n)).run(1))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert m.total("flowscope_node_runs_total", workflow=f"via_{n.name}", outcome="cancellation") == 1
        assert (
            m.value(
                "flowscope_node_runs_total", workflow=f"via_{n.name}", node="hang", outcome="cancellation"
            )
            == 1
        )
    assert m.total("flowscope_nodes_running") == 0


async def test_a_node_running_a_dynamic_child_is_its_container_while_the_child_runs(m):
    """The rule the store's open runs follow: while a node's dynamic child runs, the child
    is the node running, not both; the parent is counted again once it runs on alone."""
    seen: dict[str, float] = {}

    @node
    async def child(x):
        seen["during"] = m.total("flowscope_nodes_running")
        seen["child"] = m.value("flowscope_nodes_running", workflow="orders", node="child")
        return x

    @node
    async def parent(ctx, x):
        seen["before"] = m.total("flowscope_nodes_running")
        await ctx.run_node(child, x)
        seen["after"] = m.value("flowscope_nodes_running", workflow="orders", node="parent")
        return x

    await m.runner(chain("orders", parent)).run(1)
    assert seen == {"before": 1, "during": 1, "child": 1, "after": 1}
    assert m.total("flowscope_nodes_running") == 0


async def test_many_runs_add_up(m):
    runner = m.runner(chain("orders", ok))
    for i in range(25):
        await runner.run(i)
    assert m.value("flowscope_node_runs_total", workflow="orders", node="ok", outcome="success") == 25
    assert m.value("flowscope_node_attempts_sum", workflow="orders", node="ok") == 25
    assert m.value("flowscope_workflow_runs_total", workflow="orders", outcome="completed") == 25


# -------------------------------------------------------------------------- exemplars


def _sampled_tracer(sampler=ALWAYS_ON):
    return TracerProvider(sampler=sampler).get_tracer("test")


def _exemplars(registry: CollectorRegistry, name: str) -> list[dict[str, str]]:
    return [
        s.exemplar.labels
        for f in registry.collect()
        for s in f.samples
        if s.name == name and s.exemplar is not None
    ]


async def test_duration_exemplars_carry_the_current_trace_id(m):
    tracer = _sampled_tracer()
    with tracer.start_as_current_span("caller") as span:
        await m.runner(chain("orders", ok)).run(1)
    trace_id = format(span.get_span_context().trace_id, "032x")
    node_ex = _exemplars(m.registry, "flowscope_node_duration_seconds_bucket")
    assert len(node_ex) == 1  # ok, one bucket (the workflow's own run is flowscope_workflow_duration_seconds)
    assert {e["trace_id"] for e in node_ex} == {trace_id}
    assert all(len(e["span_id"]) == 16 for e in node_ex)
    assert {e["trace_id"] for e in _exemplars(m.registry, "flowscope_workflow_duration_seconds_bucket")} == {
        trace_id
    }
    text = generate_openmetrics(m.registry).decode()
    assert f'trace_id="{trace_id}"' in text
    assert "trace_id" not in generate_latest(m.registry).decode()  # classic text has no exemplars
    # the OTel SDK picks its exemplar from the same current span
    data = m.reader.get_metrics_data()
    points = [
        dp
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "flowscope.node.duration"
        for dp in metric.data.data_points
    ]
    if not hasattr(points[0], "exemplars"):  # pragma: no cover - opentelemetry-sdk < 1.28
        return
    otel_ex = [ex for dp in points for ex in dp.exemplars]
    assert otel_ex and {format(ex.trace_id, "032x") for ex in otel_ex} == {trace_id}


async def test_exemplar_is_the_node_span_with_a_tracing_plugin(m):
    """With plugins=[tracing, metrics], after_node of the metrics plugin runs first, while
    the node's span is still current."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    tracer = _sampled_tracer()
    node_spans = {}

    class MiniTracing(Plugin):  # what TracingPlugin does around a node run
        name = "mini-tracing"

        def before_node(self, ctx):
            span = tracer.start_span(f"invoke_node {ctx.node_name}")
            node_spans[ctx.node_name] = span
            ctx.plugin_state["token"] = otel_context.attach(trace.set_span_in_context(span))

        def after_node(self, ctx, outcome):
            otel_context.detach(ctx.plugin_state.pop("token"))
            node_spans[ctx.node_name].end()

    runner = Runner(chain("orders", ok), store=m.store, plugins=[MiniTracing(), m.plugin])
    await runner.run(1)
    by_node = {
        s.labels["node"]: s.exemplar.labels
        for f in m.registry.collect()
        for s in f.samples
        if s.name == "flowscope_node_duration_seconds_bucket" and s.exemplar is not None
    }
    assert set(by_node) == {"ok"}
    for name in ("ok",):
        sc = node_spans[name].get_span_context()
        assert by_node[name] == {
            "trace_id": format(sc.trace_id, "032x"),
            "span_id": format(sc.span_id, "016x"),
        }


@pytest.mark.parametrize("metrics_first", [False, True], ids=["tracing-first", "metrics-first"])
async def test_exemplars_with_the_real_tracing_plugin(metrics_first):
    """The node's own span, and the invocation's span for the workflow duration, in
    either plugin order (the run's traceparent is used, not only the current span)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from flowscope.observability import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    plugin = tracing.TracingPlugin(tracer_provider=provider)
    m = Metrics()
    plugins = [m.plugin, plugin] if metrics_first else [plugin, m.plugin]

    @node
    def fails(x):
        raise ValueError("x")

    await Runner(chain("orders", ok), store=m.store, plugins=plugins).run(1)
    with pytest.raises(ValueError):
        await Runner(chain("billing", fails), store=m.store, plugins=plugins).run(1)
    finished = exporter.get_finished_spans()
    node_spans = {
        (s.attributes["flowscope.node.path"].split("@")[0], s.attributes["flowscope.node.name"]): s
        for s in finished
        if "flowscope.node.path" in s.attributes
    }

    def ids(span):
        return {
            "trace_id": format(span.context.trace_id, "032x"),
            "span_id": format(span.context.span_id, "016x"),
        }

    node_ex = {
        (s.labels["workflow"], s.labels["node"]): s.exemplar.labels
        for f in m.registry.collect()
        for s in f.samples
        if s.name == "flowscope_node_duration_seconds_bucket" and s.exemplar is not None
    }
    assert set(node_spans) == {
        ("orders", "ok"),
        ("orders", "orders"),
        ("billing", "fails"),
        ("billing", "billing"),
    }
    assert node_ex == {key: ids(span) for key, span in node_spans.items() if key[0] != key[1]}
    invocations = {
        s.attributes["gen_ai.workflow.name"]: s
        for s in finished
        # one span for the invocation and its top workflow's run
        if s.attributes.get("gen_ai.operation.name") == "invoke_workflow"
    }
    wf_ex = {
        s.labels["workflow"]: s.exemplar.labels
        for f in m.registry.collect()
        for s in f.samples
        if s.name == "flowscope_workflow_duration_seconds_bucket" and s.exemplar is not None
    }
    assert wf_ex == {name: ids(span) for name, span in invocations.items()}
    m.check_invariants()


async def test_exemplar_from_the_runs_traceparent(m):
    """A tracing plugin that only fills ctx.trace_context (no current span) is enough;
    an unsampled traceparent gives no exemplar."""
    sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    unsampled = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00"

    class Propagating(Plugin):
        name = "propagating"

        def before_node(self, ctx):
            ctx.trace_context["traceparent"] = sampled if ctx.node_name == "ok" else unsampled

    await m.runner(chain("orders", ok), Propagating()).run(1)
    ex = {
        s.labels["node"]: s.exemplar.labels
        for f in m.registry.collect()
        for s in f.samples
        if s.name == "flowscope_node_duration_seconds_bucket" and s.exemplar is not None
    }
    assert ex == {"ok": {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}}


async def test_no_exemplar_without_a_sampled_span(m):
    await m.runner(chain("orders", ok)).run(1)
    tracer = _sampled_tracer(ALWAYS_OFF)
    with tracer.start_as_current_span("unsampled"):
        await m.runner(chain("orders", ok)).run(2)
    assert _exemplars(m.registry, "flowscope_node_duration_seconds_bucket") == []
    assert "trace_id" not in generate_openmetrics(m.registry).decode()


# -------------------------------------------------------------------------- registries and backends


def test_catalog_names_kinds_labels_buckets():
    registry = CollectorRegistry()
    MetricsPlugin(registry)
    families = {f.name: f for f in registry.collect()}
    expected = {
        "flowscope_node_runs": ("counter", ("workflow", "node", "outcome")),
        "flowscope_node_duration_seconds": ("histogram", ("workflow", "node", "outcome")),
        "flowscope_node_errors": ("counter", ("workflow", "node", "error_code", "error_type")),
        "flowscope_node_retries": ("counter", ("workflow", "node", "error_type")),
        "flowscope_node_attempts": ("histogram", ("workflow", "node")),
        "flowscope_nodes_running": ("gauge", ("workflow", "node")),
        "flowscope_workflow_runs": ("counter", ("workflow", "outcome")),
        "flowscope_workflow_duration_seconds": ("histogram", ("workflow", "outcome")),
        "flowscope_job_results": ("counter", ("workflow", "node", "result")),
        "flowscope_plugin_errors": ("counter", ("plugin", "hook")),
        "flowscope_resume_conflicts": ("counter", ("workflow",)),
        "flowscope_metrics_overflow": ("counter", ("metric",)),
        "flowscope_spans_not_exported": ("counter", ("reason",)),
    }
    assert {name: f.type for name, f in families.items()} == {k: v[0] for k, v in expected.items()}
    # every reason from the start, so that increase() sees the first loss
    reasons = {s.labels["reason"] for s in families["flowscope_spans_not_exported"].samples}
    assert reasons == {"queue_full", "export_failed"}
    for spec in INSTRUMENTS:
        base = spec.prom_name.removesuffix("_total")
        assert spec.labels == expected[base][1]
        collector = registry._names_to_collectors[spec.prom_name]
        assert tuple(collector._labelnames) == spec.labels
    assert registry._names_to_collectors["flowscope_node_duration_seconds"]._upper_bounds[:-1] == list(
        DURATION_BUCKETS
    )
    assert registry._names_to_collectors["flowscope_node_attempts"]._upper_bounds[:-1] == list(
        ATTEMPT_BUCKETS
    )
    assert DURATION_BUCKETS == (
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
        60,
        120,
        300,
        600,
        1800,
        3600,
        7200,
    )
    assert ATTEMPT_BUCKETS == (1, 2, 3, 4, 5, 7, 10)


def test_every_unit_keeps_the_prometheus_name_through_an_otel_collector():
    """The collector's Prometheus exporter adds a unit's suffix to a metric's name (``1`` on
    a gauge gives ``_ratio``) but drops an annotation (``{run}``): only seconds, which the
    names already end in, and annotations keep the names the dashboards and alerts read."""
    for spec in SPECS.values():
        assert (
            spec.unit == "s" and spec.prom_name.endswith("_seconds") or re.fullmatch(r"\{\w+\}", spec.unit)
        ), (
            spec.prom_name,
            spec.unit,
        )


async def test_otel_dotted_names_and_units(m):
    with pytest.raises(ZeroDivisionError):
        await m.runner(chain("orders", node(lambda x: 1 / 0, name="div"))).run(1)
    data = m.reader.get_metrics_data()
    metrics = {
        metric.name: metric
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert set(metrics) >= {
        "flowscope.node.runs", "flowscope.node.duration", "flowscope.node.errors", "flowscope.node.attempts",
        "flowscope.nodes.running", "flowscope.workflow.runs", "flowscope.workflow.duration",
    }  # fmt: skip
    assert metrics["flowscope.node.duration"].unit == "s"
    assert metrics["flowscope.workflow.duration"].unit == "s"
    assert list(metrics["flowscope.node.duration"].data.data_points[0].explicit_bounds) == list(
        DURATION_BUCKETS
    )
    assert metrics["flowscope.node.runs"].data.is_monotonic
    assert not metrics["flowscope.nodes.running"].data.is_monotonic
    assert {s.otel_name for s in INSTRUMENTS} == {
        "flowscope.node.runs", "flowscope.node.duration", "flowscope.node.errors", "flowscope.node.retries",
        "flowscope.node.attempts", "flowscope.nodes.running", "flowscope.workflow.runs",
        "flowscope.workflow.duration", "flowscope.job.results", "flowscope.plugin.errors",
        "flowscope.resume.conflicts", "flowscope.metrics.overflow",
    }  # fmt: skip


async def test_otel_only_backend_registers_nothing_in_prometheus():
    from prometheus_client import REGISTRY

    before = set(REGISTRY._names_to_collectors)
    reader = InMemoryMetricReader()
    plugin = MetricsPlugin(meter_provider=MeterProvider(metric_readers=[reader]))
    assert plugin.registry is None
    await Runner(chain("orders", ok), plugins=[plugin]).run(1)
    assert set(REGISTRY._names_to_collectors) == before
    samples = otel_as_prometheus(reader)
    assert (
        samples[
            ("flowscope_node_runs_total", (("node", "ok"), ("outcome", "success"), ("workflow", "orders")))
        ]
        == 1
    )
    assert samples[("flowscope_workflow_runs_total", (("outcome", "completed"), ("workflow", "orders")))] == 1


async def test_two_plugins_on_one_registry_share_the_collectors():
    registry = CollectorRegistry()
    a, b = MetricsPlugin(registry), MetricsPlugin(registry)
    await Runner(chain("orders", ok), plugins=[a]).run(1)
    await Runner(chain("orders", ok), plugins=[b]).run(2)
    assert (
        registry.get_sample_value(
            "flowscope_node_runs_total", {"workflow": "orders", "node": "ok", "outcome": "success"}
        )
        == 2
    )


async def test_two_plugins_on_one_meter_provider_share_the_instruments():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    a, b = MetricsPlugin(meter_provider=provider), MetricsPlugin(meter_provider=provider)
    await Runner(chain("orders", ok), plugins=[a]).run(1)
    await Runner(chain("orders", ok), plugins=[b]).run(2)
    samples = otel_as_prometheus(reader)
    assert (
        samples[
            ("flowscope_node_runs_total", (("node", "ok"), ("outcome", "success"), ("workflow", "orders")))
        ]
        == 2
    )


def test_default_registry_twice_does_not_crash():
    from prometheus_client import REGISTRY

    a, b = MetricsPlugin(), MetricsPlugin()
    assert a.registry is REGISTRY and b.registry is REGISTRY
    assert "flowscope_node_runs_total" in REGISTRY._names_to_collectors


def test_a_foreign_metric_with_the_same_name_is_a_clear_error():
    registry = CollectorRegistry()
    Counter("flowscope_node_runs", "someone else's", ["service"], registry=registry)
    with pytest.raises(ValueError, match="flowscope_node_runs_total.*not flowscope's"):
        MetricsPlugin(registry)


def test_plugin_name_and_repr():
    plugin = MetricsPlugin(CollectorRegistry(), meter_provider=MeterProvider())
    assert plugin.name == "metrics"
    assert repr(plugin) == "<MetricsPlugin prometheus+otel>"


def test_a_workflows_worker_series_start_at_0_on_its_first_claim_and_count_from_there():
    """The first claim of a workflow reports each of its worker series from 0 (each claim
    reason, leases lost, active), so increase() sees the first claim; later claims and
    releases move only their own series."""
    from flowscope.ownership import Lease, this_process
    from flowscope.store.base import Claim

    reg = CollectorRegistry()
    m = MetricsPlugin(registry=reg)
    owner = this_process()

    def claim(workflow, reason):
        return Claim(f"s-{workflow}-{reason}", workflow, reason, Lease("s", owner, 1, 0.0))

    def value(name, **labels):
        return reg.get_sample_value(name, labels)

    def claims(workflow):
        """The workflow's claims by reason: queued, answered, orphaned."""
        return [
            value("flowscope_worker_claims_total", workflow=workflow, reason=r)
            for r in ("queued", "answered", "orphaned")
        ]

    m.on_worker_claim(claim("a", "queued"))
    assert claims("a") == [1, 0, 0]
    assert value("flowscope_worker_leases_lost_total", workflow="a") == 0
    assert value("flowscope_worker_active_sessions", workflow="a") == 1
    assert value("flowscope_worker_claims_total", workflow="b", reason="queued") is None
    for _ in range(3):
        m.on_worker_claim(claim("a", "orphaned"))
        m.on_worker_release(claim("a", "orphaned"))
    m.on_worker_release(claim("a", "queued"))
    m.on_worker_claim(claim("b", "answered"))
    assert claims("a") == [1, 0, 3]
    assert value("flowscope_worker_active_sessions", workflow="a") == 0
    assert claims("b") == [0, 1, 0]
    assert value("flowscope_worker_leases_lost_total", workflow="b") == 0
    m.on_lease_lost("s", "b")
    assert value("flowscope_worker_leases_lost_total", workflow="b") == 1


async def test_series_started_at_0_never_take_a_real_series_room_nor_count_an_overflow():
    """A placeholder at 0 is made only while the metric holds under half its budget: three
    nodes under ``max_series=4`` each keep their own success series, and nothing overflows."""
    registry = CollectorRegistry()
    plugin = MetricsPlugin(registry=registry, max_series=4)
    a, b, c = (node(lambda x: x, name=n) for n in "abc")
    await Runner(Workflow("w", edges=[(START, a, b, c)]), MemoryEventStore(), [plugin]).run(1)
    runs = {
        (s.labels["node"], s.labels["outcome"]): s.value
        for f in registry.collect()
        for s in f.samples
        if s.name == "flowscope_node_runs_total"
    }
    assert {k: v for k, v in runs.items() if v} == {
        ("a", "success"): 1,
        ("b", "success"): 1,
        ("c", "success"): 1,
    }
    assert len(runs) <= 4
    overflow = [
        s for f in registry.collect() for s in f.samples if s.name == "flowscope_metrics_overflow_total"
    ]
    assert all(s.value == 0 for s in overflow), overflow
