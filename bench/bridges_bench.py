"""The bridges' cost per node run: LangGraph and ADK graphs with and without flowscope's bridge.

The same 200-node chains of trivial nodes as the harness (``peers_langgraph.py``,
``peers_adk.py``: every node adds one to an integer), run on the real engines, timed per
run and divided by the 200 nodes:

- the engine alone;
- with the bridge on the memory store (the bridge's own bookkeeping: the fold, the events);
- with the bridge on the SQLite store (a temp file: what ``flowscope runs/audit/stuck`` read);
- with the bridge on SQLite plus the ``TracingPlugin`` (SDK provider, a span processor that
  drops the spans) and the ``MetricsPlugin`` (a fresh registry): the full stack.

The added cost is the row minus the engine alone; the configurations are timed in rounds
(one run of each per round) and the best run of each taken, so a shared machine's load
(which only adds time) falls on all of them alike. Heartbeats off (they run on their own
thread every 5 s, outside a run this short). Usage::

    python bench/bridges_bench.py            # best of 7 rounds, prints a markdown table
    python bench/bridges_bench.py --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

from flowscope.engine.ids import new_id

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

__all__ = ["main", "langgraph_rows", "adk_rows"]

NODES = 200


def _plugins(kind: str) -> list[Any]:
    if kind != "full":
        return []
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from prometheus_client import CollectorRegistry

    from flowscope.observability import MetricsPlugin, TracingPlugin

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    return [TracingPlugin(tracer_provider=provider), MetricsPlugin(registry=CollectorRegistry())]


def _store(kind: str, tmp: str) -> Any:
    from flowscope.store import MemoryEventStore, SqliteEventStore

    return (
        MemoryEventStore()
        if kind == "memory"
        else SqliteEventStore(os.path.join(tmp, f"{uuid.uuid4().hex}.db"))
    )


CONFIGS = (
    "engine alone",
    "bridge, memory store",
    "bridge, SQLite store",
    "bridge, SQLite + tracing + metrics",
)
_KINDS = {CONFIGS[1]: ("memory", ""), CONFIGS[2]: ("sqlite", ""), CONFIGS[3]: ("sqlite", "full")}


def _interleaved(runs: list[tuple[str, Callable[[], Any]]], reps: int) -> list[tuple[str, float]]:
    """The best time of each run, measured in rounds (one of each per round): the load of
    a shared machine only adds time, and falls on every configuration alike."""
    for _, run in runs:
        run()  # warm
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    for _ in range(reps):
        for name, run in runs:
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    return [(name, min(times[name])) for name, _ in runs]


def langgraph_rows(reps: int, tmp: str) -> list[tuple[str, float]]:
    from flowscope.adapters.langgraph import FlowscopeCallbackHandler
    from peers_langgraph import _chain_graph

    graph = _chain_graph(NODES).compile(name="chain")
    runs: list[tuple[str, Callable[[], Any]]] = [(CONFIGS[0], lambda: graph.invoke({"x": 0}))]
    closing: list[Any] = []
    for config in CONFIGS[1:]:
        store_kind, plugins = _KINDS[config]
        store = _store(store_kind, tmp)
        handler = FlowscopeCallbackHandler(store, plugins=_plugins(plugins), heartbeat_interval=0)
        closing += [handler, store]

        def run(handler: Any = handler) -> Any:
            return graph.invoke({"x": 0}, {"configurable": {"thread_id": new_id()}, "callbacks": [handler]})

        runs.append((config, run))
    try:
        return _interleaved(runs, reps)
    finally:
        for c in closing:
            c.close()


def adk_rows(reps: int, tmp: str) -> list[tuple[str, float]]:
    from google.adk.apps import App
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.genai import types

    from flowscope.adapters.adk import FlowscopeADK
    from peers_adk import _chain

    message = types.Content(role="user", parts=[types.Part(text="0")])
    loop = asyncio.new_event_loop()
    runs: list[tuple[str, Callable[[], Any]]] = []
    closing: list[Any] = []
    for config in CONFIGS:
        sessions = InMemorySessionService()
        if config == CONFIGS[0]:
            runner = Runner(app=App(name="bench", root_agent=_chain(NODES)), session_service=sessions)
        else:
            store_kind, plugins = _KINDS[config]
            store = _store(store_kind, tmp)
            bridge = FlowscopeADK(store, plugins=_plugins(plugins), heartbeat_interval=0)
            closing += [bridge, store]
            runner = Runner(
                app=App(name="bench", root_agent=bridge.instrument(_chain(NODES)), plugins=[bridge.plugin]),
                session_service=sessions,
            )

        async def once(runner: Any = runner, sessions: Any = sessions) -> None:
            sid = (await sessions.create_session(app_name="bench", user_id="u")).id
            async for _ in runner.run_async(user_id="u", session_id=sid, new_message=message):
                pass

        runs.append((config, lambda once=once: loop.run_until_complete(once())))
    try:
        return _interleaved(runs, reps)
    finally:
        loop.close()
        for c in closing:
            c.close()


def _table(engine: str, rows: list[tuple[str, float]]) -> str:
    base = rows[0][1]
    lines = [
        f"| {engine}: {NODES}-node chain | per run (ms) | per node run (µs) | added per node run (µs) |",
        "|---|---:|---:|---:|",
    ]
    for config, t in rows:
        added = "" if config == CONFIGS[0] else f"{(t - base) / NODES * 1e6:+.0f}"
        lines.append(f"| {config} | {t * 1e3:.1f} | {t / NODES * 1e6:.0f} | {added} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger("google_adk").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        print(_table("LangGraph 1.2 (sync invoke, no checkpointer)", langgraph_rows(args.reps, tmp)))
        print()
        print(_table("ADK 2.13 (Runner over App, in-memory sessions)", adk_rows(args.reps, tmp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
