"""Who ships a session's spans: its owner, while it lives and ships its own;
a follower (`flowscope export --follow`, `serve-metrics --otlp-endpoint`) otherwise, so
that no span is sent twice and none is left behind."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_otlp_export import clean_otel_env, otelsink  # noqa: F401  (the real OTLP receiver and its fixture)

from commands import cli_env, run_cli, start_cli
from flowscope import START, Runner, Workflow, node
from flowscope.liveness import ships_own_spans
from flowscope.observability import TracingPlugin
from flowscope.observability.export import ship_store
from flowscope.observability.otlp import span_exporter
from flowscope.observability.shipping import WatermarkExporter
from flowscope.ownership import Owner, this_process
from flowscope.store.sqlite import SqliteEventStore
from waiting import poll

WORKER = str(Path(__file__).resolve().parents[1] / "span_kill_worker.py")
NOW = 10_000.0


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize(
    "owner, lease, updated, host, expected",
    [
        (None, None, NOW, None, False),  # nobody ever owned it
        ("plain", NOW + 10, NOW, None, False),  # a live owner that does not ship its own spans
        ("ships", NOW + 10, NOW, None, True),  # a live owner that does
        (
            "ships",
            0.0,
            NOW - 1,
            None,
            True,
        ),  # released a second ago, its process alive: its exporter may hold the last batch
        ("ships", 0.0, NOW - 31, None, False),  # released long ago: what is left is the follower's
        ("dead", NOW + 10, NOW, None, False),  # killed on this host: at once, lease or not
        ("dead", 0.0, NOW - 1, None, False),
        ("ships", 0.0, NOW - 1, "elsewhere", True),  # another host's, just released: taken at its word
        ("ships", 0.0, NOW - 31, "elsewhere", False),
        ("ships", NOW - 1, NOW - 20, "elsewhere", False),  # another host's lease ran out: it is gone
    ],
)
def test_ships_own_spans(owner, lease, updated, host, expected):
    me = this_process("w")
    if owner == "dead":
        o: Owner | None = Owner("w", me.host, dead_pid(), None, ships_spans=True)
    else:
        o = {None: None, "plain": me, "ships": dataclasses.replace(me, ships_spans=True)}[owner]
    if host is not None and o is not None:
        o = dataclasses.replace(o, host=host)
    assert ships_own_spans(o, lease, updated, NOW) is expected


def one_node() -> Workflow:
    @node
    async def step(ctx, x):
        return x + 1

    return Workflow("w", edges=[(START, step)])


async def test_a_runner_says_in_its_owner_record_whether_it_ships_its_spans(tmp_path):
    store = SqliteEventStore(str(tmp_path / "f.db"))
    recording = TracerProvider()
    recording.add_span_processor(SimpleSpanProcessor(WatermarkExporter(InMemorySpanExporter())))
    plain = TracerProvider()
    plain.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    await Runner(one_node(), store=store, plugins=[TracingPlugin(tracer_provider=recording)]).run(
        1, session_id="ships"
    )
    await Runner(one_node(), store=store, plugins=[TracingPlugin(tracer_provider=plain)]).run(
        1, session_id="plain"
    )
    await Runner(one_node(), store=store).run(1, session_id="none")
    flags = {sid: store.session_info(sid).owner.ships_spans for sid in ("ships", "plain", "none")}
    assert flags == {"ships": True, "plain": False, "none": False}
    store.close()


@pytest.mark.slow
def test_a_follower_beside_a_live_shipping_worker_sends_no_span_twice(tmp_path, monkeypatch):
    """The worker's batch processor holds its spans for 1.5 s while the follower passes
    every 50 ms: the follower must leave them to it (it used to send them first, then
    the worker sent them again)."""
    db, contexts = tmp_path / "flowscope.db", tmp_path / "contexts.jsonl"
    SqliteEventStore(str(db)).close()
    env = cli_env(OTEL_BSP_SCHEDULE_DELAY="1500")
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        proc = subprocess.Popen(
            [sys.executable, WORKER, str(db), "s", endpoint, str(contexts), "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        store = SqliteEventStore(str(db))
        exporter = span_exporter("http/protobuf", endpoint, timeout=5.0)
        sent_by_follower = 0
        try:
            while proc.poll() is None:
                sent_by_follower += ship_store(store, exporter)
                time.sleep(0.05)
            for _ in range(3):  # and after it is gone: nothing is left to send
                sent_by_follower += ship_store(store, exporter)
            _out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
            exporter.shutdown()
        watermark, last = store.exported_seq("s"), store.last_seq("s")
        store.close()
        received = [s for _r, _sc, s in collected.spans()]
    ids = [(s.trace_id.hex(), s.span_id.hex()) for s in received]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} spans reached the receiver twice"
    assert len(received) == 9  # 8 nodes and the invocation, sent by the worker itself
    assert sent_by_follower == 0
    assert watermark == last


FLOWS_PY = """
from flowscope import START, Workflow, node

@node
async def one(ctx, x):
    return x + 1

@node
async def two(ctx, x):
    return x * 2

traced = Workflow("traced", edges=[(START, one, two)])
"""


@pytest.mark.slow
def test_flowscope_worker_with_an_otlp_endpoint_ships_the_sessions_it_runs_and_says_so(tmp_path, monkeypatch):
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    db = tmp_path / "w.db"
    env = cli_env(OTEL_BSP_SCHEDULE_DELAY="50")
    with otelsink("http/protobuf", monkeypatch) as (endpoint, collected):
        for i in range(3):
            r = run_cli(
                "--db",
                str(db),
                "start",
                "traced",
                "--input",
                str(i),
                "--session",
                f"t{i}",
                cwd=tmp_path,
                env=env,
            )
            assert r.returncode == 0, r.stderr
        w = start_cli(
            "--db",
            str(db),
            "worker",
            "flows:traced",
            "--poll",
            "50ms",
            "--otlp-endpoint",
            endpoint,
            cwd=tmp_path,
            env=env,
        )
        try:
            poll(lambda: len(collected.spans()) >= 3 * 3, 60)  # per session: the invocation, two nodes
            store = SqliteEventStore(str(db))
            infos = {sid: store.session_info(sid) for sid in ("t0", "t1", "t2")}
            store.close()
        finally:
            w.send_signal(signal.SIGTERM)
            _out, err = w.communicate(timeout=30)
        assert w.returncode == 0, err
        received = [s for _r, _sc, s in collected.spans()]
    assert {sid: (i.status, i.owner.ships_spans) for sid, i in infos.items()} == {
        sid: ("completed", True) for sid in infos
    }
    names = sorted(s.name for s in received)
    assert names == sorted(["invoke_workflow traced", "invoke_node one", "invoke_node two"] * 3)
    assert len({(s.trace_id, s.span_id) for s in received}) == 9
