"""A store that refuses writes (a full disk, a read-only database): the worker says it once
per episode, backs off, releases what it can, takes its sessions back without spending a
recovery, and stops with exit code 3 when the outage lasts. Real SQLite files (a full
tmpfs, SQLite's own size limit, ``PRAGMA query_only``), real worker processes, and a real
PostgreSQL database made read-only with ``default_transaction_read_only``."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from commands import cli_ok, run_cli, start_cli
from conftest import unavailable
from flowscope import START, NodeContext, Runner, Worker, Workflow, node
from flowscope.engine.submit import submit_run
from flowscope.errors import StoreDiskFull, StoreLocked, StoreNotWritable, StoreReadOnly, StoreUnavailable
from flowscope.observability.metrics import MetricsPlugin
from flowscope.outage import BACKOFF_CAP_S, StoreOutage
from flowscope.plugins import Plugin
from flowscope.store import SqliteEventStore, rebuild
from prom_harness import free_port
from waiting import until, wait_for

BIG = "x" * 65536  # needs new pages: refused by a database that may not grow


def _limit(store: SqliteEventStore, pages: int | None) -> None:
    """SQLite's own size limit: the file may not grow past ``pages`` (None: the current
    size). Appends that need new pages fail with a real SQLITE_FULL; small in-place
    writes (a lease's release) may still go through, as on a nearly full disk."""
    with store._lock:
        assert store._conn is not None
        if pages is None:
            pages = int(store._conn.execute("PRAGMA page_count").fetchone()[0])
        store._conn.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_or_read_only_sqlite_store_raises_the_write_fault_classes(tmp_path):
    store = SqliteEventStore(tmp_path / "c.db")
    wf = Workflow("tiny", edges=[(START, _big)])
    sid = Runner(wf, store).submit(None)
    _limit(store, None)
    with pytest.raises(StoreDiskFull) as full:
        Runner(wf, store).submit(BIG)
    assert isinstance(full.value, StoreNotWritable)
    _limit(store, 1 << 30)
    with store._lock:
        store._conn.execute("PRAGMA query_only = 1")  # type: ignore[union-attr]
    with pytest.raises(StoreReadOnly) as ro:
        store.workers_seen(Runner(wf, store).owner, ["tiny"])
    assert isinstance(ro.value, StoreNotWritable)
    assert store.session_info(sid) is not None  # reads still work
    store.close()


def test_the_outage_backs_off_exponentially_capped_and_is_exhausted_after_its_limit():
    o = StoreOutage(poll_s=0.1, limit_s=10.0)
    exc = StoreDiskFull("full")
    assert o.failed(exc, now=0.0) is True  # the first failure starts the episode: log it
    delays = [o.delay()]
    for t in range(1, 8):
        assert o.failed(exc, now=float(t)) is False  # the same episode: silent
        delays.append(o.delay())
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8] and max(delays) == BACKOFF_CAP_S
    assert not o.exhausted(now=9.9) and o.exhausted(now=10.0)
    assert o.succeeded(now=10.5) == 10.5 and not o.active and not o.exhausted(now=100.0)
    o.failed(exc, now=10.6)
    assert o.succeeded(now=10.7) is None  # the episode's end is said once
    assert o.delay() > 0.1  # a write that went through does not reset the episode's backoff
    assert o.failed(exc, now=11.0) is False  # flapping: still one episode
    assert o.failed(exc, now=11.0 + 31.0) is True  # after a quiet gap: a new episode


@node
async def _big(ctx: NodeContext, x):
    gate = _GATES.get(ctx.run.session_id)
    if gate is not None and ctx.attempt == 1:
        await gate.wait()
    return BIG


_GATES: dict[str, asyncio.Event] = {}


@pytest.mark.slow
def test_a_full_sqlite_store_sessions_are_taken_back_by_their_worker_without_a_recovery(tmp_path, caplog):
    """SQLite's size limit (a real SQLITE_FULL) while three sessions are in flight: their
    appends fail, they halt and keep their leases (released, a small write that still goes
    through, they read as orphaned), the worker says it once and takes them back when the
    limit is lifted, each after a backoff that doubles (the probe's small write goes through
    while their events do not: it took them back, and they halted, hundreds of times a
    second): all complete, no recovery is spent (session or node), the cut-off node ran
    again as a higher attempt not flagged recovered, and the metrics count three claims and
    three completed runs, no failed one."""
    caplog.set_level(logging.INFO)
    wf = Workflow("bigout", edges=[(START, _big)])
    store = SqliteEventStore(tmp_path / "w.db")
    sids = [Runner(wf, store).submit(i) for i in range(3)]
    released: list[str] = []
    real_release = store.release

    def release(lease):  # the real release, observed
        real_release(lease)
        released.append(lease.session_id)

    store.release = release  # type: ignore[method-assign]
    registry = CollectorRegistry()
    metrics = MetricsPlugin(registry=registry, job_results=False)

    async def main() -> Worker:
        for sid in sids:
            _GATES[sid] = asyncio.Event()
        w = Worker(store, [wf], [metrics], poll_s=0.02, lease_s=3.0, max_store_outage_s=30.0)
        task = asyncio.ensure_future(w.run())
        await until(
            lambda: sum(r.path.endswith("_big@1") for r in store.open_runs()) == 3, "three runs in flight"
        )
        _limit(store, None)
        for sid in sids:
            _GATES[sid].set()
        await until(lambda: w.outcomes.get("store_fault", 0) >= 3, "three sessions halted by the full store")
        await asyncio.sleep(0.5)  # the worker backs off and probes meanwhile
        _limit(store, 1 << 30)
        await until(lambda: all(store.session_info(s).status == "completed" for s in sids), "all completed")
        w.stop()
        await task
        return w

    try:
        w = asyncio.run(main())
    finally:
        _GATES.clear()
    assert released == []  # kept at the fault (a completed session's ends with its last commit)
    for sid in sids:
        info = store.session_info(sid)
        assert info.status == "completed"
        row = store._conn.execute("SELECT recoveries FROM sessions WHERE session_id = ?", (sid,)).fetchone()
        assert row[0] == 0  # taken back by its own worker: not claimed as an orphan
        run = next(r for r in store.node_runs(sid) if r.path.endswith("_big@1"))
        assert run.attempt >= 2 and run.status == "completed"
        ws = rebuild(store.read(sid))
        assert ws.nodes[run.path].recoveries == 0  # cut off by the halt, not by a crash
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("flowscope")]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "StoreDiskFull: <path>: the disk" in warnings[0].getMessage()  # redacted, its colon kept
    assert warnings[0].exc_info is None
    assert w.outcomes.get("completed") == 3 and w.stopped_by is None
    assert 3 <= w.outcomes["store_fault"] <= 3 * 8, w.outcomes  # 0.02 s doubling over 0.5 s: about 5 each
    value = registry.get_sample_value
    assert value("flowscope_workflow_runs_total", {"workflow": "bigout", "outcome": "completed"}) == 3
    assert not value("flowscope_workflow_runs_total", {"workflow": "bigout", "outcome": "failed"})
    claims = {
        r: value("flowscope_worker_claims_total", {"workflow": "bigout", "reason": r})
        for r in ("queued", "orphaned")
    }
    assert claims == {"queued": 3, "orphaned": 0}, claims  # a take-back is no second claim
    assert value("flowscope_worker_active_sessions", {"workflow": "bigout"}) == 0
    store.close()


@pytest.mark.slow
def test_a_worker_on_a_read_only_store_stops_after_its_outage_limit_and_raises_why(tmp_path, caplog):
    wf = Workflow("bigout", edges=[(START, _big)])
    store = SqliteEventStore(tmp_path / "ro.db")
    Runner(wf, store).submit(1)
    with store._lock:
        store._conn.execute("PRAGMA query_only = 1")  # type: ignore[union-attr]
    w = Worker(store, [wf], poll_s=0.02, max_store_outage_s=0.6)
    t0 = time.monotonic()
    with pytest.raises(StoreReadOnly):
        asyncio.run(w.run())
    assert 0.6 <= time.monotonic() - t0 < 5.0
    assert w.stopped_by is not None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("flowscope")]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    store.close()


class _Writes(Plugin):
    """What a plugin hears of the store taking the worker's writes."""

    def __init__(self) -> None:
        self.heard: list[bool] = []

    def on_store_writes(self, writable: bool) -> None:
        self.heard.append(writable)


def _otel_value(reader: InMemoryMetricReader, name: str) -> float | None:
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    return metric.data.data_points[0].value
    return None


@pytest.mark.slow
def test_the_store_writable_gauge_reads_0_while_the_store_refuses_the_workers_writes(tmp_path):
    """``flowscope_worker_store_writable`` (both backends) is 1 from the worker's first
    write, 0 within a probe of the store refusing writes (no session needs to run), 1
    again once a write goes through; the plugins hear of each change once."""
    registry, reader = CollectorRegistry(), InMemoryMetricReader()
    metrics = MetricsPlugin(registry=registry, meter_provider=MeterProvider(metric_readers=[reader]))
    writes = _Writes()
    store = SqliteEventStore(tmp_path / "g.db")
    wf = Workflow("tiny", edges=[(START, _big)])
    w = Worker(store, [wf], [metrics, writes], poll_s=0.02, lease_s=0.3, max_store_outage_s=30.0)

    def gauge() -> float | None:
        return registry.get_sample_value("flowscope_worker_store_writable")

    def query_only(on: int) -> None:
        with store._lock:
            store._conn.execute(f"PRAGMA query_only = {on}")  # type: ignore[union-attr]

    seen: list[tuple[float | None, float | None]] = []

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        await until(lambda: gauge() == 1, "the first write")
        seen.append((gauge(), _otel_value(reader, "flowscope.worker.store_writable")))
        query_only(1)
        await until(lambda: gauge() == 0, "the refused write")
        seen.append((gauge(), _otel_value(reader, "flowscope.worker.store_writable")))
        await asyncio.sleep(0.3)  # more refused probes: no more changes
        query_only(0)
        await until(lambda: gauge() == 1, "a write that goes through")
        seen.append((gauge(), _otel_value(reader, "flowscope.worker.store_writable")))
        w.stop()
        await task

    asyncio.run(main())
    assert seen == [(1, 1), (0, 0), (1, 1)]
    assert writes.heard == [True, False, True]
    assert w.stopped_by is None
    store.close()


# ---------------------------------------------------------------------------- real processes

FLOWS_PY = """
import asyncio, os
from flowscope import START, Workflow, node

@node
async def chatty(ctx, x):
    for i in range(int(os.environ.get("STEPS", "200"))):
        ctx.state["i"] = "y" * 4000 + str(i)
        await asyncio.sleep(0.02)
    return x

looping = Workflow("looping", edges=[(START, chatty)])
"""


@pytest.fixture
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs (a real filesystem that fills up); root only."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        unavailable("mounting a small tmpfs needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def _writable_gauge(port: int) -> float | None:
    """``flowscope_worker_store_writable`` as the worker's endpoint serves it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "flowscope_worker_store_writable":
                return sample.value
    return None


@pytest.mark.slow
def test_flowscope_worker_on_a_full_disk_says_it_once_and_exits_3(tmp_path, tiny_fs):
    """A real full filesystem under a real ``flowscope worker``: one line for the fault
    episode, no traceback, its metrics endpoint reads ``flowscope_worker_store_writable 0``
    until it exits 3 with one line saying what is wrong and what to do; the log keeps
    everything committed before the disk filled, and no recovery is spent."""
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    port = free_port()
    db = tiny_fs / "w.db"
    with SqliteEventStore(db) as store:  # what `flowscope start looping --input i` records
        for i in range(4):
            submit_run(store, "looping", i)
    proc = start_cli(
        "--db",
        str(db),
        "worker",
        "flows:looping",
        "--poll",
        "50ms",
        "--lease",
        "2s",
        "--max-store-outage",
        "3s",
        "--metrics-port",
        str(port),
        cwd=tmp_path,
    )
    try:
        with SqliteEventStore(db, readonly=True) as probe:

            def running() -> bool:
                return sum(1 for s in probe.sessions() if s.status == "running") >= 4

            wait_for(running, 30, "the worker to start the sessions")
        assert _writable_gauge(port) == 1.0
        _fill(tiny_fs)
        wait_for(lambda: _writable_gauge(port) == 0.0, 3, "the gauge to read the refused writes")
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = err.strip().splitlines()
    assert proc.returncode == 3, err
    assert "Traceback" not in err
    faults = [x for x in lines if "StoreDiskFull" in x]
    assert len(faults) == 1, lines  # one line per fault episode
    assert lines[-1].startswith("flowscope: error: worker ") and "without a write going through" in lines[-1]
    assert "free space and retry" in lines[-1] and "free disk space" not in lines[-1]  # one piece of advice
    assert len(lines) == 3, lines  # the start line, the episode, the reason
    (tiny_fs / "filler").unlink()
    store = SqliteEventStore(db)
    for s in store.sessions():
        assert s.status == "running" and s.last_seq >= 3  # resumable from its log
        row = store._conn.execute(
            "SELECT recoveries FROM sessions WHERE session_id = ?", (s.session_id,)
        ).fetchone()
        assert row[0] == 0
    store.close()


@pytest.mark.slow
def test_flowscope_worker_on_a_read_only_postgres_database_stops_with_exit_3(tmp_path, pg_cluster):
    """``default_transaction_read_only`` on the worker's database: every claim and probe is
    refused (25006, a StoreReadOnly); one line, exit 3 after --max-store-outage."""
    (tmp_path / "flows.py").write_text(FLOWS_PY)
    url = pg_cluster.new_database("readonly_worker")
    cli_ok("--db", url, "start", "looping", "--input", "1", cwd=tmp_path)
    dbname = url.rsplit("/", 1)[1].split("?")[0]
    with pg_cluster.admin() as a:
        a.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
    r = run_cli(
        "--db",
        url,
        "worker",
        "flows:looping",
        "--poll",
        "50ms",
        "--max-store-outage",
        "1s",
        cwd=tmp_path,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    assert len([x for x in lines if "StoreReadOnly" in x]) == 1, lines
    assert lines[-1].startswith("flowscope: error: worker ") and "refuses writes" in lines[-1]


class _Unanswering(SqliteEventStore):
    """A store whose server stops answering the worker's probes and claims while ``down``
    (PostgreSQL's restart, made deterministic: the real one is in test_postgres_server_down)."""

    down = False

    def workers_seen(self, *args, **kwargs):
        if self.down:
            raise StoreUnavailable("lost the connection to PostgreSQL at h: the server closed it")
        return super().workers_seen(*args, **kwargs)

    def claim(self, *args, **kwargs):
        if self.down:
            raise StoreUnavailable("lost the connection to PostgreSQL at h")
        return super().claim(*args, **kwargs)


@node
async def _long_body(ctx: NodeContext, x):
    await asyncio.sleep(30)
    return x


@pytest.mark.slow
def test_a_drain_while_the_server_does_not_answer_records_nothing_even_if_it_answers_again(tmp_path):
    """The drain lets such a session go without a call (each would wait out a timeout) and
    without an abort that would record it cancelled, over for good, had the server answered
    meanwhile: the session stays running, for its lease to expire and a worker to claim it."""
    store = _Unanswering(tmp_path / "u.db")
    wf = Workflow("w", edges=[(START, _long_body)])
    sid = Runner(wf, store).submit(1)
    w = Worker(store, [wf], poll_s=0.05, lease_s=3.0, drain_s=0.2)

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        await until(lambda: bool(w._active), "the claim")
        store.down = True
        await until(lambda: w.store_writable is False, "the probe to fail")
        store.down = False  # back, but the worker naps before its next probe
        w.stop()
        await task

    asyncio.run(main())
    assert store.session_info(sid).status == "running"
    assert store.read(sid)[-1].type == "node_started"  # nothing recorded after the hand-off
    assert w.outcomes == {"handed_back": 1}
    store.close()


class _Locked(SqliteEventStore):
    """A store whose appends are cancelled while ``locked`` (a lock held past PostgreSQL's
    ``statement_timeout``: ``StoreLocked``)."""

    locked = False

    @staticmethod
    def _refused() -> StoreLocked:  # a new one each time: a raised one keeps its frames
        return StoreLocked("could not append: the statement was cancelled (57014); retry")

    def append(self, *args, **kwargs):
        if self.locked:
            raise self._refused()
        return super().append(*args, **kwargs)

    def append_and_release(self, batches, leases):
        if self.locked:
            return [self._refused() for _ in batches], set()
        return super().append_and_release(batches, leases)

    def append_many(self, batches):
        if self.locked:
            return [self._refused() for _ in batches]
        return super().append_many(batches)


@node
async def _ticks(ctx: NodeContext, x):
    for _ in range(5):
        await asyncio.sleep(0.02)
    return x


@pytest.mark.slow
def test_a_session_halted_by_a_lock_is_taken_back_ever_more_slowly_then_completes(tmp_path):
    """Parked, not failed, and retried with a backoff that doubles: at every loop round it
    re-ran hundreds of times a second for as long as the lock was held."""
    store = _Locked(tmp_path / "l.db")
    wf = Workflow("w", edges=[(START, *[node(_ticks.fn, name=f"t{i}") for i in range(12)])])
    sid = Runner(wf, store).submit(1)
    w = Worker(store, [wf], poll_s=0.05, lease_s=3.0)
    halts: list[int] = []

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        await until(lambda: bool(w._active), "the claim")
        store.locked = True
        await asyncio.sleep(1.0)
        halts.append(w.outcomes.get("store_fault", 0))
        store.locked = False
        await until(lambda: store.session_info(sid).status == "completed", "the session to complete")
        w.stop()
        await task

    asyncio.run(main())
    assert 1 <= halts[0] <= 7, halts  # 0.05 s doubling: about five in 1 s
    assert w.outcomes.get("failed", 0) == 0 and w.outcomes["completed"] == 1, w.outcomes
    store.close()


@pytest.mark.slow
def test_a_session_halted_by_a_lock_is_taken_back_once_by_its_worker_and_by_no_claim(tmp_path):
    """The halted invocation released its lease, so the worker's next claim took the session
    over as orphaned before the take-back's backoff ran out; the take-back then acquired it
    again and fenced the run the claim started, or found it over and logged a failed check:
    a third run of the body, a lost lease, a failure and a recovery for one held lock."""
    store = _Locked(tmp_path / "l.db")
    ran: list[str] = []

    @node
    async def slow(ctx: NodeContext, x):
        ran.append(ctx.path)
        await asyncio.sleep(0.3)
        return x

    wf = Workflow("w", edges=[(START, slow, node(lambda x: x, name="after"))])
    sid = Runner(wf, store).submit(1)
    w = Worker(store, [wf], poll_s=0.5, lease_s=3.0)

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        await until(lambda: bool(ran), "the first run")
        store.locked = True  # its completion cannot be appended: the invocation halts
        await until(lambda: w.outcomes.get("store_fault", 0) >= 1, "the halt")
        store.locked = False
        await until(lambda: store.session_info(sid).status == "completed", "the session to complete")
        await asyncio.sleep(1.2)  # two more rounds: a take-back would come now
        w.stop()
        await task

    asyncio.run(main())
    assert ran == ["w@1/slow@1"] * 2, ran  # cut off once, run once more: never a third time
    assert w.outcomes == {"store_fault": 1, "completed": 1}, w.outcomes
    ws = rebuild(store.read(sid))
    assert ws.nodes["w@1/slow@1"].attempt == 2 and ws.nodes["w@1/slow@1"].recoveries == 0
    store.close()
