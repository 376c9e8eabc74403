"""The EventStore contract (flowscope.store.testing) run for every adapter of the package."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flowscope.events import COMMON_FIELDS, EVENT_TYPES
from flowscope.store import EventStore, MemoryEventStore
from flowscope.store.testing import (  # noqa: F401  (re-exported for test_sqlite_store)
    EventStoreContract,
    append_in_batches,
    node_ev,
    one_of_each,
    random_log,
)


class TestMemoryEventStore(EventStoreContract):
    def create_store(self) -> EventStore:
        return MemoryEventStore()

    def hold_writes(self, store: EventStore):
        assert isinstance(store, MemoryEventStore)
        return store._lock  # what another thread's call holds


class TestSqliteEventStore(EventStoreContract):
    def create_store(self) -> EventStore:
        from flowscope.store import SqliteEventStore

        return SqliteEventStore(self.tmp_path / "x.db")

    def open_again(self, store: EventStore) -> EventStore:
        from flowscope.store import SqliteEventStore

        return SqliteEventStore(self.tmp_path / "x.db")  # a second connection, as another process has

    @contextmanager
    def hold_writes(self, store: EventStore) -> Iterator[None]:
        conn = sqlite3.connect(self.tmp_path / "x.db", isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")  # another process's write transaction
            yield
            conn.rollback()
        finally:
            conn.close()


def test_catalog_sample_covers_every_type_with_non_default_values():
    sample = one_of_each()
    assert {e.type for e in sample} == set(EVENT_TYPES)
    for e in sample:
        for f in dataclasses.fields(e):
            if f.name in COMMON_FIELDS:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            assert getattr(e, f.name) != default, (e.type, f.name)


def test_the_contract_is_abstract_until_a_factory_is_given():
    try:
        EventStoreContract().create_store()
    except NotImplementedError:
        return
    raise AssertionError("EventStoreContract.create_store must be abstract")


@pytest.mark.slow  # a pytest of its own
def test_a_users_broken_adapter_fails_the_contract_with_the_values_that_differ(tmp_path):
    """The suite's assertions live in the package, where pytest does not rewrite them
    unless told to: a user's failing adapter must see what differs, not a bare
    ``AssertionError``."""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "test_mine.py").write_text(
        textwrap.dedent(
            """
            from flowscope.store.memory import MemoryEventStore
            from flowscope.store.testing import EventLogContract

            class Gappy(MemoryEventStore):  # drops the first event of every read
                def read(self, session_id, after_seq=0):
                    return super().read(session_id, after_seq)[1:]

            class TestGappy(EventLogContract):
                def create_store(self):
                    return Gappy()
            """
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "test_mine.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout[-2000:]
    failure = [line for line in r.stdout.splitlines() if line.startswith("E ")]
    assert failure and failure[0] != "E       AssertionError", r.stdout[-2000:]
    assert any(" == " in line or "diff" in line for line in failure), failure
