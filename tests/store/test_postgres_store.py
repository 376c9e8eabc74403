"""PostgresEventStore beyond the shared contract: faults named in one line (never the
password), migrations applied once by concurrent openers, claim races, the fence, NOTIFY
waking a waiter, thread safety, and a server restart in the middle of a run."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from flowscope import START, Runner, Workflow, node
from flowscope.engine.lease import safe_until
from flowscope.errors import (
    ConcurrencyConflict,
    LeaseLost,
    NotAFlowscopeDatabase,
    StoreReadOnly,
    StoreSchemaTooNew,
    StoreUnavailable,
)
from flowscope.events import NodeStarted, RunStarted, RunSubmitted
from flowscope.ownership import Owner, this_process
from flowscope.store import NodeRun, PostgresEventStore, rebuild
from flowscope.store.postgres import DB_SCHEMA_VERSION, redact, server
from flowscope.store.postgres import queries as q
from flowscope.store.testing import ev
from flowscope.store.testing.helpers import summary_asks_each_owner_once
from pg_cluster import PASSWORD, PASSWORD_ROLE, PgCluster

# A real PostgreSQL cluster, started by the test session: the full suite, not the fast loop.
pytestmark = pytest.mark.slow


@pytest.fixture
def url(pg_cluster: PgCluster) -> str:
    return pg_cluster.new_database()


def owner(wid: str, host: str = "host-x", pid: int = 999_999) -> Owner:
    return Owner(worker_id=wid, host=host, pid=pid, started_at=1.0)


def submit(store: PostgresEventStore, sid: str, workflow: str = "wf", ts: float = 1000.0) -> None:
    store.append(sid, [ev(RunSubmitted, sid, workflow=workflow, input=1, ts=ts)], 0)


# ---------------------------------------------------------------- naming the server


def test_redact_and_server_never_show_the_password():
    u = "postgresql://alice:top%20secret@db.example:6543/orders?sslmode=require&password=x2"
    assert "secret" not in redact(u) and "x2" not in redact(u)
    assert redact(u).startswith("postgresql://alice:***@db.example:6543/orders")
    assert server(u) == "db.example:6543/orders"
    assert redact("host=h password='a b' dbname=d") == "host=h password=*** dbname=d"
    assert redact("postgresql://bob@h/d") == "postgresql://bob@h/d"


def test_unreachable_server_is_one_line_naming_host_port_and_db():
    with pytest.raises(StoreUnavailable) as info:
        PostgresEventStore("postgresql://flowscope:hunter2@127.0.0.1:1/orders", timeout=2)
    msg = str(info.value)
    assert "127.0.0.1:1/orders" in msg and "nothing answers" in msg
    assert "hunter2" not in msg and "\n" not in msg


def test_wrong_credentials(pg_cluster: PgCluster):
    bad = pg_cluster.url(user=PASSWORD_ROLE, password="not-" + PASSWORD)
    with pytest.raises(StoreUnavailable) as info:
        PostgresEventStore(bad)
    msg = str(info.value)
    assert f"127.0.0.1:{pg_cluster.port}/flowscope" in msg and "refused" in msg
    assert PASSWORD not in msg and "not-" not in msg and "\n" not in msg
    # the right password works (scram over TCP)
    with pg_cluster.admin(pg_cluster.url().rsplit("/", 1)[1]) as a:
        a.execute(f"CREATE SCHEMA IF NOT EXISTS pw AUTHORIZATION {PASSWORD_ROLE}")
    with PostgresEventStore(pg_cluster.url(user=PASSWORD_ROLE, password=PASSWORD), schema="pw") as s:
        assert "s3cret" not in repr(s) and "s3cret" not in s.path and s.sessions() == []


def test_a_database_of_another_application_is_refused(url: str):
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(NotAFlowscopeDatabase) as info:
        PostgresEventStore(url)
    assert "invoices" in str(info.value) and server(url) in str(info.value)
    with psycopg.connect(url, autocommit=True) as c:  # its meta table, someone else's
        c.execute("DROP TABLE invoices")
        c.execute("CREATE TABLE meta (key text primary key, value text)")
        c.execute("INSERT INTO meta VALUES ('application', 'billing')")
    with pytest.raises(NotAFlowscopeDatabase):
        PostgresEventStore(url)


def test_a_newer_schema_is_refused(url: str):
    PostgresEventStore(url).close()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(DB_SCHEMA_VERSION + 1),))
    with pytest.raises(StoreSchemaTooNew) as info:
        PostgresEventStore(url)
    assert "upgrade flowscope" in str(info.value) and "\n" not in str(info.value)


def test_concurrent_openers_migrate_once(url: str):
    barrier = threading.Barrier(6)

    def open_one(_: int) -> int:
        barrier.wait()
        with PostgresEventStore(url, min_size=1, max_size=1) as s:
            return s.schema_version_found

    with ThreadPoolExecutor(6) as pool:
        found = list(pool.map(open_one, range(6)))
    assert sorted(found) == [0] + [DB_SCHEMA_VERSION] * 5  # one migrated, five found it done
    with psycopg.connect(url) as c:
        assert c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(DB_SCHEMA_VERSION),
        )


def test_a_schema_5_database_gets_each_restarted_runs_last_start_from_its_log(url: str):
    with PostgresEventStore(url) as s:
        s.append(
            "r",
            [
                ev(RunSubmitted, sid="r", workflow="w", ts=1.0),
                node_ev("w@1/a@1", 2.0),
                node_ev("w@1/b@1", 3.0),
            ],
            0,
        )
        s.append("r", [node_ev("w@1/a@1", 7.0, attempt=2, recovered=True)], 3)
        s.append("r", [node_ev("w@1/a@1", 9.0, attempt=3, recovered=True)], 4)
    with psycopg.connect(url, autocommit=True) as c:  # the database as schema 5 kept it
        c.execute("ALTER TABLE node_runs DROP COLUMN restarted_at")
        c.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    with PostgresEventStore(url) as s:
        assert s.schema_version_found == 5 and s.schema_version == DB_SCHEMA_VERSION
        runs = {r.path: r for r in s.node_runs("r")}
        assert (runs["w@1/a@1"].started_at, runs["w@1/a@1"].restarted_at) == (2.0, 9.0)
        assert (runs["w@1/b@1"].started_at, runs["w@1/b@1"].restarted_at) == (3.0, None)
        state = rebuild(s.read("r"))
        assert s.node_runs("r") == [
            NodeRun.from_state("r", state.workflow, ns) for ns in state.nodes.values()
        ]


def node_ev(path: str, ts: float, **kw) -> NodeStarted:
    return ev(NodeStarted, sid="r", path=path, node=path.rsplit("/", 1)[-1].split("@")[0], ts=ts, **kw)


def test_a_schema_4_database_keeps_its_messages_when_their_body_becomes_the_text_sent(url: str):
    with PostgresEventStore(url) as s:
        s.send("m", "answer", {"inputs": {"ok": True}, "jobs": {}})
    with psycopg.connect(url, autocommit=True) as c:  # the inbox as schema 4 kept it
        c.execute("ALTER TABLE messages ALTER COLUMN body TYPE jsonb USING body::jsonb")
        c.execute("ALTER TABLE node_runs DROP COLUMN restarted_at")
        c.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    with PostgresEventStore(url) as s:
        assert s.schema_version_found == 4 and s.schema_version == DB_SCHEMA_VERSION
        assert [dict(m.body) for m in s.inbox("m")] == [{"inputs": {"ok": True}, "jobs": {}}]
    with psycopg.connect(url) as c:
        assert c.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name = 'messages' AND column_name = 'body'"
        ).fetchone() == ("text",)


def test_a_schema_1_database_is_migrated_to_the_span_watermark_table_keeping_its_log(url: str):
    with PostgresEventStore(url) as s:  # a database as the first release wrote it: schema 1, one session
        s.append("old", [ev(RunSubmitted, sid="old", workflow="w", ts=1.0)], 0)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DROP TABLE span_exports")
        c.execute("DROP TABLE messages")
        c.execute("DROP INDEX sessions_leased")
        c.execute("ALTER TABLE node_runs DROP COLUMN restarted_at")
        c.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with PostgresEventStore(url) as s:
        assert s.schema_version_found == 1 and s.schema_version == DB_SCHEMA_VERSION == 6
        assert s.last_seq("old") == 1 and s.exported_seq("old") == 0 and s.inbox("old") == []
        s.set_exported_seq("old", 1)
        s.acquire("old", this_process("w"), 15.0)  # schema 4: the held lease's owner is indexed
    with psycopg.connect(url) as c:
        assert c.execute("SELECT to_regclass('sessions_leased') IS NOT NULL").fetchone() == (True,)
    with PostgresEventStore(url, readonly=True) as s:  # kept in the database, readable by a reader
        assert s.exported_seq("old") == 1
        with pytest.raises(StoreReadOnly):
            s.set_exported_seq("old", 2)


# ---------------------------------------------------------------- fences and claims


def test_two_workers_claiming_the_same_queued_session_at_once_one_wins(url: str):
    with PostgresEventStore(url) as s:
        submit(s, "q1")
    stores = [PostgresEventStore(url) for _ in range(8)]
    try:
        barrier = threading.Barrier(len(stores))

        def claim(i: int) -> list:
            barrier.wait()
            return stores[i].claim(owner(f"w{i}"), ["wf"], 15.0, limit=5)

        with ThreadPoolExecutor(len(stores)) as pool:
            results = list(pool.map(claim, range(len(stores))))
        winners = [i for i, r in enumerate(results) if r]
        assert len(winners) == 1 and [c.session_id for c in results[winners[0]]] == ["q1"]
        won = results[winners[0]][0]
        # the losers append nothing: a loser that writes under its own (absent) lease is fenced
        loser = stores[(winners[0] + 1) % len(stores)]
        with pytest.raises(LeaseLost):
            loser.append("q1", [ev(NodeStarted, "q1", path="wf/a", node="a")], 1, epoch=won.lease.epoch + 1)
        assert loser.last_seq("q1") == 1
        stores[winners[0]].append(
            "q1", [ev(NodeStarted, "q1", path="wf/a", node="a")], 1, epoch=won.lease.epoch
        )
    finally:
        for s in stores:
            s.close()


def test_a_claim_that_waits_on_a_lock_longer_than_the_lease_still_gets_a_whole_lease(
    url: str, pg_cluster: PgCluster
):
    # an operator's LOCK TABLE (what VACUUM FULL takes) holds the claim up past its lease:
    # the orphan's one recovery is counted, and its new owner may run it
    lease_s = 1.0
    with PostgresEventStore(url, max_size=2) as s:
        t = time.time() - 100.0
        s.acquire("o", owner("w-dead", host="host-far"), 10.0, now=t)  # its lease long over
        s.append("o", [ev(RunStarted, "o", workflow="wf", ts=t)], 0, epoch=1)
        locked = threading.Event()

        def hold() -> None:
            with pg_cluster.admin(url.rsplit("/", 1)[1]) as conn, conn.transaction():
                conn.execute("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
                locked.set()
                time.sleep(1.5 * lease_s)

        holder = threading.Thread(target=hold)
        holder.start()
        assert locked.wait(10)
        [c] = s.claim(owner("w-a"), ["wf"], lease_s, limit=5, max_recoveries=0)
        holder.join()
        assert (c.session_id, c.reason, c.lease.epoch) == ("o", "orphaned", 2)
        assert safe_until(c.lease, lease_s).wall > time.time()  # its taker runs it
        assert s.claim(owner("w-b"), ["wf"], lease_s, limit=5) == []  # nor is it taken again
        assert s._rows("read", "SELECT recoveries FROM sessions WHERE session_id = 'o'") == [(1,)]


def test_an_append_under_a_superseded_epoch_writes_nothing(url: str):
    with PostgresEventStore(url) as s:
        first = s.acquire("f1", owner("a"), 15.0)
        s.append("f1", [ev(NodeStarted, "f1", path="wf/a", node="a")], 0, epoch=first.epoch)
        second = s.acquire("f1", owner("b"), 15.0, force=True)
        with pytest.raises(LeaseLost):
            s.append("f1", [ev(NodeStarted, "f1", path="wf/b", node="b")], 1, epoch=first.epoch)
        with pytest.raises(LeaseLost):
            s.renew(first, 15.0)
        assert s.last_seq("f1") == 1 and second.epoch == first.epoch + 1


def test_concurrent_appends_to_a_new_session_one_wins(url: str):
    stores = [PostgresEventStore(url) for _ in range(4)]
    try:
        barrier = threading.Barrier(4)

        def append(i: int) -> str:
            barrier.wait()
            try:
                stores[i].append("n1", [ev(NodeStarted, "n1", path=f"wf/{i}", node=str(i))], 0)
                return "ok"
            except ConcurrencyConflict:
                return "conflict"

        with ThreadPoolExecutor(4) as pool:
            outcomes = sorted(pool.map(append, range(4)))
        assert outcomes == ["conflict"] * 3 + ["ok"]
        assert stores[0].last_seq("n1") == 1
    finally:
        for s in stores:
            s.close()


def test_a_notify_wakes_a_waiter_at_once(url: str):
    with PostgresEventStore(url) as waiter, PostgresEventStore(url) as writer:
        waiter.wait_for_work(0.01)  # starts the listener
        deadline = time.monotonic() + 5
        while waiter.wait_for_work(0.05) and time.monotonic() < deadline:
            pass  # drain the listener's first "look once"
        got: list[float] = []

        def wait() -> None:
            t = time.monotonic()
            if waiter.wait_for_work(5.0):
                got.append(time.monotonic() - t)

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.2)
        submit(writer, "w1")
        t.join(6)
        assert got and got[0] < 1.0, got  # woken by the NOTIFY, not by the 5 s timeout
        assert waiter.wait_for_work(0.1) is False  # nothing new


def test_renewals_from_threads_while_appending(url: str):
    with PostgresEventStore(url, max_size=4) as s:
        leases = [s.acquire(f"t{i}", owner(f"w{i}"), 15.0) for i in range(8)]
        stop = threading.Event()
        errors: list[BaseException] = []

        def renew() -> None:
            while not stop.is_set():
                try:
                    for lease in leases:
                        s.renew(lease, 15.0)
                        s.heartbeat(lease.session_id, ["wf/a"])
                except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=renew) for _ in range(3)]
        for th in threads:
            th.start()
        for n in range(20):
            for lease in leases:
                s.append(
                    lease.session_id,
                    [ev(NodeStarted, lease.session_id, path=f"wf/{n}", node="x")],
                    n,
                    epoch=lease.epoch,
                )
        stop.set()
        for th in threads:
            th.join()
        assert not errors
        assert all(s.last_seq(lease.session_id) == 20 for lease in leases)


def test_a_claim_locks_the_oldest_queued_rows_through_the_index_without_sorting_the_queue(url: str):
    # Sorting below the row lock reads every queued session of the workflows to lock the
    # first: a claim's cost would grow with the queue, not with what it takes.
    with PostgresEventStore(url) as s:
        for i in range(300):
            submit(s, f"s{i}", "wf" if i % 2 else "other", ts=1000.0 + i)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ANALYZE sessions")
        params = {"workflows": ["wf", "other"], "now": 2000.0, "limit": 1, "max_recoveries": 3}
        plan = [r[0] for r in c.execute("EXPLAIN " + q.SQL_CLAIM_FREE["queued"], params)]
    lock = next(i for i, line in enumerate(plan) if "LockRows" in line)
    assert not any("Sort" in line for line in plan[lock:]), "\n".join(plan)


def test_the_open_run_summary_asks_whether_each_owner_is_alive_once(url: str, monkeypatch):
    with PostgresEventStore(url) as store:
        summary_asks_each_owner_once(store, monkeypatch)


# ---------------------------------------------------------------- the server restarted mid-run


COUNTS: dict[str, int] = {}


def _step(name: str):
    async def body(ctx, x):
        COUNTS[name] = COUNTS.get(name, 0) + 1
        if name == "s3" and ctx.attempt == 1 and RESTART.get("cluster") is not None:
            cluster = RESTART.pop("cluster")
            await asyncio.to_thread(cluster.restart)
        return (x or 0) + 1

    body.__name__ = name
    return node(body, name=name)


RESTART: dict[str, PgCluster] = {}
STEPS = [_step(f"s{i}") for i in range(1, 6)]


def test_a_run_cut_by_a_server_restart_resumes_with_nothing_completed_run_twice(pg_cluster: PgCluster):
    wf = Workflow("pg_restart_chain", edges=[(START, *STEPS)])
    url = pg_cluster.new_database()
    COUNTS.clear()
    RESTART["cluster"] = pg_cluster
    with PostgresEventStore(url) as s:
        runner = Runner(wf, store=s, heartbeat_interval=0)
        with pytest.raises(StoreUnavailable) as info:
            asyncio.run(runner.run(0, session_id="r1"))
        msg = str(info.value)
        assert server(url) in msg and "\n" not in msg
        pg_cluster.wait_ready()
        done = {p for p, ns in rebuild(s.read("r1")).nodes.items() if ns.status == "completed"}
        assert done, "nothing completed before the restart: the test proved nothing"
        result = asyncio.run(Runner(wf, store=s, heartbeat_interval=0).resume("r1"))
        assert result.status == "completed" and result.output == 5
        ws = rebuild(s.read("r1"))
        for path in done:  # completed before the cut: never run again
            assert ws.nodes[path].attempt == 1
        assert COUNTS["s1"] == 1 and COUNTS["s2"] == 1


def test_lease_renewals_lock_their_rows_in_one_order_so_two_rounds_never_deadlock(url):
    """Two keepers renewing the same leases, listed in opposite orders, at once: the rows
    are locked in session-id order whatever the list's order, so neither waits on the other
    in a cycle (40P01)."""
    from flowscope.store.postgres import queries as q

    n = 300
    with PostgresEventStore(url) as store:
        for i in range(n):
            submit(store, f"s{i:04d}")
        leases = [store.acquire(f"s{i:04d}", owner("k"), 60.0) for i in range(n)]
    deadlocks: list[BaseException] = []
    barrier = threading.Barrier(2)

    def keeper(order: list) -> None:
        params = {
            "expires": 1e12,
            "now": time.time(),
            "sids": [lease.session_id for lease in order],
            "epochs": [lease.epoch for lease in order],
        }
        with psycopg.connect(url) as conn:
            for _ in range(15):
                barrier.wait()
                try:
                    with conn.transaction():
                        rows = conn.execute(q.SQL_RENEW_MANY, params).fetchall()
                    assert len(rows) == n
                except psycopg.errors.DeadlockDetected as exc:
                    deadlocks.append(exc)

    threads = [threading.Thread(target=keeper, args=(o,)) for o in (leases, leases[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not deadlocks, f"{len(deadlocks)} of 30 renewal rounds deadlocked"


def test_sessions_started_together_take_their_leases_in_one_transaction(url: str):
    """``acquire_new_many``: one transaction for every start (one durable commit, not one
    per session): every row it wrote carries the same ``xmin``, the id of the transaction
    that last wrote it."""
    me = owner("starter")
    with PostgresEventStore(url) as store:
        earlier = store.acquire_new("owned-before", owner("gone"), 15.0, now=1.0)  # lapsed, no events
        assert earlier is not None
        sids = ["n3", "owned-before", "n1", "n2"]
        got = store.acquire_new_many(sids, me, 15.0, now=time.time())
        assert [(g.session_id, g.owner) for g in got if g is not None and not isinstance(g, Exception)] == [
            (sid, me) for sid in sids
        ]
        by_sid = {g.session_id: g.epoch for g in got if g is not None and not isinstance(g, Exception)}
        assert by_sid == {"n3": 1, "owned-before": earlier.epoch + 1, "n1": 1, "n2": 1}
        with psycopg.connect(url) as conn:
            xmins = conn.execute(
                "SELECT DISTINCT xmin::text FROM sessions WHERE session_id = ANY(%s)", (sids,)
            ).fetchall()
        assert len(xmins) == 1, f"{len(xmins)} transactions wrote the {len(sids)} leases"


def test_two_runners_starting_the_same_sessions_in_opposite_orders_never_deadlock(url: str):
    """Two batches of starts over the same new sessions, listed in opposite orders, at once:
    the rows are made and locked in key order, so neither waits on the other in a cycle
    (which the server would break by failing one batch, every start in it); each session
    goes to exactly one of them."""
    n, rounds = 200, 10
    stores = [PostgresEventStore(url) for _ in range(2)]
    owners = [owner("left"), owner("right")]
    failures: list[BaseException] = []
    won: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def starter(i: int) -> None:
        for r in range(rounds):
            sids = [f"r{r}-s{k:04d}" for k in range(n)]
            barrier.wait()
            try:
                got = stores[i].acquire_new_many(sids if i == 0 else sids[::-1], owners[i], 60.0)
            except Exception as exc:
                failures.append(exc)
                continue
            won[i] += [g.session_id for g in got if g is not None and not isinstance(g, Exception)]

    try:
        threads = [threading.Thread(target=starter, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for s in stores:
            s.close()
    assert not failures, f"{len(failures)} of {2 * rounds} batches failed: {failures[0]}"
    assert sorted(won[0] + won[1]) == sorted(f"r{r}-s{k:04d}" for r in range(rounds) for k in range(n))


@pytest.mark.slow
def test_after_a_restart_a_read_takes_a_live_connection_whatever_the_pool_held(pg_cluster: PgCluster):
    """Every idle connection died with the server, and the pool finds each one only when it
    hands it out: a read's one retry took the next dead one, and a long-lived store (a
    worker, the metrics server) failed a call for each connection it had pooled."""
    url = pg_cluster.new_database()
    with PostgresEventStore(url, max_size=6) as s:
        sid = Runner(Workflow("w", edges=[(START, STEPS[0])]), s).submit(1)
        held = [s._pool.getconn() for _ in range(5)]  # five connections in the pool, idle
        for conn in held:
            s._pool.putconn(conn)
        pg_cluster.restart()
        pg_cluster.wait_ready()
        for _ in range(3):
            assert s.session_info(sid) is not None and s.read(sid)  # the first call already
