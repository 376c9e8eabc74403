"""A process of the cross-process job test: each invocation runs in its own process.

    python job_worker.py DB DISPATCHED_FILE run|resume [--job ID=JSON] [--input ID=JSON]

``dispatch`` appends the job it was handed (as JSON) to DISPATCHED_FILE: the queue a real
worker would read. Prints the run's status and its pending ids as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

from flowscope import START, Runner, Workflow, node
from flowscope.store import SqliteEventStore


def build(dispatched: str) -> Workflow:
    def dispatch(job):
        with open(dispatched, "a") as f:
            f.write(
                json.dumps(
                    {
                        "job_id": job.job_id,
                        "idempotency_key": job.idempotency_key,
                        "dispatch_attempt": job.dispatch_attempt,
                        "payload": job.payload,
                    }
                )
                + "\n"
            )

    @node
    async def enrich(ctx, rows):
        data = await ctx.await_job(dispatch, payload=rows, expect_count=True, deadline_s=3600)
        return {"rows": data}

    return Workflow("etl", edges=[(START, enrich)])


async def main() -> None:
    db, dispatched, mode, *rest = sys.argv[1:]
    answers: dict[str, dict] = {"--job": {}, "--input": {}}
    for flag, pair in zip(rest[::2], rest[1::2]):
        key, _, value = pair.partition("=")
        answers[flag][key] = json.loads(value)
    runner = Runner(build(dispatched), store=SqliteEventStore(db))
    if mode == "run":
        result = await runner.run([1, 2, 3], session_id="s")
    else:
        result = await runner.resume("s", inputs=answers["--input"], jobs=answers["--job"])
    pending = [getattr(e, "job_id", None) or e.interrupt_id for e in result.pending]
    print(json.dumps({"status": result.status, "pending": pending, "output": result.output}))


if __name__ == "__main__":
    asyncio.run(main())
