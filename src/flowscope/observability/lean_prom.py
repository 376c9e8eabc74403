"""Prometheus collectors for the node path: counters, gauges and histograms at the cost floor.

prometheus-client's ``Counter``/``Gauge``/``Histogram`` do more on every observation
than a node run can afford: an observability check, a lock per value, a walk over the
buckets, and an exemplar validated label by label. These do the least that keeps the
exposition the same: one lock, one ``bisect`` for the bucket, and an exemplar *source*
(the run's ``traceparent`` or its span context) kept per bucket and turned into the
``trace_id``/``span_id`` exemplar only when Prometheus scrapes. They register on a
``CollectorRegistry`` like any collector and expose the same names, types, buckets,
``_created`` samples and exemplars as prometheus-client's classes.

A child also hands out per-thread *shards* (:meth:`_Value.shard`,
:meth:`_HistogramChild.shard`): a part of its value that only the thread that asked for it
updates, with plain attribute arithmetic and no lock (the metrics plugin's node path keeps
its thread's shards); a scrape adds every shard to the child's own value.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from threading import get_ident
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

__all__ = ["LeanCounter", "LeanGauge", "LeanHistogram", "ExemplarResolver", "Shard", "HistogramShard"]

#: Turns an exemplar source kept at observation time into exemplar labels (or None).
ExemplarResolver = Callable[[Any], "dict[str, str] | None"]


class _Lean(Collector):
    """A labelled collector: ``labels(*values)`` gives the child to observe into; a scrape
    adds each child's samples (:meth:`_add`) to one family of ``_family_type``."""

    _family_type: Callable[..., Any]

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry | None
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.get(values)
                if child is None:
                    child = self._children[values] = self._child()
        return child

    @abstractmethod
    def _child(self) -> Any:
        """A new child for one label set."""

    @abstractmethod
    def _add(self, family: Any, values: tuple[str, ...], child: Any) -> None:
        """Add the samples of the child of label ``values`` to ``family``."""

    def _family(self) -> Any:
        """The metric family, without samples (``describe``) or to add them to (``collect``)."""
        return self._family_type(self._name, self._documentation, labels=self._labelnames)

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        with self._lock:
            children = list(self._children.items())
        for values, child in children:
            self._add(family, values, child)
        yield family


def _thread_part(shards: dict[int, Any], lock: threading.Lock, make: Callable[[], Any]) -> Any:
    """The calling thread's entry of ``shards``, made (under ``lock``) on its first call."""
    ident = get_ident()
    part = shards.get(ident)
    if part is None:
        with lock:
            part = shards.get(ident)
            if part is None:
                part = shards[ident] = make()
    return part


class Shard:
    """One thread's part of a counter's or gauge's value: that thread adds to ``value``."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class _Value:
    """One label set's value: a gauge's, and a counter's (which refuses to go down)."""

    __slots__ = ("value", "created", "_lock", "_shards")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()
        self._lock = threading.Lock()
        self._shards: dict[int, Shard] = {}  # by thread

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:  # several event loops in several threads may share one registry
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)

    def set(self, value: float) -> None:
        with self._lock:
            self.value = float(value)
            for part in self._shards.values():  # the shards' parts are in the value set
                self.value -= part.value

    def shard(self) -> Shard:
        """The calling thread's part of this value, for that thread alone to add to."""
        return _thread_part(self._shards, self._lock, Shard)

    def total(self) -> float:
        """The value with every thread's part (what a scrape reads)."""
        return self.value + sum(part.value for part in list(self._shards.values()))


class _CounterValue(_Value):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        with self._lock:
            self.value += amount


class LeanCounter(_Lean):
    """A counter: ``name`` without ``_total`` (as prometheus-client's ``Counter`` takes it)."""

    _family_type = CounterMetricFamily

    def _child(self) -> _CounterValue:
        return _CounterValue()

    def _add(self, family: Any, values: tuple[str, ...], child: _CounterValue) -> None:
        family.add_metric(values, child.total(), created=child.created)


class LeanGauge(_Lean):
    _family_type = GaugeMetricFamily

    def _child(self) -> _Value:
        return _Value()

    def _add(self, family: Any, values: tuple[str, ...], child: _Value) -> None:
        family.add_metric(values, child.total())


class HistogramShard:
    """One thread's part of a histogram child: only that thread observes into it."""

    __slots__ = ("bounds", "counts", "sum", "exemplars")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # the upper bounds, +Inf last
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0
        #: per bucket, the last (exemplar source, value, timestamp), or None
        self.exemplars: list[tuple[Any, float, float] | None] = [None] * len(bounds)

    def observe(self, amount: float, exemplar: Any = None, ts: float = 0.0) -> None:
        """Count ``amount`` (no lock: the owning thread only); ``exemplar`` as in
        :meth:`_HistogramChild.observe`, stamped ``ts`` (the time it was observed)."""
        i = bisect_left(self.bounds, amount)
        self.counts[i] += 1
        self.sum += amount
        if exemplar is not None:
            self.exemplars[i] = (exemplar, amount, ts)


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum", "exemplars", "created", "_lock", "_shards")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # the upper bounds, +Inf last
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0
        self.exemplars: list[tuple[Any, float, float] | None] = [None] * len(bounds)
        self.created = time.time()
        self._lock = threading.Lock()
        self._shards: dict[int, HistogramShard] = {}  # by thread

    def observe(self, amount: float, exemplar: Any = None) -> None:
        """Count ``amount``; ``exemplar`` (a source for the resolver, or None to keep the
        bucket's last one) becomes the bucket's exemplar at the next scrape."""
        i = bisect_left(self.bounds, amount)  # the first bound >= amount: le is inclusive
        with self._lock:
            self.counts[i] += 1
            self.sum += amount
            if exemplar is not None:
                self.exemplars[i] = (exemplar, amount, time.time())

    def shard(self) -> HistogramShard:
        """The calling thread's part of this histogram, for that thread alone to observe into."""
        return _thread_part(self._shards, self._lock, lambda: HistogramShard(self.bounds))

    def snapshot(self) -> tuple[list[int], float, list[tuple[Any, float, float] | None]]:
        """Counts per bucket, sum and each bucket's latest exemplar, every thread's part in."""
        with self._lock:
            counts, total, kept = list(self.counts), self.sum, list(self.exemplars)
            parts = list(self._shards.values())
        for part in parts:  # read while its thread may observe: at most that observation off
            total += part.sum
            for i, (n, ex) in enumerate(zip(list(part.counts), list(part.exemplars))):
                counts[i] += n
                if ex is not None and (kept[i] is None or ex[2] >= kept[i][2]):  # type: ignore[index]
                    kept[i] = ex
        return counts, total, kept


class LeanHistogram(_Lean):
    """A histogram with ``buckets`` (+Inf added) whose exemplars are resolved at scrape."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None,
        *,
        buckets: Sequence[float],
        resolve: ExemplarResolver | None = None,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if bounds != tuple(sorted(bounds)):
            raise ValueError("buckets must be in increasing order")
        # a list, with +Inf last, as prometheus-client's Histogram keeps it
        self._upper_bounds = list(
            bounds + (float("inf"),) if not bounds or bounds[-1] != float("inf") else bounds
        )
        self._les = [floatToGoString(b) for b in self._upper_bounds]
        self._resolve = resolve
        super().__init__(name, documentation, labelnames, registry)

    _family_type = HistogramMetricFamily

    def _child(self) -> _HistogramChild:
        return _HistogramChild(tuple(self._upper_bounds))

    def _add(self, family: Any, values: tuple[str, ...], child: _HistogramChild) -> None:
        counts, total, kept = child.snapshot()
        buckets: list[Any] = []
        acc = 0
        for le, n, ex in zip(self._les, counts, kept):
            acc += n
            exemplar = self._exemplar(ex)
            buckets.append((le, acc, exemplar) if exemplar is not None else (le, acc))
        family.add_metric(values, buckets, total)
        # beside its child's other samples: OpenMetrics wants each label set's samples together
        family.samples.append(
            Sample(self._name + "_created", dict(zip(self._labelnames, values)), child.created)
        )

    def _exemplar(self, kept: tuple[Any, float, float] | None) -> Exemplar | None:
        if kept is None or self._resolve is None:
            return None
        source, value, ts = kept
        labels = self._resolve(source)
        return Exemplar(labels, value, ts) if labels else None
