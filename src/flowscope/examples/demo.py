"""The demo: an order-fulfilment pipeline, and the driver ``flowscope demo`` runs it with.

The workflow, ``order_fulfilment``::

    fetch_orders            flaky: its first attempt times out, the retry succeeds
    validate_orders
     ├─ reserve_stock       a nested workflow: check_stock -> hold_items
     └─ enrich_addresses    a long-running external job (geocoding), ctx.await_job
    ready                   a JoinNode: waits for both branches
    approve                 a human approval, ctx.request_input
     ├─ approved: ship      charges each card in a dynamic child (ctx.run_node(charge_card))
     │   ├─ send_confirmations   returns nothing: the completion marker
     │   └─ close_batch          the workflow's output
     └─ rejected: cancel_batch

The geocoding job's first result is empty (``{"success": True, "count": 0}``): the job
guard turns it into an actionable pause, the driver answers ``"retry"``, the job is
dispatched again and the second result is good. A batch whose input says
``"scenario": "card_declined"`` has a card that ``charge_card`` declines with
``error_code="PAYMENT_DECLINED"``: that session fails.

Everything is deterministic (failures depend on ``ctx.attempt`` and on the input, never on
chance), and the sleeps are a few milliseconds, so the demo takes about a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import START, JoinNode, NodeContext, Plugin, RetryConfig, Route, Runner, Workflow, node
from ..errors import StoreError

__all__ = [
    "order_fulfilment",
    "reserve_stock",
    "InventoryUnavailable",
    "PaymentDeclined",
    "batch_input",
    "geocoding_result",
    "DISPATCHED_JOBS",
    "DemoDriver",
    "SessionReport",
    "new_tag",
]


# --------------------------------------------------------------------------- errors


class InventoryUnavailable(ConnectionError):
    """The inventory API did not answer in time (retried)."""

    error_code = "INVENTORY_UNAVAILABLE"


class PaymentDeclined(Exception):
    """The payment provider declined a card (not retried: retrying will not help)."""

    error_code = "PAYMENT_DECLINED"


# --------------------------------------------------------------------------- data

_CUSTOMERS = [
    ("A-{n}01", "Ada Lovelace", "12 St James's Sq, London", "KB-01 keyboard", 89.00),
    ("A-{n}02", "Grace Hopper", "1 Navy Yard, Arlington", "MS-22 mouse", 39.50),
    ("A-{n}03", "Alan Turing", "78 High St, Wilmslow", "MN-27 monitor", 249.00),
]


def batch_input(batch: str, scenario: str = "normal", geocoding_deadline_s: float = 3600.0) -> dict[str, Any]:
    """The run input of one batch. ``scenario="card_declined"`` makes one card fail;
    ``geocoding_deadline_s`` is how long the geocoding job may take before it is overdue."""
    return {
        "batch": batch,
        "warehouse": "eu-west-1",
        "scenario": scenario,
        "geocoding_deadline_s": geocoding_deadline_s,
    }


def _orders(batch: dict[str, Any]) -> list[dict[str, Any]]:
    n = int(hashlib.sha256(str(batch.get("batch")).encode()).hexdigest()[:4], 16) % 90 + 10
    orders = []
    for i, (oid, name, address, item, amount) in enumerate(_CUSTOMERS):
        card = "tok_visa_4242"
        if batch.get("scenario") == "card_declined" and i == 1:
            card = "tok_declined_0002"
        orders.append(
            {
                "id": oid.format(n=n),
                "customer": name,
                "address": address,
                "item": item,
                "amount": amount,
                "card": card,
            }
        )
    return orders


# --------------------------------------------------------------------------- nodes

#: Every job ``enrich_addresses`` dispatched in this process (what a real dispatch would
#: post to a queue). ``flowscope resume`` prints the job id to report on.
DISPATCHED_JOBS: list[Any] = []


def dispatch_geocoding(job: Any) -> None:
    """Hand the batch's addresses to the (simulated) geocoding service."""
    DISPATCHED_JOBS.append(job)


def geocoding_result(dispatch_attempt: int, count: int = 3) -> dict[str, Any]:
    """What the simulated geocoding worker reports: nothing the first time, then the points."""
    if dispatch_attempt <= 1:
        return {"success": True, "count": 0, "data": {"geocoded": []}}
    points = [{"lat": round(51.5 - i * 0.7, 3), "lon": round(-0.1 - i * 1.3, 3)} for i in range(count)]
    return {"success": True, "count": count, "data": {"geocoded": points}}


@node(retry=RetryConfig(max_attempts=3, initial_delay=0.05, jitter=0.0, exceptions=["InventoryUnavailable"]))
async def fetch_orders(ctx: NodeContext, batch: Any) -> Any:
    await asyncio.sleep(0.02)
    if ctx.attempt == 1:
        raise InventoryUnavailable("inventory API did not answer within 2s (HTTP 504)")
    return {
        "batch": batch["batch"],
        "warehouse": batch["warehouse"],
        "orders": _orders(batch),
        "geocoding_deadline_s": batch.get("geocoding_deadline_s", 3600.0),
    }


@node
async def validate_orders(ctx: NodeContext, data: Any) -> Any:
    await asyncio.sleep(0.005)
    for order in data["orders"]:
        if order["amount"] <= 0:
            raise ValueError(f"order {order['id']} has a non-positive amount")
    return {**data, "total": round(sum(o["amount"] for o in data["orders"]), 2)}


@node
async def check_stock(ctx: NodeContext, data: Any) -> Any:
    await asyncio.sleep(0.015)
    return {**data, "in_stock": [o["id"] for o in data["orders"]]}


@node
async def hold_items(ctx: NodeContext, data: Any) -> Any:
    await asyncio.sleep(0.01)
    return {**data, "reservations": [f"R-{oid}" for oid in data["in_stock"]]}


#: A workflow nested in ``order_fulfilment``.
reserve_stock = Workflow("reserve_stock", edges=[(START, check_stock, hold_items)])


@node
async def enrich_addresses(ctx: NodeContext, data: Any) -> Any:
    result = await ctx.await_job(
        dispatch=dispatch_geocoding,
        payload={"batch": data["batch"], "addresses": [o["address"] for o in data["orders"]]},
        expect_count=True,
        deadline_s=data.get("geocoding_deadline_s", 3600.0),
    )
    return {"geocoded": len(result.get("geocoded", [])) if isinstance(result, dict) else 0}


ready = JoinNode("ready")


@node
async def approve(ctx: NodeContext, joined: Any) -> Any:
    data = joined["reserve_stock"]
    answer = await ctx.request_input(
        f"Ship {len(data['orders'])} orders of batch {data['batch']} for {data['total']:.2f} EUR?",
        payload={
            "kind": "approval",
            "batch": data["batch"],
            "orders": len(data["orders"]),
            "total": data["total"],
        },
        interrupt_id="approval",
    )
    approved = answer is True or (
        isinstance(answer, str) and answer.lower() in ("yes", "y", "approve", "approved")
    )
    return Route("approved" if approved else "rejected", output={**data, **joined["enrich_addresses"]})


@node
async def charge_card(ctx: NodeContext, order: Any) -> Any:
    await asyncio.sleep(0.005)
    if order["card"].startswith("tok_declined"):
        raise PaymentDeclined(
            f"card ending {order['card'][-4:]} declined for order {order['id']}: insufficient funds"
        )
    return {"order": order["id"], "charge": "ch_" + ctx.idempotency_key[:12], "amount": order["amount"]}


@node
async def ship(ctx: NodeContext, data: Any) -> Any:
    # Charging a card must never happen twice: each charge is a dynamic child, which a
    # resume fast-forwards once it has completed instead of running it again.
    charges = [await ctx.run_node(charge_card, order) for order in data["orders"]]
    return {"batch": data["batch"], "charges": charges, "labels": [f"LBL-{c['order']}" for c in charges]}


@node
async def send_confirmations(ctx: NodeContext, shipped: Any) -> Any:
    await asyncio.sleep(0.01)
    # The e-mails are out; there is nothing to return. The run still records a
    # NodeCompleted (has_output=False): the completion marker.
    return None


@node
async def close_batch(ctx: NodeContext, shipped: Any) -> Any:
    await asyncio.sleep(0.005)
    return {"batch": shipped["batch"], "status": "shipped", "orders": len(shipped["charges"])}


@node
def cancel_batch(ctx: NodeContext, data: Any) -> Any:
    return {"batch": data["batch"], "status": "cancelled", "orders": 0}


#: The bundled demo workflow.
order_fulfilment = Workflow(
    "order_fulfilment",
    edges=[
        (START, fetch_orders, validate_orders, (reserve_stock, enrich_addresses), ready, approve),
        (approve, {"approved": ship, "rejected": cancel_batch}),
        (ship, (send_confirmations, close_batch)),
    ],
)


# --------------------------------------------------------------------------- the driver


def new_tag() -> str:
    """A short random tag that makes the demo's session ids unique per run."""
    return uuid.uuid4().hex[:8]


@dataclass
class SessionReport:
    """How one demo session ended."""

    session_id: str
    workflow: str
    scenario: str
    status: str  # completed, failed, paused, killed
    output: Any = None
    error: str | None = None
    invocations: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class DemoDriver:
    """Runs a batch through ``order_fulfilment`` and answers every pause, like the outside
    world would: the geocoding worker reports job results, an operator answers the job
    failure (``retry``) and approves the batch.

    ``ask_approval(request) -> value`` and ``ask_job_failure(request) -> "retry"|"abort"``
    replace the automatic answers (``flowscope demo --interactive``).
    """

    def __init__(
        self,
        store: Any,
        plugins: list[Plugin],
        *,
        echo: Callable[[str], None] = print,
        ask_approval: Callable[[Any], Any] | None = None,
        ask_job_failure: Callable[[Any], Any] | None = None,
        max_invocations: int = 12,
    ) -> None:
        self.runner = Runner(order_fulfilment, store=store, plugins=plugins)
        self.echo = echo
        self.ask_approval = ask_approval
        self.ask_job_failure = ask_job_failure
        self.max_invocations = max_invocations

    def _answers(self, pending: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        inputs: dict[str, Any] = {}
        jobs: dict[str, Any] = {}
        for p in pending:
            if p.type == "job_dispatched":
                result = geocoding_result(p.dispatch_attempt)
                self.echo(
                    f"  {'worker':<9} the geocoding worker reports on {p.job_id}: "
                    f"success={result['success']} count={result['count']}"
                )
                jobs[p.job_id] = result
            elif p.type == "input_requested":
                payload = p.payload if isinstance(p.payload, dict) else {}
                if payload.get("kind") == "job_failed":
                    if self.ask_job_failure is not None:
                        value = self.ask_job_failure(p)
                    else:
                        value = "retry"
                        self.echo(
                            f'  {"operator":<9} answers {p.interrupt_id!r} with "retry" (automatic; --interactive asks you)'
                        )
                else:
                    if self.ask_approval is not None:
                        value = self.ask_approval(p)
                    else:
                        value = True
                        self.echo(
                            f"  {'operator':<9} approves {p.interrupt_id!r} (automatic; --interactive asks you)"
                        )
                inputs[p.interrupt_id] = value
        return inputs, jobs

    async def run_batch(
        self, session_id: str, run_input: dict[str, Any], *, answer: bool = True
    ) -> SessionReport:
        """Run one batch to its end, answering every pause (``answer=False``: stop at the
        first pause, as if the job's worker lost it). A node's failure is reported, not
        raised; a store's refusal (a role that may not write, a full disk) is raised: it is
        no part of the batch's story."""
        report = SessionReport(
            session_id, order_fulfilment.name, run_input.get("scenario", "normal"), "running"
        )
        try:
            report.invocations = 1  # counted before it runs: one that raises is one too
            result = await self.runner.run(run_input, session_id=session_id)
            if result.status == "paused" and not answer:
                report.status = "paused"
                report.extra["pending"] = result.pending
                return report
            while result.status == "paused":
                if report.invocations >= self.max_invocations:
                    report.status = "paused"
                    return report
                inputs, jobs = self._answers(result.pending)
                if not inputs and not jobs:
                    report.status = "paused"
                    return report
                report.invocations += 1
                result = await self.runner.resume(session_id, inputs=inputs, jobs=jobs)
            report.status = "completed"
            report.output = result.output
        except StoreError:
            raise
        except Exception as exc:  # the node's own exception: the demo shows it, then goes on
            report.status = "failed"
            code = getattr(exc, "error_code", None)
            report.error = f"{type(exc).__name__}" + (f" [{code}]" if code else "") + f": {exc}"
        return report
