"""The EventStore contract (flowscope.store.testing) run for every adapter of the package."""

from __future__ import annotations

import dataclasses

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


class TestSqliteEventStore(EventStoreContract):
    def create_store(self) -> EventStore:
        from flowscope.store import SqliteEventStore

        return SqliteEventStore(self.tmp_path / "x.db")

    def open_again(self, store: EventStore) -> EventStore:
        from flowscope.store import SqliteEventStore

        return SqliteEventStore(self.tmp_path / "x.db")  # a second connection, as another process has


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
