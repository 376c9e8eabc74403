"""StoreCollector's ``flowscope_job_results_total`` (``observability/store_collector.py``):
a counter from the collector's start, which never falls when sessions are pruned, on a
store whose own count of the log's results does fall (the memory store, as PostgreSQL's
``GROUP BY``)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from flowscope import START, Runner, Workflow, answer, node
from flowscope.observability import StoreCollector
from flowscope.store import MemoryEventStore


@node
async def geocode(ctx, x):
    return await ctx.await_job(lambda job: None, payload=x, expect_count=True)


ETL = Workflow("etl", edges=[(START, geocode)])


def _paused_on_a_job(store, sid: str) -> str:
    paused = asyncio.run(Runner(ETL, store=store).run([1], session_id=sid))
    assert paused.status == "paused"
    [job] = paused.pending
    return job.job_id


def _answered_and_finished(store, sid: str, job: str) -> None:
    answer(store, sid, jobs={job: {"success": True, "count": 2, "data": [1, 2]}})
    assert asyncio.run(Runner(ETL, store=store).resume(sid)).status == "completed"


def _results(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value(
        "flowscope_job_results_total", {"workflow": "etl", "node": "geocode", "result": "success"}
    )


def test_job_results_never_fall_when_the_sessions_that_recorded_them_are_pruned():
    store = MemoryEventStore()
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    first, second, third = (_paused_on_a_job(store, sid) for sid in ("s1", "s2", "s3"))
    assert _results(registry) is None  # the first scrape: the baseline, nothing in the log yet
    _answered_and_finished(store, "s1", first)
    _answered_and_finished(store, "s2", second)
    assert _results(registry) == 2
    assert store.delete_sessions(["s1"]) == ["s1"]  # pruned: the log's count of results falls to 1
    assert [g.count for g in store.job_result_summary()] == [1]
    assert _results(registry) == 2
    _answered_and_finished(store, "s3", third)
    assert _results(registry) == 3
