"""One call to get spans out of a process: an SDK TracerProvider wired to OTLP and/or the console.

```python
from flowscope.observability import TracingPlugin, configure_tracing

with configure_tracing("orders-worker", otlp_endpoint="http://localhost:4318") as tracing:
    runner = Runner(wf, plugins=[TracingPlugin(tracer_provider=tracing.provider)])
    runner.run_sync(...)
# leaving the block flushes and shuts the exporters down
```

The standard OpenTelemetry environment variables are honoured: ``OTEL_EXPORTER_OTLP_ENDPOINT``
/ ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` when no endpoint is passed,
``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` when no protocol is passed,
``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``), ``OTEL_SERVICE_NAME`` (it wins over
the ``service_name`` argument, so an operator can rename a service without a code change),
``OTEL_RESOURCE_ATTRIBUTES``, and everything the SDK and the exporters read themselves
(``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``, ``..._INSECURE``,
``..._CERTIFICATE``, ``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``, ``OTEL_SDK_DISABLED``).

The global tracer provider is left alone unless ``set_global=True``, or
:func:`install_global` is called (what the CLI's commands do).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import mask_url_credentials
from . import otlp
from .backlog import CLOSE_WAIT_S, drain
from .otlp import PROTOCOLS

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.sdk.trace import TracerProvider

    from .tracing import TracingPlugin

__all__ = ["configure_tracing", "install_global", "TracingHandle", "PROTOCOLS"]

log = logging.getLogger("flowscope.observability.setup")


class TracingHandle:
    """What :func:`configure_tracing` returns: the provider, and how to flush and shut it down.

    Usable as a context manager (shutdown on exit). ``shutdown()`` is idempotent.
    """

    def __init__(self, provider: TracerProvider, exporters: list[str], set_global: bool) -> None:
        self.provider = provider
        #: what the spans go to, e.g. ``["otlp grpc http://localhost:4317", "console"]``
        self.exporters = exporters
        self.is_global = set_global
        self._closed = False

    def plugin(self, **kwargs: Any) -> TracingPlugin:
        """A :class:`~flowscope.observability.TracingPlugin` on this provider."""
        from .tracing import TracingPlugin

        return TracingPlugin(tracer_provider=self.provider, **kwargs)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every finished span now; False if that did not finish in time."""
        if self._closed:
            return False
        from .shipping import flush  # the spans waiting for room, the processors, the watermarks

        return flush(self.provider, timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop the exporters. Bounded by the exporters' own timeouts."""
        if self._closed:
            return
        self._closed = True
        drain(self.provider, int(CLOSE_WAIT_S * 1000))  # the spans waiting for room: theirs to export
        self.provider.shutdown()

    def __enter__(self) -> TracingHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<TracingHandle exporters={self.exporters!r}{' closed' if self._closed else ''}>"


def configure_tracing(
    service_name: str,
    otlp_endpoint: str | None = None,
    protocol: str | None = None,
    console: bool = False,
    *,
    set_global: bool = False,
    timeout: float | None = None,
    headers: dict[str, str] | None = None,
    resource_attributes: dict[str, Any] | None = None,
) -> TracingHandle:
    """Build an SDK ``TracerProvider`` with a ``service.name`` resource and batch exporters.

    ``otlp_endpoint``: where to send spans (``http://host:4318`` for HTTP, the traces path
    is added when the URL has none; ``http://host:4317`` for gRPC, ``https://`` for TLS; a
    gRPC endpoint without a scheme uses TLS unless ``OTEL_EXPORTER_OTLP_INSECURE=true``).
    When None, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``/``OTEL_EXPORTER_OTLP_ENDPOINT`` are
    used if set; otherwise no OTLP exporter is installed.
    ``protocol``: ``"http/protobuf"`` (default) or ``"grpc"``; None reads
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``/``OTEL_EXPORTER_OTLP_PROTOCOL``.
    ``console``: also print finished spans to stdout.
    ``timeout``: the exporter's timeout in seconds (default: ``OTEL_EXPORTER_OTLP_TIMEOUT`` or 10 s);
    an unreachable collector delays ``shutdown()`` by at most about this much.
    ``set_global``: also install the provider as the global one (``trace.set_tracer_provider``).
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from .shipping import WatermarkExporter

    protocol = otlp.resolve_protocol(protocol)

    wanted = otlp.env_traces_exporters()
    use_otlp = otlp_endpoint is not None
    env_endpoint = otlp.env_traces_endpoint()
    if not use_otlp and "none" not in wanted and (env_endpoint is not None or "otlp" in wanted):
        use_otlp = True  # the exporter reads the endpoint (or its default) from the environment itself
    use_console = console or "console" in wanted

    attrs: dict[str, Any] = dict(resource_attributes or {})
    if not otlp.env("OTEL_SERVICE_NAME") and not _env_names_service():
        attrs[SERVICE_NAME] = service_name
    provider = TracerProvider(resource=Resource.create(attrs))

    described: list[str] = []
    if use_otlp:
        # The watermark follows what this exporter accepted: a killed process's unsent spans
        # are shipped by the next one to open the session (shipping.py).
        exporter = WatermarkExporter(
            otlp.span_exporter(protocol, otlp_endpoint, timeout=timeout, headers=headers)
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
        where = mask_url_credentials(otlp_endpoint or env_endpoint or "(default endpoint)")
        described.append(f"otlp {protocol} {where}")  # printable: a URL's password masked
    if use_console:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        described.append("console")
    if not described:
        log.info(
            "configure_tracing(%r): no exporter configured; spans are recorded but go nowhere", service_name
        )

    if set_global:
        from opentelemetry import trace

        trace.set_tracer_provider(provider)
    return TracingHandle(provider, described, set_global)


def _env_names_service() -> bool:
    """``OTEL_RESOURCE_ATTRIBUTES`` sets ``service.name``: the operator's name beats the code's."""
    pairs = (p.split("=", 1)[0].strip() for p in (otlp.env("OTEL_RESOURCE_ATTRIBUTES") or "").split(","))
    return "service.name" in pairs


def install_global(handle: TracingHandle) -> bool:
    """Make ``handle``'s provider the process's global one, unless the process has one
    already (set by the user's code, ``opentelemetry-instrument`` or
    ``OTEL_PYTHON_TRACER_PROVIDER``): then that one stays, as the API allows one per process.

    With it, spans that code running in the process starts through
    ``opentelemetry.trace.get_tracer(...)``, such as an instrumented HTTP or database client
    inside a node body, go to the same exporters, as children of the node's span. Returns
    whether it was installed."""
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # someone set one: theirs decides where instrumented clients' spans go
    trace.set_tracer_provider(handle.provider)
    handle.is_global = True
    return True
