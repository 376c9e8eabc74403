"""What the spans say, by convention and by flowscope's own names (docs/telemetry.md):
``gen_ai.*`` on every span, fully qualified ``error.type``, the schema URL, a run cut off by
its worker's death as an ERROR ending at its last heartbeat, job results as span events, and
a dead process's spans keeping its resource when another process ships them.

In process, with a fresh SDK provider and an in-memory exporter per test; the processes
(``flowscope worker`` killed with SIGKILL, a real OTLP receiver) are in tests/cli/test_cli_tracing.py.
"""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from flowscope import START, RetryConfig, Runner, Workflow, node
from flowscope.events import NodeStarted, RunStarted
from flowscope.export import session_spans
from flowscope.observability import TracingPlugin
from flowscope.observability.log_spans import RESOURCE_KEY, spans_of_log, trace_id_for
from flowscope.observability.shipping import Shipper, unshipped
from flowscope.store import MemoryEventStore


class CardDeclined(Exception):
    """A user's exception: its module is this test module."""


def provider(service: str = "conventions-test", **extra) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    p = TracerProvider(resource=Resource({"service.name": service, **extra}))
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p, exporter


def by_path(spans) -> dict:
    return {s.attributes["flowscope.node.path"]: s for s in spans if "flowscope.node.path" in s.attributes}


def orders_workflow() -> Workflow:
    charge = node(lambda x: x, name="charge")
    billing = Workflow("billing", edges=[(START, charge)])
    return Workflow("orders", edges=[(START, node(lambda x: x, name="fetch"), billing)])


# -- gen_ai.* ---------------------------------------------------------------------------------------


async def test_every_span_names_its_genai_operation_and_session_and_workflow_spans_their_workflow():
    p, exporter = provider()
    await Runner(orders_workflow(), store=MemoryEventStore(), plugins=[TracingPlugin(tracer_provider=p)]).run(
        1, session_id="sess-9"
    )
    spans = by_path(exporter.get_finished_spans())
    assert set(spans) == {"orders@1", "orders@1/fetch@1", "orders@1/billing@1", "orders@1/billing@1/charge@1"}
    for s in spans.values():
        assert s.attributes["gen_ai.conversation.id"] == "sess-9"
    ops = {
        path: (s.attributes["gen_ai.operation.name"], s.attributes.get("gen_ai.workflow.name"))
        for path, s in spans.items()
    }
    assert ops == {
        "orders@1": ("invoke_workflow", "orders"),  # the invocation and its root run
        "orders@1/billing@1": ("invoke_workflow", "billing"),  # a nested workflow
        "orders@1/fetch@1": ("invoke_node", None),  # a node, as ADK 2.x names its node spans
        "orders@1/billing@1/charge@1": ("invoke_node", None),
    }
    assert spans["orders@1/billing@1"].name == "invoke_workflow billing"


async def test_the_tracer_scope_carries_the_schema_url_of_the_conventions_followed_live_and_in_export():
    p, exporter = provider()
    store = MemoryEventStore()
    await Runner(orders_workflow(), store=store, plugins=[TracingPlugin(tracer_provider=p)]).run(
        1, session_id="s"
    )
    for spans in (exporter.get_finished_spans(), session_spans(store.read("s"))):
        assert {(s.instrumentation_scope.name, s.instrumentation_scope.schema_url) for s in spans} == {
            ("flowscope", "https://opentelemetry.io/schemas/1.41.0")
        }


# -- error.type -------------------------------------------------------------------------------------


async def test_error_type_is_the_fully_qualified_class_name_and_a_builtins_stays_bare():
    calls = []

    @node(retry=RetryConfig(max_attempts=2, initial_delay=0.001))
    def charge(x):
        calls.append(x)
        if len(calls) == 1:
            raise ValueError("amount is not a number")  # a builtin: bare
        raise CardDeclined("card ending 4242 declined")

    wf = Workflow("orders", edges=[(START, Workflow("billing", edges=[(START, charge)]))])
    p, exporter = provider()
    store = MemoryEventStore()
    with pytest.raises(CardDeclined):
        await Runner(wf, store=store, plugins=[TracingPlugin(tracer_provider=p)]).run(1, session_id="s")
    qualified = f"{__name__}.CardDeclined"
    for spans in (exporter.get_finished_spans(), session_spans(store.read("s"))):
        n = by_path(spans)
        failed = n["orders@1/billing@1/charge@1"]
        assert failed.attributes["error.type"] == qualified
        retry, exc = failed.events
        assert (retry.name, retry.attributes["error.type"]) == ("node.retry", "ValueError")
        assert (exc.name, exc.attributes["exception.type"]) == ("exception", qualified)
        for enclosing in ("orders@1/billing@1", "orders@1"):  # the nested workflow, and the invocation
            assert n[enclosing].status.status_code is StatusCode.ERROR
            assert n[enclosing].attributes["error.type"] == qualified
    # the log keeps error_type as the class name (RetryConfig.exceptions matches it), and the qualified name beside it
    (err,) = [e for e in store.read("s") if e.type == "node_error"]
    assert (err.error_type, err.error_qualname) == ("CardDeclined", qualified)


# -- a run cut off by its worker's death ---------------------------------------------------------------


async def cut_off_log(plugin=None):
    """The log of an invocation whose process died inside orders@1/billing@1/charge@1: the
    events up to that run's NodeStarted (what a SIGKILL there leaves)."""
    store = MemoryEventStore()
    await Runner(orders_workflow(), store=store, plugins=[plugin] if plugin else []).run(1, session_id="s")
    events = store.read("s")
    cut = next(i for i, e in enumerate(events) if isinstance(e, NodeStarted) and e.path.endswith("charge@1"))
    return events[: cut + 1]


async def test_a_run_cut_off_by_its_workers_death_is_an_error_that_ends_at_its_last_heartbeat():
    log = await cut_off_log()
    beat = log[-1].ts + 3.0  # the lease keeper's last heartbeat, 3 s after the run's last event
    n = {r.attributes["flowscope.node.path"]: r for r in spans_of_log(log, lost=True, alive_at=beat)}
    for path in (
        "orders@1/billing@1/charge@1",
        "orders@1/billing@1",
        "orders@1",
    ):  # the run, its workflow, the invocation
        r = n[path]
        assert (r.error, r.attributes["error.type"]) == (
            "the worker running this was lost: its process ended before the run did",
            "flowscope.WorkerLost",
        ), path
        assert r.end == beat and r.attributes["flowscope.export.incomplete"] is True
    assert n["orders@1/fetch@1"].error is None and n["orders@1/fetch@1"].end < beat  # it had ended: untouched
    # the same through the shipping walk (what the next process, or a follower, sends)
    records, _ = unshipped(log, 0, ended=True, alive_at=beat)
    assert {r.attributes["flowscope.node.path"]: (r.error is not None, r.end) for r in records} == {
        p: (r.error is not None, r.end) for p, r in n.items()
    }
    # a heartbeat older than the last event does not move the end back
    (late,) = [
        r
        for r in spans_of_log(log, lost=True, alive_at=log[0].ts)
        if r.attributes["flowscope.node.path"].endswith("charge@1")
    ]
    assert late.end == log[-1].ts


async def test_a_log_that_stops_while_its_owner_may_live_is_incomplete_not_an_error():
    log = await cut_off_log()
    for r in spans_of_log(
        log
    ):  # flowscope export of a session still running: nothing says its worker is gone
        assert r.error is None and "error.type" not in r.attributes


async def test_an_invocation_a_later_one_superseded_without_an_end_is_a_worker_lost_error():
    log = await cut_off_log()
    last = log[-1]
    resumed = RunStarted(
        session_id="s",
        invocation_id="inv-2",
        seq=last.seq + 1,
        ts=last.ts + 10,
        workflow="orders",
        resumed=True,
    )
    first = [
        r for r in spans_of_log([*log, resumed]) if r.trace_id == trace_id_for("s", log[0].invocation_id)
    ]
    charge = next(r for r in first if r.attributes["flowscope.node.path"].endswith("charge@1"))
    assert charge.attributes["error.type"] == "flowscope.WorkerLost" and charge.end == last.ts


# -- job results ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "result, verdict, count",
    [
        ({"success": True, "count": 0, "data": []}, "empty", 0),
        ({"success": False, "error": "token expired"}, "failed", None),
        ({"success": True, "count": 2, "data": [1, 2]}, "success", 2),
    ],
)
async def test_a_job_result_is_a_span_event_on_the_run_it_answers(result, verdict, count):
    jobs = []

    async def dispatch(job):
        jobs.append(job)

    @node
    async def enrich(ctx, rows):
        return await ctx.await_job(dispatch, payload=rows, expect_count=True)

    p, exporter = provider()
    store = MemoryEventStore()
    runner = Runner(
        Workflow("etl", edges=[(START, enrich)]), store=store, plugins=[TracingPlugin(tracer_provider=p)]
    )
    await runner.run([1], session_id="s")
    resumed = await runner.resume("s", jobs={jobs[0].job_id: result})
    expected = {"flowscope.job.id": jobs[0].job_id, "flowscope.job.result": verdict}
    if count is not None:
        expected["flowscope.job.count"] = count
    for spans in (exporter.get_finished_spans(), session_spans(store.read("s"))):
        (run,) = [s for s in spans if any(e.name == "job.result" for e in s.events)]
        assert run.name == "invoke_node enrich"
        assert run.context.trace_id == trace_id_for("s", resumed.invocation_id)  # the run the result answers
        (event,) = run.events
        assert dict(event.attributes) == expected
        assert run.start_time <= event.timestamp <= run.end_time
    assert resumed.status in ("completed", "paused")


# -- the resource of the process that ran it -----------------------------------------------------------


async def test_spans_shipped_for_a_dead_process_keep_its_resource():
    dead_provider, _ = provider(
        "orders-worker-a",
        **{"service.version": "1.2.3", "process.command_args": ["--db", "postgres://u:pw@h/db"]},
    )
    log = await cut_off_log(TracingPlugin(tracer_provider=dead_provider))
    recorded = json.loads(log[0].trace_context[RESOURCE_KEY])
    assert recorded["service.name"] == "orders-worker-a" and recorded["service.version"] == "1.2.3"
    assert not [
        k for k in recorded if k.startswith("process.")
    ]  # command lines and paths stay out of the log

    shipper_provider, shipped = provider("orders-worker-b")
    records, _ = unshipped(log, 0, ended=True)
    Shipper(shipper_provider).ship(records, None)
    spans = shipped.get_finished_spans()
    assert spans and {s.resource.attributes["service.name"] for s in spans} == {"orders-worker-a"}
    assert {s.resource.attributes.get("service.version") for s in spans} == {"1.2.3"}
    # and in an export, whatever --service-name says
    assert {s.resource.attributes["service.name"] for s in session_spans(log, "flowscope")} == {
        "orders-worker-a"
    }
    # an invocation that recorded none gets the shipping process's own (or export's service.name)
    bare = await cut_off_log()
    Shipper(shipper_provider).ship(unshipped(bare, 0, ended=True)[0], None)
    assert {s.resource.attributes["service.name"] for s in shipped.get_finished_spans()[len(spans) :]} == {
        "orders-worker-b"
    }
