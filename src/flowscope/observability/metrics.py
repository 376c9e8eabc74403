"""``MetricsPlugin``: node and workflow runs as Prometheus or OpenTelemetry metrics.

One table, :data:`~flowscope.observability.catalog.INSTRUMENTS`, defines every instrument
(name, kind, labels, help, buckets); ``backends.py`` holds the two backends it drives:

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

``flowscope_spans_not_exported_total{reason}`` counts the spans this process ended and did
not export (``span_losses.py``): read at scrape time, once per registry or meter, from the
process's start, whichever plugin or runner traced them.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry

from .. import __version__
from ..fold import from_descendant
from ..plugins import HOOKS, Plugin
from .backends import (
    Instrument,
    Series,
    exemplar_source,
    otel_instrument,
    otel_reader,
    prom_collector,
    prom_reader,
)
from .catalog import (
    ATTEMPT_BUCKETS,
    CLAIM_REASONS,
    DURATION_BUCKETS,
    INSTRUMENTS,
    JOB_RESULTS,
    NODE_OUTCOMES,
    READ_INSTRUMENTS,
    UNKNOWN_WORKFLOW,
    WORKER_INSTRUMENTS,
    WORKFLOW_OUTCOMES,
    InstrumentSpec,
)
from .labels import DEFAULT_MAX_SERIES, LabelBudget, code_label
from .lean_prom import HistogramShard, Shard
from .span_losses import SPAN_LOSSES

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.context import NodeContext, NodeOutcome, RunInfo
    from ..engine.runner import RunResult
    from ..events import Event

__all__ = [
    "MetricsPlugin",
    "report_span_losses",
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


_KEY = "metrics"  # our slot in ctx.plugin_state
#: A run's slot while children of its own run: ``[its series, how many run]``. Its series
#: leaves ``_KEY`` meanwhile, so that its after_node (a bridge may end it first) takes it
#: for uncounted, and the common run pays no lookup for this rule.
_CONTAINER = "metrics.container"
#: set on a run when a child of it ended cancelled (its cancellation, if it follows, is theirs)
_CHILD_CANCELLED = "metrics.child_cancelled"
#: The node outcomes whose series start at 0 with a node's first run (an error rate's).
_COUNTED_FROM_0 = ("success", "failure", "timeout")


class _InvocationLabels:
    """What an invocation's workflow series need, from ``before_run``/``RunStarted`` to
    ``after_run``: events carry only ids, and the label is the workflow's name."""

    __slots__ = ("workflow", "status", "committed", "parked")

    def __init__(self, workflow: str) -> None:
        self.workflow = workflow
        self.status: str | None = None  # RunFinished.status, once appended
        self.committed = 0  # the last seq of this invocation's events in the log
        #: node outcomes whose terminal event is not in the log yet: counted when it is
        self.parked: list[tuple[Any, ...]] = []


class _NodeSeries:
    """The pre-bound series of one (workflow, node), for one thread: what a node run
    touches. Where a series is a prometheus child alone, this thread's shard of it
    (``lean_prom``) is kept and observed into directly, without a lock or a call per
    series; else the series itself."""

    __slots__ = ("workflow", "node", "running", "running_part", "attempts", "attempts_part", "by_outcome")

    def __init__(self, workflow: str, node: str, running: Series) -> None:
        self.workflow = workflow
        self.node = node
        self.running = running
        self.running_part: Shard | None = running.shard()
        if self.running_part is None:  # a meter's series exists once touched: at 0, as a bound child
            running.add(0.0)
        self.attempts: Series | None = None  # bound on first use: no empty histogram series
        self.attempts_part: HistogramShard | None = None
        #: status -> (runs, duration, runs' shard, duration's shard)
        self.by_outcome: dict[str, tuple[Series, Series, Shard | None, HistogramShard | None]] = {}

    def up(self) -> None:
        part = self.running_part
        if part is not None:
            part.value += 1.0
        else:
            self.running.add(1.0)

    def down(self) -> None:
        part = self.running_part
        if part is not None:
            part.value -= 1.0
        else:
            self.running.add(-1.0)


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
        self._worker: dict[str, Instrument] | None = None  # WORKER_INSTRUMENTS, on first use
        self._worker_workflows: set[str] = set()  # the workflows whose worker series are made
        self._store_writable = 0.0  # flowscope_worker_store_writable's value
        self._workflows_seen: set[str] = set()  # whose flowscope_workflow_runs_total start at 0
        self._instruments: dict[str, Instrument] = {}
        self.budget = LabelBudget(
            max_series, self._overflowed
        )  # R13: at most max_series label sets per metric
        #: Whether this plugin counts job results (False: a StoreCollector counts them).
        self.job_results = job_results
        for spec in INSTRUMENTS:
            if spec.key == "job_results" and not job_results:
                self._instruments[spec.key] = Instrument(spec, None, None, None)
                continue
            prom = prom_collector(registry, spec) if registry is not None else None
            otel = otel_instrument(meter, spec) if meter is not None else None
            budget = None if spec.key == "metrics_overflow" else self.budget  # its labels are metric names
            self._instruments[spec.key] = Instrument(spec, prom, otel, budget)
        report_span_losses(registry, meter)
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
        #: per thread, its _NodeSeries by (workflow, node) (``nodes``)
        self._local = threading.local()
        self._invocations: dict[str, _InvocationLabels] = {}  # by invocation id
        self._on_event = {
            "run_started": self._run_started,
            "run_finished": self._run_finished,
            "node_retrying": self._retrying,
            "node_error": self._error,
        }
        if job_results:
            self._on_event["job_result"] = self._job_result

    # -- helpers ---------------------------------------------------------------------------

    def _bind(self, instrument: Instrument, values: tuple[str, ...]) -> Series:
        """The one place a labelled series is bound for the node path, which keeps it (once
        per label set): bounded by the metric's budget like every other lookup."""
        return instrument.bind(values)

    def _overflowed(self, metric: str) -> None:
        self._overflow.series((metric,)).add()

    def _node(self, workflow: str, node: str) -> _NodeSeries:
        """This thread's series of (workflow, node), bound on first use."""
        try:
            nodes = self._local.nodes
        except AttributeError:
            nodes = self._local.nodes = {}
        key = (workflow, node)
        ns = nodes.get(key)
        if ns is None:
            ns = nodes[key] = _NodeSeries(workflow, node, self._bind(self._nodes_running, key))
            # The outcomes an error rate reads start at 0 with the node's first run, so that
            # rate() and increase() see its first failure (a series born at 1 has no
            # increase); waiting and cancellation are left out, as few nodes have them.
            for status in _COUNTED_FROM_0:
                self._node_runs.start_at_0((workflow, node, status))
        return ns

    def _attempts(self, ns: _NodeSeries) -> Series:
        """The attempts series of (workflow, node), bound on first use with its shard."""
        if ns.attempts is None:
            ns.attempts = self._bind(self._node_attempts, (ns.workflow, ns.node))
            ns.attempts_part = ns.attempts.shard()
        return ns.attempts

    def _outcome(
        self, ns: _NodeSeries, status: str
    ) -> tuple[Series, Series, Shard | None, HistogramShard | None]:
        key = (ns.workflow, ns.node, status)
        runs, duration = self._bind(self._node_runs, key), self._bind(self._node_duration, key)
        bound = ns.by_outcome[status] = (runs, duration, runs.shard(), duration.shard())
        return bound

    def _workflow_of(self, event: Event) -> str:
        inv = self._invocations.get(event.invocation_id)
        return inv.workflow if inv is not None else UNKNOWN_WORKFLOW

    # -- run hooks ---------------------------------------------------------------------------

    def before_run(self, run: RunInfo) -> None:
        self._invocations[run.invocation_id] = _InvocationLabels(run.workflow)
        if run.workflow not in self._workflows_seen:  # its outcomes from 0, as a node's
            self._workflows_seen.add(run.workflow)
            for outcome in WORKFLOW_OUTCOMES:
                self._workflow_runs.start_at_0((run.workflow, outcome))
        if run.plugins != self._known_plugins:
            # Start each plugin's error counters at 0: the series exists before the first
            # error, so the dashboard shows 0 rather than "no data" and increase() sees it.
            self._known_plugins = run.plugins
            for name in run.plugins:
                for hook in HOOKS:
                    self._plugin_errors.start_at_0((str(name), hook))

    def after_run(self, run: RunInfo, result: RunResult | None, error: BaseException | None) -> None:
        inv = self._invocations.pop(run.invocation_id, None)
        status = inv.status if inv is not None else None
        if status is None:  # RunFinished was not appended (the store failed): say what it would
            if result is not None:
                status = result.status
            elif error is not None and _is_conflict(error):
                return  # a lost race: counted once by on_resume_conflict, never as a failure
            elif error is not None and _is_store_fault(error):
                return  # halted by its store, not failed: counted when it ends, taken back
            elif error is not None and _is_cancellation(error):
                status = "cancelled"
            else:
                status = "failed"
        key = (run.workflow, status)
        self._workflow_runs.series(key).add()
        self._workflow_duration.series(key).record(
            max(0.0, time.time() - run.started_at), exemplar_source(run.trace_context)
        )

    # -- node hooks --------------------------------------------------------------------------

    def before_node(self, ctx: NodeContext) -> None:
        if ctx.parent is None:
            return  # the invocation's own run: its outcome is flowscope_workflow_runs_total's
        # Bound once per (workflow, node) and thread: the run carries its series to after_node.
        ns = ctx.plugin_state[_KEY] = self._node(ctx.run.workflow, ctx.node_name)
        if ctx.kind != "workflow":  # a nested workflow runs while its children do: they are running
            ns.up()
        parent = ctx.parent
        if parent.kind != "workflow":  # a node's dynamic child, a bridge's subgraph task
            self._child_started(parent)

    @staticmethod
    def _child_started(parent: NodeContext) -> None:
        """A run whose child runs is their container, as a workflow is (the rule the
        StoreCollector's open runs follow): it is running through them, not beside them."""
        ps = parent.plugin_state
        held = ps.get(_CONTAINER)
        if held is not None:
            held[1] += 1
            return
        ns = ps.pop(_KEY, None)
        ps[_CONTAINER] = [ns, 1]
        if ns is not None:
            ns.down()

    @staticmethod
    def _child_ended(parent: NodeContext, status: str) -> None:
        ps = parent.plugin_state
        if status == "cancellation":  # the container's own cancellation, if it follows, is this one
            ps[_CHILD_CANCELLED] = True
        held = ps.get(_CONTAINER)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:  # still running, on its own again
            del ps[_CONTAINER]
            ns = held[0]
            if ns is not None:
                ps[_KEY] = ns
                ns.up()

    def after_node(self, ctx: NodeContext, outcome: NodeOutcome) -> None:
        if ctx.parent is None:
            return
        ns: _NodeSeries | None = ctx.plugin_state.pop(_KEY, None)
        nested = ctx.kind == "workflow"
        if ns is None:  # a container of running children (ended first), or added after before_node
            ctx.plugin_state.pop(_CONTAINER, None)  # a child that ends later counts nothing back
            ns = self._node(ctx.run.workflow, ctx.node_name)
        elif not nested:
            running = ns.running_part
            if running is not None:
                running.value -= 1.0
            else:
                ns.running.add(-1.0)
        parent = ctx.parent
        status = outcome.status
        if parent.kind != "workflow":
            self._child_ended(parent, status)
        origin = outcome.origin_path
        if (origin is not None and from_descendant(ctx.path, origin)) or (
            status == "cancellation" and (nested or ctx.plugin_state.pop(_CHILD_CANCELLED, False))
        ):
            # A container: the failure or pause is its descendant's, counted once there
            # (docs/design.md, "Counting once, at the deepest path"); so is the cancellation
            # of a nested workflow, or of a run whose child was cancelled (a dynamic child's
            # parent, a bridge's subgraph node), which stops it with the children it runs.
            return
        event = outcome.event
        counted = (
            ns,
            status,
            outcome.duration_s,
            exemplar_source(ctx.trace_context),
            event,
            outcome.attempt_count,
        )
        inv = self._invocations.get(ctx.invocation_id)
        if inv is not None and event.seq > inv.committed:
            # The engine appends the run's terminal event after this hook. A run is counted
            # once that event is in the log: an attempt a store fault cuts off (its event
            # never committed, the run taken back and run again) is not a second outcome.
            inv.parked.append(counted)
            return
        self._count((counted,))

    def _count(self, ended: Sequence[tuple[Any, ...]]) -> None:
        """Node runs' outcomes, durations and attempts: ``(series, status, duration_s,
        exemplar, terminal event, attempts)`` each."""
        for ns, status, duration_s, exemplar, event, attempts in ended:
            bound = ns.by_outcome.get(status)
            if bound is None:  # once per (workflow, node, outcome)
                bound = self._outcome(ns, status)
            runs, duration, runs_part, duration_part = bound
            if runs_part is not None:
                runs_part.value += 1.0
            else:
                runs.add()
            if duration_part is not None:  # the exemplar's time: the terminal event's
                duration_part.observe(duration_s, exemplar, event.ts)
            else:
                duration.record(duration_s, exemplar)
            if status == "success" or status == "failure" or status == "timeout":
                part = ns.attempts_part
                if part is not None:
                    part.observe(attempts)
                else:
                    self._attempts(ns).record(attempts)

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        self.on_events((event,))

    def on_events(self, events: Sequence[Event]) -> None:
        """The events of one append, committed: counted, with the node runs they end."""
        if not events:
            return
        handlers = self._on_event
        for event in events:
            handler = handlers.get(event.type)
            if handler is not None:
                handler(event)
        last = events[-1]
        if events[0].invocation_id != last.invocation_id:  # not one invocation's append
            for event in events[:-1]:
                self._committed(event)
        self._committed(last)

    def _committed(self, last: Event) -> None:
        """``last`` and its invocation's events before it are in the log: count the runs they end."""
        inv = self._invocations.get(last.invocation_id)
        if inv is None:
            return
        seq = last.seq
        if seq > inv.committed:
            inv.committed = seq
        parked = inv.parked
        if parked:
            if len(parked) == 1 and parked[0][4].seq <= seq:  # one run ended: the chain's case
                inv.parked = []
                self._count(parked)
                return
            ready = [p for p in parked if p[4].seq <= seq]
            inv.parked = [] if len(ready) == len(parked) else [p for p in parked if p[4].seq > seq]
            self._count(ready)

    def _run_started(self, event: Any) -> None:
        inv = self._invocations.get(event.invocation_id)
        if inv is None:
            self._invocations[event.invocation_id] = _InvocationLabels(event.workflow or UNKNOWN_WORKFLOW)

    def _run_finished(self, event: Any) -> None:
        inv = self._invocations.get(event.invocation_id)
        if inv is not None:
            inv.status = event.status

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

    def _worker_instruments(self, workflow: str | None = None) -> dict[str, Instrument]:
        """The worker's instruments, made on first use; with ``workflow``, its series too."""
        w = self._worker
        if w is None:
            w = self._worker = {
                spec.key: Instrument(
                    spec,
                    prom_collector(self.registry, spec) if self.registry is not None else None,
                    otel_instrument(self._meter, spec) if self._meter is not None else None,
                    self.budget,
                )
                for spec in WORKER_INSTRUMENTS
            }
        if workflow is not None and workflow not in self._worker_workflows:
            # Every series of the workflow starts at 0 (once), so increase() sees the first
            # claim and the dashboard shows 0 rather than "no data".
            self._worker_workflows.add(workflow)
            for reason in CLAIM_REASONS:
                w["worker_claims"].start_at_0((workflow, reason))
            w["worker_leases_lost"].start_at_0((workflow,))
            w["worker_active"].start_at_0((workflow,))
        return w

    def on_worker_claim(self, claim: Any) -> None:
        w = self._worker_instruments(claim.workflow)
        if not getattr(claim, "taken_back", False):  # a take-back is the same claim again
            w["worker_claims"].series((claim.workflow, claim.reason)).add()
        w["worker_active"].series((claim.workflow,)).add(1.0)

    def on_worker_release(self, claim: Any) -> None:
        self._worker_instruments(claim.workflow)["worker_active"].series((claim.workflow,)).add(-1.0)

    def on_lease_lost(self, session_id: str, workflow: str) -> None:
        self._worker_instruments(workflow)["worker_leases_lost"].series((workflow,)).add()

    def on_store_writes(self, writable: bool) -> None:
        # A gauge as an up/down counter (the OpenTelemetry backend has no settable one):
        # the change since the last value; the first call makes the series, at 0 or 1.
        value = 1.0 if writable else 0.0
        self._worker_instruments()["worker_store_writable"].series(()).add(value - self._store_writable)
        self._store_writable = value

    def __repr__(self) -> str:
        backends = [
            b for b, on in (("prometheus", self.registry), ("otel", self.meter_provider)) if on is not None
        ]
        return f"<MetricsPlugin {'+'.join(backends)}>"


def _span_losses() -> dict[tuple[str, ...], float]:
    return {(reason,): float(n) for reason, n in SPAN_LOSSES.counts().items()}


#: What each read instrument reports (catalog.READ_INSTRUMENTS).
_READERS = {"spans_not_exported": _span_losses}


def report_span_losses(registry: CollectorRegistry | None = None, meter: Any = None) -> None:
    """Report ``flowscope_spans_not_exported_total`` (this process's spans not exported,
    ``span_losses.py``) on ``registry`` and/or ``meter``, once each however often called:
    every ``MetricsPlugin`` does; so does ``flowscope serve-metrics`` when it ships spans."""
    for spec in READ_INSTRUMENTS:
        read = _READERS[spec.key]
        if registry is not None:
            prom_reader(registry, spec, read)
        if meter is not None:
            otel_reader(meter, spec, read)


def _is_conflict(error: BaseException) -> bool:
    from ..errors import ConcurrencyConflict

    return isinstance(error, ConcurrencyConflict)


def _is_store_fault(error: BaseException) -> bool:
    from ..errors import StoreError

    return isinstance(error, StoreError)


def _is_cancellation(error: BaseException) -> bool:
    import asyncio

    from ..errors import InvocationAbortedError

    return isinstance(error, (asyncio.CancelledError, InvocationAbortedError))
