"""A worker whose store stops answering or refuses writes: it says an unanswered server
once, its drain makes no call for the sessions it lets go meanwhile, and a write outage
that lasts stops it at once, without waiting out ``drain_s`` (an in-process ``Worker`` on a
real SQLite file)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from flowscope import START, NodeContext, Runner, Worker, Workflow, node
from flowscope.errors import StoreReadOnly, StoreUnavailable
from flowscope.store import SqliteEventStore
from waiting import until


class _Away(SqliteEventStore):
    """A store whose server does not answer while ``down``: every call the worker or its
    runners make raises ``StoreUnavailable``, and ``asked`` names the calls made then."""

    down = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    def _away(self, name: str) -> None:
        if self.down:
            self.asked.append(name)
            raise StoreUnavailable(f"lost the connection to PostgreSQL at h ({name})")

    def workers_seen(self, *args, **kwargs):
        self._away("workers_seen")
        return super().workers_seen(*args, **kwargs)

    def claim(self, *args, **kwargs):
        self._away("claim")
        return super().claim(*args, **kwargs)

    def acquire(self, *args, **kwargs):
        self._away("acquire")
        return super().acquire(*args, **kwargs)

    def release(self, *args, **kwargs):
        self._away("release")
        return super().release(*args, **kwargs)

    def renew_many(self, *args, **kwargs):
        self._away("renew_many")
        return super().renew_many(*args, **kwargs)


@node
async def _long(ctx: NodeContext, x):
    await asyncio.sleep(30)
    return x


def test_a_server_that_stops_answering_is_said_once_and_nothing_is_claimed_meanwhile(tmp_path, caplog):
    store = _Away(tmp_path / "a.db")
    wf = Workflow("w", edges=[(START, _long)])
    # a lease a third of which is shorter than the poll: every round begins with the probe
    w = Worker(store, [wf], poll_s=0.02, lease_s=0.03)

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        await until(lambda: w.store_writable is True, "the first write")
        store.down = True
        await until(lambda: w.store_writable is False, "the failed probe")
        await asyncio.sleep(0.3)  # more probes while it stays away: said once
        w.stop()
        await task

    asyncio.run(main())
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "flowscope.worker" and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 1 and warnings[0].startswith("could not record worker"), warnings
    assert "claim" not in store.asked  # it stops claiming: it probes
    store.close()


def test_a_drain_while_the_server_does_not_answer_makes_no_call_for_the_sessions_it_lets_go(tmp_path):
    """Each call would wait out the server's timeout: the drain stops the session in hand
    without asking the store anything; its lease expires by itself."""
    store = _Away(tmp_path / "d.db")
    wf = Workflow("w", edges=[(START, _long)])
    sid = Runner(wf, store).submit(1)
    w = Worker(store, [wf], poll_s=0.05, lease_s=3.0, drain_s=0.1)

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        await until(lambda: bool(w._active), "the claim")
        store.down = True
        await until(lambda: w.store_writable is False, "the probe to fail")
        w.stop()
        await task

    asyncio.run(main())
    assert w.outcomes == {"handed_back": 1}
    assert "acquire" not in store.asked and "release" not in store.asked, store.asked
    store.down = False
    assert store.read(sid)[-1].type == "node_started"  # nothing recorded for it
    assert store.session_info(sid).lease_expires_at > time.time()  # not released: it expires
    store.close()


def test_a_write_outage_that_lasts_stops_the_worker_at_once_without_waiting_out_its_drain(tmp_path):
    """``--max-store-outage`` reached: the sessions in hand are handed back at once (a store
    that refuses writes records nothing), not run on for ``drain_s``."""
    store = SqliteEventStore(tmp_path / "o.db")
    wf = Workflow("w", edges=[(START, _long)])
    Runner(wf, store).submit(1)
    w = Worker(store, [wf], poll_s=0.02, lease_s=10.0, drain_s=30.0, max_store_outage_s=0.3)
    took: list[float] = []

    async def main() -> None:
        task = asyncio.ensure_future(w.run())
        await until(lambda: bool(w._active), "the claim")
        with store._lock:
            store._conn.execute("PRAGMA query_only = 1")  # type: ignore[union-attr]
        t0 = time.monotonic()
        with pytest.raises(StoreReadOnly):
            await task
        took.append(time.monotonic() - t0)

    asyncio.run(main())
    # the outage limit, a probe's backoff and the hand-back: well before the lease's safe end
    # (9 s), which would end a body left to run on
    assert took[0] < 3.0, took
    assert "completed" not in w.outcomes
    store.close()
