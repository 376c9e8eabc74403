"""``MetricsPlugin``: node and workflow runs as Prometheus or OpenTelemetry metrics.

One table, :data:`INSTRUMENTS`, defines every instrument (name, kind, labels, help,
buckets). It drives both backends:

- **prometheus-client**: collectors registered on the given ``CollectorRegistry`` (the
  default ``REGISTRY`` when neither ``registry`` nor ``meter_provider`` is given);
- **OpenTelemetry**: instruments of a ``MeterProvider`` under dotted names
  (``flowscope.node.runs``, ``flowscope.node.duration`` in ``s``, ...), which the
  Collector's Prometheus exporter turns into the same series names.

``MetricsPlugin(meter_provider=mp)`` uses OpenTelemetry only; pass ``registry=`` as
well to feed both (scrape only one of them, or everything counts twice).

Labels are bounded: workflow and node names, outcomes, error codes and types. Never a
session id, an invocation id or a path. The ``workflow`` label is the invocation's
top-level workflow, also for nodes of nested workflows. Node outcomes use the span
vocabulary (success, failure, timeout, cancellation, waiting); workflow outcomes are
``RunFinished.status`` (completed, failed, paused, cancelled).

Counted once, at the deepest path (docs/design.md): the invocation's own run is
``flowscope_workflow_runs_total`` and no node series; a run whose failure or pause comes
from a descendant (a nested workflow, the parent of a dynamic child) is a container and
adds no node outcome: one declined card is one failure, of the node that raised.

Job results (``flowscope_job_results_total``) are counted where they are recorded: in the
log. A result reported by another process (``flowscope resume --job``,
``flowscope.answer()``) is never seen by this plugin, so a fleet counts them from the
store (:class:`~flowscope.observability.store_collector.StoreCollector`: ``serve-metrics``,
``demo``); ``MetricsPlugin(job_results=False)`` leaves them to it, as the CLI's worker
does, so that no result is counted twice. The default counts the results this process's
invocations record, for a process that runs without a StoreCollector.

Duration histograms carry a ``trace_id`` exemplar (with ``span_id``) of the run's own
span: the W3C ``traceparent`` a tracing plugin put in ``ctx.trace_context`` /
``run.trace_context``, or else the current span (with ``plugins=[TracingPlugin(),
MetricsPlugin()]`` the node's span is current in ``after_node``, since ``after_*`` hooks
run in reverse registration order), when it is sampled. Exemplars show in the
OpenMetrics exposition only.

Several plugins on one registry (two runners on the default ``REGISTRY``, say) share
the same collectors instead of failing with "Duplicated timeseries".
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from opentelemetry.trace import SpanContext, get_current_span
from prometheus_client import REGISTRY, CollectorRegistry

from .. import __version__
from ..fold import from_descendant
from ..plugins import HOOKS, Plugin
from .labels import DEFAULT_MAX_SERIES, LabelBudget, code_label
from .lean_prom import LeanCounter, LeanGauge, LeanHistogram
from .traceparent import parse_traceparent

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.context import NodeContext, NodeOutcome, RunInfo
    from ..engine.runner import RunResult
    from ..events import Event

__all__ = [
    "MetricsPlugin",
    "InstrumentSpec",
    "INSTRUMENTS",
    "DURATION_BUCKETS",
    "ATTEMPT_BUCKETS",
    "NODE_OUTCOMES",
    "WORKFLOW_OUTCOMES",
    "JOB_RESULTS",
    "WORKER_INSTRUMENTS",
    "CLAIM_REASONS",
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

_KEY = "metrics"  # our slot in ctx.plugin_state

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

#: The instruments of a :class:`~flowscope.worker.Worker` (issue 13). They are created on
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
)  # fmt: skip
CLAIM_REASONS = ("queued", "answered", "orphaned")

_SPECS = {s.key: s for s in INSTRUMENTS}


# -- prometheus-client backend ---------------------------------------------------------------

# Collectors at the cost floor (lean_prom.py): the same exposition as prometheus-client's
# classes for a fraction of the cost per observation, exemplars resolved at scrape.
_PROM_CLASSES: dict[str, type] = {"counter": LeanCounter, "histogram": LeanHistogram, "updown": LeanGauge}
# Collectors this module created, per registry, so that several plugins share them.
_shared: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def _prom_base_name(spec: InstrumentSpec) -> str:
    # prometheus-client appends "_total" to counters itself
    name = spec.prom_name
    return name[: -len("_total")] if spec.kind == "counter" and name.endswith("_total") else name


def _compatible(existing: Any, spec: InstrumentSpec) -> bool:
    if not isinstance(existing, _PROM_CLASSES[spec.kind]):
        return False
    if tuple(getattr(existing, "_labelnames", ())) != spec.labels:
        return False
    if spec.buckets is not None:
        bounds = tuple(getattr(existing, "_upper_bounds", ())[:-1])  # without +Inf
        if bounds != spec.buckets:
            return False
    return True


def _prom_collector(registry: CollectorRegistry, spec: InstrumentSpec) -> Any:
    """The collector for ``spec`` on ``registry``: the one already there, or a new one."""
    with _shared_lock:
        try:
            cache = _shared.setdefault(registry, {})
        except TypeError:  # a registry that cannot be weakly referenced: no sharing cache
            cache = {}
        collector = cache.get(spec.key)
        if collector is not None:
            return collector
        existing = getattr(registry, "_names_to_collectors", {}).get(spec.prom_name)
        if existing is not None:
            if not _compatible(existing, spec):
                raise ValueError(
                    f"the registry already has a metric {spec.prom_name!r} that is not flowscope's "
                    f"(expected a {_PROM_CLASSES[spec.kind].__name__} with labels {list(spec.labels)}"
                    f"{' and buckets ' + str(list(spec.buckets)) if spec.buckets else ''}); "
                    "give MetricsPlugin its own CollectorRegistry or remove the other metric"
                )
            collector = existing
        else:
            cls = _PROM_CLASSES[spec.kind]
            kwargs: dict[str, Any] = {"registry": registry}
            if spec.buckets is not None:
                kwargs["buckets"] = spec.buckets
                kwargs["resolve"] = _resolve_exemplar
            collector = cls(_prom_base_name(spec), spec.help, spec.labels, **kwargs)
        cache[spec.key] = collector
        return collector


# -- one labelled series, on one or both backends --------------------------------------------


class _Series:
    """A pre-bound label set of one instrument: the prometheus child and/or the OTel
    instrument with its attribute dict. Cheap to call on every node run."""

    __slots__ = ("_prom", "_otel", "_attrs")

    def __init__(self, prom: Any, otel: Any, attrs: dict[str, str]) -> None:
        self._prom = prom
        self._otel = otel
        self._attrs = attrs

    def add(self, value: float = 1.0) -> None:
        """Counter increment or up/down change (negative for a gauge going down)."""
        if self._prom is not None:
            self._prom.inc(value)
        if self._otel is not None:
            self._otel.add(value, self._attrs)

    def record(self, value: float, exemplar: Any = None) -> None:
        """Histogram observation, with its exemplar's source (``_exemplar_source``). The
        OTel SDK takes its exemplar from the current span."""
        if self._prom is not None:
            self._prom.observe(value, exemplar)
        if self._otel is not None:
            self._otel.record(value, self._attrs)


class _Instrument:
    __slots__ = ("spec", "prom", "otel", "budget", "_series", "_lock")

    def __init__(self, spec: InstrumentSpec, prom: Any, otel: Any, budget: LabelBudget | None = None) -> None:
        self.spec = spec
        self.prom = prom
        self.otel = otel
        self.budget = budget  # None: the labels are bounded by construction
        self._series: dict[tuple[str, ...], _Series] = {}
        self._lock = threading.Lock()

    def series(self, values: tuple[str, ...]) -> _Series:
        s = self._series.get(values)
        if s is None:
            with self._lock:
                s = self._series.get(values)
                if s is None:
                    key = values
                    if self.budget is not None:
                        key = self.budget.admit(self.spec.prom_name, values, len(self._series))
                        s = self._series.get(key)
                    if s is None:
                        prom = self.prom.labels(*key) if self.prom is not None else None
                        s = self._series[key] = _Series(prom, self.otel, dict(zip(self.spec.labels, key)))
        return s

    def bind(self, values: tuple[str, ...]) -> _Series:
        """``series(values)`` for a caller that keeps it: a label set folded into ``_other``
        comes wrapped so that each later observation counts one overflow too, as a lookup
        would (the bind itself counted the first)."""
        s = self.series(values)
        budget = self.budget
        if budget is None or budget.on_overflow is None or values in self._series:
            return s
        return _FoldedSeries(s, self.spec.prom_name, budget.on_overflow)


class _FoldedSeries(_Series):
    """The ``_other`` series as bound for a label set beyond the budget (see
    :meth:`_Instrument.bind`)."""

    __slots__ = ("_metric", "_count", "_bound")

    def __init__(self, other: _Series, metric: str, count: Callable[[str], None]) -> None:
        super().__init__(other._prom, other._otel, other._attrs)
        self._metric = metric
        self._count = count
        self._bound = True  # the first observation was counted when bound

    def _overflow(self) -> None:
        if self._bound:
            self._bound = False
        else:
            self._count(self._metric)

    def add(self, value: float = 1.0) -> None:
        self._overflow()
        _Series.add(self, value)

    def record(self, value: float, exemplar: Any = None) -> None:
        self._overflow()
        _Series.record(self, value, exemplar)


def _otel_instrument(meter: Any, spec: InstrumentSpec) -> Any:
    if spec.kind == "counter":
        return meter.create_counter(spec.otel_name, unit=spec.unit, description=spec.help)
    if spec.kind == "updown":
        return meter.create_up_down_counter(spec.otel_name, unit=spec.unit, description=spec.help)
    try:
        return meter.create_histogram(
            spec.otel_name,
            unit=spec.unit,
            description=spec.help,
            explicit_bucket_boundaries_advisory=list(spec.buckets or ()),
        )
    except TypeError:  # opentelemetry-api < 1.23 has no bucket advisory
        return meter.create_histogram(spec.otel_name, unit=spec.unit, description=spec.help)


def _traceparent_exemplar(tp: str) -> dict[str, str] | None:
    """The exemplar of a W3C ``traceparent`` if it is valid and sampled."""
    parsed = parse_traceparent(tp)
    if parsed is None or not parsed.sampled:
        return None
    return {"trace_id": format(parsed.trace_id, "032x"), "span_id": format(parsed.span_id, "016x")}


#: The last hex digit of a traceparent's flags when its sampled bit is set.
_SAMPLED_DIGITS = frozenset("13579bdfBDF")


def _exemplar_source(trace_context: dict[str, str] | None = None) -> str | SpanContext | None:
    """What the run's exemplar will be made of at scrape time: its own ``traceparent``
    (set by a tracing plugin in ``before_*``, whatever the plugin order) when it is
    sampled, else the current span's context when that is. Nothing is formatted on the
    node path (``_resolve_exemplar`` does it for the scrape)."""
    if trace_context:
        tp = trace_context.get("traceparent")
        if tp and tp[-1] in _SAMPLED_DIGITS:
            return tp
    ctx = get_current_span().get_span_context()
    if ctx.trace_flags & 0x01 and ctx.trace_id:
        return ctx
    return None


def _resolve_exemplar(source: Any) -> dict[str, str] | None:
    """``{"trace_id", "span_id"}`` (hex) of an exemplar source, or None if it is not a
    sampled span."""
    if isinstance(source, str):
        return _traceparent_exemplar(source)
    if isinstance(source, SpanContext) and source.trace_flags & 0x01 and source.trace_id:
        return {"trace_id": format(source.trace_id, "032x"), "span_id": format(source.span_id, "016x")}
    return None


# -- the plugin --------------------------------------------------------------------------------


class _NodeSeries:
    """The pre-bound series of one (workflow, node): what a node run touches."""

    __slots__ = ("running", "attempts", "by_outcome")

    def __init__(self, running: _Series) -> None:
        self.running = running
        self.attempts: _Series | None = None  # bound on first use: no empty histogram series
        self.by_outcome: dict[str, tuple[_Series, _Series]] = {}


class MetricsPlugin(Plugin):
    """Counts node runs, errors, retries, attempts, job results and workflow runs.

    ``registry``: the prometheus-client ``CollectorRegistry`` to register on (default:
    the global ``REGISTRY``, unless only ``meter_provider`` is given). ``meter_provider``:
    an OpenTelemetry ``MeterProvider`` to record the same instruments under dotted names.
    ``max_series``: the label sets each metric keeps; new ones beyond it are folded into
    ``_other`` and counted in ``flowscope_metrics_overflow_total{metric}`` (R13).
    ``job_results=False``: leave ``flowscope_job_results_total`` to a StoreCollector, which
    counts every result in the log, whichever process recorded it (see the module docs).
    """

    name = "metrics"

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        meter_provider: Any = None,
        *,
        max_series: int = DEFAULT_MAX_SERIES,
        job_results: bool = True,
    ) -> None:
        if registry is None and meter_provider is None:
            registry = REGISTRY
        self.registry = registry
        self.meter_provider = meter_provider
        meter = meter_provider.get_meter("flowscope", __version__) if meter_provider is not None else None
        self._meter = meter
        self._worker: dict[str, _Instrument] | None = None  # WORKER_INSTRUMENTS, on first use
        self._instruments: dict[str, _Instrument] = {}
        self.budget = LabelBudget(max_series, self._overflowed)  # R13: at most max_series label sets per metric
        #: Whether this plugin counts job results (False: a StoreCollector counts them).
        self.job_results = job_results
        for spec in INSTRUMENTS:
            if spec.key == "job_results" and not job_results:
                self._instruments[spec.key] = _Instrument(spec, None, None, None)
                continue
            prom = _prom_collector(registry, spec) if registry is not None else None
            otel = _otel_instrument(meter, spec) if meter is not None else None
            budget = None if spec.key == "metrics_overflow" else self.budget  # its labels are metric names
            self._instruments[spec.key] = _Instrument(spec, prom, otel, budget)
        i = self._instruments
        self._resume_conflicts = i["resume_conflicts"]
        self._overflow = i["metrics_overflow"]
        self._node_runs = i["node_runs"]
        self._node_duration = i["node_duration"]
        self._node_errors = i["node_errors"]
        self._node_retries = i["node_retries"]
        self._node_attempts = i["node_attempts"]
        self._nodes_running = i["nodes_running"]
        self._workflow_runs = i["workflow_runs"]
        self._workflow_duration = i["workflow_duration"]
        self._job_results = i["job_results"]
        self._plugin_errors = i["plugin_errors"]
        self._known_plugins: tuple[str, ...] = ()
        self._nodes: dict[tuple[str, str], _NodeSeries] = {}
        # invocation id -> [workflow, RunFinished.status or None], from before_run/RunStarted
        # to after_run: events carry only ids, and the label is the workflow name.
        self._invocations: dict[str, list[Any]] = {}
        self._on_event = {
            "run_started": self._run_started,
            "run_finished": self._run_finished,
            "node_retrying": self._retrying,
            "node_error": self._error,
        }
        if job_results:
            self._on_event["job_result"] = self._job_result

    # -- helpers ---------------------------------------------------------------------------

    def _bind(self, instrument: _Instrument, values: tuple[str, ...]) -> _Series:
        """The one place a labelled series is bound for the node path, which keeps it (once
        per label set): bounded by the metric's budget like every other lookup."""
        return instrument.bind(values)

    def _overflowed(self, metric: str) -> None:
        self._overflow.series((metric,)).add()

    def _node(self, workflow: str, node: str) -> _NodeSeries:
        key = (workflow, node)
        ns = self._nodes.get(key)
        if ns is None:
            ns = self._nodes[key] = _NodeSeries(self._bind(self._nodes_running, key))
        return ns

    def _workflow_of(self, event: Event) -> str:
        inv = self._invocations.get(event.invocation_id)
        return inv[0] if inv is not None else UNKNOWN_WORKFLOW

    # -- run hooks ---------------------------------------------------------------------------

    def before_run(self, run: RunInfo) -> None:
        self._invocations[run.invocation_id] = [run.workflow, None]
        if run.plugins != self._known_plugins:
            # Start each plugin's error counters at 0: the series exists before the first
            # error, so the dashboard shows 0 rather than "no data" and increase() sees it.
            self._known_plugins = run.plugins
            for name in run.plugins:
                for hook in HOOKS:
                    self._plugin_errors.series((str(name), hook)).add(0)

    def after_run(self, run: RunInfo, result: RunResult | None, error: BaseException | None) -> None:
        inv = self._invocations.pop(run.invocation_id, None)
        status = inv[1] if inv is not None else None
        if status is None:  # RunFinished was not appended (the store failed): say what it would
            if result is not None:
                status = result.status
            elif error is not None and _is_conflict(error):
                return  # a lost race: counted once by on_resume_conflict, never as a failure
            elif error is not None and _is_cancellation(error):
                status = "cancelled"
            else:
                status = "failed"
        key = (run.workflow, status)
        self._workflow_runs.series(key).add()
        self._workflow_duration.series(key).record(max(0.0, time.time() - run.started_at), _exemplar_source(run.trace_context))

    # -- node hooks --------------------------------------------------------------------------

    def before_node(self, ctx: NodeContext) -> None:
        if ctx.parent is None:
            return  # the invocation's own run: its outcome is flowscope_workflow_runs_total's
        # Bound once per (workflow, node): the run carries its series to after_node.
        ns = ctx.plugin_state[_KEY] = self._node(ctx.run.workflow, ctx.node_name)
        ns.running.add(1.0)

    def after_node(self, ctx: NodeContext, outcome: NodeOutcome) -> None:
        if ctx.parent is None:
            return
        ns: _NodeSeries | None = ctx.plugin_state.pop(_KEY, None)
        if ns is None:  # the plugin was added after before_node ran
            ns = self._node(ctx.run.workflow, ctx.node_name)
            ns.running.add(1.0)
        ns.running.add(-1.0)
        if from_descendant(ctx.path, outcome.origin_path):
            # A container: the failure or pause is its descendant's, counted once there
            # (docs/design.md, "Counting once, at the deepest path").
            return
        status = outcome.status
        pair = ns.by_outcome.get(status)
        if pair is None:  # once per (workflow, node, outcome)
            key = (ctx.run.workflow, ctx.node_name, status)
            pair = ns.by_outcome[status] = (self._bind(self._node_runs, key), self._bind(self._node_duration, key))
        pair[0].add()
        pair[1].record(outcome.duration_s, _exemplar_source(ctx.trace_context))
        if status == "success" or status == "failure" or status == "timeout":
            attempts = ns.attempts
            if attempts is None:
                attempts = ns.attempts = self._bind(self._node_attempts, (ctx.run.workflow, ctx.node_name))
            attempts.record(outcome.attempt_count)

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        handler = self._on_event.get(event.type)
        if handler is not None:
            handler(event)

    def _run_started(self, event: Any) -> None:
        inv = self._invocations.get(event.invocation_id)
        if inv is None:
            self._invocations[event.invocation_id] = [event.workflow or UNKNOWN_WORKFLOW, None]

    def _run_finished(self, event: Any) -> None:
        inv = self._invocations.get(event.invocation_id)
        if inv is not None:
            inv[1] = event.status

    def _retrying(self, event: Any) -> None:
        self._node_retries.series((self._workflow_of(event), event.node, event.error_type)).add()

    def _error(self, event: Any) -> None:
        key = (self._workflow_of(event), event.node, code_label(event.error_code), event.error_type)
        self._node_errors.series(key).add()

    def _job_result(self, event: Any) -> None:
        self._job_results.series((self._workflow_of(event), event.node, event.result)).add()

    def on_resume_conflict(self, session_id: str, workflow: str) -> None:
        self._resume_conflicts.series((workflow,)).add()

    def on_plugin_error(self, plugin: str, hook: str, error: BaseException) -> None:
        self._plugin_errors.series((str(plugin), str(hook))).add()

    # -- worker hooks --------------------------------------------------------------------------

    def _worker_instruments(self, workflow: str) -> dict[str, _Instrument]:
        w = self._worker
        if w is None:
            w = self._worker = {
                spec.key: _Instrument(
                    spec,
                    _prom_collector(self.registry, spec) if self.registry is not None else None,
                    _otel_instrument(self._meter, spec) if self._meter is not None else None,
                    self.budget,
                )
                for spec in WORKER_INSTRUMENTS
            }
        # Every series of the workflow starts at 0, so increase() sees the first claim
        # and the dashboard shows 0 rather than "no data".
        for reason in CLAIM_REASONS:
            w["worker_claims"].series((workflow, reason)).add(0)
        w["worker_leases_lost"].series((workflow,)).add(0)
        w["worker_active"].series((workflow,)).add(0)
        return w

    def on_worker_claim(self, claim: Any) -> None:
        w = self._worker_instruments(claim.workflow)
        w["worker_claims"].series((claim.workflow, claim.reason)).add()
        w["worker_active"].series((claim.workflow,)).add(1.0)

    def on_worker_release(self, claim: Any) -> None:
        self._worker_instruments(claim.workflow)["worker_active"].series((claim.workflow,)).add(-1.0)

    def on_lease_lost(self, session_id: str, workflow: str) -> None:
        self._worker_instruments(workflow)["worker_leases_lost"].series((workflow,)).add()

    def __repr__(self) -> str:
        backends = [b for b, on in (("prometheus", self.registry), ("otel", self.meter_provider)) if on is not None]
        return f"<MetricsPlugin {'+'.join(backends)}>"


def _is_conflict(error: BaseException) -> bool:
    from ..errors import ConcurrencyConflict

    return isinstance(error, ConcurrencyConflict)


def _is_cancellation(error: BaseException) -> bool:
    import asyncio

    from ..errors import InvocationAbortedError

    return isinstance(error, (asyncio.CancelledError, InvocationAbortedError))
