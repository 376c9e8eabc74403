"""The shared store contract (flowscope.store.testing) on PostgreSQL: a fresh schema per test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flowscope.store import EventStore, PostgresEventStore
from flowscope.store.testing import EventStoreContract


@pytest.mark.slow  # a real PostgreSQL cluster, started by the test session
class TestPostgresContract(EventStoreContract):
    @pytest.fixture(autouse=True)
    def _cluster(self, pg_cluster):
        self.pg = pg_cluster

    def create_store(self) -> EventStore:
        return PostgresEventStore(self.pg.url(), schema=self.pg.new_schema(), max_size=4)

    @contextmanager
    def hold_writes(self, store: EventStore) -> Iterator[None]:
        assert isinstance(store, PostgresEventStore)
        with self.pg.admin(self.pg.url().rsplit("/", 1)[1]) as conn, conn.transaction():
            conn.execute(
                f"LOCK TABLE {store.schema}.sessions IN ACCESS EXCLUSIVE MODE"
            )  # as VACUUM FULL takes
            yield
