"""Observability adapters: OpenTelemetry spans, Prometheus/OTel metrics, store-backed metrics.

Spans: ``spans`` (the one mapping from events to span names, attributes, status, span
events), applied live by ``tracing`` and after the fact by ``log_spans`` (the walk over a
session's log) and ``export`` (OTLP encoding and sending); ``otlp`` (endpoints, protocol,
exporter) and ``setup`` (``configure_tracing``). Metrics: ``metrics``, ``store_collector``,
``serve``.

Names are imported lazily so that ``import flowscope.observability`` stays cheap and a
user of one backend does not pay for the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers; at run time __getattr__ below imports each on first use
    from .metrics import MetricsPlugin
    from .serve import serve_metrics
    from .setup import configure_tracing
    from .store_collector import StoreCollector
    from .tracing import TracingPlugin

__all__ = [
    "TracingPlugin",
    "MetricsPlugin",
    "StoreCollector",
    "configure_tracing",
    "serve_metrics",
]

_WHERE = {
    "TracingPlugin": ".tracing",
    "configure_tracing": ".setup",
    "MetricsPlugin": ".metrics",
    "StoreCollector": ".store_collector",
    "serve_metrics": ".serve",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(name)
    from importlib import import_module

    return getattr(import_module(module, __name__), name)
