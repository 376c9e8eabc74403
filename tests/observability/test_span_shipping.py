"""Spans from the log: the context a node body sees is the context of the span
that is exported, live or by the next process after a SIGKILL, exactly once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, SamplingResult
from opentelemetry.trace import TraceState
from test_otlp_export import attrs, clean_otel_env, otelsink  # noqa: F401  (the real OTLP receiver and its fixture)

from commands import cli_env, run_cli, start_cli
from conftest import asking
from flowscope import START, JoinNode, Runner, Workflow, node
from flowscope.examples.demo import DemoDriver, batch_input
from flowscope.export import session_spans
from flowscope.observability import TracingPlugin
from flowscope.observability.export import ship_store
from flowscope.observability.shipping import Ledger, WatermarkExporter
from flowscope.store import MemoryEventStore
from flowscope.store.sqlite import SqliteEventStore
from waiting import wait_for

WORKER = str(Path(__file__).resolve().parents[1] / "span_kill_worker.py")


def provider_with(exporter) -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p


# --------------------------------------------------------------------------- SIGKILL


def _contexts(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "k, shipper", [(1, "resume"), (3, "resume"), (6, "resume"), (3, "follow"), (2, "serve-metrics")]
)
def test_sigkill_after_k_node_runs_every_finished_span_reaches_the_receiver_once_with_the_ids_its_body_saw(
    k, shipper, tmp_path, monkeypatch
):
    db, contexts = tmp_path / "flowscope.db", tmp_path / "contexts.jsonl"
    env = cli_env(OTEL_BSP_SCHEDULE_DELAY="20")
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        args = [sys.executable, WORKER, str(db), "s", endpoint, str(contexts)]
        proc = subprocess.Popen(
            [*args, "run", str(k + 1)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            # node k+1 has written its context and hangs: k node runs have finished
            wait_for(lambda: len(_contexts(contexts)) == k + 1, 60, f"{k} node runs")
            time.sleep(0.1)  # let the batch processor export some of them
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        before = {s.span_id for _r, _sc, s in collected.spans()}
        store = SqliteEventStore(db)
        watermark = store.exported_seq("s")
        store.close()
        if shipper == "resume":  # the next process to open the session ships what the killed one did not
            done = subprocess.run([*args, "resume"], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["completed", "8"]
        elif (
            shipper == "follow"
        ):  # flowscope export --follow tails the store (twice over: the second pass sends nothing)
            done = run_cli(
                *("export", "--follow", "--rounds", "2", "--interval", "0.05"),
                *("--db", str(db), "--otlp-endpoint", endpoint),
                env=env,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
        elif shipper == "serve-metrics":  # the store's metrics server ships them too, while it serves
            server = start_cli(
                *("serve-metrics", "--port", "0", "--db", str(db)),
                *("--otlp-endpoint", endpoint, "--ship-interval", "50ms"),
                env=env,
            )
            try:
                wait_for(
                    lambda: len(collected.spans()) >= k + 2,
                    60,
                    "serve-metrics to ship the killed run's spans",
                )
                time.sleep(0.3)  # a few more passes: nothing more is sent
            finally:
                server.send_signal(signal.SIGTERM)
                out, err = server.communicate(timeout=30)
            assert server.returncode == 0, err
            assert "shipping spans to" in out and "stopped" in out, out
        received = [s for _r, _sc, s in collected.spans()]

    ids = [(s.trace_id.hex(), s.span_id.hex()) for s in received]
    assert len(ids) == len(set(ids)), "a span reached the receiver twice"
    by_path: dict[tuple[str, str], object] = {}
    for s in received:
        a = attrs(s.attributes)
        by_path[(s.trace_id.hex(), a.get("flowscope.node.path", ""))] = s
    seen = _contexts(contexts)
    killed = [c for c in seen if c["pid"] == proc.pid]
    assert [c["path"] for c in killed] == [f"killed_chain@1/n{i}@1" for i in range(1, k + 2)]
    for c in seen:  # every node body's context is the context of a span the receiver got
        span = by_path[(c["trace_id"], c["path"])]
        assert span.span_id.hex() == c["span_id"]
        assert c["traceparent"] == f"00-{c['trace_id']}-{c['span_id']}-01"
    # the killed process: its k finished runs, the cut-off run and its invocation (incomplete)
    dead_trace = killed[0]["trace_id"]
    dead = [s for s in received if s.trace_id.hex() == dead_trace]
    assert len(dead) == k + 2
    for c in killed[:k]:
        a = attrs(by_path[(dead_trace, c["path"])].attributes)
        assert a["flowscope.node.outcome"] == "success" and "flowscope.export.incomplete" not in a
    cut = attrs(by_path[(dead_trace, killed[k]["path"])].attributes)
    assert cut["flowscope.export.incomplete"] is True and "flowscope.node.outcome" not in cut
    (inv,) = [s for s in dead if attrs(s.attributes).get("gen_ai.operation.name") == "invoke_workflow"]
    assert attrs(inv.attributes)["flowscope.export.incomplete"] is True
    if shipper in ("follow", "serve-metrics"):
        assert len(received) == k + 2
        return
    # the resume: a new trace linked to the killed one, the cut-off run recovered
    (resumed,) = [s for s in received if s.trace_id.hex() != dead_trace and not s.parent_span_id]
    assert [(l.trace_id.hex(), l.span_id.hex()) for l in resumed.links] == [(dead_trace, inv.span_id.hex())]
    assert len([s for s in received if s.trace_id == resumed.trace_id]) == 1 + (8 - k)
    # both ways of shipping were used once the batch processor had time: some spans went live
    if k >= 3:
        assert before and watermark > 0
        assert before < {s.span_id for s in dead}


# --------------------------------------------------------------------------- child spans, context


async def test_a_span_the_node_body_starts_is_the_child_of_the_node_span():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    user_tracer = provider.get_tracer("http-client")
    seen = {}

    @node
    async def call(ctx, x):
        with user_tracer.start_as_current_span("GET /inventory") as mine:
            seen["mine"] = mine.get_span_context()
            seen["parent"] = mine.parent
        seen["current"] = trace.get_current_span().get_span_context()
        return x

    wf = Workflow("w", edges=[(START, node(lambda x: x, name="pre"), call)])
    await Runner(wf, store=MemoryEventStore(), plugins=[TracingPlugin(tracer_provider=provider)]).run(
        1, session_id="s"
    )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"invoke_workflow w", "invoke_node pre", "invoke_node call", "GET /inventory"}
    node_span, child = spans["invoke_node call"], spans["GET /inventory"]
    assert child.parent.span_id == node_span.context.span_id == seen["current"].span_id
    assert child.context.trace_id == node_span.context.trace_id == spans["invoke_workflow w"].context.trace_id
    assert node_span.parent.span_id == spans["invoke_workflow w"].context.span_id
    assert child.start_time >= node_span.start_time and child.end_time <= node_span.end_time


async def test_an_invocation_started_in_a_callers_span_joins_its_trace_live_and_in_export():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    store = MemoryEventStore()
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"))])
    with provider.get_tracer("app").start_as_current_span("POST /orders") as outer:
        await Runner(wf, store=store, plugins=[TracingPlugin(tracer_provider=provider)]).run(
            1, session_id="s"
        )
    live = {s.name: s for s in exporter.get_finished_spans()}
    inv = live["invoke_workflow w"]
    assert inv.context.trace_id == outer.get_span_context().trace_id
    assert inv.parent.span_id == outer.get_span_context().span_id
    exported = {s.name: s for s in session_spans(store.read("s"))}
    assert exported["invoke_workflow w"].parent.span_id == inv.parent.span_id
    assert exported["invoke_node a"].context == live["invoke_node a"].context


class _StatefulSampler(Sampler):
    """Samples every trace in, with a vendor's tracestate entry."""

    def should_sample(
        self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None
    ):
        return SamplingResult(Decision.RECORD_AND_SAMPLE, None, TraceState([("vendor", "k1")]))

    def get_description(self) -> str:
        return "stateful"


async def test_a_live_span_has_exactly_the_context_its_log_record_gives_in_export():
    # The live walk takes the invocation's context from the plugin rather than reading
    # RunStarted's record back: the two must agree, tracestate and caller's span included.
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=_StatefulSampler())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = MemoryEventStore()
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"), node(lambda x: x, name="b"))])
    runner = Runner(wf, store=store, plugins=[TracingPlugin(tracer_provider=provider)])
    await runner.run(1, session_id="alone")
    with provider.get_tracer("app").start_as_current_span("POST /orders"):
        await runner.run(1, session_id="called")
    for sid in ("alone", "called"):
        live = {
            s.name: s
            for s in exporter.get_finished_spans()
            if s.attributes.get("gen_ai.conversation.id") == sid
        }
        exported = {s.name: s for s in session_spans(store.read(sid))}
        assert set(live) == set(exported) == {"invoke_workflow w", "invoke_node a", "invoke_node b"}
        for name, span in live.items():
            assert span.context == exported[name].context, name
            assert span.context.trace_state.get("vendor") == "k1"
            assert (span.parent and span.parent.span_id) == (
                exported[name].parent and exported[name].parent.span_id
            )
    finished = exporter.get_finished_spans()
    (caller,) = [s for s in finished if s.name == "POST /orders"]
    (called,) = [
        s
        for s in finished
        if s.name == "invoke_workflow w" and s.attributes["gen_ai.conversation.id"] == "called"
    ]
    assert called.parent.span_id == caller.context.span_id
    assert called.context.trace_id == caller.context.trace_id


async def test_a_sampled_out_trace_emits_nothing_and_says_so_in_its_traceparent():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen = []

    @node
    def a(ctx, x):
        seen.append(ctx.trace_context["traceparent"])
        return x

    store = MemoryEventStore()
    await Runner(
        Workflow("w", edges=[(START, a)]), store=store, plugins=[TracingPlugin(tracer_provider=provider)]
    ).run(1, session_id="s")
    assert exporter.get_finished_spans() == ()
    assert seen[0].endswith("-00")
    assert store.read("s")[0].trace_context["traceparent"].endswith("-00")


async def test_without_a_sampler_the_log_records_the_callers_decision_or_sampled_for_a_follower():
    # A no-op provider (the API's default) decides nothing: recording "sampled out" made a
    # span follower drop every span of the runs it is there to ship.
    store = MemoryEventStore()
    runner = Runner(
        Workflow("w", edges=[(START, node(lambda x: x, name="a"))]),
        store=store,
        plugins=[TracingPlugin(tracer_provider=trace.NoOpTracerProvider())],
    )
    await runner.run(1, session_id="s")
    assert store.read("s")[0].trace_context["traceparent"].endswith("-01")
    exporter = InMemorySpanExporter()
    assert ship_store(store, exporter) == 2
    caller = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(0))
    with trace.use_span(trace.NonRecordingSpan(caller)):  # a caller that sampled its trace out
        await runner.run(1, session_id="t")
    recorded = store.read("t")[0].trace_context["traceparent"]
    assert recorded.startswith(f"00-{0xABC:032x}-") and recorded.endswith("-00")
    assert ship_store(store, exporter) == 0


# --------------------------------------------------------------------------- live == export, field for field


def _fields(s) -> dict:
    return {
        "name": s.name,
        "context": (s.context.trace_id, s.context.span_id, int(s.context.trace_flags)),
        "parent": (s.parent.trace_id, s.parent.span_id) if s.parent else None,
        "kind": s.kind,
        "start": s.start_time,
        "end": s.end_time,
        "attributes": dict(s.attributes),
        "status": (s.status.status_code, s.status.description),
        "events": [(e.name, dict(e.attributes), e.timestamp) for e in s.events],
        "links": [(l.context.trace_id, l.context.span_id, dict(l.attributes or {})) for l in s.links],
        "scope": (s.instrumentation_scope.name, s.instrumentation_scope.version),
    }


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_the_live_spans_of_the_demo_are_the_spans_export_rebuilds_field_for_field():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    store = MemoryEventStore()
    driver = DemoDriver(store, [TracingPlugin(tracer_provider=provider)], echo=lambda _line: None)

    async def go():
        await driver.run_batch("orders", batch_input("B-1"))
        await driver.run_batch("declined", batch_input("B-2", "card_declined"))

    asyncio.run(go())
    live = sorted((_fields(s) for s in exporter.get_finished_spans()), key=lambda f: f["context"])
    rebuilt = sorted(
        (_fields(s) for sid in ("orders", "declined") for s in session_spans(store.read(sid))),
        key=lambda f: f["context"],
    )
    assert len(live) >= 20 and any(f["events"] for f in live) and any(f["links"] for f in live)
    assert live == rebuilt


# --------------------------------------------------------------------------- the watermark


class _Flaky(SpanExporter):
    def __init__(self) -> None:
        self.ok = True
        self.got: list = []

    def export(self, spans):
        self.got.extend(spans)
        return SpanExportResult.SUCCESS if self.ok else SpanExportResult.FAILURE


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
async def test_the_watermark_moves_only_over_spans_an_exporter_accepted(store_kind, tmp_path):
    store = MemoryEventStore() if store_kind == "memory" else SqliteEventStore(tmp_path / "f.db")
    inner = _Flaky()
    ledger = Ledger()
    provider = provider_with(WatermarkExporter(inner, ledger))
    plugin = TracingPlugin(tracer_provider=provider)
    assert plugin.shipper.ledger is ledger
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"), node(lambda x: x, name="b"))])
    await Runner(wf, store=store, plugins=[plugin]).run(1, session_id="ok")
    assert plugin.force_flush()  # the watermarks are written off the exporter's thread: flushed here
    assert store.exported_seq("ok") == store.last_seq("ok")  # RunFinished ended the last span
    inner.ok = False
    await Runner(wf, store=store, plugins=[plugin]).run(1, session_id="refused")
    assert plugin.force_flush()
    assert store.exported_seq("refused") == 0
    assert len(inner.got) == 6
    # a provider without a WatermarkExporter records nothing, so a resume ships nothing again
    plain = InMemorySpanExporter()
    other = TracingPlugin(tracer_provider=provider_with(plain))
    assert other.shipper.ledger is None


def _branches() -> Workflow:
    """``b`` and ``c`` in parallel, joined: ``b`` completes while ``c`` runs."""

    @node
    def b(x):
        return x

    @node
    async def c(x):
        await asyncio.sleep(0.01)
        return x

    j = JoinNode("j")
    return Workflow("w", edges=[(START, (b, c)), (b, j), (c, j)])


def _killed_after_a_shipped_completion(store) -> list:
    """Leave in ``store`` the log of a process killed while branch ``c`` ran, right after
    its sibling ``b`` completed, with every span that log ended shipped (its watermark at
    its last event, ``b``'s completion): only ``c``, the workflow and the invocation are
    left open. Returns the spans export makes of it as a dead process's (``lost``)."""
    whole = MemoryEventStore()
    asyncio.run(Runner(_branches(), store=whole).run(1, session_id="s"))
    events = whole.read("s")
    cut = next(i for i, e in enumerate(events) if e.type == "node_completed" and e.node == "b")
    assert any(e.type == "node_started" and e.node == "c" for e in events[:cut])
    store.append("s", events[: cut + 1], 0)
    store.set_exported_seq("s", events[cut].seq)
    return [sp for sp in session_spans(events[: cut + 1], lost=True) if sp.attributes.get("error.type")]


LOST = "flowscope.WorkerLost"


def test_a_resume_ships_the_runs_a_kill_cut_off_after_a_completion_it_had_shipped(tmp_path):
    store = SqliteEventStore(tmp_path / "f.db")
    cut_off = _killed_after_a_shipped_completion(store)
    assert sorted(sp.name for sp in cut_off) == ["invoke_node c", "invoke_workflow w"]
    inner = InMemorySpanExporter()
    plugin = TracingPlugin(tracer_provider=provider_with(WatermarkExporter(inner, Ledger())))
    assert asyncio.run(Runner(_branches(), store=store, plugins=[plugin]).resume("s")).status == "completed"
    assert plugin.force_flush()
    lost = [sp for sp in inner.get_finished_spans() if sp.attributes.get("error.type") == LOST]
    assert sorted((sp.name, sp.context.span_id) for sp in lost) == sorted(
        (sp.name, sp.context.span_id) for sp in cut_off
    )
    resumed = next(sp for sp in inner.get_finished_spans() if sp.attributes.get("flowscope.run.resumed"))
    assert [link.context.span_id for link in resumed.links] == [
        sp.context.span_id for sp in cut_off if sp.name == "invoke_workflow w"
    ]
    assert store.exported_seq("s") == store.last_seq("s")


def test_a_follower_ships_the_runs_a_dead_owner_cut_off_after_a_completion_once(tmp_path):
    store = SqliteEventStore(tmp_path / "f.db")
    cut_off = _killed_after_a_shipped_completion(store)  # no owner holds it: it is gone
    exporter = InMemorySpanExporter()
    assert ship_store(store, exporter) == 2
    assert ship_store(store, exporter) == 0  # once: its watermark is past them now
    got = exporter.get_finished_spans()
    assert sorted((sp.name, sp.context.span_id, sp.attributes["error.type"]) for sp in got) == sorted(
        (sp.name, sp.context.span_id, LOST) for sp in cut_off
    )


def test_after_a_refused_export_the_watermark_of_that_session_stays_put_in_this_process():
    from flowscope.observability.log_spans import SpanRecord

    store = MemoryEventStore()
    ledger = Ledger()

    def rec(span_id: int, seq: int) -> SpanRecord:
        return SpanRecord("s", 1, span_id, None, 0.0, 1.0, {}, end_seq=seq, session_id="x")

    class Ctx:
        def __init__(self, span_id: int) -> None:
            self.context = type("C", (), {"trace_id": 1, "span_id": span_id})()

    ledger.register(store, [rec(1, 3)])
    ledger.exported([Ctx(1)], ok=False)
    ledger.register(store, [rec(2, 7)])
    ledger.exported([Ctx(2)], ok=True)
    assert ledger.flush(5)
    assert store.exported_seq("x") == 0  # the refused span at seq 3 is sent again by the next opener
    ledger.register(store, [rec(3, 2)])
    ledger.exported([Ctx(3)], ok=True)
    assert ledger.flush(5)
    assert store.exported_seq("x") == 0
    # another session's accepted spans do advance its watermark: the flush above waited for writes
    ledger.register(store, [SpanRecord("s", 1, 4, None, 0.0, 1.0, {}, end_seq=5, session_id="y")])
    ledger.exported([Ctx(4)], ok=True)
    assert ledger.flush(5)
    assert store.exported_seq("y") == 5


async def test_after_a_refusal_the_next_catch_up_in_this_process_lets_the_watermark_move_again(tmp_path):
    """A session an exporter refused spans of is sent from its watermark by the next opener;
    when that is this process (a worker that keeps the session), its catch-up re-sends them,
    and the watermark follows the exports again: nothing is sent a third time at each
    later resume, and nothing waits for a follower to send it again."""

    ask1, ask2 = asking("ask1", "q1"), asking("ask2", "q2")

    store = SqliteEventStore(tmp_path / "f.db")
    inner = _Flaky()
    plugin = TracingPlugin(tracer_provider=provider_with(WatermarkExporter(inner, Ledger())))
    runner = Runner(Workflow("w", edges=[(START, ask1, ask2)]), store=store, plugins=[plugin])
    inner.ok = False  # the collector is down for the first invocation
    await runner.run(None, session_id="s")
    assert plugin.force_flush() and store.exported_seq("s") == 0
    refused = {sp.context.span_id for sp in inner.got}
    inner.ok = True
    await runner.resume("s", inputs={"q1": 1})  # its catch-up sends the refused spans again
    assert plugin.force_flush()
    assert store.exported_seq("s") == store.last_seq("s")
    await runner.resume("s", inputs={"q2": 2})
    assert plugin.force_flush()
    assert store.exported_seq("s") == store.last_seq("s")
    sent: dict[int, int] = {}
    for sp in inner.got:
        sent[sp.context.span_id] = sent.get(sp.context.span_id, 0) + 1
    assert refused and {i for i, n in sent.items() if n > 1} == refused  # once refused, once accepted
    assert all(n <= 2 for n in sent.values()), sent


class _CountingStore(SqliteEventStore):
    """A SQLite store that counts its watermark writes (each is a transaction)."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.watermark_calls: list[int] = []

    def set_exported_seqs(self, marks) -> None:
        self.watermark_calls.append(len(marks))
        super().set_exported_seqs(marks)


async def test_one_export_of_many_sessions_spans_advances_their_watermarks_in_one_transaction(tmp_path):
    # One write per session was one SQLite commit per session per export, on the exporter's
    # thread, holding the store against the appends of the event loop.
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    store = _CountingStore(tmp_path / "f.db")
    inner = InMemorySpanExporter()
    provider = TracerProvider()
    ledger = Ledger()
    provider.add_span_processor(
        BatchSpanProcessor(
            WatermarkExporter(inner, ledger),
            max_queue_size=10_000,
            max_export_batch_size=10_000,
            schedule_delay_millis=60_000,
        )
    )
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"), node(lambda x: x, name="b"))])
    runner = Runner(wf, store=store, plugins=[TracingPlugin(tracer_provider=provider)])
    sids = [f"s{i}" for i in range(100)]
    await asyncio.gather(*(runner.run(1, session_id=s) for s in sids))
    assert provider.force_flush() and ledger.flush(10)
    assert len(inner.get_finished_spans()) == 100 * 3
    assert [store.exported_seq(s) for s in sids] == [
        store.last_seq(s) for s in sids
    ]  # every span shipped, on record
    assert sum(store.watermark_calls) == 100 and len(store.watermark_calls) <= 2, store.watermark_calls
    provider.shutdown()


def test_watermarks_advance_together_and_never_move_back_in_sqlite(tmp_path):
    with SqliteEventStore(tmp_path / "f.db") as store:
        store.set_exported_seqs({})  # nothing to write: no table, no transaction
        store.set_exported_seqs({"a": 3, "b": 2})
        store.set_exported_seqs({"a": 1, "b": 5, "c": 1})
        assert [store.exported_seq(s) for s in "abcd"] == [3, 5, 1, 0]


class _Requests(SpanExporter):
    """Counts export requests; refuses the ones whose number is in ``refuse``."""

    def __init__(self, refuse=()) -> None:
        self.requests: list[list] = []
        self.refuse = set(refuse)

    def export(self, spans):
        self.requests.append(list(spans))
        return SpanExportResult.FAILURE if len(self.requests) in self.refuse else SpanExportResult.SUCCESS


async def test_a_follower_pass_sends_many_sessions_per_request_and_records_each_requests_watermarks_once(
    tmp_path, monkeypatch
):
    from flowscope.export import ExportError
    from flowscope.observability import export as export_mod

    store = _CountingStore(tmp_path / "f.db")
    wf = Workflow("w", edges=[(START, node(lambda x: x, name="a"), node(lambda x: x, name="b"))])
    runner = Runner(wf, store=store)  # no tracing: the follower ships every span
    sids = [f"s{i:02d}" for i in range(30)]
    await asyncio.gather(*(runner.run(1, session_id=s) for s in sids))

    one = _Requests()
    assert export_mod.ship_store(store, one) == 30 * 3
    assert len(one.requests) == 1 and store.watermark_calls == [30]  # one request, one transaction
    assert export_mod.ship_store(store, one) == 0 and len(one.requests) == 1  # nothing new: nothing sent

    # In requests of ~7 spans, the second refused: the first one's sessions are on record anyway.
    other = _CountingStore(tmp_path / "g.db")
    await asyncio.gather(*(Runner(wf, store=other).run(1, session_id=s) for s in sids))
    monkeypatch.setattr(export_mod, "FOLLOW_BATCH_SPANS", 7)
    flaky = _Requests(refuse={2})
    with pytest.raises(ExportError):
        export_mod.ship_store(other, flaky)
    assert other.watermark_calls == [3]  # the accepted request's sessions, written before the next request
    first = {s.context.span_id for s in flaky.requests[0]}
    shipped = [s for s in sids if other.exported_seq(s) == other.last_seq(s)]
    assert len(shipped) == 3 and all(
        other.exported_seq(s) == 0 for s in sids if s not in shipped
    )  # 3 sessions x 3 spans = 9 >= 7
    assert export_mod.ship_store(other, flaky) == 30 * 3 - 9  # the rest, next pass
    later = [s.context.span_id for r in flaky.requests[2:] for s in r]
    assert (
        not first & set(later) and len(later) == len(set(later)) == 30 * 3 - 9
    )  # nothing accepted is sent again
    assert all(other.exported_seq(s) == other.last_seq(s) for s in sids)
