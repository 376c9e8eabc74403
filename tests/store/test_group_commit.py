"""Group commit across sessions: concurrent sessions' events go to the store in
one transaction per loop turn; each session's next node still waits for its own terminal
event to be committed; a failed transaction fails each of its sessions with the store's error."""

from __future__ import annotations

import asyncio

import pytest

from flowscope import START, Runner, Workflow, node
from flowscope.errors import StoreLocked
from flowscope.events import NodeCompleted
from flowscope.store import MemoryEventStore
from flowscope.store.sqlite import SqliteEventStore


def chain(store, n: int = 5) -> Workflow:
    def make(i: int):
        @node(name=f"n{i}")
        async def body(ctx, x):
            if i > 1:  # the previous node's terminal event is committed before this body runs
                done = [e.node for e in store.read(ctx.session_id) if isinstance(e, NodeCompleted)]
                assert done[-1] == f"n{i - 1}", done
            await asyncio.sleep(0)
            return x + 1

        return body

    nodes = [make(i) for i in range(1, n + 1)]
    return Workflow("c", edges=[(START, nodes[0])] + list(zip(nodes, nodes[1:])))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_concurrent_sessions_share_transactions_and_each_waits_for_its_own_commit(kind, tmp_path):
    store = MemoryEventStore() if kind == "memory" else SqliteEventStore(tmp_path / "g.db")
    sizes: list[int] = []
    real = store.append_many

    def spy(batches):
        sizes.append(len({b[0] for b in batches}))
        return real(batches)

    store.append_many = spy  # type: ignore[method-assign]
    runner = Runner(chain(store), store=store)
    results = await asyncio.gather(*(runner.run(0, session_id=f"s{i}") for i in range(50)))
    assert [r.output for r in results] == [5] * 50
    assert max(sizes) >= 25  # many sessions in one transaction
    assert sum(sizes) < 50 * 7  # fewer transactions than one per session per flush
    for i in range(50):
        events = store.read(f"s{i}")
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "run_finished" and events[-1].status == "completed"


async def test_a_failed_transaction_fails_each_of_its_sessions_with_the_stores_error():
    class Locking(MemoryEventStore):
        fail = 0

        def append_many(self, batches):
            if len(batches) > 1 and not self.fail:
                self.fail = len(batches)
                raise StoreLocked("the database is locked")
            return super().append_many(batches)

    store = Locking()
    runner = Runner(chain(store), store=store)
    results = await asyncio.gather(
        *(runner.run(0, session_id=f"s{i}") for i in range(10)), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    assert store.fail > 1 and len(failed) == store.fail
    assert all(isinstance(r, StoreLocked) for r in failed)
    assert all(not isinstance(r, BaseException) and r.output == 5 for r in results if r not in failed)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_append_many_keeps_the_good_batches_and_returns_each_refusal(kind, tmp_path):
    from flowscope.errors import ConcurrencyConflict, LeaseLost
    from flowscope.events import RunSubmitted
    from flowscope.ownership import this_process

    store = MemoryEventStore() if kind == "memory" else SqliteEventStore(tmp_path / "m.db")

    def ev(sid, seq):
        return RunSubmitted(
            session_id=sid, invocation_id="i", seq=seq, ts=float(seq), workflow="w", input=None
        )

    store.append("b", [ev("b", 1)], 0)
    lease = store.acquire("c", this_process(), 30.0)
    store.append("c", [ev("c", 1)], 0, epoch=lease.epoch)
    out = store.append_many(
        [
            ("a", [ev("a", 1), ev("a", 2)], 0, None),
            ("b", [ev("b", 2)], 0, None),  # expected 0, the session is at 1: a conflict
            ("c", [ev("c", 2)], 1, lease.epoch + 1),  # a superseded epoch: fenced
            ("d", [ev("d", 1)], 0, None),
        ]
    )
    assert [e.seq for e in out[0]] == [1, 2] and [e.seq for e in out[3]] == [1]
    assert isinstance(out[1], ConcurrencyConflict) and isinstance(out[2], LeaseLost)
    assert [store.last_seq(s) for s in "abcd"] == [2, 1, 1, 1]
    store.set_exported_seq("a", 2)
    store.set_exported_seq("a", 1)  # never moves back
    assert (store.exported_seq("a"), store.exported_seq("b")) == (2, 0)


async def test_sessions_started_together_take_their_leases_in_one_transaction(tmp_path):
    store = SqliteEventStore(tmp_path / "starts.db")
    calls: list[tuple[str, int]] = []
    one, many = store.acquire_new, store.acquire_new_many

    def spy_one(session_id, owner, lease_s, **kw):
        calls.append(("acquire_new", 1))
        return one(session_id, owner, lease_s, **kw)

    def spy_many(session_ids, owner, lease_s, **kw):
        calls.append(("acquire_new_many", len(session_ids)))
        return many(session_ids, owner, lease_s, **kw)

    store.acquire_new, store.acquire_new_many = spy_one, spy_many  # type: ignore[method-assign]
    runner = Runner(chain(store), store=store)
    results = await asyncio.gather(*(runner.run(0, session_id=f"s{i}") for i in range(50)))
    assert [r.output for r in results] == [5] * 50
    # the first starts alone, at once; the 49 started in the same loop turn wait for one step
    assert calls == [("acquire_new", 1), ("acquire_new_many", 49)]
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        got = store.acquire_new_many(["t1", "t2", "t3"], runner.owner, 15.0)
    finally:
        store._conn.set_trace_callback(None)
    assert all(g is not None and not isinstance(g, BaseException) for g in got)
    assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == ["BEGIN IMMEDIATE", "COMMIT"]


async def busy_runner(kind: str, tmp_path):
    """A runner with one session running (its node waits for the gate returned): the
    sessions it starts now take their leases at the end of the loop turn, together."""
    store = MemoryEventStore() if kind == "memory" else SqliteEventStore(tmp_path / "busy.db")
    gate = asyncio.Event()

    @node(name="hold")
    async def hold(ctx, x):
        await gate.wait()
        return x

    runner = Runner(Workflow("h", edges=[(START, hold)]), store=store)
    busy = asyncio.create_task(runner.run(0, session_id="busy"))
    await asyncio.sleep(0.01)
    return store, runner, gate, busy


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_new_session_started_twice_at_once_in_one_runner_runs_once(kind, tmp_path):
    from flowscope.errors import ConcurrencyConflict

    store, runner, gate, busy = await busy_runner(kind, tmp_path)
    twice = [asyncio.create_task(runner.run(0, session_id="same")) for _ in range(2)]
    await asyncio.sleep(0.01)
    gate.set()
    results = await asyncio.gather(busy, *twice, return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["ConcurrencyConflict", "RunResult", "RunResult"]
    conflict = next(r for r in results if isinstance(r, ConcurrencyConflict))
    assert "already running in this runner" in str(conflict)
    assert [e.type for e in store.read("same")].count("run_started") == 1


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_start_cancelled_while_it_waits_for_its_lease_leaves_no_lease_held(kind, tmp_path):
    from flowscope.ownership import this_process

    store, runner, gate, busy = await busy_runner(kind, tmp_path)
    asked: list[list[str]] = []
    many = store.acquire_new_many

    def spy(session_ids, owner, lease_s, **kw):
        asked.append(list(session_ids))
        return many(session_ids, owner, lease_s, **kw)

    store.acquire_new_many = spy  # type: ignore[method-assign]
    late = asyncio.create_task(runner.run(0, session_id="late"))
    await asyncio.sleep(0)  # its first step: queued for the end of the turn, nothing asked yet
    assert asked == []
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    await asyncio.sleep(0)
    assert asked == [["late"]]  # the step still ran, and took the lease ...
    # ... which was let go: another live owner of this host may take the session at once
    assert store.acquire_new("late", this_process("w-next"), 15.0) is not None
    assert store.read("late") == []
    gate.set()
    assert (await busy).status == "completed"
