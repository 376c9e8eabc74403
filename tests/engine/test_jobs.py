"""The failure contract for long-running external jobs, in one process."""

from __future__ import annotations

import pytest

from conftest import of_type
from flowscope import START, Runner, Workflow, node
from flowscope.errors import JobFailedError, ResumeError
from flowscope.jobs import check_result
from flowscope.store import rebuild


class Worker:
    """Stands in for the queue a real dispatch would post to: it records what it was handed."""

    def __init__(self, fail_with=None):
        self.jobs = []
        self.fail_with = fail_with

    async def dispatch(self, job):
        if self.fail_with is not None:
            raise self.fail_with
        self.jobs.append(job)


def enrich_workflow(worker, expect_count=True, deadline_s=None, completed=None):
    @node
    async def enrich(ctx, rows):
        data = await ctx.await_job(
            worker.dispatch, payload=rows, expect_count=expect_count, deadline_s=deadline_s
        )
        return {"enriched": data}

    @node
    def publish(ctx, x):
        if completed is not None:
            completed.append(x)
        return x

    return Workflow("etl", edges=[(START, enrich, publish)])


async def test_success_returns_data_and_dispatches_once(store):
    worker = Worker()
    runner = Runner(enrich_workflow(worker), store=store)
    paused = await runner.run([1, 2], session_id="s")
    assert paused.status == "paused"
    (pending,) = paused.pending
    assert pending.type == "job_dispatched" and pending.dispatch_attempt == 1
    (job,) = worker.jobs
    assert (job.job_id, job.payload, job.dispatch_attempt) == (pending.job_id, [1, 2], 1)
    assert job.idempotency_key == pending.idempotency_key
    assert rebuild(store.read("s")).nodes["etl@1/enrich@1"].status == "waiting_job"
    done = await runner.resume("s", jobs={job.job_id: {"success": True, "count": 2, "data": ["a", "b"]}})
    assert done.status == "completed" and done.output == {"enriched": ["a", "b"]}
    assert len(worker.jobs) == 1  # resuming does not dispatch again
    (res,) = of_type(store.read("s"), "job_result")
    assert res.result == "success"


@pytest.mark.parametrize(
    "result, verdict",
    [
        ({"success": False, "error": "token expired"}, "failed"),
        ({"success": True, "count": 0, "data": []}, "empty"),
        ({"count": 5, "data": [1]}, "failed"),  # no success field: cannot be trusted
        ({"success": "yes", "count": 3}, "failed"),  # truthy is not True
    ],
)
async def test_each_failure_shape_ends_in_the_actionable_pause(store, result, verdict):
    worker = Worker()
    completed = []
    runner = Runner(enrich_workflow(worker, completed=completed), store=store)
    await runner.run([1], session_id="s")
    paused = await runner.resume("s", jobs={worker.jobs[0].job_id: result})
    assert paused.status == "paused" and completed == []
    (req,) = paused.pending
    assert req.type == "input_requested"
    assert req.payload["kind"] == "job_failed" and req.payload["actions"] == ["retry", "abort"]
    assert req.payload["result"] == verdict and req.payload["problem"] and req.payload["fix"]
    state = rebuild(store.read("s"))
    assert state.nodes["etl@1/enrich@1"].status == "waiting_input"
    assert "node_completed" not in {e.type for e in store.read("s") if e.path == "etl@1/enrich@1"}


async def test_a_dispatch_that_raises_is_a_failed_result_not_a_crash(store):
    class HTTPError(Exception):
        pass

    worker = Worker(fail_with=HTTPError("401 Unauthorized"))
    runner = Runner(enrich_workflow(worker), store=store)
    paused = await runner.run([1], session_id="s")
    assert paused.status == "paused"
    (req,) = paused.pending
    assert req.payload["kind"] == "job_failed" and "401 Unauthorized" in req.payload["problem"]
    events = store.read("s")
    assert of_type(events, "node_error") == []
    (dispatched,) = of_type(events, "job_dispatched")
    (res,) = of_type(events, "job_result")
    assert res.job_id == dispatched.job_id and res.success is False and res.result == "failed"


async def test_retry_dispatches_a_new_job_past_the_in_flight_guard(store):
    worker = Worker()
    runner = Runner(enrich_workflow(worker), store=store)
    await runner.run([1], session_id="s")
    first = worker.jobs[0]
    paused = await runner.resume("s", jobs={first.job_id: {"success": True, "count": 0}})
    iid = paused.pending[0].interrupt_id
    again = await runner.resume("s", inputs={iid: "retry"})
    assert again.status == "paused"
    assert len(worker.jobs) == 2
    second = worker.jobs[1]
    assert second.dispatch_attempt == 2
    assert second.job_id != first.job_id and second.idempotency_key != first.idempotency_key
    assert again.pending[0].job_id == second.job_id
    done = await runner.resume("s", jobs={second.job_id: {"success": True, "count": 1, "data": "ok"}})
    assert done.output == {"enriched": "ok"}
    dispatches = of_type(store.read("s"), "job_dispatched")
    assert [d.dispatch_attempt for d in dispatches] == [1, 2]  # the audit shows both


async def test_abort_fails_the_node_with_job_failed(store):
    worker = Worker()
    runner = Runner(enrich_workflow(worker), store=store)
    await runner.run([1], session_id="s")
    paused = await runner.resume("s", jobs={worker.jobs[0].job_id: {"success": False, "error": "quota"}})
    with pytest.raises(JobFailedError, match="quota"):
        await runner.resume("s", inputs={paused.pending[0].interrupt_id: "abort"})
    (err,) = of_type(store.read("s"), "node_error")
    assert (err.error_code, err.path) == ("JOB_FAILED", "etl@1/enrich@1")


@pytest.mark.parametrize("how", ["resume", "retry"])
async def test_after_an_abort_a_retry_asks_again_and_can_dispatch_anew(store, how):
    """The operator's "abort" failed the node; running it again (a resume of the failed
    session, or flowscope.retry) spends it: the question is asked again instead of the
    abort replayed, which failed every new attempt at once."""
    import flowscope

    worker = Worker()
    runner = Runner(enrich_workflow(worker), store=store)
    await runner.run([1], session_id="s")
    paused = await runner.resume("s", jobs={worker.jobs[0].job_id: {"success": False, "error": "quota"}})
    iid = paused.pending[0].interrupt_id
    with pytest.raises(JobFailedError):
        await runner.resume("s", inputs={iid: "abort"})
    if how == "retry":
        flowscope.retry(store, "s", reason="quota raised")
    again = await runner.resume("s")
    assert again.status == "paused" and [p.interrupt_id for p in again.pending] == [iid]
    redo = await runner.resume("s", inputs={iid: "retry"})
    assert len(worker.jobs) == 2 and worker.jobs[1].dispatch_attempt == 2
    done = await runner.resume(
        "s", jobs={redo.pending[0].job_id: {"success": True, "count": 1, "data": "ok"}}
    )
    assert done.output == {"enriched": "ok"}
    assert len(of_type(store.read("s"), "node_error")) == 1  # the abort's, once


async def test_except_exception_in_user_code_cannot_swallow_the_pause(store):
    worker = Worker()
    swallowed = []

    @node
    async def careless(ctx, x):
        try:
            return await ctx.await_job(worker.dispatch, payload=x)
        except Exception as exc:  # the pause is a BaseException and passes through
            swallowed.append(exc)
            return "swallowed"

    runner = Runner(Workflow("w", edges=[(START, careless)]), store=store)
    assert (await runner.run(1, session_id="s")).status == "paused"
    assert swallowed == []


async def test_a_deliberate_raise_in_user_code_is_a_node_failure_not_a_job_failure(store):
    worker = Worker()

    @node
    async def strict(ctx, x):
        data = await ctx.await_job(worker.dispatch, payload=x)
        if data["rows"] == 0:
            raise ValueError("no rows to publish")
        return data

    runner = Runner(Workflow("w", edges=[(START, strict)]), store=store)
    await runner.run(1, session_id="s")
    with pytest.raises(ValueError, match="no rows"):
        await runner.resume("s", jobs={worker.jobs[0].job_id: {"success": True, "data": {"rows": 0}}})
    events = store.read("s")
    assert [e.error_code for e in of_type(events, "node_error")] == ["UNKNOWN_ERROR"]
    assert not any(e.type == "input_requested" for e in events)


async def test_unknown_job_id_is_a_clear_error_and_a_duplicate_result_is_refused(store):
    worker = Worker()
    runner = Runner(enrich_workflow(worker, expect_count=False), store=store)
    await runner.run([1], session_id="s")
    before = store.last_seq("s")
    with pytest.raises(ResumeError, match="no dispatched job 'nope'"):
        await runner.resume("s", jobs={"nope": {"success": True}})
    assert store.last_seq("s") == before  # nothing appended
    job_id = worker.jobs[0].job_id
    await runner.resume("s", jobs={job_id: {"success": True, "data": 1}})
    with pytest.raises(ResumeError, match="already completed"):
        await runner.resume("s", jobs={job_id: {"success": True, "data": 1}})
    assert len(of_type(store.read("s"), "job_result")) == 1


async def test_a_result_delivered_twice_while_still_paused_is_appended_once(store):
    worker = Worker()

    @node
    async def two_jobs(ctx, x):
        a = await ctx.await_job(worker.dispatch, payload="a")
        b = await ctx.await_job(worker.dispatch, payload="b")
        return [a, b]

    runner = Runner(Workflow("w", edges=[(START, two_jobs)]), store=store)
    await runner.run(None, session_id="s")
    first = worker.jobs[0].job_id
    await runner.resume("s", jobs={first: {"success": True, "data": 1}})
    before = store.last_seq("s")
    with pytest.raises(ResumeError, match="already reported"):  # a redelivery (an error, not dropped)
        await runner.resume("s", jobs={first: {"success": True, "data": 1}})
    assert store.last_seq("s") == before  # no empty invocation appended
    assert len([r for r in of_type(store.read("s"), "job_result") if r.job_id == first]) == 1
    assert len(worker.jobs) == 2
    done = await runner.resume("s", jobs={worker.jobs[1].job_id: {"success": True, "data": 2}})
    assert done.output == [1, 2]


async def test_answer_to_a_failed_job_must_be_an_action(store):
    worker = Worker()
    runner = Runner(enrich_workflow(worker), store=store)
    await runner.run([1], session_id="s")
    paused = await runner.resume("s", jobs={worker.jobs[0].job_id: {"success": False}})
    with pytest.raises(ResumeError, match="retry"):
        await runner.resume("s", inputs={paused.pending[0].interrupt_id: "maybe"})


async def test_deadline_is_projected_for_overdue_detection(store):
    worker = Worker()
    runner = Runner(enrich_workflow(worker, deadline_s=60), store=store)
    await runner.run([1], session_id="s")
    (row,) = [r for r in store.open_runs() if r.path == "etl@1/enrich@1"]
    dispatched = of_type(store.read("s"), "job_dispatched")[0]
    assert row.status == "waiting_job" and row.job_deadline_at == pytest.approx(dispatched.ts + 60)


def test_the_guard():
    assert check_result({"success": True}, expect_count=False).ok
    assert check_result({"success": True, "count": 3}, expect_count=True).ok
    assert check_result({"success": True, "count": 0}, expect_count=True).result == "empty"
    assert check_result({"success": True}, expect_count=True).result == "empty"
    assert check_result({"success": 1}, expect_count=False).result == "failed"
    assert check_result(None, expect_count=False).result == "failed"
    assert check_result({"success": False, "error": "x"}, expect_count=False).problem == "the job failed: x"


@pytest.mark.parametrize(
    "result, says",
    [
        ([1, 2], "a job result is a JSON object, not list"),
        ({"succes": True}, "unknown key(s) succes"),
        ({"success": True, "count": "3"}, "must be a number"),
    ],
)
async def test_one_rule_refuses_a_job_result_of_the_wrong_shape_whoever_reports_it(store, result, says):
    """resume(), flowscope.answer() (what the console calls) and the CLI share one rule: a
    result of the wrong shape is refused before anything is recorded, never judged failed."""
    from flowscope import answer

    worker = Worker()
    runner = Runner(enrich_workflow(worker), store=store)
    await runner.run([1], session_id="s")
    (job,) = worker.jobs
    before = store.last_seq("s")
    with pytest.raises(ResumeError, match="refused") as by_resume:
        await runner.resume("s", jobs={job.job_id: result})
    with pytest.raises(ResumeError, match="refused") as by_answer:
        answer(store, "s", jobs={job.job_id: result})
    assert says in str(by_resume.value) and str(by_resume.value) == str(by_answer.value)
    assert store.last_seq("s") == before and not store.inbox("s")


async def test_an_unknown_id_says_what_the_session_waits_on(store):
    worker = Worker()
    runner = Runner(enrich_workflow(worker), store=store)
    await runner.run([1], session_id="s")
    (job,) = worker.jobs
    with pytest.raises(ResumeError) as info:
        await runner.resume("s", inputs={job.job_id: True})
    assert "(a job id: give it as a job result)" in str(info.value)
    assert f"it waits on job {job.job_id}" in str(info.value)


async def test_a_run_awaiting_two_jobs_is_overdue_by_the_earliest_deadline_still_open(store):
    import asyncio

    worker = Worker()

    @node
    async def two(ctx, x):
        return await asyncio.gather(
            ctx.await_job(worker.dispatch, payload="fast", deadline_s=1.0),
            ctx.await_job(worker.dispatch, payload="slow", deadline_s=3600.0),
        )

    await Runner(Workflow("two", edges=[(START, two)]), store=store).run(1, session_id="s")
    fast, slow = of_type(store.read("s"), "job_dispatched")
    assert (fast.deadline_s, slow.deadline_s) == (1.0, 3600.0)
    (row,) = [r for r in store.open_runs() if r.path == "two@1/two@1"]
    assert row.job_deadline_at == pytest.approx(fast.ts + 1.0)  # not the last one dispatched
    result = {"success": True, "count": 1, "data": "done"}
    paused = await Runner(Workflow("two", edges=[(START, two)]), store=store).resume(
        "s", jobs={slow.job_id: result}
    )
    assert paused.status == "paused"
    ns = rebuild(store.read("s")).nodes["two@1/two@1"]
    assert ns.job_deadline_at == pytest.approx(fast.ts + 1.0)  # the slow job reported, not the fast one
