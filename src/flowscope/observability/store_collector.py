"""``StoreCollector``: open, orphaned and overdue node runs, read from the store at scrape time.

A prometheus-client custom collector. Because it reads the store's ``node_runs``
projection (not this process's memory) it sees the runs of every worker that shares the
store, including workers that died: a run left ``running`` by a killed process shows as
open, and as orphaned by :mod:`flowscope.liveness`'s rule: at once when its owner was a
process on this host that is gone, when its owner's lease has ended, or (sessions without
an owner) once its heartbeat is older than ``stale_after_s``. Queued sessions (submitted,
not yet started by a worker) come from :meth:`EventStore.queued_summary`.

======================================================== =====================================
series                                                   labels
======================================================== =====================================
``flowscope_store_open_runs``                            workflow, node, state
``flowscope_store_oldest_open_run_start_timestamp_seconds`` workflow, node, state
``flowscope_store_orphaned_runs``                        workflow, node
``flowscope_store_overdue_jobs``                         workflow, node
``flowscope_store_queued_sessions``                      workflow
``flowscope_store_oldest_queued_timestamp_seconds``      workflow
``flowscope_store_up``                                   (none): 1 if the store answered
``flowscope_job_results_total`` (a counter)              workflow, node, result
======================================================== =====================================

Counted once, at the deepest path (docs/design.md): a run that is open only because a run
below it is (a workflow around a running node, the parent of a dynamic child) is a
container, and neither its open run nor its orphan is reported: one SIGKILLed worker
inside ``nightly_export`` is one orphaned run of ``export_rows``, as ``flowscope stuck``
lists it.

Job results are counted from the log (:meth:`EventStore.job_result_summary`), so a
result reported by any process (a worker, ``flowscope resume --job``,
``flowscope.answer()``) is counted once, by whoever serves this collector; the CLI's
workers leave them to it (``MetricsPlugin(job_results=False)``). Like any counter it
starts at 0 with the process: the results already in the log at the first scrape are the
baseline, not an increase (a restarted ``serve-metrics`` does not report old empty
results as new). A fall of the log's count (sessions pruned) is not a decrease.

``state`` is ``running``, ``waiting_input`` or ``waiting_job``. A series seen once keeps
being reported, with 0, after its runs have closed, so that ``rate()``, "absent" and
alert resolution behave (0 for the oldest-start timestamp means "no open run": alert on
``... > 0``). A store error at scrape time is logged and reported as
``flowscope_store_up 0`` with no other ``flowscope_store_*`` sample; the scrape itself
never fails. :meth:`describe` never touches the store.

The collector asks the store for the aggregate
(:meth:`EventStore.open_run_summary <flowscope.store.base.EventStore.open_run_summary>`,
rows of :class:`~flowscope.store.base.OpenRunGroup`): an SQL store answers it with one
``GROUP BY`` over its open-runs index, any other folds ``open_runs()``. Orphaned and
overdue are :mod:`flowscope.liveness`'s definitions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..errors import describe_exception
from ..fold import OPEN_STATES
from ..store.base import EventStore, JobResultGroup, OpenRunGroup, QueuedGroup, summarize_open_runs
from .labels import DEFAULT_MAX_SERIES, OTHER

__all__ = ["StoreCollector", "OpenRunGroup", "summarize_open_runs", "OPEN_STATES"]

log = logging.getLogger("flowscope.observability.store_collector")

OPEN_RUNS = "flowscope_store_open_runs"
OLDEST = "flowscope_store_oldest_open_run_start_timestamp_seconds"
ORPHANED = "flowscope_store_orphaned_runs"
OVERDUE = "flowscope_store_overdue_jobs"
QUEUED = "flowscope_store_queued_sessions"
OLDEST_QUEUED = "flowscope_store_oldest_queued_timestamp_seconds"
UP = "flowscope_store_up"
#: The family's name without ``_total`` (prometheus-client adds it to a counter).
JOB_RESULTS = "flowscope_job_results"

_HELP = {
    OPEN_RUNS: "Open node runs in the store by state (running, waiting_input, waiting_job), all processes.",
    OLDEST: "Start time (epoch seconds) of the oldest open node run by state; 0 when there is none.",
    ORPHANED: "Node runs marked running whose owner is gone (lease ended, or its process on this host died; "
    "without an owner: heartbeat older than stale_after_s).",
    OVERDUE: "Node runs waiting for an external job that is past its deadline_s.",
    QUEUED: "Sessions submitted and not yet started by a worker, by workflow.",
    OLDEST_QUEUED: "Submit time (epoch seconds) of the oldest queued session by workflow; 0 when there is none.",
    UP: "1 if the store answered the last scrape, 0 if it failed (see the log).",
    JOB_RESULTS: "Results of long-running external jobs recorded in the store since this collector started, "
    "by the guard's verdict (success, failed, empty), whichever process reported them.",
}
_LABELS = {
    OPEN_RUNS: ("workflow", "node", "state"),
    OLDEST: ("workflow", "node", "state"),
    ORPHANED: ("workflow", "node"),
    OVERDUE: ("workflow", "node"),
    QUEUED: ("workflow",),
    OLDEST_QUEUED: ("workflow",),
    UP: (),
    JOB_RESULTS: ("workflow", "node", "result"),
}


class StoreCollector(Collector):
    """A prometheus-client collector over an :class:`~flowscope.store.base.EventStore`.

    ``stale_after_s``: a ``running`` run whose last heartbeat is older than this is
    orphaned; keep it well above the runner's ``heartbeat_interval`` (5 s by default).
    ``clock`` gives "now" in epoch seconds (``time.time``).

    Register it on a registry (``registry.register(StoreCollector(store))``) or let
    :func:`~flowscope.observability.serve.serve_metrics` do it.
    """

    def __init__(
        self,
        store: EventStore,
        stale_after_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        max_series: int = DEFAULT_MAX_SERIES,
    ) -> None:
        if stale_after_s < 0:
            raise ValueError("stale_after_s must be >= 0")
        if max_series < 1:
            raise ValueError("max_series must be at least 1")
        #: Label sets per family at most (as ``MetricsPlugin`` bounds its own): workflow
        #: names come from whoever calls ``start``, so past the budget new sets are
        #: reported together under ``_other``.
        self.max_series = max_series
        self.store = store
        self.stale_after_s = float(stale_after_s)
        self.clock = clock
        self._lock = threading.Lock()
        # label sets reported so far: they report 0 rather than vanish
        self._seen_open: set[tuple[str, str, str]] = set()
        self._seen_orphaned: set[tuple[str, str]] = set()
        self._seen_overdue: set[tuple[str, str]] = set()
        self._seen_queued_keys: set[tuple[str]] = set()
        # job results: the log's count at the last scrape (None before the first: the
        # baseline) and what this collector has counted since it started
        self._job_log: dict[tuple[str, str, str], int] | None = None
        self._job_counted: dict[tuple[str, str, str], float] = {}
        self._seen_job: set[tuple[str, str, str]] = set()
        self.last_error: BaseException | None = None
        self.last_scrape_s: float | None = None

    def __repr__(self) -> str:
        return f"StoreCollector({self.store!r}, stale_after_s={self.stale_after_s:g})"

    def count_job_results_from_now(self) -> None:
        """Take the job results already in the log as the baseline now, rather than at the
        first scrape, so that results recorded before Prometheus first scrapes are counted
        (``serve_metrics`` calls it when it starts). A store error leaves the baseline to
        the first scrape that reads it."""
        try:
            groups = self.store.job_result_summary()
        except Exception as exc:
            log.warning("flowscope StoreCollector could not read %r: %s", self.store, describe_exception(exc))
            return
        self._job_results_family(groups)

    # -- the prometheus-client protocol ---------------------------------------------------

    def describe(self) -> Iterator[Metric]:
        """The families this collector produces, without samples; the store is not read."""
        for name in (OPEN_RUNS, OLDEST, ORPHANED, OVERDUE, QUEUED, OLDEST_QUEUED, UP):
            yield GaugeMetricFamily(name, _HELP[name], labels=_LABELS[name])
        yield CounterMetricFamily(JOB_RESULTS, _HELP[JOB_RESULTS], labels=_LABELS[JOB_RESULTS])

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        now = self.clock()
        try:
            self.store.refresh()  # a file replaced or deleted since the last scrape
            groups = self._groups(now)
            queued = self.store.queued_summary()
            job_results = self.store.job_result_summary()
        except Exception as exc:  # a scrape must survive a locked, missing or broken store
            self.last_error = exc
            log.warning("flowscope StoreCollector could not read %r: %s", self.store, describe_exception(exc))
            up = GaugeMetricFamily(UP, _HELP[UP])
            up.add_metric((), 0.0)
            yield up
            return
        self.last_error = None
        yield from self._families(groups)
        yield from self._queued_families(queued)
        yield self._job_results_family(job_results)
        up = GaugeMetricFamily(UP, _HELP[UP])
        up.add_metric((), 1.0)
        yield up
        self.last_scrape_s = time.perf_counter() - t0

    # -- reading and shaping ----------------------------------------------------------------

    def _groups(self, now: float) -> list[OpenRunGroup]:
        rows: Iterable[OpenRunGroup | tuple[Any, ...]] = self.store.open_run_summary(
            now=now, stale_after_s=self.stale_after_s
        )
        # Adapters written before OpenRunGroup existed return plain tuples in its field order.
        return [r if isinstance(r, OpenRunGroup) else OpenRunGroup(*r) for r in rows]

    def _families(self, groups: list[OpenRunGroup]) -> list[GaugeMetricFamily]:
        open_runs: dict[tuple[str, str, str], tuple[float, float]] = {}
        orphaned: dict[tuple[str, str], float] = {}
        overdue: dict[tuple[str, str], float] = {}
        for g in groups:
            if g.state not in OPEN_STATES:
                continue
            key: tuple[str, str, str] = (str(g.workflow or ""), str(g.node or ""), g.state)
            open_runs[key] = (float(g.count), float(g.oldest_started_at or 0.0))
            wn = key[:2]
            if g.state == "running":
                orphaned[wn] = orphaned.get(wn, 0.0) + float(g.orphaned or 0)
            elif g.state == "waiting_job":
                overdue[wn] = overdue.get(wn, 0.0) + float(g.overdue or 0)
        with self._lock:
            open_runs = self._bounded(self._seen_open, open_runs, _count_and_oldest)
            orphaned = self._bounded(self._seen_orphaned, orphaned, _sum)
            overdue = self._bounded(self._seen_overdue, overdue, _sum)
            seen_open = sorted(self._seen_open)
            seen_orphaned = sorted(self._seen_orphaned)
            seen_overdue = sorted(self._seen_overdue)
        f_open = GaugeMetricFamily(OPEN_RUNS, _HELP[OPEN_RUNS], labels=_LABELS[OPEN_RUNS])
        f_oldest = GaugeMetricFamily(OLDEST, _HELP[OLDEST], labels=_LABELS[OLDEST])
        for key in seen_open:
            count, oldest = open_runs.get(key, (0.0, 0.0))
            f_open.add_metric(key, count)
            f_oldest.add_metric(key, oldest)
        f_orphaned = GaugeMetricFamily(ORPHANED, _HELP[ORPHANED], labels=_LABELS[ORPHANED])
        for wn in seen_orphaned:
            f_orphaned.add_metric(wn, orphaned.get(wn, 0.0))
        f_overdue = GaugeMetricFamily(OVERDUE, _HELP[OVERDUE], labels=_LABELS[OVERDUE])
        for wn in seen_overdue:
            f_overdue.add_metric(wn, overdue.get(wn, 0.0))
        return [f_open, f_oldest, f_orphaned, f_overdue]

    def _bounded(
        self, seen: set[Any], now: dict[Any, Any], merge: Callable[[Any, Any], Any]
    ) -> dict[Any, Any]:
        """``now`` with the label sets past ``max_series`` merged into the ``_other`` set;
        ``seen`` (the sets reported so far, which report 0 rather than vanish) grows to
        at most ``max_series`` and the ``_other`` set. Called under the lock."""
        out: dict[Any, Any] = {}
        for key, value in now.items():
            if key not in seen:
                if len(seen) < self.max_series:
                    seen.add(key)
                else:
                    key = (OTHER,) * len(key)
                    seen.add(key)
            out[key] = merge(out[key], value) if key in out else value
        return out

    def _queued_families(self, queued: list[QueuedGroup]) -> list[GaugeMetricFamily]:
        now_queued = {
            str(g.workflow or ""): (float(g.count), float(g.oldest_submitted_at or 0.0)) for g in queued
        }
        with self._lock:
            bounded = self._bounded(
                self._seen_queued_keys, {(wf,): v for wf, v in now_queued.items()}, _count_and_oldest
            )
            now_queued = {key[0]: v for key, v in bounded.items()}
            seen = sorted(k[0] for k in self._seen_queued_keys)
        f_queued = GaugeMetricFamily(QUEUED, _HELP[QUEUED], labels=_LABELS[QUEUED])
        f_oldest = GaugeMetricFamily(OLDEST_QUEUED, _HELP[OLDEST_QUEUED], labels=_LABELS[OLDEST_QUEUED])
        for wf in seen:
            count, oldest = now_queued.get(wf, (0.0, 0.0))
            f_queued.add_metric((wf,), count)
            f_oldest.add_metric((wf,), oldest)
        return [f_queued, f_oldest]

    def _job_results_family(self, groups: list[JobResultGroup]) -> CounterMetricFamily:
        """``flowscope_job_results_total``: what the log's count grew by since the first
        scrape, per label set (bounded like the gauges)."""
        log_now: dict[tuple[str, str, str], int] = {}
        for g in groups:
            key = (str(g.workflow or ""), str(g.node or ""), str(g.result))
            log_now[key] = log_now.get(key, 0) + int(g.count)
        with self._lock:
            before = self._job_log
            self._job_log = log_now
            grown: dict[tuple[str, str, str], float] = {}
            for key, n in log_now.items():
                delta = n - (before.get(key, 0) if before is not None else n)
                grown[key] = float(max(delta, 0))
            for key, delta in self._bounded(self._seen_job, grown, _sum).items():
                self._job_counted[key] = self._job_counted.get(key, 0.0) + delta
            counted = sorted(self._job_counted.items())
        family = CounterMetricFamily(JOB_RESULTS, _HELP[JOB_RESULTS], labels=_LABELS[JOB_RESULTS])
        for key, value in counted:
            family.add_metric(key, value)
        return family


def _sum(a: float, b: float) -> float:
    return a + b


def _count_and_oldest(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """Counts add up; the oldest is the earliest non-zero timestamp (0 means none)."""
    oldest = min((t for t in (a[1], b[1]) if t), default=0.0)
    return a[0] + b[0], oldest
