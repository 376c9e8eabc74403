"""What a worker claims: at most ``concurrency`` sessions at once, no orphan recovered more
than ``max_recoveries`` times, and an orphan of a crashed owner re-run as a recovery (an
in-process ``Worker`` on a real SQLite file)."""

from __future__ import annotations

import asyncio
import time

from flowscope import START, NodeContext, Runner, Worker, Workflow, node
from flowscope.events import NodeStarted, RunStarted
from flowscope.store import SqliteEventStore, rebuild
from flowscope.store.testing.helpers import ev, node_ev, other_host_owner
from waiting import until


@node
async def _one(ctx: NodeContext, x):
    return x


async def _serve(worker: Worker, done) -> None:
    """Run ``worker`` until ``done()`` holds, then drain it."""
    task = asyncio.ensure_future(worker.run())
    try:
        await until(done, "the worker to finish its sessions")
    finally:
        worker.stop()
        await task


async def test_a_worker_runs_at_most_its_concurrency_of_sessions_at_once(tmp_path):
    store = SqliteEventStore(tmp_path / "c.db")
    gate = asyncio.Event()

    @node
    async def hold(ctx: NodeContext, x):
        await gate.wait()
        return x

    wf = Workflow("held", edges=[(START, hold)])
    sids = [Runner(wf, store).submit(i) for i in range(4)]
    w = Worker(store, [wf], concurrency=2, poll_s=0.02, lease_s=5.0)
    task = asyncio.ensure_future(w.run())
    await until(lambda: w.active == 2, "two sessions claimed")
    await asyncio.sleep(0.2)  # ten polls: a third claim would have come by now
    statuses = [store.session_info(s).status for s in sids]
    assert w.active == 2 and statuses.count("running") == 2 and statuses.count("queued") == 2, statuses
    gate.set()  # as each ends, the next is claimed
    await until(lambda: all(store.session_info(s).status == "completed" for s in sids), "all four")
    w.stop()
    await task
    assert w.outcomes == {"completed": 4}
    store.close()


def _orphan(store: SqliteEventStore, sid: str, takeovers: int) -> str:
    """A session of workflow ``crash`` whose node ``_one`` was left running by an owner on
    another host whose lease ran out long ago, then taken over as orphaned ``takeovers``
    times by owners that died in turn (each lease ran out); the path of its open run."""
    path = "crash@1/_one@1"
    t = time.time() - 1000.0
    store.acquire(sid, other_host_owner("w-crashed"), 10.0, now=t)
    events = [ev(RunStarted, sid=sid, workflow="crash", ts=t), node_ev(NodeStarted, path, ts=t, sid=sid)]
    store.append(sid, events, 0, epoch=1)
    for i in range(takeovers):
        t += 20.0
        [c] = store.claim(other_host_owner(f"w-{i}", pid=100 + i), ["crash"], 10.0, limit=5, now=t)
        assert (c.session_id, c.reason) == (sid, "orphaned")
    return path


async def test_a_worker_leaves_alone_an_orphan_recovered_more_than_its_max_recoveries(tmp_path):
    store = SqliteEventStore(tmp_path / "r.db")
    wf = Workflow("crash", edges=[(START, _one)])
    _orphan(store, "crashy", takeovers=3)
    before = store.last_seq("crashy")
    strict = Worker(store, [wf], poll_s=0.02, max_recoveries=2)
    task = asyncio.ensure_future(strict.run())
    await asyncio.sleep(0.3)  # fifteen polls, each of which finds the orphan claimable but for the limit
    strict.stop()
    await task
    assert strict.outcomes == {}
    assert store.last_seq("crashy") == before
    assert store.session_info("crashy").owner.worker_id == "w-2"  # not taken over
    lenient = Worker(store, [wf], poll_s=0.02, max_recoveries=3)  # recovered 3 times: within it
    await _serve(lenient, lambda: bool(lenient.outcomes))
    assert lenient.outcomes == {"completed": 1}
    store.close()


async def test_an_orphan_whose_owner_crashed_is_rerun_by_a_worker_as_a_recovery(tmp_path):
    """Not a hand-back: the cut-off run is re-executed flagged ``recovered``, and its
    recovery counts against ``max_recoveries`` (``RECOVERY_LIMIT``)."""
    store = SqliteEventStore(tmp_path / "o.db")
    wf = Workflow("crash", edges=[(START, _one)])
    path = _orphan(store, "crashy", takeovers=0)
    w = Worker(store, [wf], poll_s=0.02)
    await _serve(w, lambda: bool(w.outcomes))
    assert w.outcomes == {"completed": 1}
    events = store.read("crashy")
    ws = rebuild(events)
    assert ws.status == "completed"
    assert (ws.nodes[path].attempt, ws.nodes[path].recoveries) == (2, 1)
    assert [e.recovered for e in events if isinstance(e, RunStarted)][-1] == 1
    store.close()
