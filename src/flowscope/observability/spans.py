"""The one mapping from the event log to spans: names, attributes, status, span events, links.

Both producers of spans use it: :class:`~flowscope.observability.TracingPlugin` applies it to
SDK spans as a run goes, and :mod:`flowscope.observability.log_spans` applies it to a
session's log after the fact (``flowscope export``). Each function is pure: it reads an event
(or the few facts about a run that are not on its terminal event, such as the attempt
number) and returns attribute dicts or a frozen record; neither caller decides a name, an
attribute, an outcome or a status on its own. The span catalog is described in
``docs/design.md`` ("Spans").

Attribute names that OpenTelemetry's semantic conventions define are taken from
``opentelemetry.semconv``; the rest are flowscope's own and defined here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_WORKFLOW_NAME,
    GenAiOperationNameValues,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.util.types import AttributeValue

from ..errors import NodeTimeoutError
from ..events import (
    Event,
    InputRequested,
    JobDispatched,
    NodeCancelled,
    NodeCompleted,
    NodeErrorEvent,
    NodeErrorPropagated,
    NodePaused,
    NodeRetrying,
)

__all__ = [
    # semantic-convention names, re-exported so callers import every name from one place
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_WORKFLOW_NAME",
    "GEN_AI_CONVERSATION_ID",
    "ERROR_TYPE",
    "EXCEPTION_TYPE",
    "EXCEPTION_MESSAGE",
    "EXCEPTION_STACKTRACE",
    # flowscope's own names
    "INVOKE_WORKFLOW",
    "INVOCATION_ID",
    "RUN_RESUMED",
    "RUN_OUTCOME",
    "NODE_NAME",
    "NODE_PATH",
    "NODE_KIND",
    "NODE_OUTCOME",
    "NODE_ATTEMPT_COUNT",
    "NODE_COMPLETED",
    "NODE_HAS_OUTPUT",
    "NODE_RECOVERED",
    "NODE_ATTEMPT",
    "NODE_INPUT",
    "NODE_OUTPUT",
    "INTERRUPT_ID",
    "ERROR_CODE",
    "ERROR_MESSAGE",
    "ERROR_ORIGIN_PATH",
    "RETRY_DELAY",
    "INCOMPLETE",
    "RETRY_EVENT",
    "EXCEPTION_EVENT",
    "UNKNOWN_ERROR_CODE",
    # records and the mapping
    "Attributes",
    "SpanEventRecord",
    "SpanEnd",
    "RunError",
    "outcome_of",
    "invocation_span_name",
    "invocation_attributes",
    "invocation_end",
    "node_span_name",
    "node_attributes",
    "node_end",
    "unfinished_node_end",
    "unfinished_invocation_end",
    "retry_event",
]

Attributes = dict[str, AttributeValue]

# -- flowscope's attribute names (the telemetry catalog; tests and dashboards depend on the spelling) --
INVOKE_WORKFLOW: str = GenAiOperationNameValues.INVOKE_WORKFLOW.value  # "invoke_workflow"
INVOCATION_ID = "flowscope.invocation.id"
RUN_RESUMED = "flowscope.run.resumed"
RUN_OUTCOME = "flowscope.run.outcome"
NODE_NAME = "flowscope.node.name"
NODE_PATH = "flowscope.node.path"
NODE_KIND = "flowscope.node.kind"
NODE_OUTCOME = "flowscope.node.outcome"
NODE_ATTEMPT_COUNT = "flowscope.node.attempt_count"
NODE_COMPLETED = "flowscope.node.completed"
NODE_HAS_OUTPUT = "flowscope.node.has_output"
NODE_RECOVERED = "flowscope.node.recovered"
NODE_ATTEMPT = "flowscope.node.attempt"
NODE_INPUT = "flowscope.node.input"
NODE_OUTPUT = "flowscope.node.output"
INTERRUPT_ID = "flowscope.interrupt.id"
ERROR_CODE = "flowscope.error.code"
ERROR_MESSAGE = "flowscope.error.message"
ERROR_ORIGIN_PATH = "flowscope.error.origin_path"
RETRY_DELAY = "flowscope.retry.delay_s"
#: On spans whose run has no end in the log (its process died); only export can see that.
INCOMPLETE = "flowscope.export.incomplete"
#: Span event names: a retried attempt, and the failure itself (the semconv name).
RETRY_EVENT = "node.retry"
EXCEPTION_EVENT = "exception"
UNKNOWN_ERROR_CODE = "UNKNOWN_ERROR"

_TIMEOUT_CODE = NodeTimeoutError.error_code
_WORKFLOW_PREFIX = INVOKE_WORKFLOW + " "
_NODE_PREFIX = "invoke_node "

# The outcome vocabulary of flowscope.node.outcome, by terminal event (failures are refined below).
_OUTCOME: dict[type[Event], str] = {
    NodeCompleted: "success",
    NodeErrorEvent: "failure",
    NodeErrorPropagated: "failure",
    NodeCancelled: "cancellation",
    NodePaused: "waiting",
    InputRequested: "waiting",
    JobDispatched: "waiting",
}


@dataclass(frozen=True, slots=True)
class SpanEventRecord:
    """A span event: its name, attributes and time (the ``ts`` of the event it comes from)."""

    name: str
    attributes: Mapping[str, AttributeValue]
    ts: float

    @property
    def time_ns(self) -> int:
        return int(round(self.ts * 1e9))


@dataclass(frozen=True, slots=True)
class SpanEnd:
    """What the end of a run adds to its span: attributes, status and span events.

    ``error`` is the status description of an ERROR span; None leaves the status UNSET
    (a success, a cancellation, a pause: none of those is an error).
    """

    attributes: Mapping[str, AttributeValue]  # never mutate: a completion's is shared
    error: str | None = None
    events: tuple[SpanEventRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class RunError:
    """Why an invocation failed: the error's type, code and message, and the path it started at."""

    type: str
    code: str
    message: str
    origin_path: str | None = None


def outcome_of(event: Event) -> str:
    """``flowscope.node.outcome`` of a run that ended with ``event``: success, failure,
    timeout, cancellation or waiting. A timeout is a failure whose recorded code is
    ``NodeTimeoutError``'s (on ``NodeErrorEvent``, and carried by ``NodeErrorPropagated``)."""
    outcome = _OUTCOME.get(type(event))
    if outcome is None:
        raise ValueError(f"{event.type} is not the terminal event of a node run")
    if isinstance(event, (NodeErrorEvent, NodeErrorPropagated)) and event.error_code == _TIMEOUT_CODE:
        return "timeout"
    return outcome


# -- invocations ------------------------------------------------------------------------


def invocation_span_name(workflow: str) -> str:
    return _WORKFLOW_PREFIX + workflow


def invocation_attributes(workflow: str, session_id: str, invocation_id: str, resumed: bool) -> Attributes:
    """The attributes an invocation span starts with (``RunStarted``)."""
    return {
        GEN_AI_OPERATION_NAME: INVOKE_WORKFLOW,
        GEN_AI_WORKFLOW_NAME: workflow,
        GEN_AI_CONVERSATION_ID: session_id,
        INVOCATION_ID: invocation_id,
        RUN_RESUMED: bool(resumed),
    }


def invocation_end(outcome: str, error: RunError | None = None) -> SpanEnd:
    """The end of an invocation: ``outcome`` is ``RunFinished.status`` (completed, failed,
    paused, cancelled); a failed one carries ``error`` and has status ERROR."""
    attrs: Attributes = {}
    message = None
    if outcome == "failed" and error is not None:
        attrs[ERROR_TYPE] = error.type
        attrs[ERROR_CODE] = error.code or UNKNOWN_ERROR_CODE
        if error.origin_path:
            attrs[ERROR_ORIGIN_PATH] = error.origin_path
        message = error.message
    attrs[RUN_OUTCOME] = outcome
    return SpanEnd(attrs, message)


# -- node runs --------------------------------------------------------------------------


def node_span_name(kind: str, node: str) -> str:
    """``invoke_workflow {name}`` for a nested workflow, ``invoke_node {name}`` otherwise."""
    return (_WORKFLOW_PREFIX if kind == "workflow" else _NODE_PREFIX) + node


def node_attributes(node: str, path: str, kind: str) -> Attributes:
    """The attributes a node run's span starts with (``NodeStarted``)."""
    return {NODE_NAME: node, NODE_PATH: path, NODE_KIND: kind}


def _end_attributes(outcome: str, attempt_count: int, has_output: bool, recovered: bool) -> Attributes:
    return {
        NODE_OUTCOME: outcome,
        NODE_ATTEMPT_COUNT: attempt_count,
        NODE_COMPLETED: outcome == "success",
        NODE_HAS_OUTPUT: has_output,
        NODE_RECOVERED: recovered,
    }


# Completions are most node runs and differ only in these three facts: their SpanEnd is
# built once per combination and shared, which keeps the live plugin's cost per node run at
# a dict lookup. Callers only read ``attributes`` (a plain dict: the SDK copies a dict
# faster than a read-only proxy, by about 1 us per span).
_COMPLETED: dict[tuple[int, bool, bool], SpanEnd] = {}


def node_end(event: Event, attempt_count: int, recovered: bool, origin_message: str | None = None) -> SpanEnd:
    """The end of a node run from its terminal ``event``.

    ``attempt_count`` and ``recovered`` are not on every terminal event (the caller knows
    them from the run); ``origin_message`` is the message of the failure a
    ``NodeErrorPropagated`` points at (its status description; the failure's own span
    carries the ``exception`` event, once).
    """
    if type(event) is NodeCompleted:
        key = (attempt_count, bool(recovered), bool(event.has_output))
        end = _COMPLETED.get(key)
        if end is None:
            end = SpanEnd(_end_attributes("success", attempt_count, key[2], key[1]))
            if len(_COMPLETED) < 256:  # attempt counts are small; stay bounded if they are not
                _COMPLETED[key] = end
        return end
    attrs = _end_attributes(outcome_of(event), attempt_count, False, bool(recovered))
    if isinstance(event, NodeErrorEvent):
        attrs[ERROR_TYPE] = event.error_type
        attrs[ERROR_CODE] = event.error_code
        exc = SpanEventRecord(
            EXCEPTION_EVENT, {EXCEPTION_TYPE: event.error_type, EXCEPTION_MESSAGE: event.error_message}, event.ts
        )
        return SpanEnd(attrs, event.error_message, (exc,))
    if isinstance(event, NodeErrorPropagated):
        attrs[ERROR_TYPE] = event.error_type
        attrs[ERROR_CODE] = event.error_code
        attrs[ERROR_ORIGIN_PATH] = event.origin_path
        return SpanEnd(attrs, origin_message or event.error_type)
    interrupt = None
    if isinstance(event, InputRequested):
        interrupt = event.interrupt_id
    elif isinstance(event, JobDispatched):
        interrupt = event.job_id
    elif isinstance(event, NodePaused):
        interrupt = ",".join(event.interrupt_ids)
    if interrupt:
        attrs[INTERRUPT_ID] = interrupt
    return SpanEnd(attrs)  # cancellation (and waiting) leave the status UNSET


def unfinished_invocation_end() -> SpanEnd:
    """An invocation span without ``RunFinished`` in the log: its process died."""
    return SpanEnd({INCOMPLETE: True})


def unfinished_node_end(invocation_finished: bool) -> SpanEnd:
    """A node span whose run never got a terminal event: a cancellation when its invocation
    ended anyway (live, ``after_run`` ends it), else incomplete (the process died)."""
    return SpanEnd({NODE_OUTCOME: "cancellation"} if invocation_finished else {INCOMPLETE: True})


def retry_event(event: NodeRetrying) -> SpanEventRecord:
    """The ``node.retry`` span event of a failed attempt that is retried."""
    return SpanEventRecord(
        RETRY_EVENT,
        {
            NODE_ATTEMPT: event.attempt,
            ERROR_TYPE: event.error_type,
            ERROR_CODE: event.error_code,
            ERROR_MESSAGE: event.error_message,
            RETRY_DELAY: float(event.delay_s),
        },
        event.ts,
    )
