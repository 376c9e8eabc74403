"""``serve_metrics``: a Prometheus endpoint for in-process metrics and the store.

Serves ``/metrics`` on a daemon thread: everything in ``registry`` (the global
``REGISTRY`` by default, where :class:`~flowscope.observability.MetricsPlugin` registers)
plus, when ``store`` is given, a :class:`~flowscope.observability.StoreCollector` over
it. The StoreCollector is added to a private registry that also forwards ``registry``,
so nothing is registered twice and the caller's registry is left as it was.

Content negotiation is prometheus-client's: a scraper that accepts
``application/openmetrics-text`` (Prometheus does) gets OpenMetrics, the only format that
carries exemplars; anything else gets the classic text format. ``?name[]=...`` restricts
the output to the named series; gzip is used when accepted.

The endpoint binds 127.0.0.1 unless told otherwise: node and workflow names are not
secrets, but nothing here authenticates, so exposing it is a decision for the caller.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler, make_server, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..store.base import EventStore
from ..threads import start_thread
from .store_collector import JOB_RESULTS, StoreCollector

__all__ = [
    "serve_metrics",
    "start_metrics_http",
    "MetricsServer",
    "DEFAULT_PORT",
    "LISTEN_BACKLOG",
    "READ_TIMEOUT_S",
]

#: The port of ``flowscope serve-metrics`` (OpenTelemetry's Prometheus exporter default).
DEFAULT_PORT = 9464
#: Connections the kernel queues before accept (prometheus-client's server keeps 5: a burst
#: of scrapes from several Prometheus replicas and probes timed out).
LISTEN_BACKLOG = 128
#: How long a connection may take to send its request: an idle connection holds a thread.
READ_TIMEOUT_S = 10.0


class _Handler(_SilentHandler):
    timeout = READ_TIMEOUT_S  # StreamRequestHandler sets it on the socket


class _Server(ThreadingWSGIServer):
    request_queue_size = LISTEN_BACKLOG


def start_metrics_http(port: int, host: str, registry: CollectorRegistry) -> tuple[Any, threading.Thread]:
    """prometheus-client's WSGI exposition (text, OpenMetrics, gzip, ``?name[]=``) on a
    daemon thread, with a listen backlog and a read timeout; ``host`` is IPv4 or IPv6."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("_MetricsServer", (_Server,), {"address_family": family})
    httpd: Any = make_server(host, port, make_wsgi_app(registry), server_class, handler_class=_Handler)
    thread = start_thread(httpd.serve_forever, "flowscope-metrics-http")
    return httpd, thread


class _Forward(Collector):
    """Yields whatever another registry collects (no names of its own: no clash), but the
    families in ``drop``: those the endpoint's StoreCollector reports for the whole store."""

    def __init__(self, registry: CollectorRegistry, drop: frozenset[str] = frozenset()) -> None:
        self._registry = registry
        self._drop = drop

    def collect(self) -> Iterator[Metric]:
        if not self._drop:
            return iter(self._registry.collect())
        return (m for m in self._registry.collect() if m.name not in self._drop)

    def describe(self) -> list[Metric]:
        return []


@dataclass
class MetricsServer:
    """A running metrics endpoint: ``url`` to scrape, ``shutdown()`` to stop it."""

    host: str
    port: int
    registry: CollectorRegistry
    store_collector: StoreCollector | None
    _server: WSGIServer | None = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop serving, close the socket and join the thread (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self._thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def serve_metrics(
    store: EventStore | None = None,
    registry: CollectorRegistry | None = None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    stale_after_s: float = 300.0,
) -> MetricsServer:
    """Serve ``/metrics`` for ``registry`` (default: the global ``REGISTRY``) and, when
    ``store`` is given, a :class:`StoreCollector` over it; on a daemon thread.

    ``port=0`` picks a free port (read it back from ``.port``). Returns a
    :class:`MetricsServer`; call ``.shutdown()`` (or use it as a context manager) to stop.
    """
    source = REGISTRY if registry is None else registry
    collector: StoreCollector | None = None
    if store is None:
        exposed = source
    else:
        try:  # "without names": ?name[]= filtering still reaches the forwarded registry
            exposed = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
        except TypeError:  # prometheus-client < 0.21
            exposed = CollectorRegistry(auto_describe=False)
        # Job results are counted from the log by the StoreCollector, whoever recorded them;
        # a MetricsPlugin's in-process count of the same results is not exposed beside it.
        exposed.register(_Forward(source, frozenset({JOB_RESULTS})))
        collector = StoreCollector(store, stale_after_s=stale_after_s)
        exposed.register(collector)  # describe() only: the store is not read here
        collector.count_job_results_from_now()
    server, thread = start_metrics_http(port, host, exposed)
    thread.name = f"flowscope-metrics-{server.server_port}"
    return MetricsServer(host, server.server_port, exposed, collector, server, thread)
