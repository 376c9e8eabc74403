"""A full batch queue makes spans wait, never drops them silently; the watermark writes
leave the exporter's thread free; a backlog past its bound drops the newest spans,
counted, and their watermarks hold so that a follower ships exactly those."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from test_otlp_export import clean_otel_env, otelsink  # noqa: F401  (the real OTLP receiver and its fixture)

from commands import cli_env, start_cli
from flowscope import START, Runner, Workflow, node
from flowscope.observability import TracingPlugin
from flowscope.observability import backlog as backlog_mod
from flowscope.observability.export import ship_store
from flowscope.observability.shipping import Ledger, WatermarkExporter
from flowscope.store import MemoryEventStore
from flowscope.store.sqlite import SqliteEventStore


class _Slow(SpanExporter):
    """Accepts spans at a pace (``delay_s`` per export), or not at all until ``gate`` opens."""

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.gate = gate
        self.ids: list[int] = []

    def export(self, spans):
        if self.gate is not None:
            self.gate.wait(30)
        time.sleep(self.delay_s)
        self.ids.extend(s.context.span_id for s in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def flowscope(db, *args: str, env: dict, cwd=None) -> subprocess.Popen[str]:
    """``flowscope --db DB ARGS...`` in a process of its own, its stderr kept."""
    return start_cli("--db", str(db), *args, cwd=cwd, env=env, stdout=subprocess.DEVNULL)


def chain(n: int) -> Workflow:
    return Workflow("w", edges=[(START, *[node(lambda x: x + 1, name=f"n{i}") for i in range(n)])])


def small_queue(exporter: SpanExporter, size: int, batch: int) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter, max_queue_size=size, max_export_batch_size=batch, schedule_delay_millis=20
        )
    )
    return provider


async def test_a_full_batch_queue_makes_spans_wait_rather_than_drop_them(caplog):
    # 40 concurrent sessions end spans faster than an exporter taking 5 ms a batch of 16
    # exports them: the SDK's queue of 64 overflowed and dropped most of them.
    caplog.set_level(logging.WARNING)
    exporter = _Slow(delay_s=0.005)
    provider = small_queue(exporter, size=64, batch=16)
    plugin = TracingPlugin(tracer_provider=provider)
    runner = Runner(chain(5), store=MemoryEventStore(), plugins=[plugin])
    results = await asyncio.gather(*(runner.run(0, session_id=f"s{i}") for i in range(40)))
    assert all(r.status == "completed" for r in results)
    assert plugin.force_flush()
    assert len(exporter.ids) == len(set(exporter.ids)) == 40 * 6
    assert not [r for r in caplog.records if "dropping" in r.getMessage() or "not exported" in r.getMessage()]
    backlog = backlog_mod.backlog_for(provider._active_span_processor)
    assert backlog is not None and backlog.waiting == 0 and backlog.dropped == 0
    provider.shutdown()


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
async def test_the_tracing_handles_shutdown_hands_the_backlog_over_before_it_stops_the_exporters():
    from flowscope.observability.setup import TracingHandle

    exporter = _Slow(delay_s=0.02)  # 15 batches of 16: 0.3 s, far longer than the runs
    provider = small_queue(exporter, size=64, batch=16)
    handle = TracingHandle(provider, ["slow"], False)
    runner = Runner(chain(5), store=MemoryEventStore(), plugins=[handle.plugin()])
    await asyncio.gather(*(runner.run(0, session_id=f"s{i}") for i in range(40)))
    backlog = backlog_mod.backlog_for(provider._active_span_processor)
    assert backlog is not None and backlog.waiting > 0  # the exporter is behind: spans wait
    handle.shutdown()
    assert len(exporter.ids) == len(set(exporter.ids)) == 40 * 6


async def test_spans_beyond_the_backlogs_bound_are_counted_and_a_follower_ships_exactly_those(
    tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="flowscope.observability.backlog")
    monkeypatch.setattr(backlog_mod, "BACKLOG_QUEUES", 2)  # queue 8 (limit 4) and a backlog of 16
    gate = threading.Event()  # the exporter takes nothing until the runs are over
    exporter = _Slow(gate=gate)
    ledger = Ledger()
    provider = small_queue(WatermarkExporter(exporter, ledger), size=8, batch=4)
    plugin = TracingPlugin(tracer_provider=provider)
    store = SqliteEventStore(tmp_path / "f.db")
    sids = [f"s{i}" for i in range(10)]
    await asyncio.gather(
        *(Runner(chain(3), store=store, plugins=[plugin]).run(0, session_id=s) for s in sids)
    )
    backlog = backlog_mod.backlog_for(provider._active_span_processor)
    assert backlog is not None
    dropped = backlog.dropped
    assert dropped > 0
    gate.set()
    assert plugin.force_flush()
    assert len(exporter.ids) == len(set(exporter.ids)) == 10 * 4 - dropped
    assert ledger.pending == 0  # the dropped ones are not kept for the life of the process
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and f"{dropped} spans were not exported" in warnings[1], warnings
    # the sessions whose spans were dropped kept their watermarks before them
    behind = [s for s in sids if store.exported_seq(s) < store.last_seq(s)]
    assert behind
    follower = _Slow()
    assert ship_store(store, follower, handover_s=0.0) == dropped
    assert not set(follower.ids) & set(exporter.ids)  # exactly the dropped ones: nothing twice
    assert all(store.exported_seq(s) == store.last_seq(s) for s in sids)
    provider.shutdown()
    store.close()


class _WaitingStore(SqliteEventStore):
    """A store whose watermark writes wait until ``release`` is set (a store busy with appends)."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.release = threading.Event()

    def set_exported_seqs(self, marks) -> None:
        self.release.wait(30)
        super().set_exported_seqs(marks)


async def test_the_exporters_thread_does_not_wait_for_the_stores_watermark_write(tmp_path):
    store = _WaitingStore(tmp_path / "f.db")
    exporter = _Slow()
    ledger = Ledger()
    watermarked = WatermarkExporter(exporter, ledger)
    provider = small_queue(watermarked, size=2048, batch=512)
    plugin = TracingPlugin(tracer_provider=provider)
    await Runner(chain(3), store=store, plugins=[plugin]).run(0, session_id="s")
    started = time.monotonic()
    assert provider.force_flush()  # the batch is exported while the store still waits
    assert time.monotonic() - started < 5 and len(exporter.ids) == 4
    assert store.exported_seq("s") == 0 and not ledger.flush(0.05)
    store.release.set()
    assert ledger.flush(10)
    assert store.exported_seq("s") == store.last_seq("s")
    provider.shutdown()
    store.close()


async def test_an_exporters_shutdown_does_not_wait_long_for_a_store_that_does_not_answer(
    tmp_path, monkeypatch
):
    from flowscope.observability import shipping

    monkeypatch.setattr(shipping, "CLOSE_WAIT_S", 0.2)
    store = _WaitingStore(tmp_path / "f.db")
    exporter = WatermarkExporter(_Slow(), Ledger())
    provider = small_queue(exporter, size=2048, batch=512)
    await Runner(chain(3), store=store, plugins=[TracingPlugin(tracer_provider=provider)]).run(
        0, session_id="s"
    )
    started = time.monotonic()
    provider.shutdown()  # exports the batch; its watermark's write waits for the store
    assert time.monotonic() - started < 5
    assert store.exported_seq("s") == 0  # the next opener sends those spans again: never a loss
    store.release.set()
    assert exporter.ledger.flush(10)
    store.close()


def test_one_watermark_writer_serves_export_after_export_and_ends_when_idle(tmp_path, monkeypatch):
    from flowscope.observability import shipping
    from flowscope.observability.log_spans import SpanRecord

    monkeypatch.setattr(shipping, "_WRITER_IDLE_S", 0.2)
    store = SqliteEventStore(tmp_path / "f.db")
    ledger = Ledger()

    class Ctx:
        def __init__(self, span_id: int) -> None:
            self.context = type("C", (), {"trace_id": 1, "span_id": span_id})()

    def export(span_id: int, seq: int) -> None:
        ledger.register(store, [SpanRecord("s", 1, span_id, None, 0.0, 1.0, {}, end_seq=seq, session_id="x")])
        ledger.exported([Ctx(span_id)], ok=True)
        assert ledger.flush(5)
        assert store.exported_seq("x") == seq

    export(1, 2)
    writer = ledger._writer
    export(2, 4)
    assert ledger._writer is writer and writer is not None  # not a thread per export
    writer.join(5)
    assert not writer.is_alive() and ledger._writer is None  # idle: it ended
    export(3, 6)  # and the next export starts another
    assert ledger._writer is not None and ledger._writer is not writer
    store.close()


class _CountingStore(SqliteEventStore):
    """Counts the watermark writes (store transactions) it was asked for."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.writes: list[dict[str, int]] = []

    def set_exported_seqs(self, marks) -> None:
        self.writes.append(dict(marks))
        super().set_exported_seqs(marks)


def test_the_marks_of_exports_close_together_go_in_one_write_and_flush_writes_at_once(tmp_path, monkeypatch):
    from flowscope.observability import shipping
    from flowscope.observability.log_spans import SpanRecord

    monkeypatch.setattr(shipping, "_WRITE_EVERY_S", 30.0)  # longer than the test: only flush() writes early
    store = _CountingStore(tmp_path / "f.db")
    ledger = Ledger()

    class Ctx:
        def __init__(self, span_id: int) -> None:
            self.context = type("C", (), {"trace_id": 1, "span_id": span_id})()

    def export(i: int) -> None:
        sid = f"s{i % 4}"
        ledger.register(store, [SpanRecord("n", 1, i, None, 0.0, 1.0, {}, end_seq=i, session_id=sid)])
        ledger.exported([Ctx(i)], ok=True)

    export(1)  # nothing written before: its mark at once
    deadline = time.monotonic() + 10
    while not store.writes and time.monotonic() < deadline:
        time.sleep(0.005)
    for i in range(2, 21):  # nineteen more exports of short invocations, a few ms apart
        export(i)
        time.sleep(0.005)
    started = time.monotonic()
    assert ledger.flush(10)
    assert time.monotonic() - started < 10  # flush() did not wait for the interval
    # the first export's mark, then the other nineteen's together
    assert store.writes == [{"s1": 1}, {"s0": 20, "s1": 17, "s2": 18, "s3": 19}], store.writes
    assert [store.exported_seq(f"s{k}") for k in range(4)] == [20, 17, 18, 19]
    store.close()


def test_a_forked_child_writes_its_watermarks_though_a_parents_thread_held_the_lock(tmp_path):

    from flowscope.observability.log_spans import SpanRecord

    ledger = Ledger()
    provider = small_queue(_Slow(), size=64, batch=16)
    backlog = backlog_mod.backlog_for(provider._active_span_processor)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a parent's thread inside the ledger and the backlog at the fork
        with ledger._lock, backlog._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: both must work, or it hangs and the parent's wait times out
        code = 1
        try:
            store = SqliteEventStore(tmp_path / "child.db")
            ledger.register(store, [SpanRecord("s", 1, 7, None, 0.0, 1.0, {}, end_seq=3, session_id="x")])

            class Ctx:
                context = type("C", (), {"trace_id": 1, "span_id": 7})()

            ledger.exported([Ctx()], ok=True)
            fresh = backlog_mod.backlog_for(provider._active_span_processor)
            fresh.hand([])
            code = 0 if ledger.flush(5) and store.exported_seq("x") == 3 and fresh is not backlog else 2
        finally:
            os._exit(code)
    release.set()
    holder.join(5)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on a lock a parent's thread held")
    assert os.waitstatus_to_exitcode(status) == 0
    provider.shutdown()


EXITING = """
import asyncio, sys, time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from flowscope import START, Runner, Workflow, node
from flowscope.observability import TracingPlugin
from flowscope.store import MemoryEventStore

class Slow(SpanExporter):
    n = 0
    def export(self, spans):
        time.sleep(0.005)
        self.n += len(spans)
        return SpanExportResult.SUCCESS
    def shutdown(self):
        print(self.n, flush=True)

provider = TracerProvider()  # its atexit handler shuts it down; nobody flushes
provider.add_span_processor(
    BatchSpanProcessor(Slow(), max_queue_size=64, max_export_batch_size=16, schedule_delay_millis=1000)
)
wf = Workflow("w", edges=[(START, *[node(lambda x: x + 1, name=f"n{i}") for i in range(5)])])
runner = Runner(wf, store=MemoryEventStore(), plugins=[TracingPlugin(tracer_provider=provider)])

async def main():
    await asyncio.gather(*(runner.run(0) for _ in range(100)))

asyncio.run(main())
"""


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_a_program_that_ends_without_flushing_exports_the_spans_that_waited_for_room(tmp_path):

    (tmp_path / "exiting.py").write_text(EXITING)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "exiting.py")],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(100 * 6)], done.stdout + done.stderr


@pytest.mark.parametrize("processors", [1, 2])
def test_only_the_sdks_batch_queues_are_guarded(processors):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Slow()))
    assert backlog_mod.backlog_for(provider._active_span_processor) is None
    if processors == 2:
        provider.add_span_processor(BatchSpanProcessor(_Slow(), max_queue_size=100, max_export_batch_size=10))
        found = backlog_mod.backlog_for(provider._active_span_processor)
        assert found is not None and found.waiting == 0
    provider.shutdown()


@pytest.mark.slow
def test_a_worker_running_300_sessions_at_once_ships_every_span_through_a_small_queue(tmp_path, monkeypatch):
    # The worker's batch queue holds 64 spans (OTEL_BSP_MAX_QUEUE_SIZE): 300 sessions ending
    # at once overflowed it, and the SDK dropped most of their spans.

    (tmp_path / "flows.py").write_text(
        "from flowscope import START, Workflow, node\n"
        "traced = Workflow('traced', edges=[(START, node(lambda x: x + 1, name='one'), node(lambda x: x * 2, name='two'))])\n"
    )
    db = tmp_path / "w.db"
    store = SqliteEventStore(str(db))
    submitter = Runner(
        Workflow(
            "traced", edges=[(START, node(lambda x: x + 1, name="one"), node(lambda x: x * 2, name="two"))]
        ),
        store=store,
    )
    for i in range(300):
        submitter.submit(i, session_id=f"t{i}")
    store.close()
    env = cli_env(
        OTEL_BSP_SCHEDULE_DELAY="50", OTEL_BSP_MAX_QUEUE_SIZE="64", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16"
    )
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        w = flowscope(
            db, "worker", "flows:traced", "--poll", "50ms", "--concurrency", "300", "--otlp-endpoint", endpoint,
            env=env, cwd=tmp_path,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while len(collected.spans()) < 300 * 3 and time.monotonic() < deadline and w.poll() is None:
                time.sleep(0.1)
            time.sleep(0.3)  # nothing more arrives: no span twice
        finally:
            w.send_signal(signal.SIGTERM)
            _out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        received = [s for _r, _sc, s in collected.spans()]
    assert "Queue full" not in err and "not exported" not in err, err
    assert len(received) == len({(s.trace_id, s.span_id) for s in received}) == 300 * 3
    store = SqliteEventStore(str(db))
    assert all(store.exported_seq(f"t{i}") == store.last_seq(f"t{i}") for i in range(300))  # on record too
    store.close()
