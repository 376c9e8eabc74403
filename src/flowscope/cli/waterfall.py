"""The one waterfall layout: where a session's node runs go on a time axis whose idle gaps
between invocations are compressed, for ``flowscope show`` (a gap is one ``:`` column) and
for the console (a gap is a fixed-width band with its length written on it).

A session that paused for an hour and resumed has two busy stretches and one idle gap; to
scale, the gap would squash every bar into a sliver. :class:`Axis` maps time to a position
on ``width`` units: busy time to scale, each gap longer than :data:`GAP_S` as ``gap_width``
units. :func:`waterfall_layout` gives each ``show`` row its segments on that axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GAP_S", "Axis", "Gap", "waterfall_layout"]

#: An idle stretch between two invocations longer than this (seconds) is drawn compressed
#: instead of to scale: a run resumed an hour later must not squash the rest.
GAP_S = 1.0


@dataclass(frozen=True, slots=True)
class Gap:
    """An idle stretch between invocations: from ``start`` to ``end`` (epoch seconds),
    drawn from ``x`` to ``x + width`` on the axis."""

    start: float
    end: float
    x: float
    width: float

    @property
    def duration_s(self) -> float:
        return self.end - self.start


class Axis:
    """Time -> position on ``width`` units: the invocations' windows to scale, each idle gap
    longer than :data:`GAP_S` between them as ``gap_width`` units."""

    def __init__(
        self,
        t0: float,
        t1: float,
        windows: Sequence[tuple[float, float]],
        width: float,
        gap_width: float = 1.0,
    ) -> None:
        merged: list[list[float]] = []
        for a, b in sorted(windows):
            if merged and a - merged[-1][1] <= GAP_S:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.cuts: list[tuple[float, float]] = [
            (b, c) for (_a, b), (c, _d) in zip(merged, merged[1:]) if b >= t0 and c <= t1
        ]
        self.width = width
        self.gap_width = gap_width
        busy = (t1 - t0) - sum(c - b for b, c in self.cuts)
        units = max(width - gap_width * len(self.cuts), gap_width * (len(self.cuts) + 1))
        self.scale = units / max(busy, 1e-6)
        self.t0 = t0
        self.t1 = t1

    def x(self, t: float) -> float:
        """The position of time ``t`` (each gap counts ``gap_width`` units)."""
        pos = (t - self.t0) * self.scale
        for b, c in self.cuts:
            if t >= c:
                pos += self.gap_width - (c - b) * self.scale
            elif t > b:  # inside an idle gap: its share of the gap's band
                pos += (t - b) / (c - b) * self.gap_width - (t - b) * self.scale
        return pos

    def gaps(self) -> list[Gap]:
        """The compressed gaps, in time order, with where each is drawn."""
        return [Gap(b, c, self.x(b), self.gap_width) for b, c in self.cuts]

    def gap_columns(self) -> list[int]:
        """The terminal's columns that are gaps (``gap_width`` 1)."""
        return [int(self.x(c)) - 1 for _b, c in self.cuts]


def waterfall_layout(
    rows: Sequence[dict[str, Any]],
    *,
    width: float = 1000.0,
    gap_width: float = 40.0,
    end_ts: float | None = None,
    windows: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """Each ``show`` row's segments (one per invocation that ran it) as ``[x0, x1]`` on an
    :class:`Axis` of ``width`` units, and the gaps with their lengths.

    Returns ``{"width", "t0", "t1", "gaps": [{"x", "width", "start", "end", "duration_s"}],
    "segments": [[[x0, x1], ...] per row]}``; a run with no start has no segment; an open
    segment ends at the axis's end (``end_ts`` or the last time any row shows).
    """
    starts = [r["started_at"] for r in rows if r.get("started_at") is not None]
    ends = [r["ended_at"] for r in rows if r.get("ended_at") is not None]
    t0: float = min(starts) if starts else 0.0
    t1: float = max(ends + starts + ([end_ts] if end_ts is not None else []) + [t0])
    axis = Axis(t0, t1, windows, width, gap_width)
    out: list[list[list[float]]] = []
    for r in rows:
        start = r.get("started_at")
        if start is None:
            out.append([])
            continue
        segments = r.get("segments") or [{"started_at": start, "ended_at": r.get("ended_at")}]
        placed = []
        for seg in segments:
            seg_end = seg["ended_at"] if seg.get("ended_at") is not None else t1
            placed.append([round(axis.x(seg["started_at"]), 2), round(axis.x(seg_end), 2)])
        out.append(placed)
    return {
        "width": width,
        "t0": t0,
        "t1": t1,
        "gaps": [
            {
                "x": round(g.x, 2),
                "width": g.width,
                "start": g.start,
                "end": g.end,
                "duration_s": round(g.duration_s, 3),
            }
            for g in axis.gaps()
        ],
        "segments": out,
    }
