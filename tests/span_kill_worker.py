"""A worker process for the span-shipping SIGKILL test (tests/observability/test_span_shipping.py).

``python span_kill_worker.py DB SESSION ENDPOINT CONTEXTS MODE [BLOCK_AT]``: MODE ``run``
starts a chain of 8 nodes on SQLite with the tracing plugin exporting to ENDPOINT over
OTLP/HTTP; node BLOCK_AT writes its context and hangs (the test kills the process
there). MODE ``resume`` resumes the session in a new process. Every node body appends the
span context it sees (``trace.get_current_span()``) and its ``traceparent`` to CONTEXTS.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from opentelemetry import trace

from flowscope import START, Runner, Workflow, node
from flowscope.observability import configure_tracing
from flowscope.store.sqlite import SqliteEventStore

N = 8


def chain(contexts: str, block_at: int) -> Workflow:
    def make(i: int):
        @node(name=f"n{i}")
        async def body(ctx, x):
            sc = trace.get_current_span().get_span_context()
            with open(contexts, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "path": ctx.path,
                            "attempt": ctx.attempt,
                            "pid": os.getpid(),
                            "trace_id": f"{sc.trace_id:032x}",
                            "span_id": f"{sc.span_id:016x}",
                            "traceparent": ctx.trace_context.get("traceparent"),
                        }
                    )
                    + "\n"
                )
                f.flush()
                os.fsync(f.fileno())
            if i == block_at:
                await asyncio.sleep(3600)  # killed here
            await asyncio.sleep(0.03)  # lets the batch processor export some spans before the kill
            return x + 1

        return body

    nodes = [make(i) for i in range(1, N + 1)]
    edges = [(START, nodes[0])] + [(a, b) for a, b in zip(nodes, nodes[1:])]
    return Workflow("killed_chain", edges=edges)


async def main() -> None:
    db, session, endpoint, contexts, mode = sys.argv[1:6]
    block_at = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    with configure_tracing(
        "span-kill-worker", otlp_endpoint=endpoint, protocol="http/protobuf", timeout=5
    ) as tracing:
        runner = Runner(chain(contexts, block_at), store=SqliteEventStore(db), plugins=[tracing.plugin()])
        if mode == "run":
            await runner.run(0, session_id=session)
        else:
            result = await runner.resume(session)
            print(result.status, result.output)


if __name__ == "__main__":
    asyncio.run(main())
