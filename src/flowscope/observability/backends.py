"""The two metric backends behind one series type: prometheus-client collectors and
OpenTelemetry instruments.

:func:`prom_collector` finds or registers a catalog instrument's collector on a registry
(shared by every plugin on it); :func:`otel_instrument` creates it on a meter;
:func:`prom_reader` and :func:`otel_reader` do it for a counter read at collection time.
:class:`Instrument` binds label sets to :class:`Series` within a label budget, and the
exemplar helpers turn a run's trace context into the ``trace_id`` exemplar read at scrape.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import SpanContext, get_current_span
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from .catalog import InstrumentSpec
from .labels import LabelBudget
from .lean_prom import LeanCounter, LeanGauge, LeanHistogram
from .traceparent import parse_traceparent

__all__ = [
    "Series",
    "FoldedSeries",
    "Instrument",
    "prom_collector",
    "prom_reader",
    "otel_instrument",
    "otel_reader",
    "exemplar_source",
    "resolve_exemplar",
]


# -- prometheus-client backend ---------------------------------------------------------------

# Collectors at the cost floor (lean_prom.py): the same exposition as prometheus-client's
# classes for a fraction of the cost per observation, exemplars resolved at scrape.
_PROM_CLASSES: dict[str, type] = {"counter": LeanCounter, "histogram": LeanHistogram, "updown": LeanGauge}
# Collectors this module created, per registry, so that several plugins share them.
_shared: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()
# Observable instruments this module created, per meter, so that several plugins share them.
_observed: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _cache(shared: weakref.WeakKeyDictionary[Any, dict[str, Any]], owner: Any) -> dict[str, Any]:
    """What this module made for ``owner`` (a registry, a meter), by instrument key; a fresh
    dict, so no sharing, for an owner that cannot be weakly referenced."""
    try:
        return shared.setdefault(owner, {})
    except TypeError:
        return {}


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


def prom_collector(registry: CollectorRegistry, spec: InstrumentSpec) -> Any:
    """The collector for ``spec`` on ``registry``: the one already there, or a new one."""
    with _shared_lock:
        cache = _cache(_shared, registry)
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
                kwargs["resolve"] = resolve_exemplar
            collector = cls(_prom_base_name(spec), spec.help, spec.labels, **kwargs)
        cache[spec.key] = collector
        return collector


#: What a read instrument reports: its count per label set, at collection time.
Read = Callable[[], Mapping[tuple[str, ...], float]]


class _ReadCounter:
    """A prometheus-client collector of a counter whose counts ``read()`` gives at scrape."""

    def __init__(self, spec: InstrumentSpec, read: Read) -> None:
        self.spec = spec
        self.read = read

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(_prom_base_name(self.spec), self.spec.help, labels=self.spec.labels)

    def describe(self) -> list[CounterMetricFamily]:
        return [self._family()]  # the names, so that the registry refuses a second owner

    def collect(self) -> list[CounterMetricFamily]:
        family = self._family()
        for values, count in sorted(self.read().items()):
            family.add_metric(list(values), count)
        return [family]


def prom_reader(registry: CollectorRegistry, spec: InstrumentSpec, read: Read) -> Any:
    """Register, once per registry, a collector of ``spec``'s counter as ``read()`` reports it."""
    with _shared_lock:
        cache = _cache(_shared, registry)
        collector = cache.get(spec.key)
        if collector is None:
            existing = getattr(registry, "_names_to_collectors", {}).get(spec.prom_name)
            if existing is not None:
                if not isinstance(existing, _ReadCounter):
                    raise ValueError(
                        f"the registry already has a metric {spec.prom_name!r} that is not flowscope's; "
                        "give MetricsPlugin its own CollectorRegistry or remove the other metric"
                    )
                collector = existing
            else:
                collector = _ReadCounter(spec, read)
                registry.register(collector)
            cache[spec.key] = collector
        return collector


def otel_reader(meter: Any, spec: InstrumentSpec, read: Read) -> Any:
    """Create, once per meter, an observable counter of ``spec`` that ``read()`` reports."""
    from opentelemetry.metrics import Observation

    def observe(_options: Any) -> list[Any]:
        return [Observation(count, dict(zip(spec.labels, values))) for values, count in read().items()]

    with _shared_lock:
        cache = _cache(_observed, meter)
        instrument = cache.get(spec.key)
        if instrument is None:
            instrument = cache[spec.key] = meter.create_observable_counter(
                spec.otel_name, callbacks=[observe], unit=spec.unit, description=spec.help
            )
        return instrument


# -- one labelled series, on one or both backends --------------------------------------------


class Series:
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
        """Histogram observation, with its exemplar's source (``exemplar_source``). The
        OTel SDK takes its exemplar from the current span."""
        if self._prom is not None:
            self._prom.observe(value, exemplar)
        if self._otel is not None:
            self._otel.record(value, self._attrs)

    def shard(self) -> Any:
        """The calling thread's shard of the series' prometheus child (``lean_prom``), when
        the series is that child alone: the thread may then observe into it with plain
        arithmetic. None when it also feeds OpenTelemetry, or counts overflows
        (:class:`FoldedSeries`): observe through :meth:`add`/:meth:`record` then."""
        if self._otel is not None or self._prom is None:
            return None
        make = getattr(self._prom, "shard", None)
        return make() if make is not None else None


class Instrument:
    __slots__ = ("spec", "prom", "otel", "budget", "_series", "_lock")

    def __init__(self, spec: InstrumentSpec, prom: Any, otel: Any, budget: LabelBudget | None = None) -> None:
        self.spec = spec
        self.prom = prom
        self.otel = otel
        self.budget = budget  # None: the labels are bounded by construction
        self._series: dict[tuple[str, ...], Series] = {}
        self._lock = threading.Lock()

    def series(self, values: tuple[str, ...]) -> Series:
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
                        s = self._series[key] = Series(prom, self.otel, dict(zip(self.spec.labels, key)))
        return s

    def start_at_0(self, values: tuple[str, ...]) -> None:
        """Make the series of ``values`` exist at 0 before its first observation, while the
        metric holds under half its budget: a placeholder never takes a real series' room,
        nor counts as an overflow."""
        if values in self._series:
            return
        if self.budget is not None and 2 * len(self._series) >= self.budget.max_series:
            return
        self.series(values).add(0)

    def bind(self, values: tuple[str, ...]) -> Series:
        """``series(values)`` for a caller that keeps it: a label set folded into ``_other``
        comes wrapped so that each later observation counts one overflow too, as a lookup
        would (the bind itself counted the first)."""
        s = self.series(values)
        budget = self.budget
        if budget is None or budget.on_overflow is None or values in self._series:
            return s
        return FoldedSeries(s, self.spec.prom_name, budget.on_overflow)


class FoldedSeries(Series):
    """The ``_other`` series as bound for a label set beyond the budget (see
    :meth:`Instrument.bind`)."""

    __slots__ = ("_metric", "_count", "_bound")

    def __init__(self, other: Series, metric: str, count: Callable[[str], None]) -> None:
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
        Series.add(self, value)

    def record(self, value: float, exemplar: Any = None) -> None:
        self._overflow()
        Series.record(self, value, exemplar)

    def shard(self) -> Any:
        return None  # each observation counts an overflow: through record/add


def otel_instrument(meter: Any, spec: InstrumentSpec) -> Any:
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


def exemplar_source(trace_context: dict[str, str] | None = None) -> str | SpanContext | None:
    """What the run's exemplar will be made of at scrape time: its own ``traceparent``
    (set by a tracing plugin in ``before_*``, whatever the plugin order) when it is
    sampled, else the current span's context when that is. Nothing is formatted on the
    node path (``resolve_exemplar`` does it for the scrape)."""
    if trace_context:
        tp = trace_context.get("traceparent")
        if tp and tp[-1] in _SAMPLED_DIGITS:
            return tp
    ctx = get_current_span().get_span_context()
    if ctx.trace_flags & 0x01 and ctx.trace_id:
        return ctx
    return None


def resolve_exemplar(source: Any) -> dict[str, str] | None:
    """``{"trace_id", "span_id"}`` (hex) of an exemplar source, or None if it is not a
    sampled span."""
    if isinstance(source, str):
        return _traceparent_exemplar(source)
    if isinstance(source, SpanContext) and source.trace_flags & 0x01 and source.trace_id:
        return {"trace_id": format(source.trace_id, "032x"), "span_id": format(source.span_id, "016x")}
    return None


# -- the plugin --------------------------------------------------------------------------------
