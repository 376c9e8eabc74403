"""PostgresEventStore's own promises beyond the contract, each on a real server: a claim
passes over a row another transaction holds without waiting, a released lease and a message
to a paused session wake idle workers, a gap in a log is reported, a prune guards rows an
uncommitted resume holds, a claim never takes a session whose epoch moved after it read it,
a write that may have committed is not sent twice, and the server's errors are typed by
their SQLSTATE."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from flowscope.errors import StoreCorrupt, StoreDiskFull, StoreLocked, StoreUnavailable
from flowscope.events import NodeStarted, RunFinished, RunStarted, RunSubmitted
from flowscope.ownership import Owner
from flowscope.store import PostgresEventStore
from flowscope.store.postgres import inbox, maintenance
from flowscope.store.postgres import queries as q
from flowscope.store.postgres.faults import store_error
from flowscope.store.testing import dead_owner, ev, paused_log
from pg_cluster import PgCluster

# A real PostgreSQL cluster, started by the test session: the full suite, not the fast loop.
pytestmark = pytest.mark.slow


@pytest.fixture
def url(pg_cluster: PgCluster) -> str:
    return pg_cluster.new_database("rules")


def owner(wid: str) -> Owner:
    return Owner(worker_id=wid, host="host-x", pid=999_999, started_at=1.0)


def submit(store: PostgresEventStore, sid: str, ts: float) -> None:
    store.append(sid, [ev(RunSubmitted, sid, workflow="wf", input=1, ts=ts)], 0)


def quiet(waiter: PostgresEventStore) -> None:
    """Start ``waiter``'s listener and take its first look, so that the next wake is news."""
    waiter.wait_for_work(0.01)
    deadline = time.monotonic() + 5
    while waiter.wait_for_work(0.05) and time.monotonic() < deadline:
        pass


def test_a_claim_passes_over_a_row_another_transaction_holds_without_waiting(url: str, pg_cluster: PgCluster):
    with PostgresEventStore(url, call_timeout=3.0) as s:
        submit(s, "held", 1.0)  # the oldest
        submit(s, "free", 2.0)
        with pg_cluster.admin(url.rsplit("/", 1)[1]) as conn, conn.transaction():
            conn.execute("SELECT 1 FROM sessions WHERE session_id = 'held' FOR UPDATE")  # an append's lock
            t = time.monotonic()
            claims = s.claim(owner("w1"), ["wf"], 15.0, limit=5)
            took = time.monotonic() - t
        assert [(c.session_id, c.reason) for c in claims] == [("free", "queued")]
        assert took < 1.0, took
        [c] = s.claim(owner("w2"), ["wf"], 15.0, limit=5)  # let go: the next claim takes it
        assert c.session_id == "held"


def test_a_released_lease_wakes_an_idle_worker(url: str):
    with PostgresEventStore(url) as waiter, PostgresEventStore(url) as s:
        submit(s, "q", 1.0)
        [c] = s.claim(owner("w1"), ["wf"], 15.0, limit=1)  # it never starts the session
        quiet(waiter)
        s.release(c.lease)  # queued, and free at once
        assert waiter.wait_for_work(5.0) is True
        assert waiter.wait_for_work(0.2) is False  # nothing new


def test_a_message_to_a_paused_session_wakes_an_idle_worker(url: str):
    with PostgresEventStore(url) as waiter, PostgresEventStore(url) as s:
        s.append("p", paused_log("p", "wf", 1.0), 0)
        quiet(waiter)
        s.send("p", "answer", {"inputs": {"ok": True}, "jobs": {}})
        assert waiter.wait_for_work(5.0) is True


def test_a_gap_in_the_log_is_reported_naming_the_missing_seq(url: str, pg_cluster: PgCluster):
    with PostgresEventStore(url) as s:
        events = [ev(RunStarted, "g", workflow="wf", ts=1.0)]
        events += [ev(NodeStarted, "g", path=f"wf/n{k}", node=f"n{k}", ts=2.0 + k) for k in range(3)]
        s.append("g", events, 0)
        with pg_cluster.admin(url.rsplit("/", 1)[1]) as conn:
            conn.execute("DELETE FROM events WHERE session_id = 'g' AND seq = 3")
        with pytest.raises(StoreCorrupt) as exc:
            s.read("g")
        assert "seq 3 is missing" in str(exc.value) and s.where in str(exc.value)
        assert [e.seq for e in s.read("g", after_seq=3)] == [4]


def test_a_prune_spares_a_session_a_resume_takes_before_the_prune_commits(url: str, pg_cluster: PgCluster):
    with PostgresEventStore(url) as s:
        s.append(
            "p",
            [ev(RunStarted, "p", workflow="wf", ts=1.0), ev(RunFinished, "p", status="completed", ts=2.0)],
            0,
        )
        out: list[list[str]] = []
        with pg_cluster.admin(url.rsplit("/", 1)[1]) as conn:
            with conn.transaction():  # a resume: locks the row, moves the session on, commits later
                conn.execute("UPDATE sessions SET status = 'running' WHERE session_id = 'p'")
                pruner = threading.Thread(target=lambda: out.append(s.delete_sessions(["p"])))
                pruner.start()
                time.sleep(0.5)  # the prune waits for the row
            pruner.join(10)
        assert out == [[]]  # it saw the session running once it had the row
        assert s.last_seq("p") == 2 and len(s.read("p")) == 2


@pytest.mark.parametrize(
    ("call", "module", "name"),
    [
        (lambda s: s.send("m", "answer", {"inputs": {}, "jobs": {}}), inbox, "send"),
        (lambda s: s.delete_sessions(["m"]), maintenance, "delete_sessions"),
    ],
    ids=["send", "delete_sessions"],
)
def test_a_write_whose_connection_is_lost_after_it_was_sent_is_not_sent_again(
    url: str, monkeypatch: pytest.MonkeyPatch, call, module, name
):
    # the server may have committed it: a second message, or a prune that reports nothing
    # deleted, would be wrong; the caller hears the outage and reads the outcome
    with PostgresEventStore(url) as s:
        s.append(
            "m",
            [ev(RunStarted, "m", workflow="wf", ts=1.0), ev(RunFinished, "m", status="completed", ts=2.0)],
            0,
        )
        real, calls = getattr(module, name), []

        def lost_after_commit(*args, **kwargs):
            calls.append(real(*args, **kwargs))
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(module, name, lost_after_commit)
        with pytest.raises(StoreUnavailable):
            call(s)
        assert len(calls) == 1


def test_a_claim_leaves_a_dead_owners_session_taken_over_between_its_read_and_its_lock(
    url: str, monkeypatch: pytest.MonkeyPatch
):
    # the claim reads a dead owner's sessions without locking them; one a live owner takes
    # over before the claim locks it (its epoch moved on) is that owner's, not the claim's
    with PostgresEventStore(url) as s, PostgresEventStore(url) as other:
        s.acquire("o", dead_owner(), 600.0)
        s.append("o", [ev(RunStarted, "o", workflow="wf", ts=1.0)], 0, epoch=1)
        execute, taken = psycopg.Connection.execute, []

        def take_over_first(self: psycopg.Connection, query, params=None, **kw):  # type: ignore[no-untyped-def]
            if query == q.SQL_CLAIM_LOCK and not taken:
                taken.append(other.acquire("o", owner("w-live"), 30.0, force=True))
            return execute(self, query, params, **kw)

        monkeypatch.setattr(psycopg.Connection, "execute", take_over_first)
        assert s.claim(owner("w-claimer"), ["wf"], 15.0, limit=5) == []
        assert len(taken) == 1
        info = s.session_info("o")
        assert info is not None and (info.owner, info.epoch) == (owner("w-live"), taken[0].epoch)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (psycopg.errors.DeadlockDetected("deadlock detected"), StoreLocked),
        (psycopg.errors.SerializationFailure("could not serialize access"), StoreLocked),
        (psycopg.errors.LockNotAvailable("could not obtain lock"), StoreLocked),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), StoreLocked),
        (
            psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
            StoreUnavailable,
        ),
        (psycopg.OperationalError("server closed the connection unexpectedly"), StoreUnavailable),
        (psycopg.errors.DiskFull("could not extend file"), StoreDiskFull),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v.__name__,
)
def test_an_error_of_the_server_is_typed_by_its_sqlstate(error: Exception, kind: type[Exception]):
    # a worker retries a StoreLocked at once, and waits out a StoreUnavailable as an outage
    got = store_error(error, "db:5432/x", "append events")
    assert type(got) is kind and "db:5432/x" in str(got) and "append events" in str(got)
