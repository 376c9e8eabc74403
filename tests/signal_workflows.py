"""Workflows of the production-shape signals test (tests/observability/test_signals_e2e.py), served by
``flowscope worker signal_workflows:ATTR`` processes. Every fault happens inside a nested
workflow, so that a signal counted at a container instead of the deepest path shows.

- ``kill_wf``: prepare -> ``kill_inner`` (a nested workflow) -> ``hang_forever``: the node
  the test's SIGKILL cuts off;
- ``hang_wf``: ``hang_inner`` -> ``stall``: sleeps while its worker stays alive;
- ``card_wf``: ``payment`` -> ``charge_card``: raises ``CardDeclined`` (PAYMENT_DECLINED)
  when the input says ``{"declined": true}``;
- ``job_wf``: ``enrich_inner`` -> ``geocode``: waits for an external job (``expect_count``),
  answered by the test through ``flowscope resume --job``;
- ``queued_wf``: nothing serves it (the test only submits it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from flowscope import START, NodeContext, Workflow, node

__all__ = ["KILLED", "SERVED", "CardDeclined", "kill_wf", "hang_wf", "card_wf", "job_wf", "queued_wf"]


class CardDeclined(Exception):
    """The card was declined: a classified failure, never retried."""

    error_code = "PAYMENT_DECLINED"


@node
async def prepare(x: Any) -> Any:
    return x


@node
async def hang_forever(x: Any) -> Any:
    await asyncio.sleep(86400)
    return x


@node
async def stall(x: Any) -> Any:
    await asyncio.sleep(86400)
    return x


@node
async def charge_card(x: Any) -> Any:
    if isinstance(x, dict) and x.get("declined"):
        raise CardDeclined("card declined by the issuer")
    return {"charged": True}


@node
async def geocode(ctx: NodeContext, x: Any) -> Any:
    return await ctx.await_job(lambda job: None, payload=x, expect_count=True)


@node
async def noop(x: Any) -> Any:
    return x


kill_wf = Workflow("kill_wf", edges=[(START, prepare, Workflow("kill_inner", edges=[(START, hang_forever)]))])
hang_wf = Workflow("hang_wf", edges=[(START, Workflow("hang_inner", edges=[(START, stall)]))])
card_wf = Workflow("card_wf", edges=[(START, Workflow("payment", edges=[(START, charge_card)]))])
job_wf = Workflow("job_wf", edges=[(START, Workflow("enrich_inner", edges=[(START, geocode)]))])
queued_wf = Workflow("queued_wf", edges=[(START, noop)])

#: What the worker the test SIGKILLs serves, and what the surviving worker serves.
KILLED = [kill_wf]
SERVED = [hang_wf, card_wf, job_wf]
