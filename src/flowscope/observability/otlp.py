"""OTLP endpoints: parsing, protocol choice, the ``OTEL_EXPORTER_OTLP_*`` environment, the exporter.

One module for what :func:`~flowscope.observability.configure_tracing` and
``flowscope export`` both need, so that an endpoint means the same thing to both: a bare
``host:port`` is read as ``http://host:port``, an HTTP endpoint without a path gets
``/v1/traces`` (as ``OTEL_EXPORTER_OTLP_ENDPOINT`` would), and port 4317 means gRPC.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "PROTOCOLS",
    "HTTP_PROTOBUF",
    "GRPC",
    "HTTP_TRACES_PATH",
    "split_endpoint",
    "guess_protocol",
    "resolve_protocol",
    "http_traces_url",
    "env",
    "env_traces_endpoint",
    "env_traces_exporters",
    "sdk_disabled",
    "default_endpoint",
    "span_exporter",
]

HTTP_PROTOBUF = "http/protobuf"
GRPC = "grpc"
PROTOCOLS = (HTTP_PROTOBUF, GRPC)
HTTP_TRACES_PATH = "/v1/traces"
_GRPC_PORT = 4317  # the OTLP/gRPC port (4318 is OTLP/HTTP)


def env(*names: str) -> str | None:
    """The first of the environment variables ``names`` that is set and not blank."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def env_traces_endpoint() -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    return env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def env_traces_exporters() -> set[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (``otlp``, ``console``, ``none``), lower case."""
    return {w.strip().lower() for w in (env("OTEL_TRACES_EXPORTER") or "").split(",") if w.strip()}


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED=true``: the SDK's providers record nothing (the SDK reads it too)."""
    return (env("OTEL_SDK_DISABLED") or "").lower() == "true"


def default_endpoint(protocol: str) -> str:
    """Where an OTLP exporter sends when nothing says otherwise: the spec's default per protocol."""
    return "http://localhost:4317" if protocol == GRPC else "http://localhost:4318"


def split_endpoint(endpoint: str) -> SplitResult:
    """``endpoint`` as URL parts; a bare ``host:port`` is taken as ``http://host:port``."""
    return urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")


def guess_protocol(endpoint: str) -> str:
    """``grpc`` for port 4317 (the OTLP/gRPC port), else ``http/protobuf``."""
    try:
        port = split_endpoint(endpoint).port
    except ValueError:  # a port that is not a number: let the exporter report the endpoint
        port = None
    return GRPC if port == _GRPC_PORT else HTTP_PROTOBUF


def resolve_protocol(protocol: str | None) -> str:
    """``protocol``, or ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` when None, or ``http/protobuf``;
    ``http`` is accepted for ``http/protobuf``. Raises ValueError for anything else."""
    if protocol is None:
        protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or HTTP_PROTOBUF
    if protocol == "http":
        protocol = HTTP_PROTOBUF
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
    return protocol


def http_traces_url(endpoint: str) -> str:
    """An OTLP/HTTP endpoint with the traces path added when it has no path."""
    parts = split_endpoint(endpoint)
    if parts.path in ("", "/"):
        parts = parts._replace(path=HTTP_TRACES_PATH)
    return parts.geturl()


def span_exporter(
    protocol: str,
    endpoint: str | None,
    *,
    timeout: float | None = None,
    headers: dict[str, str] | None = None,
    plaintext_unless_https: bool = False,
) -> SpanExporter:
    """The OTLP span exporter for ``protocol`` (as :func:`resolve_protocol` returns it).

    ``endpoint`` None lets the exporter read it (or its default) from the environment.
    gRPC: by default the exporter decides TLS itself (``http://`` is plaintext, a bare
    ``host:port`` uses TLS unless ``OTEL_EXPORTER_OTLP_INSECURE=true``);
    ``plaintext_unless_https`` makes every endpoint but an ``https://`` one plaintext, which
    is what a one-off ``flowscope export host:4317`` to a local collector means.
    """
    headers = headers or None  # None: the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)HEADERS
    if protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        if endpoint is not None and plaintext_unless_https:
            parts = split_endpoint(endpoint)
            return GrpcExporter(
                endpoint=parts.netloc or endpoint,
                insecure=parts.scheme != "https",
                timeout=timeout,
                headers=headers,
            )
        return GrpcExporter(endpoint=endpoint, timeout=timeout, headers=headers)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(
        endpoint=http_traces_url(endpoint) if endpoint else None, timeout=timeout, headers=headers
    )
