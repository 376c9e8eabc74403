"""LangGraph peers: the benchmark workflows as LangGraph ``StateGraph``s.

State is ``{"x": int}``; every trivial node returns ``{"x": x + 1}``. Runs use the sync
``invoke`` (measured faster than ``ainvoke`` for these graphs, so the comparison favours
LangGraph). Configurations:

- no checkpointer;
- ``SqliteSaver`` on a temp file (WAL, as ``setup()`` makes it), default durability
  (``"async"``: checkpoints written in the background while the next step runs);
- ``SqliteSaver``, ``durability="sync"`` (each checkpoint written before the next step).

Durability: a ``sqlite3`` connection keeps SQLite's default ``synchronous=FULL`` (in WAL
mode an fsync of the WAL at every commit), where flowscope's store runs ``NORMAL`` by
default (no fsync at a commit). :data:`SAME_AS_STORE` is the store's setting: the two
``SqliteSaver`` configurations run at it (:attr:`LangGraphConfig.synchronous`), and
``sqlite_chain``/``async_sqlite_chain`` take it as ``synchronous`` (None keeps SQLite's
default), so that a comparison is at the same durability.

The pause workflow calls ``interrupt()`` in node 100 and resumes with
``Command(resume=...)``; it needs a checkpointer, so it is n/a without one.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from flowscope.engine.ids import new_id  # thread ids of the kind flowscope gives its sessions
from flowscope.store.sqlite.schema import DURABILITY

__all__ = [
    "LangGraphConfig",
    "langgraph_configs",
    "available",
    "versions",
    "sqlite_chain",
    "async_sqlite_chain",
    "SYNCHRONOUS",
    "SAME_AS_STORE",
    "sqlite_connection",
]

#: The values of SQLite's ``synchronous`` a peer's connection may be given.
SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
#: flowscope's SQLite store's setting at its default durability: the peers' to compare alike.
SAME_AS_STORE = DURABILITY["normal"]


def _pragma_synchronous(synchronous: str) -> str:
    """``PRAGMA synchronous = ...`` for one of :data:`SYNCHRONOUS` (a pragma takes no
    parameter: the value is checked against the list, never pasted from elsewhere)."""
    if synchronous not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}, not {synchronous!r}")
    return f"PRAGMA synchronous = {synchronous}"


def sqlite_connection(path: str, synchronous: str | None = None) -> sqlite3.Connection:
    """The connection a peer's ``SqliteSaver`` gets: SQLite's default durability
    (``synchronous=FULL``), or ``synchronous`` (one of :data:`SYNCHRONOUS`)."""
    conn = sqlite3.connect(path, check_same_thread=False)
    if synchronous is not None:
        try:
            conn.execute(_pragma_synchronous(synchronous))
        except ValueError:
            conn.close()
            raise
    return conn


def available() -> str | None:
    try:
        import langgraph.graph  # noqa: F401
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class S(TypedDict):
    x: int


class FS(TypedDict):
    x: int
    r: Annotated[list, operator.add]


def _inc(s: dict) -> dict:
    return {"x": s["x"] + 1}


def _chain_graph(n: int, ask_at: int | None = None) -> Any:
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(S)
    prev = START
    for i in range(n):
        name = f"n{i}"
        if i == ask_at:
            name = "ask"
            g.add_node(name, _ask)
        else:
            g.add_node(name, _inc)
        g.add_edge(prev, name)
        prev = name
    g.add_edge(prev, END)
    return g


def _ask(s: dict) -> dict:
    from langgraph.types import interrupt

    interrupt({"prompt": "continue?", "payload": s["x"]})
    return {"x": s["x"] + 1}


def _branch(s: dict) -> dict:
    return {"r": [s["x"] + 1]}


def _join(s: dict) -> dict:
    return {"x": len(s["r"])}


def _count(s: dict) -> dict:
    return {"x": s["x"]}


def _fanout_graph(n: int) -> Any:
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(FS)
    names = [f"b{i}" for i in range(n)]
    for name in names:
        g.add_node(name, _branch)
        g.add_edge(START, name)
    g.add_node("join", _join)
    g.add_edge(names, "join")  # waits for all of them
    g.add_node("count", _count)
    g.add_edge("join", "count")
    g.add_edge("count", END)
    return g


def _nested_graph(inner: int, length: int, checkpointer: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(S)
    prev = START
    for j in range(inner):
        # compiled without a checkpointer: a subgraph uses its parent's
        sub = _chain_graph(length).compile()
        name = f"inner{j}"
        g.add_node(name, sub)
        g.add_edge(prev, name)
        prev = name
    g.add_edge(prev, END)
    return g


@dataclass
class LangGraphConfig:
    key: str
    label: str
    sqlite: bool = False
    durability: str | None = None  # None: LangGraph's default ("async")
    #: SQLite's ``synchronous`` on the saver's connection (None: SQLite's default, FULL)
    synchronous: str | None = SAME_AS_STORE

    def make(
        self, wf_key: str, spec: Any, tmpdir: str
    ) -> tuple[Callable[[], Any] | None, str | None, Callable[[], None]]:
        """``(run, n/a reason, close)``: ``run()`` executes the workflow once and returns its output."""
        from workflows import FAN, INNER, INNER_LEN, PAUSE_LEN

        saver = None
        conn = None
        if self.sqlite:
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite_connection(os.path.join(tmpdir, f"{self.key}-{wf_key}.db"), self.synchronous)
            saver = SqliteSaver(conn)
            saver.setup()

        def close() -> None:
            if conn is not None:
                conn.close()

        kw: dict[str, Any] = {}
        if self.durability is not None:
            kw["durability"] = self.durability
        if wf_key.startswith("chain"):
            graph = _chain_graph(int(wf_key[len("chain") :])).compile(checkpointer=saver)
        elif wf_key == "fanout50":
            graph = _fanout_graph(FAN).compile(checkpointer=saver)
        elif wf_key == "nested":
            graph = _nested_graph(INNER, INNER_LEN, saver).compile(checkpointer=saver)
        elif wf_key == "pause200":
            if saver is None:
                close()
                return (
                    None,
                    "interrupt() needs a checkpointer: LangGraph cannot pause and resume without one",
                    close,
                )
            graph = _chain_graph(PAUSE_LEN, ask_at=PAUSE_LEN // 2).compile(checkpointer=saver)
        else:
            raise KeyError(wf_key)
        limit = spec.nodes * 2 + 100

        if wf_key == "pause200":
            from langgraph.types import Command

            def run() -> Any:
                cfg = {"recursion_limit": limit, "configurable": {"thread_id": new_id()}}
                first = graph.invoke({"x": 0}, cfg, **kw)
                if "__interrupt__" not in first:
                    raise AssertionError(f"LangGraph did not pause: {first!r}")
                return graph.invoke(Command(resume=5), cfg, **kw)["x"]

        else:

            def run() -> Any:
                cfg = {"recursion_limit": limit, "configurable": {"thread_id": new_id()}}
                return graph.invoke({"x": 0}, cfg, **kw)["x"]

        return run, None, close


def langgraph_configs() -> list[LangGraphConfig]:
    return [
        LangGraphConfig("lg_plain", "LangGraph, no checkpointer"),
        LangGraphConfig(
            "lg_sqlite", "LangGraph + SqliteSaver (default durability, async; NORMAL)", sqlite=True
        ),
        LangGraphConfig(
            "lg_sqlite_sync",
            'LangGraph + SqliteSaver (durability="sync"; NORMAL)',
            sqlite=True,
            durability="sync",
        ),
    ]


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langchain-core"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "not installed"
    return out


def sqlite_chain(
    n: int, folder: str, synchronous: str | None = None
) -> tuple[Callable[[], None], Callable[[], None]]:
    """A chain of ``n`` nodes on ``SqliteSaver`` (a new file in ``folder``), compiled once:
    ``run()`` runs one new thread to the end; ``close()`` closes the file. What the
    telemetry and baseline benches time against flowscope's 200-chain. ``synchronous``:
    the connection's setting (default: SQLite's, ``FULL``)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite_connection(os.path.join(folder, f"lg-{uuid.uuid4().hex}.db"), synchronous)
    saver = SqliteSaver(conn)
    saver.setup()
    graph = _chain_graph(n).compile(checkpointer=saver)

    def run() -> None:
        out = graph.invoke(
            {"x": 0}, {"recursion_limit": 2 * n + 100, "configurable": {"thread_id": new_id()}}
        )
        assert out["x"] == n

    return run, conn.close


async def async_sqlite_chain(n: int, sessions: int, folder: str, synchronous: str | None = None) -> Any:
    """A chain of ``n`` nodes on ``AsyncSqliteSaver`` (a new file in ``folder``), compiled
    once: ``await once()`` runs ``sessions`` new threads concurrently and returns the seconds
    they took (``once(k)`` runs ``k``). What the benches time against flowscope's 1,000
    concurrent sessions. ``synchronous``: the connection's setting (default: SQLite's,
    ``FULL``)."""
    import asyncio
    import gc
    import time

    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    cm = AsyncSqliteSaver.from_conn_string(os.path.join(folder, f"lga-{uuid.uuid4().hex}.db"))
    saver = await cm.__aenter__()
    if synchronous is not None:
        await saver.conn.execute(_pragma_synchronous(synchronous))
    await saver.setup()
    graph = _chain_graph(n).compile(checkpointer=saver)

    async def once(k: int = sessions) -> float:
        cfgs = [{"recursion_limit": 2 * n + 100, "configurable": {"thread_id": new_id()}} for _ in range(k)]
        gc.collect()
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(graph.ainvoke({"x": 0}, c) for c in cfgs))
        dt = time.perf_counter() - t0
        assert all(o["x"] == n for o in outs)
        return dt

    once.keep = (cm, saver)  # type: ignore[attr-defined]  # the context manager owns the connection
    return once
