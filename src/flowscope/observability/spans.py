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

from collections.abc import Mapping
from dataclasses import dataclass

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
    JobResultReceived,
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
    # the convention version, and flowscope's own names and values
    "SCHEMA_URL",
    "INVOKE_WORKFLOW",
    "INVOKE_NODE",
    "WORKER_LOST",
    "WORKER_LOST_MESSAGE",
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
    "JOB_ID",
    "JOB_RESULT",
    "JOB_COUNT",
    "RETRY_EVENT",
    "EXCEPTION_EVENT",
    "JOB_RESULT_EVENT",
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
    "job_result_event",
    "error_type_of",
]

Attributes = dict[str, AttributeValue]

#: The semantic-conventions version these spans follow (the tracer's schema URL): the
#: GenAI ``invoke_workflow`` span and ``gen_ai.workflow.name`` are those of v1.41.0, the
#: last release that held the GenAI conventions; ``error.type`` and ``exception.*`` are
#: stable. A later GenAI version is emitted only on opt-in (docs/telemetry.md).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.0"

# -- flowscope's attribute names (the telemetry catalog; tests and dashboards depend on the spelling) --
INVOKE_WORKFLOW: str = GenAiOperationNameValues.INVOKE_WORKFLOW.value  # "invoke_workflow"
#: ``gen_ai.operation.name`` of a node run that is not a workflow. No convention release
#: names one; a custom value is allowed, and this is the one ADK 2.x sets on its node spans.
INVOKE_NODE = "invoke_node"
#: ``error.type`` of a run cut off by the death of the process running it (a SIGKILLed or
#: crashed worker, a lost host): the log has no end for the run. Namespaced, as the
#: convention asks of a custom value; no exception class has this name.
WORKER_LOST = "flowscope.WorkerLost"
WORKER_LOST_MESSAGE = "the worker running this was lost: its process ended before the run did"
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
JOB_ID = "flowscope.job.id"
JOB_RESULT = "flowscope.job.result"
JOB_COUNT = "flowscope.job.count"
#: Span event names: a retried attempt, the failure itself (the semconv name), and a job
#: result the run received.
RETRY_EVENT = "node.retry"
EXCEPTION_EVENT = "exception"
JOB_RESULT_EVENT = "job.result"
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


def error_type_of(event: NodeErrorEvent | NodeErrorPropagated | NodeRetrying) -> str:
    """``error.type`` of a recorded failure: the exception's fully qualified class name
    (``module.Qualname``; a builtin's bare name), as the convention asks; the bare
    ``error_type`` for a log written before the qualified name was recorded."""
    return event.error_qualname or event.error_type


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


def node_attributes(node: str, path: str, kind: str, session_id: str) -> Attributes:
    """The attributes a node run's span starts with (``NodeStarted``): the GenAI operation
    (``invoke_workflow`` for a nested workflow, with its name; ``invoke_node`` otherwise)
    and the session as ``gen_ai.conversation.id``, so that every span can be tied to its
    session and workflow by attribute, as on ADK 2.x's node spans."""
    if kind == "workflow":
        return {
            GEN_AI_OPERATION_NAME: INVOKE_WORKFLOW,
            GEN_AI_WORKFLOW_NAME: node,
            GEN_AI_CONVERSATION_ID: session_id,
            NODE_NAME: node,
            NODE_PATH: path,
            NODE_KIND: kind,
        }
    return {
        GEN_AI_OPERATION_NAME: INVOKE_NODE,
        GEN_AI_CONVERSATION_ID: session_id,
        NODE_NAME: node,
        NODE_PATH: path,
        NODE_KIND: kind,
    }


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
        error_type = error_type_of(event)
        attrs[ERROR_TYPE] = error_type
        attrs[ERROR_CODE] = event.error_code
        exc = SpanEventRecord(
            EXCEPTION_EVENT, {EXCEPTION_TYPE: error_type, EXCEPTION_MESSAGE: event.error_message}, event.ts
        )
        return SpanEnd(attrs, event.error_message, (exc,))
    if isinstance(event, NodeErrorPropagated):
        attrs[ERROR_TYPE] = error_type_of(event)
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


_INCOMPLETE = SpanEnd({INCOMPLETE: True})
_LOST = SpanEnd({INCOMPLETE: True, ERROR_TYPE: WORKER_LOST}, WORKER_LOST_MESSAGE)


def unfinished_invocation_end(lost: bool = False) -> SpanEnd:
    """An invocation span without ``RunFinished`` in the log. ``lost``: its process died
    (status ERROR, ``error.type`` :data:`WORKER_LOST`); else it stopped recording and may
    still be running (``flowscope export`` of a live session, a store that failed)."""
    return _LOST if lost else _INCOMPLETE


def unfinished_node_end(invocation_finished: bool, lost: bool = False) -> SpanEnd:
    """A node span whose run never got a terminal event: a cancellation when its invocation
    ended anyway (live, ``after_run`` ends it), else incomplete, and ``lost`` (ERROR,
    :data:`WORKER_LOST`) when the process running it died."""
    if invocation_finished:
        return SpanEnd({NODE_OUTCOME: "cancellation"})
    return _LOST if lost else _INCOMPLETE


def retry_event(event: NodeRetrying) -> SpanEventRecord:
    """The ``node.retry`` span event of a failed attempt that is retried."""
    return SpanEventRecord(
        RETRY_EVENT,
        {
            NODE_ATTEMPT: event.attempt,
            ERROR_TYPE: error_type_of(event),
            ERROR_CODE: event.error_code,
            ERROR_MESSAGE: event.error_message,
            RETRY_DELAY: float(event.delay_s),
        },
        event.ts,
    )


def job_result_event(event: JobResultReceived, ts: float) -> SpanEventRecord:
    """The ``job.result`` span event of a job result the run received: its job id, the
    guard's verdict (``success``, ``failed``, ``empty``) and the count the job reported."""
    attrs: dict[str, AttributeValue] = {JOB_ID: event.job_id, JOB_RESULT: event.result}
    if isinstance(event.count, int) and not isinstance(event.count, bool):
        attrs[JOB_COUNT] = event.count
    return SpanEventRecord(JOB_RESULT_EVENT, attrs, ts)
