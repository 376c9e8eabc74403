"""What the commands that run something share: tracing from ``--otlp-endpoint``, the
metrics server, and waiting for Ctrl-C or SIGTERM (``resume``, ``serve-metrics``, ``demo``)."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

from .failures import CliError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..observability.serve import MetricsServer
    from ..observability.setup import TracingHandle

__all__ = ["resolve_otlp_protocol", "configure_cli_tracing", "start_metrics_server", "wait_for_signal"]


def resolve_otlp_protocol(endpoint: str, protocol: str | None) -> str:
    """``--otlp-protocol`` when given, else the protocol the endpoint's port suggests."""
    from ..export import guess_protocol

    return protocol or guess_protocol(endpoint)


def configure_cli_tracing(endpoint: str | None, protocol: str | None, service: str) -> TracingHandle | None:
    """A tracer provider sending to ``--otlp-endpoint`` (None without one); a bad URL is a CliError."""
    if not endpoint:
        return None
    from ..observability.setup import configure_tracing

    try:
        return configure_tracing(service, otlp_endpoint=endpoint, protocol=resolve_otlp_protocol(endpoint, protocol), timeout=5.0)
    except ValueError as exc:
        raise CliError(f"--otlp-endpoint {endpoint}: {exc}") from None


def start_metrics_server(
    store: Any, registry: CollectorRegistry, *, host: str, port: int, stale_after: float
) -> MetricsServer:
    """Serve ``registry`` and the store's metrics on ``host:port``; a port in use is a CliError."""
    from ..observability.serve import serve_metrics

    try:
        return serve_metrics(store=store, registry=registry, host=host, port=port, stale_after_s=stale_after)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # pragma: no cover - not the main thread
            pass
    try:
        while not stop.wait(0.25):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
