"""The ids flowscope makes for sessions and invocations: version-7 UUIDs, so ids made
later sort later and a store's indexes keyed by session id take new sessions at one end."""

from __future__ import annotations

import time
import uuid

from flowscope import START, Runner, Workflow, node
from flowscope.engine.ids import new_id
from flowscope.store import MemoryEventStore


def test_an_id_is_a_version_7_uuid_of_its_millisecond():
    before = time.time_ns() // 1_000_000
    made = new_id()
    after = time.time_ns() // 1_000_000
    u = uuid.UUID(hex=made)
    assert made == u.hex and len(made) == 32
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert before <= int(made[:12], 16) <= after  # the first 48 bits: the Unix time in ms


def test_ids_made_later_sort_later_and_none_repeats():
    earlier = [new_id() for _ in range(1000)]
    time.sleep(0.002)  # the next millisecond at least
    later = [new_id() for _ in range(1000)]
    assert max(earlier) < min(later)
    assert len(set(earlier + later)) == 2000


async def test_the_sessions_a_runner_names_sort_in_the_order_they_were_made():
    @node
    async def one(ctx, x):
        return x

    store = MemoryEventStore()
    runner = Runner(Workflow("w", edges=[(START, one)]), store=store)
    made = []
    for i in range(3):
        made.append((await runner.run(i)).session_id)
        time.sleep(0.002)
    made.append(runner.submit(3))
    assert made == sorted(made) and len(set(made)) == 4
