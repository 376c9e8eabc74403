"""Spans rebuilt from the event log (flowscope.export, `flowscope export`) against the spans
the live TracingPlugin produced for the same runs."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections import defaultdict

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowscope import START, JoinNode, RetryConfig, Runner, Workflow, node
from flowscope.errors import StoreReadOnly
from flowscope.examples.demo import DemoDriver, batch_input
from flowscope.export import (
    INCOMPLETE,
    export_json,
    export_request,
    load_otlp_json,
    send_spans,
    session_spans,
    span_id_for,
    to_otlp_json,
    trace_id_for,
)
from flowscope.observability import TracingPlugin
from flowscope.observability.export import IDLE_WAIT_FACTOR, follow, ship_store
from flowscope.store import MemoryEventStore
from flowscope.store.sqlite import SqliteEventStore

STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


# --------------------------------------------------------------------------- helpers


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attrs(kvs):
    return {kv.key: _value(kv.value) for kv in kvs}


def tree_from_proto(request: ExportTraceServiceRequest) -> dict:
    """Spans keyed by (invocation id, path, occurrence): name, parent key, status, attributes, events."""
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    rows = [
        {
            "trace": s.trace_id,
            "id": s.span_id,
            "parent": s.parent_span_id or None,
            "name": s.name,
            "start": s.start_time_unix_nano,
            "status": STATUS[s.status.code],
            "message": s.status.message,
            "attrs": _attrs(s.attributes),
            "events": [(e.name, _attrs(e.attributes)) for e in s.events],
            "links": [(l.trace_id, l.span_id) for l in s.links],
        }
        for s in spans
    ]
    return _keyed(rows)


def tree_from_sdk(spans) -> dict:
    rows = [
        {
            "trace": s.context.trace_id.to_bytes(16, "big"),
            "id": s.context.span_id.to_bytes(8, "big"),
            "parent": s.parent.span_id.to_bytes(8, "big") if s.parent else None,
            "name": s.name,
            "start": s.start_time,
            "status": s.status.status_code.name,
            "message": s.status.description or "",
            "attrs": dict(s.attributes),
            "events": [(e.name, dict(e.attributes)) for e in s.events],
            "links": [
                (l.context.trace_id.to_bytes(16, "big"), l.context.span_id.to_bytes(8, "big"))
                for l in s.links
            ],
        }
        for s in spans
    ]
    return _keyed(rows)


def _keyed(rows) -> dict:
    inv_of_trace = {
        r["trace"]: r["attrs"]["flowscope.invocation.id"]
        for r in rows
        if "flowscope.invocation.id" in r["attrs"]
    }
    seen = defaultdict(int)
    key_of = {}
    for r in sorted(rows, key=lambda r: r["start"]):
        base = (inv_of_trace[r["trace"]], r["attrs"].get("flowscope.node.path", ""))
        seen[base] += 1
        key_of[(r["trace"], r["id"])] = (*base, seen[base])
    out = {}
    for r in rows:
        key = key_of[(r["trace"], r["id"])]
        parent = key_of.get((r["trace"], r["parent"])) if r["parent"] else None
        out[key] = {
            "name": r["name"],
            "parent": parent,
            "status": r["status"],
            "message": r["message"],
            "attrs": r["attrs"],
            "events": r["events"],
            "links": [key_of.get(l) for l in r["links"]],
        }
    return out


def live_provider():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def assert_same_spans(live: dict, exported: dict) -> None:
    assert set(exported) == set(live), sorted(set(live) ^ set(exported))
    for key, want in live.items():
        got = exported[key]
        assert got == want, f"{key}:\n live     {want}\n exported {got}"


# --------------------------------------------------------------------------- the demo workflow


@pytest.fixture(scope="module")
def demo_run():
    """Both demo batches (completed, and failed with PAYMENT_DECLINED) with the live TracingPlugin."""
    provider, exporter = live_provider()
    store = MemoryEventStore()
    driver = DemoDriver(store, [TracingPlugin(tracer_provider=provider)], echo=lambda _line: None)

    async def go():
        ok = await driver.run_batch("orders", batch_input("B-1"))
        bad = await driver.run_batch("declined", batch_input("B-2", "card_declined"))
        return ok, bad

    ok, bad = asyncio.run(go())
    assert (ok.status, bad.status) == ("completed", "failed")
    return store, exporter.get_finished_spans()


def _session_spans(spans, session_id):
    traces = {s.context.trace_id for s in spans if s.attributes.get("gen_ai.conversation.id") == session_id}
    return [s for s in spans if s.context.trace_id in traces]


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
@pytest.mark.parametrize("session_id", ["orders", "declined"])
def test_export_matches_the_live_spans_of_the_demo(demo_run, session_id):
    store, live_spans = demo_run
    events = store.read(session_id)
    exported = tree_from_proto(load_otlp_json(export_json(events)))
    live = tree_from_sdk(_session_spans(live_spans, session_id))
    assert len(live) >= 20  # one span per invocation and its top workflow's run
    assert_same_spans(live, exported)


def test_export_shows_what_the_demo_promises(demo_run):
    store, _ = demo_run
    spans = tree_from_proto(export_request(store.read("declined")))
    by_path = defaultdict(list)
    for key, s in spans.items():
        by_path[key[1]].append(s)
    (fetch,) = by_path["order_fulfilment@1/fetch_orders@1"]
    assert [e[0] for e in fetch["events"]] == ["node.retry"]
    assert fetch["events"][0][1]["flowscope.error.code"] == "INVENTORY_UNAVAILABLE"
    (declined,) = by_path["order_fulfilment@1/ship@1/charge_card@2"]
    assert declined["status"] == "ERROR" and "declined" in declined["message"]
    assert declined["attrs"]["flowscope.error.code"] == "PAYMENT_DECLINED"
    assert [e[0] for e in declined["events"]] == ["exception"]
    (ship,) = by_path["order_fulfilment@1/ship@1"]
    assert (
        ship["status"] == "ERROR" and ship["events"] == []
    )  # no second exception event (R5 in docs/design.md)
    assert ship["attrs"]["flowscope.error.origin_path"] == "order_fulfilment@1/ship@1/charge_card@2"
    waits = [
        s
        for s in by_path["order_fulfilment@1/enrich_addresses@1"]
        if s["attrs"]["flowscope.node.outcome"] == "waiting"
    ]
    assert waits and all(s["status"] == "UNSET" and s["attrs"]["flowscope.interrupt.id"] for s in waits)
    invocations = [s for s in spans.values() if "flowscope.invocation.id" in s["attrs"]]
    assert len(invocations) == 5
    assert sum(1 for s in invocations if s["links"]) == 4  # every resume links to the invocation before it
    ok = tree_from_proto(export_request(store.read("orders")))
    (marker,) = [s for k, s in ok.items() if k[1].endswith("send_confirmations@1")]
    assert (
        marker["attrs"]["flowscope.node.completed"] is True
        and marker["attrs"]["flowscope.node.has_output"] is False
    )


# --------------------------------------------------------------------------- edge cases, live vs export


def edge_workflow():
    state = {"flaky_child": 0}

    @node
    async def slow(ctx, x):
        await asyncio.sleep(5)
        return x

    @node
    async def boom(ctx, x):
        await asyncio.sleep(0.01)
        raise KeyError("missing")

    @node
    async def child(ctx, x):
        state["flaky_child"] += 1
        if state["flaky_child"] == 1:
            raise ValueError("child failed once")
        return x

    @node
    def first(ctx, x):
        return x

    inner = Workflow(
        "inner", edges=[(START, first, child)], retry=RetryConfig(max_attempts=2, initial_delay=0, jitter=0)
    )

    @node(timeout=0.02)
    async def too_slow(ctx, x):
        await asyncio.sleep(1)

    @node
    def pick(ctx, x):
        return x

    join = JoinNode("join")
    wf_ok = Workflow("edges_ok", edges=[(START, inner, pick)])
    wf_cancel = Workflow("edges_cancel", edges=[(START, (slow, boom), join)])
    wf_timeout = Workflow("edges_timeout", edges=[(START, too_slow)])
    return wf_ok, wf_cancel, wf_timeout


async def test_export_matches_live_for_nested_retry_cancellation_and_timeout():
    provider, exporter = live_provider()
    store = MemoryEventStore()
    wf_ok, wf_cancel, wf_timeout = edge_workflow()
    plugin = TracingPlugin(tracer_provider=provider)
    await Runner(wf_ok, store=store, plugins=[plugin]).run(1, session_id="ok")
    with pytest.raises(KeyError):
        await Runner(wf_cancel, store=store, plugins=[plugin]).run(1, session_id="cancel")
    with pytest.raises(Exception):
        await Runner(wf_timeout, store=store, plugins=[plugin]).run(1, session_id="timeout")
    live_all = exporter.get_finished_spans()
    for sid in ("ok", "cancel", "timeout"):
        exported = tree_from_proto(load_otlp_json(export_json(store.read(sid))))
        assert_same_spans(tree_from_sdk(_session_spans(live_all, sid)), exported)
    ok = tree_from_proto(export_request(store.read("ok")))
    child_runs = [k for k in ok if k[1] == "edges_ok@1/inner@1/child@1"]
    assert len(child_runs) == 2  # the nested workflow's retry ran the child again: two spans, two ids
    cancel = tree_from_proto(export_request(store.read("cancel")))
    (slow,) = [s for k, s in cancel.items() if k[1].endswith("slow@1")]
    assert slow["status"] == "UNSET" and slow["attrs"]["flowscope.node.outcome"] == "cancellation"
    timeout = tree_from_proto(export_request(store.read("timeout")))
    (slow,) = [s for k, s in timeout.items() if k[1].endswith("too_slow@1")]
    assert slow["attrs"]["flowscope.node.outcome"] == "timeout" and slow["status"] == "ERROR"


def everything_workflow():
    """One session with every kind of span end: a retry, a pause in a dynamic child of a
    nested workflow, then (on resume) a failure there that cancels its sibling."""
    state = {"flaky": 0}

    @node(retry=RetryConfig(max_attempts=2, initial_delay=0, jitter=0))
    def flaky(ctx, x):
        state["flaky"] += 1
        if state["flaky"] == 1:
            raise ValueError("flaky once")
        return x

    @node
    async def ask_then_fail(ctx, x):
        answer = await ctx.request_input("ok?", interrupt_id="q1")
        await asyncio.sleep(0.01)
        raise RuntimeError(f"refused: {answer}")

    @node
    async def spawn(ctx, x):
        return await ctx.run_node(ask_then_fail, x)  # a dynamic child

    @node
    async def slow(ctx, x):
        await ctx.request_input("wait?", interrupt_id="q2")
        await asyncio.sleep(5)  # cancelled when its sibling fails
        return x

    @node
    def after(ctx, x):
        return x

    inner = Workflow("inner_all", edges=[(START, (spawn, slow), JoinNode("inner_join"))])
    return Workflow("everything", edges=[(START, flaky, inner, after)])


def _event_times_from_proto(request):
    return sorted(
        (s.name, e.name, e.time_unix_nano)
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        for e in s.events
    )


def _event_times_from_sdk(spans):
    return sorted((s.name, e.name, e.timestamp) for s in spans for e in s.events)


async def test_live_and_exported_spans_agree_for_retry_pause_dynamic_child_failure_and_cancellation():
    provider, exporter = live_provider()
    store = MemoryEventStore()
    runner = Runner(everything_workflow(), store=store, plugins=[TracingPlugin(tracer_provider=provider)])
    paused = await runner.run(1, session_id="all")
    assert paused.status == "paused"
    with pytest.raises(RuntimeError):
        await runner.resume("all", inputs={"q1": "no", "q2": "go"})
    live_spans = _session_spans(exporter.get_finished_spans(), "all")
    request = load_otlp_json(export_json(store.read("all")))
    live, exported = tree_from_sdk(live_spans), tree_from_proto(request)
    assert_same_spans(live, exported)
    # span events carry the time of the event they come from, live and exported alike
    assert _event_times_from_sdk(live_spans) == _event_times_from_proto(request)

    # what the session had to show, so that the comparison above is not vacuous
    outcomes = {(k[0], k[1]): s["attrs"].get("flowscope.node.outcome") for k, s in exported.items() if k[1]}
    (first,) = [
        k[0] for k, s in exported.items() if "flowscope.invocation.id" in s["attrs"] and not s["links"]
    ]
    (second,) = {k[0] for k in exported} - {first}
    by_path = {}
    for (inv, path, _n), s in exported.items():
        by_path.setdefault(path, []).append((inv, s))
    (flaky,) = by_path["everything@1/flaky@1"]
    assert [e[0] for e in flaky[1]["events"]] == ["node.retry"] and flaky[1]["attrs"][
        "flowscope.node.attempt_count"
    ] == 2
    child = "everything@1/inner_all@1/spawn@1/ask_then_fail@1"
    assert sorted(s["attrs"]["flowscope.node.outcome"] for _inv, s in by_path[child]) == [
        "failure",
        "waiting",
    ]
    failed = next(s for _inv, s in by_path[child] if s["status"] == "ERROR")
    assert [e[0] for e in failed["events"]] == ["exception"] and failed["message"] == "refused: no"
    assert failed["parent"][1] == "everything@1/inner_all@1/spawn@1"  # the dynamic child under its parent
    spawn_spans = [s for _inv, s in by_path["everything@1/inner_all@1/spawn@1"]]
    assert {s["name"] for s in spawn_spans} == {"invoke_node spawn"}
    (nested,) = {s["name"] for _inv, s in by_path["everything@1/inner_all@1"]}
    assert nested == "invoke_workflow inner_all"
    propagated = [s for _inv, s in by_path["everything@1/inner_all@1"] if s["status"] == "ERROR"]
    assert propagated and propagated[0]["events"] == [] and propagated[0]["message"] == "refused: no"
    assert outcomes[(second, "everything@1/inner_all@1/slow@1")] == "cancellation"
    assert outcomes[(first, "everything@1/inner_all@1/slow@1")] == "waiting"
    resumed = exported[(second, "everything@1", 1)]  # the invocation and its top workflow's run: one span
    assert (
        resumed["links"] == [(first, "everything@1", 1)]
        and resumed["attrs"]["flowscope.run.outcome"] == "failed"
    )


# --------------------------------------------------------------------------- determinism and format


def test_a_second_export_is_byte_identical_and_ids_are_derived(demo_run):
    store, _ = demo_run
    events = store.read("orders")
    first = export_json(events)
    assert export_json(store.read("orders")) == first
    req = load_otlp_json(first)
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    inv = events[0].invocation_id
    assert spans[0].trace_id == trace_id_for("orders", inv).to_bytes(16, "big")
    assert spans[0].span_id == span_id_for("orders", inv).to_bytes(8, "big")
    assert all(len(s.trace_id) == 16 and len(s.span_id) == 8 for s in spans)
    assert len({s.span_id for s in spans}) == len(spans)
    assert to_otlp_json(req) == first  # the JSON round-trips through the protobuf class
    # the same log under another session id gives other ids
    assert trace_id_for("other", inv) != trace_id_for("orders", inv)


def test_otlp_json_uses_hex_ids_and_integer_enums_and_parses_with_protobuf(demo_run):
    import json

    store, _ = demo_run
    text = export_json(store.read("orders"))
    d = json.loads(text)
    span = d["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    assert len(span["traceId"]) == 32 and int(span["traceId"], 16)
    assert len(span["spanId"]) == 16 and len(span["parentSpanId"]) == 16
    assert span["kind"] == 1
    # the plain protobuf mapping (base64 ids) parses with json_format too, to the same message
    req = load_otlp_json(text)
    plain = json_format.MessageToJson(req)
    assert json_format.Parse(plain, ExportTraceServiceRequest()) == req
    assert load_otlp_json(plain) == req


def test_a_crashed_run_is_exported_as_incomplete():
    store = MemoryEventStore()

    @node
    def a(x):
        return x

    @node
    def b(x):
        return x

    asyncio.run(Runner(Workflow("crashy", edges=[(START, a, b)]), store=store).run(1, session_id="s"))
    events = store.read("s")
    # cut the log right after b's NodeStarted: what a killed process leaves behind
    cut = next(i for i, e in enumerate(events) if e.type == "node_started" and e.node == "b")
    spans = session_spans(events[: cut + 1])
    by_name = {s.name: s for s in spans}
    assert by_name["invoke_node b"].attributes[INCOMPLETE] is True
    assert "flowscope.node.outcome" not in by_name["invoke_node b"].attributes
    assert by_name["invoke_node a"].attributes["flowscope.node.outcome"] == "success"
    assert by_name["invoke_workflow crashy"].attributes.get(INCOMPLETE) is True


# --------------------------------------------------------------------------- sending


class _Sink(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        type(self).received.append((self.path, self.headers.get("Content-Type"), req))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args):
        pass


@pytest.fixture
def otlp_sink():
    _Sink.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    t = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )  # a quick shutdown()
    t.start()
    yield f"http://127.0.0.1:{server.server_port}", _Sink.received
    server.shutdown()
    server.server_close()


def test_send_spans_posts_the_same_request_with_the_real_exporter(demo_run, otlp_sink):
    url, received = otlp_sink
    store, _ = demo_run
    events = store.read("declined")
    send_spans(session_spans(events), url, "http/protobuf", timeout=5)
    ((path, ctype, req),) = received
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    assert req == export_request(events)


# ------------------------------------------------------------- a follower's idle passes


class _SlowScan(SqliteEventStore):
    """A store whose list of sessions to ship takes ``scan_s`` (one of a million sessions),
    noting when each pass began."""

    def __init__(self, path, scan_s: float) -> None:
        super().__init__(path)
        self.scan_s = scan_s
        self.scans: list[float] = []

    def unexported(self):
        self.scans.append(time.monotonic())
        time.sleep(self.scan_s)
        return super().unexported()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_an_idle_follower_spends_at_most_a_tenth_of_its_time_scanning(tmp_path):
    # With a pass every interval whatever the pass cost, a follower beside a million
    # sessions (0.4 s a pass) spent 30% of a core reading watermarks that had not moved.
    store = _SlowScan(tmp_path / "f.db", scan_s=0.05)
    follow(store, InMemorySpanExporter(), interval=0.01, rounds=4)
    gaps = [b - a for a, b in zip(store.scans, store.scans[1:])]
    assert len(gaps) == 3
    assert all(g >= 0.05 * (1 + IDLE_WAIT_FACTOR) for g in gaps), gaps
    store.close()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_follower_with_spans_to_send_keeps_its_interval(tmp_path):
    store = _SlowScan(tmp_path / "f.db", scan_s=0.05)
    exporter = InMemorySpanExporter()
    wf = Workflow("w", edges=[(START, node(lambda x: x + 1, name="a"))])

    def more(n: int) -> None:  # a new session's spans to send at every pass
        if n:
            asyncio.run(Runner(wf, store=store).run(0, session_id=f"s{len(store.scans)}"))

    more(1)
    follow(store, exporter, interval=0.01, rounds=3, on_sent=more)
    gaps = [b - a for a, b in zip(store.scans, store.scans[1:])]
    assert len(exporter.get_finished_spans()) == 3 * 2  # each pass sent a session's two spans
    assert all(g < 0.05 * (1 + IDLE_WAIT_FACTOR) for g in gaps), gaps
    store.close()


class _NoWatermarks(SqliteEventStore):
    """A store whose role may not write the span watermarks until ``allow`` is set."""

    allow = False

    def set_exported_seqs(self, seqs):
        if not self.allow:
            raise StoreReadOnly(
                "this role may not advance the span watermarks (42501): grant it the privileges"
            )
        return super().set_exported_seqs(seqs)


def test_spans_sent_whose_watermark_the_store_refused_are_not_sent_again_by_that_follower(tmp_path):
    store = _NoWatermarks(tmp_path / "f.db")
    wf = Workflow("w", edges=[(START, node(lambda x: x + 1, name="a"))])
    asyncio.run(Runner(wf, store=store).run(0, session_id="s"))
    exporter = InMemorySpanExporter()
    shipped: dict[str, int] = {}
    for _ in range(3):  # each pass: the spans are out, their watermark refused
        with pytest.raises(StoreReadOnly):
            ship_store(store, exporter, shipped=shipped)
    assert len(exporter.get_finished_spans()) == 2  # the session's two spans, once
    assert shipped == {"s": store.last_seq("s")}
    asyncio.run(Runner(wf, store=store).run(1, session_id="t"))  # another session: its spans alone
    with pytest.raises(StoreReadOnly):
        ship_store(store, exporter, shipped=shipped)
    assert len(exporter.get_finished_spans()) == 4
    store.allow = True  # the grant: the watermark goes on record, and the entry goes
    assert ship_store(store, exporter, shipped=shipped) == 0
    assert shipped == {} and store.unexported() == []
    assert len(exporter.get_finished_spans()) == 4
    store.close()
