"""Pauses: input requests, external jobs, and the answers ``resume()`` brings to them.

A run that waits raises :class:`~flowscope.engine.context.PauseSignal`. A request for
input is held on the run's context and recorded when the attempt loop sees the run pause
(one that fails instead was never asked); a job's dispatch is recorded at once (the job is
out there) and the signal carries it. Either becomes the run's terminal event. On resume the
run executes again from its start, and each ``request_input``/``await_job`` call replays
its answer from the log instead of asking again. :class:`Pauses` is the part of an
invocation that does it (``invocation.py``), recording through its
:class:`~flowscope.engine.record.Recorder`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import JobFailedError, OtherEngineError, ResumeError, redact_value
from ..events import Event, InputReceived, InputRequested, JobDispatched, JobResultReceived
from ..fold import WorkflowState
from ..jobs import (
    Job,
    check_result,
    decision_id,
    dispatch_failure,
    job_failed_payload,
    job_ids,
    result_shape_problem,
)
from ..store.base import FINISHED_SESSION_STATUSES
from .context import NodeContext, PauseSignal
from .record import Recorder, json_value
from .submit import check_input

__all__ = [
    "Pauses",
    "Answer",
    "validate_answers",
    "check_own_engine",
    "continued_in",
    "waiting_on",
    "recorded_result",
    "FINISHED",
]

log = logging.getLogger("flowscope.engine")


@dataclass(frozen=True, slots=True)
class Answer:
    """An event to append for an answer given to ``resume()`` or sent to the inbox: its
    class, the path and node of the run it answers, and its own fields."""

    cls: type[Event]
    path: str
    node: str
    fields: Mapping[str, Any]


#: Session statuses that take no more answers (the finished ones, one copy in the store port).
FINISHED = FINISHED_SESSION_STATUSES


class Pauses:
    """The part of an invocation that asks for input and waits for jobs."""

    def __init__(self, rec: Recorder) -> None:
        self._rec = rec

    async def request_input(self, ctx: NodeContext, interrupt_id: str, prompt: str, payload: Any) -> Any:
        """The recorded answer to this request, or a pause that asks for it."""
        ns = self._rec.ws.nodes[ctx.path]
        if interrupt_id in ns.inputs:
            return ns.inputs[interrupt_id]
        payload = json_value(payload, f"the payload of input request {interrupt_id!r}")
        ctx.hold_request(interrupt_id, str(prompt), payload)  # recorded when the run pauses
        raise PauseSignal(ctx.path, "input", [interrupt_id])

    async def await_job(
        self,
        ctx: NodeContext,
        n: int,
        dispatch: Callable[[Job], Any],
        payload: Any,
        expect_count: bool,
        deadline_s: float | None,
    ) -> Any:
        """Replay this ``await_job`` call's history from the log, then take the next step:
        dispatch, keep waiting, return the data, or pause on a failed result."""
        path = ctx.path
        key = f"{path}#job{n}"
        ns = self._rec.ws.nodes[path]
        history = [j for j in ns.jobs.values() if j.job_key == key]
        i = 0
        while True:
            if i == len(history):
                history.append(
                    await self._dispatch(ctx, key, i + 1, dispatch, payload, expect_count, deadline_s)
                )
            job = history[i]
            res = ns.job_results.get(job.job_id)
            if res is None:  # in flight: never dispatch the same attempt twice
                raise PauseSignal(path, "job", [job.job_id])
            if res.result == "success":
                return res.data
            verdict = check_result(
                {"success": res.success, "count": res.count, "error": res.error}, job.expect_count
            )
            iid = decision_id(key, job.dispatch_attempt)
            decision = ns.inputs.get(iid)
            if decision is None:
                prompt = f"job {job.job_id} {verdict.result}: {verdict.problem}"
                ctx.hold_request(iid, prompt, job_failed_payload(verdict, job.job_id, job.dispatch_attempt))
                raise PauseSignal(path, "input", [iid])
            if decision == "abort":
                raise JobFailedError(
                    f"job {job.job_id} {verdict.result}: {verdict.problem}; aborted by the operator"
                )
            i += 1  # "retry": the next dispatch attempt (a new job, a new idempotency key)

    async def _dispatch(
        self,
        ctx: NodeContext,
        key: str,
        attempt: int,
        dispatch: Callable[[Job], Any],
        payload: Any,
        expect_count: bool,
        deadline_s: float | None,
    ) -> JobDispatched:
        """Hand a job to ``dispatch`` and record it; a dispatch that raises is recorded as
        a failed result at once (returned), otherwise the run pauses for the result."""
        rec = self._rec
        job_id, idem = job_ids(rec.session_id, key, attempt)
        job = Job(
            job_id,
            idem,
            attempt,
            payload,
            ctx.trace_context.get("traceparent"),
            deadline_s,
            rec.session_id,
            ctx.path,
        )
        failed: dict[str, Any] | None = None
        try:
            r = dispatch(job)
            if asyncio.iscoroutine(r) or isinstance(r, asyncio.Future):
                await r
        except Exception as exc:  # an HTTP 401/5xx, a refused connection: a failed result, not a crash
            info = rec.classify(exc)
            failed = dispatch_failure(info.type, info.message)
        ev = rec.emit(
            JobDispatched,
            ctx.path,
            ctx.node_name,
            job_id=job_id,
            dispatch_attempt=attempt,
            idempotency_key=idem,
            trace_context=dict(ctx.trace_context),
            deadline_s=deadline_s,
            expect_count=expect_count,
            job_key=key,
        )
        if failed is not None:
            rec.emit(
                JobResultReceived,
                ctx.path,
                ctx.node_name,
                job_id=job_id,
                success=False,
                error=failed["error"],
                result="failed",
            )
            return ev
        raise PauseSignal(ctx.path, "job", [job_id], ev)


def recorded_result(job_id: str, result: Any) -> Any:
    """A job's result as the store keeps it: JSON data, its error text redacted."""
    result = json_value(result, f"the result of job {job_id!r}")
    if not isinstance(result, Mapping):
        return result
    # A job's error is a message like a node's: recorded redacted (an object's every
    # string, and the value of a key that names a secret), so events, the pause it
    # becomes, `show` and `events` never carry what it leaked. A `success` that is no
    # boolean is recorded by its type alone: the guard takes only `true`, and the value
    # may be anything the job sent.
    error, success = result.get("error"), result.get("success")
    if error is not None:
        result = {**result, "error": redact_value(error)}
    if success is not None and not isinstance(success, bool):
        result = {**result, "success": f"<{type(success).__name__}>"}
    return result


def waiting_on(ws: WorkflowState) -> str:
    """``input 'approval', job job-1``: what a session waits on, for messages."""
    return ", ".join(
        f"input {p.interrupt_id!r}" if isinstance(p, InputRequested) else f"job {p.job_id}"
        for p in ws.pending
        if isinstance(p, (InputRequested, JobDispatched))
    )


#: How each engine a bridge records continues a session: what an operator does instead.
_CONTINUED_IN = {
    "langgraph": "LangGraph continues it: graph.invoke(Command(resume=...), config) answers its thread, "
    "graph.invoke(None, config) runs it again",
    "adk": "ADK continues it: a message to runner.run_async with the function response answers it, "
    "a new message runs the session again",
}


def continued_in(engine: str) -> str:
    """How the engine a bridge records continues a session: what to do instead of a
    flowscope action, in the words the refusal and ``show`` print."""
    return _CONTINUED_IN.get(engine, f"continue it in {engine}")


def check_own_engine(ws: WorkflowState) -> None:
    """Refuse (:class:`~flowscope.errors.OtherEngineError`) an answer, retry, cancel or
    resume of a session another engine runs (``RunStarted.engine``, written by a bridge):
    it would change the log, never the engine, and the two would disagree from then on."""
    if ws.engine is None:
        return
    how = continued_in(ws.engine)
    raise OtherEngineError(
        f"session {ws.session_id!r} is run by {ws.engine}, whose bridge records it: "
        f"flowscope cannot answer, retry, cancel or resume it; {how}"
    )


def validate_answers(ws: WorkflowState, inputs: Mapping[str, Any], jobs: Mapping[str, Any]) -> list[Answer]:
    """Check answers (input values by interrupt id, job results by job id) against the
    session's open requests, and return the events that record them.

    The one rule ``resume(inputs=, jobs=)`` and :func:`flowscope.answer` share. It raises
    :class:`~flowscope.errors.ResumeError` before anything is appended for an unknown id,
    an input already answered, a job already reported, a job result of the wrong shape
    (:func:`~flowscope.jobs.result_shape_problem`), or a value JSON cannot hold. The CLI,
    the console and ``resume`` all call it: one rule, one set of messages. (A session
    another engine runs is refused before, where each of them loads it: ``check_own_engine``.)
    """
    out: list[Answer] = []
    nodes = ws.nodes
    sid = ws.session_id
    for iid, value in inputs.items():
        targets = [ns for ns in nodes.values() if ns.status == "waiting_input" and iid in ns.requests]
        if not targets:
            if any(iid in ns.inputs for ns in nodes.values()):
                raise ResumeError(
                    f"input {iid!r} of session {sid!r} was already answered; an answer is given once"
                )
            hint = (
                " (a job id: give it as a job result)" if any(iid in ns.jobs for ns in nodes.values()) else ""
            )
            raise ResumeError(
                f"session {sid!r} has no open input request {iid!r}{hint}; it waits on {waiting_on(ws) or 'nothing'}"
            )
        value = check_input(value, f"the input for {iid!r}")  # JSON, and Unicode text
        for ns in targets:
            payload = ns.requests[iid].payload
            if (
                isinstance(payload, dict)
                and payload.get("kind") == "job_failed"
                and value not in payload.get("actions", ())
            ):
                raise ResumeError(
                    f"input {iid!r} answers a failed job: give one of {payload.get('actions')}, not {value!r}"
                )
            out.append(Answer(InputReceived, ns.path, ns.node, {"interrupt_id": iid, "value": value}))
    for job_id, result in jobs.items():
        owner = next((ns for ns in nodes.values() if job_id in ns.jobs), None)
        if owner is None:
            asked = any(ns.status == "waiting_input" and job_id in ns.requests for ns in nodes.values())
            hint = " (an input request: give it as an input)" if asked else ""
            raise ResumeError(
                f"session {sid!r} has no dispatched job {job_id!r}{hint}; it waits on {waiting_on(ws) or 'nothing'}"
            )
        if job_id in owner.job_results:
            raise ResumeError(
                f"job {job_id!r} of session {sid!r} already reported its result; a result is reported once"
            )
        # JSON, and Unicode text: an answer's rule, an input's or a job result's
        result = recorded_result(job_id, check_input(result, f"the result of job {job_id!r}"))
        problem = result_shape_problem(result)
        if problem is not None:
            raise ResumeError(f"the result of job {job_id!r} of session {sid!r} is refused: {problem}")
        verdict = check_result(result, owner.jobs[job_id].expect_count)
        r = result if isinstance(result, Mapping) else {}
        fields = {
            "job_id": job_id,
            "success": r.get("success"),
            "count": r.get("count"),
            "error": r.get("error"),
            "data": r.get("data"),
            "result": verdict.result,
        }
        out.append(Answer(JobResultReceived, owner.path, owner.node, fields))
    return out
