"""Until when an owner trusts its lease (engine/lease.py's ``safe_until``): until ``t0 +
lease_s`` by the monotonic clock (``t0``: when the renewal or claim that produced it was
asked for) and until its ``expires_at`` by the wall clock, each less a margin of a tenth of
the lease, at most 1 s. The invocation's clocks are moved (``engine/record.py``'s ``time``);
a real SQLite file."""

from __future__ import annotations

import time

import pytest

from flowscope import START, Runner, Workflow, node
from flowscope.engine import record
from flowscope.errors import LeaseExpired
from flowscope.ownership import this_process
from flowscope.store.sqlite import SqliteEventStore


class Clocks:
    """``engine/record.py``'s clocks, each moved by its own offset."""

    def __init__(self) -> None:
        self.mono = 0.0
        self.wall = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.mono

    def time(self) -> float:
        return time.time() + self.wall


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    c = Clocks()
    monkeypatch.setattr(record, "time", c)
    return c


@pytest.fixture
def db(tmp_path):
    store = SqliteEventStore(str(tmp_path / "m.db"))
    yield store
    store.close()


def _two_steps(started: list[str], between) -> Workflow:
    @node
    async def a(ctx, x):
        started.append("a")
        between()
        return x + 1

    @node
    async def b(ctx, x):
        started.append("b")
        return x + 1

    return Workflow("w", edges=[(START, a, b)])


async def test_an_owner_stops_a_margin_before_its_lease_ends_by_the_wall_clock(db, clocks):
    """A lease of 5 s is trusted until 0.5 s before its ``expires_at``: with the wall clock
    0.25 s short of it, b never starts and a's result is not recorded."""
    started: list[str] = []

    def to_just_before_the_end() -> None:
        clocks.wall = db.session_info("s").lease_expires_at - 0.25 - time.time()

    runner = Runner(_two_steps(started, to_just_before_the_end), store=db, lease_s=5.0)
    with pytest.raises(LeaseExpired):
        await runner.run(1, session_id="s")
    assert started == ["a"]
    assert [e.type for e in db.read("s")] == ["run_started", "node_started", "node_started"]


async def test_the_margin_of_a_long_lease_is_at_most_one_second(db, clocks):
    """A lease of 30 s is trusted until 1 s before its end, not 3 s (a tenth): with the wall
    clock 2 s short of it, the run goes on and completes."""
    started: list[str] = []

    def to_two_seconds_before_the_end() -> None:
        clocks.wall = db.session_info("s").lease_expires_at - 2.0 - time.time()

    runner = Runner(_two_steps(started, to_two_seconds_before_the_end), store=db, lease_s=30.0)
    assert (await runner.run(1, session_id="s")).output == 3
    assert started == ["a", "b"]


async def test_a_claimed_lease_is_trusted_for_what_is_left_of_it_not_a_whole_lease(db, clocks):
    """A lease taken 4 s before the run (a claim that waited: 1 s of its 5 left) is safe by
    the monotonic clock for that second less the margin, even if the wall clock then steps
    back: 2 s later by the monotonic clock the owner stops."""
    wf_started: list[str] = []

    def two_seconds_on_and_the_wall_clock_back() -> None:
        clocks.mono = 2.0
        clocks.wall = -60.0

    wf = _two_steps(wf_started, two_seconds_on_and_the_wall_clock_back)
    Runner(wf, db).submit(1, session_id="s")
    lease = db.acquire("s", this_process("claimer"), 5.0, now=time.time() - 4.0)
    runner = Runner(wf, store=db, lease_s=5.0, worker_id="claimer")
    with pytest.raises(LeaseExpired):
        await runner.resume("s", lease=lease)
    assert wf_started == ["a"]
    assert [e.type for e in db.read("s")][-1] == "node_started"
