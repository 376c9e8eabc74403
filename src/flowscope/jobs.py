"""The failure contract for long-running external jobs.

A job is handed to an outside worker and reports back later through
``Runner.resume(session_id, jobs={job_id: result})``. Frameworks that treat "no
exception" as success show a failed job as done, or as a spinner that never stops.
Here one guard, :func:`check_result`, judges every result — the dispatch's own failure
and the reported result alike — and a failure becomes an actionable pause (an input
request with ``retry``/``abort``), never a crash and never a quiet success.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Job",
    "Verdict",
    "check_result",
    "result_type_problem",
    "result_shape_problem",
    "JOB_RESULT_KEYS",
    "dispatch_failure",
    "job_failed_payload",
    "job_ids",
    "decision_id",
    "JOB_ACTIONS",
]

JOB_ACTIONS = ("retry", "abort")
#: The keys a reported job result may have.
JOB_RESULT_KEYS = ("success", "count", "error", "data")


@dataclass(frozen=True, slots=True)
class Job:
    """What ``dispatch`` receives: hand ``job_id`` and ``idempotency_key`` to the worker.

    ``idempotency_key`` is new for every dispatch attempt (a retry is a new job) but the
    same if a crash makes the engine dispatch the same attempt again, so the worker can
    drop the duplicate. ``traceparent`` (W3C) lets the worker join the node's trace.
    """

    job_id: str
    idempotency_key: str
    dispatch_attempt: int
    payload: Any
    traceparent: str | None
    deadline_s: float | None
    session_id: str
    path: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The guard's judgement of a job result."""

    result: str  # "success", "failed" or "empty"
    problem: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.result == "success"


def job_ids(session_id: str, job_key: str, dispatch_attempt: int) -> tuple[str, str]:
    """Deterministic ``(job_id, idempotency_key)`` for one dispatch attempt of one job."""
    digest = hashlib.sha256(f"{session_id}\x00{job_key}\x00{dispatch_attempt}".encode()).hexdigest()
    return f"job-{digest[:20]}", f"idem-{digest[20:52]}"


def decision_id(job_key: str, dispatch_attempt: int) -> str:
    """The interrupt id of the retry/abort question a failed dispatch attempt asks."""
    return f"{job_key}.{dispatch_attempt}"


def result_type_problem(result: Mapping[str, Any] | Any) -> str | None:
    """What is wrong with a reported result's ``count``, or None: when present (and not
    null) it is a JSON number. A result that breaks it (``"count": "3"``) is refused when
    reported, with this sentence, instead of judged "empty": the mistake is the
    reporter's, not the job's, and the job's work is not lost. (A ``success`` that is
    not ``true`` stays the guard's to judge: failed, never refused.)"""
    if not isinstance(result, Mapping):
        return None  # not an object at all: the guard's "failed" verdict says so
    count = result.get("count")
    if count is None or (isinstance(count, (int, float)) and not isinstance(count, bool)):
        return None
    return f"'count' is {json.dumps(count)[:40]} ({type(count).__name__}); it must be a number (3, not \"3\")"


def result_shape_problem(result: Any) -> str | None:
    """What is wrong with a reported job result's shape, or None: it is a JSON object whose
    keys are among :data:`JOB_RESULT_KEYS`, with a numeric ``count`` (:func:`result_type_problem`).
    Anything else is refused when reported, whoever reports it (a worker, ``flowscope
    resume --job``, the console): a typo (``"succes"``) would otherwise be recorded as a
    failed job and the job's work lost."""
    if not isinstance(result, Mapping):
        return f"a job result is a JSON object, not {type(result).__name__} {json.dumps(result)[:40]}"
    unknown = sorted(set(result) - set(JOB_RESULT_KEYS))
    if unknown:
        return f"unknown key(s) {', '.join(map(str, unknown))}; a job result has {', '.join(JOB_RESULT_KEYS)}"
    return result_type_problem(result)


def check_result(result: Mapping[str, Any] | Any, expect_count: bool) -> Verdict:
    """The one guard: success only when ``success is True`` (and ``count > 0`` with ``expect_count``)."""
    if not isinstance(result, Mapping):
        return Verdict(
            "failed",
            f"the job reported {type(result).__name__}, not a result object",
            'report {"success": true, "data": ...} (and "count" when items are expected)',
        )
    success = result.get("success")
    if success is not True:
        error = result.get("error")
        if "success" not in result:
            problem = "the job's result has no 'success' field, so it cannot be trusted as a success"
        elif error:
            problem = f"the job failed: {str(error)[:500]}"
        elif success is None or isinstance(success, bool):
            problem = f"the job reported success={success!r}"
        else:  # its value is not repeated: it may be anything the job sent
            problem = f"the job reported a 'success' of type {type(success).__name__}, not true"
        return Verdict(
            "failed", problem, "fix the cause in the worker or its inputs, then answer 'retry'; or 'abort'"
        )
    if expect_count:
        count = result.get("count")
        if not isinstance(count, (int, float)) or isinstance(count, bool) or count <= 0:
            return Verdict(
                "empty",
                f"the job reported success but count={count!r}: it produced nothing",
                "check the job's inputs (an empty source, a filter that matched nothing), then answer 'retry'; or 'abort'",
            )
    return Verdict("success")


def dispatch_failure(error_type: str, message: str) -> dict[str, Any]:
    """The failed result recorded when ``dispatch`` itself raises (HTTP 401/5xx, refused)."""
    return {"success": False, "error": f"dispatch failed: {error_type}: {message}"}


def job_failed_payload(verdict: Verdict, job_id: str, dispatch_attempt: int) -> dict[str, Any]:
    """The payload of the actionable pause a failed job becomes."""
    return {
        "kind": "job_failed",
        "result": verdict.result,
        "problem": verdict.problem,
        "fix": verdict.fix,
        "actions": list(JOB_ACTIONS),
        "job_id": job_id,
        "dispatch_attempt": dispatch_attempt,
    }
