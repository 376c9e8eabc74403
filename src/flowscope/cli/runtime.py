"""What the commands that run something share: tracing from ``--otlp-endpoint``, the
metrics server, and waiting for Ctrl-C or SIGTERM (``resume``, ``serve-metrics``, ``demo``)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import mask_url_credentials
from ..threads import start_thread
from .failures import CliError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..observability.serve import MetricsServer
    from ..observability.setup import TracingHandle

__all__ = [
    "EXPORT_TIMEOUT_S",
    "resolve_otlp_protocol",
    "unreachable",
    "configure_cli_tracing",
    "start_metrics_server",
    "wait_for_signal",
    "SpanFollower",
    "check_endpoint",
    "follower_exporter",
]

#: The OTLP exporter's timeout for the CLI's own runs: a collector that stops answering
#: mid-run costs at most this per batch, not the SDK's default 10 s of retries.
EXPORT_TIMEOUT_S = 1.0
#: A span follower's export timeout: nothing waits on it, and a slow collector should not
#: make it send a batch twice.
FOLLOW_TIMEOUT_S = 5.0


def resolve_otlp_protocol(endpoint: str, protocol: str | None) -> str:
    """``--otlp-protocol`` when given, else the protocol the endpoint's port suggests."""
    from ..export import guess_protocol

    return protocol or guess_protocol(endpoint)


def follower_exporter(endpoint: str, protocol: str | None, timeout: float) -> Any:
    """The OTLP span exporter of a span follower (``export --follow``, ``serve-metrics
    --otlp-endpoint``); a malformed endpoint or protocol is a CliError. Its own retry and
    failure lines would repeat on every pass: run the follower inside
    :func:`quiet_exporter_logs`, and say once what the endpoint refused."""
    from ..observability import otlp

    check_endpoint(endpoint)
    try:
        proto = otlp.resolve_protocol(resolve_otlp_protocol(endpoint, protocol))
    except ValueError as exc:
        raise CliError(f"--otlp-endpoint {endpoint}: {exc}") from None
    return otlp.span_exporter(proto, endpoint, timeout=timeout, plaintext_unless_https=True)


@contextlib.contextmanager
def quiet_exporter_logs() -> Iterator[None]:
    """The OpenTelemetry exporters' log lines left out while a span follower runs (it says
    once what an endpoint refused); the level before is put back after."""
    logger = logging.getLogger("opentelemetry.exporter")
    before = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(before)


def check_endpoint(endpoint: str, option: str = "--otlp-endpoint") -> None:
    """A CliError unless ``endpoint`` is an OTLP endpoint: ``http(s)://host[:port]`` or a
    bare ``host:port``."""
    from ..observability.otlp import split_endpoint

    try:
        parts = split_endpoint(endpoint)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise CliError(f"{option} {endpoint}: not a URL ({exc}); use e.g. http://localhost:4318") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(
            f"{option} {endpoint}: an OTLP endpoint is http(s)://host[:port] or host:port, e.g. http://localhost:4318"
        )


def unreachable(endpoint: str) -> str | None:
    """Why nothing can receive spans at ``endpoint`` (a TCP connect fails), or None."""
    import socket

    from ..observability.otlp import split_endpoint

    try:
        parts = split_endpoint(endpoint)
        host = parts.hostname or "localhost"
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"{mask_url_credentials(endpoint)} is not a URL ({exc})"
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or exc})"


class _FirstExportProblem(logging.Handler):
    """The OpenTelemetry SDK's export warnings as one line on stderr, once per process:
    its retry lines (``Transient error HTTPConnectionPool(...)``) would land in the middle
    of the CLI's output."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(logging.WARNING)
        self.endpoint = endpoint
        self.said = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.said:
            return
        self.said = True
        import click

        click.echo(
            f"warning: spans could not be sent to {mask_url_credentials(self.endpoint)}; later ones may not be either "
            "(flowscope_spans_not_exported_total counts them; `flowscope export --follow` ships them "
            "from the log)",
            err=True,
        )


def _quiet_sdk(endpoint: str) -> None:
    otel = logging.getLogger("opentelemetry")
    for h in list(otel.handlers):
        if isinstance(h, _FirstExportProblem):
            otel.removeHandler(h)
    otel.addHandler(_FirstExportProblem(endpoint))
    otel.propagate = False


def configure_cli_tracing(
    endpoint: str | None, protocol: str | None, service: str, *, warn: Callable[[str], None] | None = None
) -> TracingHandle | None:
    """The tracing of a command that runs workflows (``worker``, ``demo``, ``resume``), or None.

    Spans go to ``--otlp-endpoint`` (``endpoint``) when given; without it, to what the
    standard variables say, as the SDK reads them: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_TRACES_EXPORTER=otlp`` / ``console``), with
    ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``, ``..._HEADERS`` and ``..._TIMEOUT``; with neither,
    None. ``--otlp-endpoint`` wins over the variables (and ``OTEL_TRACES_EXPORTER=none``).
    ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` name the service (else
    ``service``), ``OTEL_TRACES_SAMPLER(_ARG)`` samples, and ``OTEL_SDK_DISABLED=true``
    turns tracing off (None, said through ``warn`` when an endpoint was given).

    The provider becomes the process's global one unless it has one already
    (:func:`~flowscope.observability.setup.install_global`), so spans that node bodies and
    instrumented clients start are children of the node's span and reach the same place.
    An endpoint where nothing answers is said once through ``warn`` and not used (None): the
    run goes on at full speed instead of stalling in the SDK's retries. A bad URL or
    protocol is a CliError.
    """
    from ..observability import otlp
    from ..observability.setup import configure_tracing, install_global

    exporters = otlp.env_traces_exporters()
    if otlp.sdk_disabled():
        if warn is not None and (endpoint or otlp.env_traces_endpoint()):
            warn("OTEL_SDK_DISABLED=true: tracing is off, no spans are sent")
        return None
    if endpoint:
        check_endpoint(endpoint)
        proto: str | None = resolve_otlp_protocol(endpoint, protocol)
        target: str | None = endpoint
        option = "--otlp-endpoint"
    else:
        env_endpoint = otlp.env_traces_endpoint()
        if "none" in exporters or (env_endpoint is None and not exporters & {"otlp", "console"}):
            return None
        try:
            proto = otlp.resolve_protocol(protocol)
        except ValueError as exc:
            raise CliError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {exc}") from None
        uses_otlp = env_endpoint is not None or "otlp" in exporters
        target = (env_endpoint or otlp.default_endpoint(proto)) if uses_otlp else None
        option = "OTEL_EXPORTER_OTLP_ENDPOINT"
    if target is not None:
        problem = unreachable(target)
        if problem is not None:
            if warn is not None:
                warn(
                    f"{problem}: the spans will be dropped (start a collector or Jaeger first: `flowscope deploy-files DIR` writes one; docs/operations.md)"
                )
            return None
        _quiet_sdk(target)
    # The CLI's short export timeout, unless the operator set one.
    timeout = (
        None
        if otlp.env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
        else EXPORT_TIMEOUT_S
    )
    try:
        handle = configure_tracing(service, otlp_endpoint=endpoint or None, protocol=proto, timeout=timeout)
    except ValueError as exc:
        raise CliError(f"{option} {target or ''}: {exc}".replace("  ", " ")) from None
    install_global(handle)
    return handle


def start_metrics_server(
    store: Any, registry: CollectorRegistry, *, host: str, port: int, stale_after: float
) -> MetricsServer:
    """Serve ``registry`` and the store's metrics on ``host:port``; a port in use is a CliError."""
    from ..observability.serve import serve_metrics

    try:
        return serve_metrics(store=store, registry=registry, host=host, port=port, stale_after_s=stale_after)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class SpanFollower:
    """``flowscope export --follow`` in a daemon thread, for ``serve-metrics``: ships the
    spans of sessions whose owner is gone (and of owners that do not ship their own) to
    an OTLP endpoint. A refused export or a store hiccup is said once and retried the next
    pass; :meth:`stop` ends it."""

    def __init__(
        self,
        store: Any,
        endpoint: str,
        protocol: str | None,
        service: str,
        interval: float,
        warn: Callable[[str], None],
    ) -> None:
        self.exporter = follower_exporter(endpoint, protocol, FOLLOW_TIMEOUT_S)
        self._quiet = contextlib.ExitStack()  # until stop()
        self._quiet.enter_context(quiet_exporter_logs())
        self.store, self.service, self.interval, self.warn = store, service, interval, warn
        self._stop = threading.Event()
        self._said: set[str] = set()
        #: spans sent whose watermark the store refused: not sent again (ship_store)
        self._shipped: dict[str, int] = {}
        self._thread = start_thread(self._run, "flowscope-span-follower")

    def _run(self) -> None:
        from ..errors import StoreError
        from ..observability.export import ExportError, follow

        while not self._stop.is_set():
            try:
                follow(
                    self.store,
                    self.exporter,
                    service_name=self.service,
                    interval=self.interval,
                    stop=self._stop,
                    shipped=self._shipped,
                )
            except (ExportError, StoreError) as exc:  # said once; the watermark keeps what was not sent
                text = str(exc)
                if text not in self._said:
                    self._said.add(text)
                    self.warn(f"{text} (retrying every {self.interval:g}s)")
                self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(FOLLOW_TIMEOUT_S + self.interval + 1)
        self.exporter.shutdown()
        self._quiet.close()


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
