"""A PostgreSQL store's ``call_timeout``: a call the server does not answer in time is cut
off (its connection closed, not retried, not reused) and fails with StoreUnavailable; a
call answered in time keeps its connection; the prune's VACUUM is not cut off. The server
is held up by a real lock here; a frozen server: tests/test_postgres_server_down.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from flowscope.errors import StoreUnavailable
from flowscope.events import RunFinished, RunStarted, RunSubmitted
from flowscope.store import PostgresEventStore
from flowscope.store.postgres.deadline import Deadlines
from flowscope.store.testing import ev
from pg_cluster import PgCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def url(pg_cluster: PgCluster) -> str:
    return pg_cluster.new_database()


@contextmanager
def table_locked(cluster: PgCluster, url: str, sql: str, hold_s: float) -> Iterator[None]:
    """Another connection holds ``sql``'s lock for ``hold_s`` seconds from the block's start."""
    locked = threading.Event()

    def hold() -> None:
        with cluster.admin(url.rsplit("/", 1)[1]) as conn, conn.transaction():
            conn.execute(sql)
            locked.set()
            time.sleep(hold_s)

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(10)
    try:
        yield
    finally:
        holder.join()


def backends(store: PostgresEventStore) -> set[int]:
    return {
        r[0]
        for r in store._rows("read", "SELECT pid FROM pg_stat_activity WHERE application_name = 'flowscope'")
    }


def test_a_call_past_the_call_timeout_fails_once_and_its_connection_is_closed(url, pg_cluster):
    with PostgresEventStore(url, max_size=1, call_timeout=0.5) as store:
        store.append("s", [ev(RunSubmitted, "s", workflow="wf", ts=1.0)], 0)
        before = backends(store)
        with table_locked(pg_cluster, url, "LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE", 2.5):
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"did not answer within 0\.5 s \(call_timeout\)"):
                store.session_info("s")  # a read: retried on a lost connection, not on this
            took = time.monotonic() - t0
        assert 0.5 <= took < 1.0, took  # cut off at its deadline, and not retried
        assert store.session_info("s").status == "queued"  # a new connection, once the lock is gone
        assert backends(store).isdisjoint(before)  # the one cut off was not handed out again


def test_a_call_answered_in_time_keeps_its_connection(url):
    with PostgresEventStore(url, max_size=1, call_timeout=0.2) as store:
        store.append("s", [ev(RunSubmitted, "s", workflow="wf", ts=1.0)], 0)
        first = backends(store)
        for _ in range(10):
            store.session_info("s")
            time.sleep(0.05)  # the watchdog's ticks pass between the calls
        assert backends(store) == first


def test_the_prunes_vacuum_waits_past_the_call_timeout(url, pg_cluster):
    with PostgresEventStore(url, call_timeout=0.5) as store:
        store.append("done", [ev(RunStarted, "done", workflow="wf", ts=1.0)], 0)
        store.append("done", [ev(RunFinished, "done", status="completed", ts=2.0)], 1)
        # SHARE UPDATE EXCLUSIVE: the DELETE goes through, a VACUUM of the table waits
        with table_locked(pg_cluster, url, "LOCK TABLE events IN SHARE UPDATE EXCLUSIVE MODE", 1.5):
            t0 = time.monotonic()
            assert store.delete_sessions(["done"]) == ["done"]
            took = time.monotonic() - t0
        assert took >= 1.2, took  # cut off at 0.5 s, it would have returned then


def test_a_connection_cut_off_as_its_call_ended_is_closed_not_reused(url):
    # the watchdog shut its socket as the answer came: the call succeeded, but the
    # connection is dead, and the next call on it would fail
    deadlines = Deadlines(5.0)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            with deadlines.watch(conn) as call:
                assert call is not None
                assert conn.execute("SELECT 1").fetchone() == (1,)
                call.expired = True  # the watchdog's verdict, as it shuts the socket
            assert conn.closed
    finally:
        deadlines.close()


def test_a_call_timeout_is_a_positive_number_of_seconds_or_none():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="call_timeout"):
            Deadlines(bad)
    none = Deadlines(None)
    with none.watch(object()) as call:  # no connection is even looked at
        assert call is None
    assert none._thread is None
