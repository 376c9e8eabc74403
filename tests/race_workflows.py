"""The answer-while-running workflow, served by ``flowscope worker tests.race_workflows:ALL``.

``race_ask`` asks for input at once while ``race_slow`` works on (``$RACE_SLOW_S``), so an
operator answers the pause while the session's other branch runs. Every body appends its
side effect to ``$CHAOS_LOG`` (tests/chaos_workflows.py's line format) after its work.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from flowscope import START, JoinNode, NodeContext, Workflow, node

from tests.chaos_workflows import side_effect

__all__ = ["ALL", "race"]

SLOW_S = float(os.environ.get("RACE_SLOW_S", "2.0"))


@node
async def race_ask(ctx: NodeContext, x: Any) -> Any:
    q = await ctx.request_input("go on?", interrupt_id="q")
    side_effect(ctx, "race_ask")
    return q


@node
async def race_slow(ctx: NodeContext, x: Any) -> Any:
    await asyncio.sleep(SLOW_S)
    side_effect(ctx, "race_slow")
    return "slow done"


@node
async def race_fin(ctx: NodeContext, joined: Any) -> Any:
    side_effect(ctx, "race_fin")
    return joined


race = Workflow("race", edges=[(START, (race_ask, race_slow), JoinNode("race_join"), race_fin)])

#: What ``flowscope worker tests.race_workflows:ALL`` serves.
ALL = [race]
