from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from flowscope import Node, node
from flowscope.store import MemoryEventStore

sys.path.insert(0, str(Path(__file__).parent))
# Commands run in-process see the environment of the test process, not a terminal's: a
# table fits $COLUMNS when set (pytest-xdist's workers set it to 80), every cell whole if not.
os.environ.pop("COLUMNS", None)
# Test modules are filed in folders mirroring src/flowscope, with unique names; a few share
# fixtures and helpers by importing each other (test_otlp_export's receiver, say).
for _folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and p.name.isidentifier()):
    sys.path.insert(1, str(_folder))


#: Test modules whose imports alone take seconds (google-adk and langgraph with langsmith:
#: ~2.5 s together). They are slow as a whole (``pytestmark``), and the fast loop does not
#: even collect them, so it does not pay for the imports.
SLOW_TO_IMPORT = {"test_bridge_adk.py", "test_bridge_langgraph.py"}
#: A module marked slow as a whole says so on a line of its own.
_WHOLLY_SLOW = "\npytestmark = pytest.mark.slow"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast loop (``-m "not slow"``) does not collect a module that is slow as a whole:
    importing it (and rewriting its asserts) would cost the loop time for no test."""
    if config.getoption("markexpr", "").replace(" ", "") != "notslow" or collection_path.suffix != ".py":
        return None
    if collection_path.name in SLOW_TO_IMPORT:
        return True
    if collection_path.name.startswith("test_") and _WHOLLY_SLOW in collection_path.read_text(
        encoding="utf-8"
    ):
        return True
    return None


@pytest.fixture
def store():
    return MemoryEventStore()


def asking(name: str, interrupt_id: str) -> Node:
    """A node ``name`` that asks for the input ``interrupt_id`` and returns the answer."""

    async def ask(ctx, x):
        return await ctx.request_input(f"{interrupt_id}?", interrupt_id=interrupt_id)

    return node(ask, name=name)


def of_type(events, type_name):
    return [e for e in events if e.type == type_name]


def unavailable(reason: str) -> None:
    """Skip a test whose real fault cannot be made on this machine, except in CI, where
    every test runs: there the missing tool is a failure, not a silent skip."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs every test: install what it needs)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_cluster():
    """A PostgreSQL cluster of this test session (tests/pg_cluster.py), started on first use.

    Never skipped: without the server binaries it errors with the line that installs them.
    """
    from pg_cluster import PgCluster

    cluster = PgCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
