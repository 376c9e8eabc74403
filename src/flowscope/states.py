"""The vocabularies of a session's record, defined once: node status, session status, how
an invocation ends, a run's outcome, what a run waits for, and the event kinds.

Each is a ``Literal`` of the very strings the log, the store and the event JSON carry, so
a value is a plain ``str`` at run time (nothing persisted changes) and mypy checks every
field and signature typed with one. The tuples beside them are the same values for code
that iterates or tests membership; ``tests/test_states.py`` checks that each agrees with
the code that produces it (the fold, the catalog).
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "NodeStatus",
    "SessionStatus",
    "RunStatus",
    "ResultStatus",
    "OutcomeStatus",
    "Waiting",
    "EventKind",
    "NODE_STATUSES",
    "OPEN_STATES",
    "RUN_STATUSES",
    "OUTCOME_STATUSES",
    "EVENT_KINDS",
]

#: A node run's status in the fold (``NodeState.status``) and the ``node_runs`` projection.
NodeStatus = Literal["running", "completed", "failed", "cancelled", "waiting_input", "waiting_job"]
#: A session's status in the fold (``WorkflowState.status``): ``new`` before its first
#: event, ``answered`` once ``flowscope.answer`` recorded what a paused session waited for.
SessionStatus = Literal["new", "queued", "running", "completed", "failed", "paused", "answered", "cancelled"]
#: How an invocation ended (``RunFinished.status``).
RunStatus = Literal["completed", "failed", "paused", "cancelled"]
#: How a ``run``/``resume`` call returned without an exception (``RunResult.status``).
ResultStatus = Literal["completed", "paused"]
#: How a node run ended, in the span vocabulary (``NodeOutcome.status``, ``after_node``).
OutcomeStatus = Literal["success", "failure", "timeout", "cancellation", "waiting"]
#: What a paused run waits for (``NodePaused.waiting``).
Waiting = Literal["input", "job"]
#: An event's ``type`` in the log and its JSON (one per class of ``flowscope.events``).
EventKind = Literal[
    "run_submitted",
    "run_started",
    "run_finished",
    "node_started",
    "node_retrying",
    "node_completed",
    "node_error",
    "node_error_propagated",
    "node_cancelled",
    "node_paused",
    "input_requested",
    "input_received",
    "job_dispatched",
    "job_result",
    "state_updated",
]

NODE_STATUSES: tuple[NodeStatus, ...] = get_args(NodeStatus)
#: The statuses of a run that has not ended for good: running, or waiting.
OPEN_STATES: tuple[NodeStatus, ...] = ("running", "waiting_input", "waiting_job")
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
OUTCOME_STATUSES: tuple[OutcomeStatus, ...] = get_args(OutcomeStatus)
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)
