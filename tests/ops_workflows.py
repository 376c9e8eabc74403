"""Workflows for the operator-action tests (tests/test_operator_actions.py), served by
``flowscope worker tests.ops_workflows:ALL``. Every body appends its side effect to
``$CHAOS_LOG`` (tests/chaos_workflows.py's line format) after its work."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from tests.chaos_workflows import side_effect

from flowscope import START, NodeContext, Workflow, node

__all__ = ["ALL", "gated", "steps", "long"]


def _step(name: str) -> Any:
    async def body(ctx: NodeContext, x: Any) -> Any:
        side_effect(ctx, name)
        return (x or 0) + 1

    body.__name__ = name
    return node(body, name=name)


class GateClosed(RuntimeError):
    error_code = "GATE_CLOSED"


@node
async def g_gate(ctx: NodeContext, x: Any) -> Any:
    side_effect(ctx, "g_gate")
    if not Path(os.environ["OPS_FLAG"]).exists():
        raise GateClosed("the flag file does not exist yet")
    return x + 1


#: Fails at g_gate until $OPS_FLAG exists.
gated = Workflow("ops_gated", edges=[(START, _step("g_first"), g_gate, _step("g_last"))])
#: Three steps that complete.
steps = Workflow("ops_steps", edges=[(START, _step("s1"), _step("s2"), _step("s3"))])


@node
async def l_wait(ctx: NodeContext, x: Any) -> Any:
    side_effect(ctx, "l_wait started")
    await asyncio.sleep(float(os.environ.get("OPS_WAIT_S", "60")))
    side_effect(ctx, "l_wait finished")
    return x


#: A node that works for a minute ($OPS_WAIT_S seconds): cancelled while it runs.
long = Workflow("ops_long", edges=[(START, _step("l_first"), l_wait)])

#: What ``flowscope worker tests.ops_workflows:ALL`` serves.
ALL = [gated, steps, long]
