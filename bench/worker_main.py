"""``flowscope worker`` (the real command, ``flowscope.cli.main``) whose tracing exports
into the benches' no-op exporter instead of an OTLP endpoint.

    python bench/worker_main.py worker worker_flows:WORKFLOWS --db F --otlp-endpoint http://127.0.0.1:9 ...

``--otlp-endpoint`` then builds what it builds in production (``configure_tracing``: an SDK
``TracerProvider``, a ``BatchSpanProcessor``, the ``WatermarkExporter``), with
``NoopSpanExporter`` where the OTLP exporter would be, and no reachability check: what
``targets.py`` measures a worker process with its full stack on.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import flowscope.cli.runtime as _runtime  # noqa: E402
import flowscope.observability.otlp as _otlp  # noqa: E402
from workflows import NoopSpanExporter  # noqa: E402


def _noop_exporter(*_args: object, **_kwargs: object) -> NoopSpanExporter:
    return NoopSpanExporter()


_runtime.unreachable = lambda endpoint: None  # type: ignore[assignment]
_otlp.span_exporter = _noop_exporter  # type: ignore[assignment]

if __name__ == "__main__":
    from flowscope.cli import main

    main(sys.argv[1:])
