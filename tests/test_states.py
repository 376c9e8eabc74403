"""The vocabularies of ``flowscope.states`` are the values the code produces: the fold's
node statuses, the catalog's event kinds, the session statuses the fold and the store
give, and the outcomes ``after_node`` hooks see. The types are ``Literal`` s of plain
strings, so the event JSON is what it was.
"""

from __future__ import annotations

import asyncio
from typing import get_args

from flowscope import START, Plugin, Runner, Workflow, node
from flowscope.events import (
    EVENT_TYPES,
    TERMINAL_TYPES,
    InputRequested,
    JobDispatched,
    NodeCancelled,
    NodeCompleted,
    NodeErrorEvent,
    NodeStarted,
    RunFinished,
    encode,
)
from flowscope.fold import rebuild
from flowscope.states import (
    EVENT_KINDS,
    NODE_STATUSES,
    OPEN_STATES,
    OUTCOME_STATUSES,
    RUN_STATUSES,
    SessionStatus,
)
from flowscope.store.base import FINISHED_SESSION_STATUSES, SESSION_STATUSES


def test_every_node_status_is_one_the_fold_gives():
    ends = [NodeCompleted, NodeErrorEvent, NodeCancelled, InputRequested, JobDispatched]
    seen = set()
    for i, end in enumerate([None, *ends]):
        events = [NodeStarted(session_id="s", seq=1, path=f"w@{i}", node="w")]
        if end is not None:
            events.append(end(session_id="s", seq=2, path=f"w@{i}", node="w"))
        seen.add(rebuild(events).nodes[f"w@{i}"].status)
    assert seen == set(NODE_STATUSES)
    assert set(OPEN_STATES) == {"running", "waiting_input", "waiting_job"}


def test_the_event_kinds_are_the_catalog():
    assert set(EVENT_KINDS) == set(EVENT_TYPES) and len(EVENT_KINDS) == len(EVENT_TYPES)
    assert set(EVENT_KINDS) >= TERMINAL_TYPES


def test_session_statuses_are_the_folds_and_the_stores():
    statuses = set(get_args(SessionStatus))
    assert statuses == {"new", *SESSION_STATUSES}
    assert set(RUN_STATUSES) <= statuses and set(FINISHED_SESSION_STATUSES) <= set(RUN_STATUSES)
    for status in RUN_STATUSES:
        assert rebuild([RunFinished(session_id="s", seq=1, status=status)]).status == status


def test_a_typed_status_is_a_plain_string_in_the_json():
    e = RunFinished(session_id="s", seq=3, status="paused")
    assert type(e.status) is str
    assert '"status":"paused"' in encode(e)


async def test_after_node_sees_every_outcome_status(store):
    seen: set[str] = set()

    class Outcomes(Plugin):
        def after_node(self, ctx, outcome):
            seen.add(outcome.status)

    @node
    async def slow(x):
        await asyncio.sleep(10)

    @node
    def bad(x):
        raise ValueError("no")

    @node(timeout=0.01)
    async def late(x):
        await asyncio.sleep(10)

    ok = node(lambda x: 1, name="ok")

    @node
    async def ask(ctx, x):
        return await ctx.request_input("ok?")

    for i, edges in enumerate([[(START, (slow, bad))], [(START, late)], [(START, ok), (ok, ask)]]):
        runner = Runner(Workflow(f"w{i}", edges=edges), store=store, plugins=[Outcomes()])
        try:
            await runner.run(None, session_id=f"s{i}")
        except Exception:
            pass
    assert seen == set(OUTCOME_STATUSES)
