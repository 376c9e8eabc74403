"""The spans this process ended and did not export, by reason: what
``flowscope_spans_not_exported_total{reason}`` reports.

Tracing counts here and ``MetricsPlugin`` reads the counts at collection time, so a
process counts its losses once, from its start, whichever plugins or registries it has,
and without tracing importing a metrics backend:

- ``queue_full``: the batch processor's queue and flowscope's backlog behind it were full
  (``backlog.py``): the exporter stayed slower than the runs;
- ``export_failed``: a ``WatermarkExporter``'s exporter returned FAILURE or raised (the
  backend was down or refused them).

Either way the spans' sessions keep their watermarks before them, so ``flowscope export``
or the session's next opener can still ship them from the log: the counter says that
traces are incomplete now, not that the spans are gone for good. A span lost by a
processor flowscope cannot see into (not the SDK's batch processor, or an exporter that is
not wrapped in a ``WatermarkExporter``) is not counted.
"""

from __future__ import annotations

import threading

__all__ = ["REASONS", "SpanLosses", "SPAN_LOSSES"]

#: Every reason, each reported from the start (at 0), so that ``increase()`` sees the first.
REASONS = ("queue_full", "export_failed")


class SpanLosses:
    """Counts of spans not exported, by reason, safe to add to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REASONS, 0)

    def add(self, reason: str, spans: int) -> None:
        if reason not in self._counts:
            raise ValueError(f"unknown reason {reason!r}: one of {', '.join(REASONS)}")
        with self._lock:
            self._counts[reason] += spans

    def counts(self) -> dict[str, int]:
        """Every reason and its count so far."""
        with self._lock:
            return dict(self._counts)


#: This process's losses (a forked child starts from its parent's, like any counter).
SPAN_LOSSES = SpanLosses()
