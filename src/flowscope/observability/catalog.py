"""The metric catalog: every instrument flowscope's plugin records, for both backends.

One table, :data:`INSTRUMENTS` (with :data:`WORKER_INSTRUMENTS` for a worker's claims and
leases and :data:`READ_INSTRUMENTS` for counts read at collection time), gives each
instrument its Prometheus name, OpenTelemetry name, kind, labels, help and buckets. The
names are a contract (docs/design.md): dashboards and alert rules use them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "InstrumentSpec",
    "INSTRUMENTS",
    "WORKER_INSTRUMENTS",
    "READ_INSTRUMENTS",
    "DURATION_BUCKETS",
    "ATTEMPT_BUCKETS",
    "NODE_OUTCOMES",
    "WORKFLOW_OUTCOMES",
    "JOB_RESULTS",
    "CLAIM_REASONS",
    "UNKNOWN_WORKFLOW",
    "SPECS",
]

#: Node durations from milliseconds (a function call) to hours (a human approval, a job).
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
)  # fmt: skip
#: Attempts per finished node run (1 = no retry).
ATTEMPT_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0)

NODE_OUTCOMES = ("success", "failure", "timeout", "cancellation", "waiting")
WORKFLOW_OUTCOMES = ("completed", "failed", "paused", "cancelled")
JOB_RESULTS = ("success", "failed", "empty")

#: Fallback label when an event's invocation is unknown to the plugin (it was added
#: to the runner after the invocation began). Never an id.
UNKNOWN_WORKFLOW = "unknown"


@dataclass(frozen=True, slots=True)
class InstrumentSpec:
    """One instrument, for both backends.

    ``prom_name`` is the exposed Prometheus name (counters end in ``_total``);
    ``otel_name`` the dotted OpenTelemetry name; ``kind`` is ``counter``,
    ``histogram`` or ``updown`` (a Prometheus gauge, an OTel UpDownCounter);
    ``unit`` is the OTel unit (``s``, or a ``{annotation}`` that exporters drop).
    """

    key: str
    prom_name: str
    otel_name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    unit: str = ""
    buckets: tuple[float, ...] | None = None


INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    InstrumentSpec(
        "node_runs", "flowscope_node_runs_total", "flowscope.node.runs", "counter",
        ("workflow", "node", "outcome"),
        "Finished node runs by outcome (success, failure, timeout, cancellation, waiting).",
        "{run}",
    ),
    InstrumentSpec(
        "node_duration", "flowscope_node_duration_seconds", "flowscope.node.duration", "histogram",
        ("workflow", "node", "outcome"),
        "Duration of node runs, all attempts included, in seconds.",
        "s", DURATION_BUCKETS,
    ),
    InstrumentSpec(
        "node_errors", "flowscope_node_errors_total", "flowscope.node.errors", "counter",
        ("workflow", "node", "error_code", "error_type"),
        "Node runs that failed for good (one per NodeErrorEvent, at the deepest path).",
        "{error}",
    ),
    InstrumentSpec(
        "node_retries", "flowscope_node_retries_total", "flowscope.node.retries", "counter",
        ("workflow", "node", "error_type"),
        "Failed node attempts that were retried.",
        "{retry}",
    ),
    InstrumentSpec(
        "node_attempts", "flowscope_node_attempts", "flowscope.node.attempts", "histogram",
        ("workflow", "node"),
        "Attempts per finished node run (success, failure or timeout).",
        "{attempt}", ATTEMPT_BUCKETS,
    ),
    InstrumentSpec(
        "nodes_running", "flowscope_nodes_running", "flowscope.nodes.running", "updown",
        ("workflow", "node"),
        "Node runs in progress in this process.",
        "{run}",
    ),
    InstrumentSpec(
        "workflow_runs", "flowscope_workflow_runs_total", "flowscope.workflow.runs", "counter",
        ("workflow", "outcome"),
        "Finished workflow invocations (run or resume) by outcome (completed, failed, paused, cancelled).",
        "{run}",
    ),
    InstrumentSpec(
        "workflow_duration", "flowscope_workflow_duration_seconds", "flowscope.workflow.duration", "histogram",
        ("workflow", "outcome"),
        "Duration of workflow invocations (run or resume), in seconds.",
        "s", DURATION_BUCKETS,
    ),
    InstrumentSpec(
        "job_results", "flowscope_job_results_total", "flowscope.job.results", "counter",
        ("workflow", "node", "result"),
        "Results of long-running external jobs by the guard's verdict (success, failed, empty).",
        "{result}",
    ),
    InstrumentSpec(
        "plugin_errors", "flowscope_plugin_errors_total", "flowscope.plugin.errors", "counter",
        ("plugin", "hook"),
        "Plugin hooks that raised (the workflow went on).",
        "{error}",
    ),
    InstrumentSpec(
        "resume_conflicts", "flowscope_resume_conflicts_total", "flowscope.resume.conflicts", "counter",
        ("workflow",),
        "Invocations (run or resume) that lost a race for their session and appended nothing (no failure).",
        "{conflict}",
    ),
    InstrumentSpec(
        "metrics_overflow", "flowscope_metrics_overflow_total", "flowscope.metrics.overflow", "counter",
        ("metric",),
        "Observations folded into the _other label set because the metric reached max_series label sets.",
        "{observation}",
    ),
)  # fmt: skip

#: The instruments of a :class:`~flowscope.worker.Worker`. They are created on
#: the first worker hook, so a process that runs no worker exposes none of them.
WORKER_INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    InstrumentSpec(
        "worker_claims", "flowscope_worker_claims_total", "flowscope.worker.claims", "counter",
        ("workflow", "reason"),
        "Sessions a worker claimed, by reason (queued, answered, orphaned).",
        "{session}",
    ),
    InstrumentSpec(
        "worker_leases_lost", "flowscope_worker_leases_lost_total", "flowscope.worker.leases_lost", "counter",
        ("workflow",),
        "Invocations that lost their lease to another owner and stopped without appending.",
        "{session}",
    ),
    InstrumentSpec(
        "worker_active", "flowscope_worker_active_sessions", "flowscope.worker.active_sessions", "updown",
        ("workflow",),
        "Sessions this worker is running now.",
        "{session}",
    ),
    InstrumentSpec(
        "worker_store_writable", "flowscope_worker_store_writable", "flowscope.worker.store_writable", "updown",
        (),
        "1 while this worker's writes to its store go through; 0 while the store refuses them "
        "or does not answer (the worker claims nothing then).",
        "{state}",
    ),
)  # fmt: skip
CLAIM_REASONS = ("queued", "answered", "orphaned")

#: Instruments read at collection time from counts the process keeps itself (its spans
#: not exported: ``span_losses.py``), so each is reported once per registry or meter,
#: from the process's start, however many plugins share it.
READ_INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    InstrumentSpec(
        "spans_not_exported", "flowscope_spans_not_exported_total", "flowscope.spans.not_exported", "counter",
        ("reason",),
        "Spans this process ended and did not export, by reason (queue_full, export_failed); "
        "their sessions' logs still hold them.",
        "{span}",
    ),
)  # fmt: skip

#: Every instrument by its key.
SPECS = {s.key: s for s in INSTRUMENTS + WORKER_INSTRUMENTS + READ_INSTRUMENTS}
