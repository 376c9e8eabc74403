"""Which failed attempts of a LangGraph task LangGraph retries: its own rule, on its own policy.

LangGraph (``pregel/_retry.py``, ``run_with_retry``/``arun_with_retry``) retries a failed
attempt when the first policy of the task's ``retry_policy`` (the node's own, else the
graph's default) whose ``retry_on`` matches the exception allows another attempt: failures
so far below its ``max_attempts``. No callback names the policy, so the bridge reads it
where LangGraph runs the task: the ``PregelExecutableTask`` on the stack of the attempt's
``on_chain_start`` (a local ``task`` of the frame that runs it, the task id checked).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import CodeType, FrameType
from typing import Any

from langgraph.pregel._retry import _should_retry_on
from langgraph.types import PregelExecutableTask, RetryPolicy

__all__ = ["retried", "retry_policy_of"]

#: How far up the stack of a task's ``on_chain_start`` LangGraph's frame is looked for
#: (about eight frames up: the callback manager, then the task's ``RunnableSeq``).
_MAX_FRAMES = 32


def retry_policy_of(task_id: str) -> tuple[RetryPolicy, ...]:
    """The retry policy LangGraph runs the task ``task_id`` under, read from the task it is
    running on this stack; ``()`` (never retried) if it has none or is not found."""
    start = sys._getframe(1)
    # The frames a task was found in before (a handful of LangGraph's functions) are looked
    # at first: reading a frame's locals costs, and most frames named ``task`` are others.
    found = _task_frame(start, task_id, _RUNNERS) if _RUNNERS else None
    if found is None:
        found = _task_frame(start, task_id, None)
    if found is None:
        return ()
    task, local = found
    policy = task.retry_policy or local.get("retry_policy") or ()  # LangGraph's own choice
    return tuple(p for p in policy if isinstance(p, RetryPolicy))


#: The code of the frames a task was found in (LangGraph's sync and async runners).
_RUNNERS: set[CodeType] = set()


def _task_frame(
    frame: FrameType | None, task_id: str, only: set[CodeType] | None
) -> tuple[PregelExecutableTask, dict[str, Any]] | None:
    """The task ``task_id`` and the locals of the frame running it, up to ``_MAX_FRAMES``
    up from ``frame``, in frames of the code in ``only`` (None: any that names a ``task``)."""
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        code = frame.f_code
        if (
            (code in only)
            if only is not None
            else ("task" in code.co_varnames or "task" in code.co_freevars or "task" in code.co_cellvars)
        ):
            local = frame.f_locals
            task = local.get("task")
            if isinstance(task, PregelExecutableTask) and task.id == task_id:
                _RUNNERS.add(code)
                return task, local
        frame = frame.f_back
    return None


def retried(policy: Sequence[RetryPolicy], error: BaseException, attempt: int) -> bool:
    """Whether LangGraph retries a task whose ``attempt``-th attempt (counted from its
    first in this run of the graph) failed with ``error``, by its policy ``policy``: the
    first policy LangGraph's own ``_should_retry_on`` matches decides."""
    if not isinstance(error, Exception):  # LangGraph retries Exceptions only
        return False
    for p in policy:
        try:
            matches = _should_retry_on(p, error)
        except Exception:  # LangGraph raises this error in place of the task's: no retry
            return False
        if matches:
            return attempt < p.max_attempts
    return False
