"""A PostgreSQL server that goes away (stopped, restarted, frozen): not a refusal of writes
and not a crash. The sessions it halts are taken back by the same worker without spending
a recovery or counting a failure; a drain meanwhile does not wait out the server; a pool
that gives no connection fails after its timeout, once, and a call a frozen server does not
answer after the call timeout; ``show --follow`` waits for it. A cluster of its own
(tests/pg_cluster.py), stopped, started, frozen and thawed by the tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from flowscope import START, NodeContext, Runner, Worker, Workflow, node
from flowscope.errors import StoreUnavailable
from flowscope.store import PostgresEventStore, rebuild

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    from pg_cluster import PgCluster

    c = PgCluster.start()
    try:
        yield c
    finally:
        c.stop()


@node
async def steps(ctx: NodeContext, n: int) -> int:
    for _ in range(n):
        await asyncio.sleep(0.1)
    return n


async def _tick(ctx: NodeContext, n: int) -> int:
    await asyncio.sleep(0.2)
    return n


#: 16 nodes of 0.2 s: the session appends all along, and an outage cuts it off.
CHAIN = Workflow("chain", edges=[(START, *[node(_tick, name=f"t{i}") for i in range(16)])])


def _store(cluster, name: str) -> PostgresEventStore:
    return PostgresEventStore(cluster.url(), schema=cluster.new_schema(name), timeout=1.0)


def test_a_restart_under_a_worker_spends_no_recovery_and_counts_no_failure(cluster):
    store = _store(cluster, "restart")
    wf = CHAIN
    sids = [Runner(wf, store).submit(1) for _ in range(3)]
    w = Worker(store, [wf], poll_s=0.05, lease_s=30.0)

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        loop = asyncio.get_running_loop()
        for _ in range(1):
            await asyncio.sleep(1.0)
            await loop.run_in_executor(None, cluster.stop_server)
            await asyncio.sleep(2.5)  # past the pool's timeout: the sessions' appends fail
            await loop.run_in_executor(None, cluster.start_server)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if all(store.session_info(s).status == "completed" for s in sids):
                    break
            except StoreUnavailable:
                pass
            await asyncio.sleep(0.2)
        w.stop()
        await task

    asyncio.run(main())
    for sid in sids:
        info = store.session_info(sid)
        assert info.status == "completed", info
        ws = rebuild(store.read(sid))
        assert not any(ns.recoveries for ns in ws.nodes.values()), sid  # a halt, not a crash
    assert w.outcomes.get("failed", 0) == 0, w.outcomes
    assert w.outcomes.get("store_fault", 0) >= 1 and w.outcomes["completed"] == 3, w.outcomes
    with store._pool.connection() as conn:  # no session was claimed as an orphan
        rows = conn.execute(f"SELECT recoveries FROM {store.schema}.sessions").fetchall()
    assert [r[0] for r in rows] == [0, 0, 0]
    store.close()


def test_a_drain_while_the_server_is_down_does_not_wait_it_out(cluster):
    store = _store(cluster, "drain")
    wf = Workflow("long", edges=[(START, steps)])
    for _ in range(5):
        Runner(wf, store).submit(600)
    w = Worker(store, [wf], poll_s=0.05, lease_s=30.0, drain_s=1.0)
    took: list[float] = []

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        deadline = time.monotonic() + 30
        while len(w._active) < 5:
            assert time.monotonic() < deadline, "the worker did not take the five sessions"
            await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, cluster.stop_server)
        deadline = time.monotonic() + 30
        while w.store_writable is not False:  # the probe or a halted session says so
            assert time.monotonic() < deadline, "the worker never saw the server go"
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        w.stop()
        await task
        took.append(time.monotonic() - t0)

    try:
        asyncio.run(main())
    finally:
        cluster.start_server()
    # one group commit of the sessions' last events waits out the pool (1 s), no call per session
    assert took[0] < 12.0, took
    store.close()


def test_a_read_while_the_server_is_down_fails_after_the_pool_timeout_once(cluster):
    store = _store(cluster, "read")
    sid = Runner(Workflow("long", edges=[(START, steps)]), store).submit(1)
    cluster.stop_server()
    try:
        for call in (lambda: store.session_info(sid), lambda: store.read(sid)):
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            assert time.monotonic() - t0 < 1.8  # timeout=1.0, not twice it
    finally:
        cluster.start_server()
    store.close()


def test_a_call_to_a_frozen_server_fails_after_the_call_timeout_and_the_next_one_works(cluster):
    store = PostgresEventStore(
        cluster.url(), schema=cluster.new_schema("frozen"), timeout=1.0, call_timeout=1.0
    )
    sid = Runner(Workflow("long", edges=[(START, steps)]), store).submit(1)
    outcome: list[object] = []
    pids = cluster.freeze()  # the pool's connection is open: nothing answers on it
    safety = threading.Timer(20.0, cluster.thaw, [pids])  # on code that waits for ever
    safety.start()
    try:
        t0 = time.monotonic()
        try:
            outcome.append(store.session_info(sid))
        except StoreUnavailable as exc:
            outcome.append(exc)
        took = time.monotonic() - t0
    finally:
        safety.cancel()
        cluster.thaw(pids)
    assert isinstance(outcome[0], StoreUnavailable) and "call_timeout" in str(outcome[0]), outcome
    assert took < 1.8, took  # the call, cut off once: a retry would wait out another second
    assert store.session_info(sid).status == "queued"  # thawed: a new connection answers
    store.close()


def test_opening_a_store_on_a_frozen_server_says_it_did_not_answer_not_that_it_refused(cluster):
    url = cluster.url()
    pids = cluster.freeze()
    try:
        with pytest.raises(StoreUnavailable) as caught:
            PostgresEventStore(url, timeout=1.0)
    finally:
        cluster.thaw(pids)
    text = str(caught.value)
    assert "did not answer" in text and "pg_isready" in text, text
    assert "password" not in text and "refused" not in text, text  # not the advice for a login refused


def test_a_drain_while_the_server_is_frozen_ends_after_the_call_timeout_and_loses_nothing(cluster):
    schema = cluster.new_schema("frozendrain")
    store = PostgresEventStore(cluster.url(), schema=schema, timeout=1.0, call_timeout=1.0)
    sids = [Runner(CHAIN, store).submit(1) for _ in range(4)]
    w = Worker(store, [CHAIN], poll_s=0.05, lease_s=3.0, drain_s=1.0)
    took: list[float] = []
    pids: list[int] = []

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        deadline = time.monotonic() + 30
        while len(w._active) < 4:
            assert time.monotonic() < deadline, "the worker did not take the four sessions"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        pids.extend(cluster.freeze())
        safety.start()
        deadline = time.monotonic() + 10
        while w.store_writable is not False:  # a cut-off call says so
            assert time.monotonic() < deadline, "the worker never saw the server freeze"
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        w.stop()
        await task
        took.append(time.monotonic() - t0)

    safety = threading.Timer(30.0, lambda: cluster.thaw(pids))  # on code that waits for ever
    try:
        asyncio.run(main())
    finally:
        safety.cancel()
        cluster.thaw(pids)
    assert took[0] < 1.0 + 1.0 + 1.0 + 2.0, took  # a call cut off, a wait for a connection, the drain
    store.close()
    # thawed: another worker takes the sessions over once their leases run out, and runs
    # each node the frozen one did not record as completed
    store = PostgresEventStore(cluster.url(), schema=schema, timeout=1.0)
    w2 = Worker(store, [CHAIN], poll_s=0.05, lease_s=3.0)

    async def finish() -> None:
        task = asyncio.ensure_future(w2.run())
        deadline = time.monotonic() + 60
        while not all(store.session_info(s).status == "completed" for s in sids):
            assert time.monotonic() < deadline, [store.session_info(s).status for s in sids]
            await asyncio.sleep(0.2)
        w2.stop()
        await task

    asyncio.run(finish())
    for sid in sids:
        ws = rebuild(store.read(sid))
        assert ws.status == "completed" and all(ns.status == "completed" for ns in ws.nodes.values()), sid
    store.close()


def test_show_follow_waits_out_a_restart_and_ends_with_the_session(cluster):
    from commands import run_cli, start_cli

    url = cluster.new_database("follow")
    assert run_cli("--db", url, "start", "nightly_export", "--session", "f-1").returncode == 0
    proc = start_cli("--db", url, "show", "f-1", "--follow", "--interval", "200ms")
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # drawn once (a fixed wait lost to a slow start under load)
        assert first.startswith("session f-1"), first
        cluster.stop_server()
        time.sleep(1.5)
        cluster.start_server()
        cluster.wait_ready()
        assert run_cli("--db", url, "cancel", "f-1").returncode == 0
        rest, err = proc.communicate(timeout=30)
        out = first + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "cancelled" in out and err.count("retrying every") == 1, err


def test_the_metrics_server_and_the_console_say_an_outage_without_the_pools_own_retries(cluster):
    import urllib.request

    from commands import run_cli, start_cli

    url = cluster.new_database("quiet")
    assert run_cli("--db", url, "start", "nightly_export", "--session", "q-1").returncode == 0
    procs = [
        start_cli("--db", url, "serve-metrics", "--port", "0"),
        start_cli("--db", url, "ui", "--port", "0"),
    ]
    try:
        metrics = procs[0].stdout.readline().split()[1]  # "serving URL (store ...)"
        assert procs[1].stdout.readline().startswith("http://127.0.0.1:")
        cluster.stop_server()
        for _ in range(2):  # scrapes while it is down: the pool tries to connect again
            try:
                urllib.request.urlopen(metrics, timeout=5).read()
            except OSError:
                pass
        cluster.start_server()
        cluster.wait_ready()
    finally:
        for proc in procs:
            proc.terminate()
    errs = [proc.communicate(timeout=30)[1] for proc in procs]
    for err in errs:
        assert "psycopg" not in err and "error connecting" not in err, err  # the driver's own lines
    assert len(errs[0].splitlines()) <= 3, errs[0]  # the collector's own line per failed scrape
