"""Formatting rows for the terminal (table), for programs (JSON) and for spreadsheets (CSV)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from ..errors import one_line_text
from .waterfall import Axis

__all__ = [
    "use_utc",
    "use_wide",
    "table_width",
    "fit_widths",
    "zone_name",
    "fmt_time",
    "fmt_duration",
    "invocation_label",
    "one_line_text",
    "render_table",
    "render_json",
    "render_csv",
    "waterfall_lines",
    "STATUS_COLORS",
]

STATUS_COLORS = {
    "completed": "green",
    "success": "green",
    "failed": "red",
    "orphaned": "red",
    "overdue": "red",
    "cancelled": "bright_black",
    "paused": "yellow",
    "waiting_input": "yellow",
    "waiting_job": "yellow",
    "running": "cyan",
}

_BAR = {
    "completed": "=",
    "failed": "x",
    "cancelled": "-",
    "waiting_input": "~",
    "waiting_job": "~",
    "running": "?",
}


#: Whether every time the CLI prints is in UTC (``--utc``, ``FLOWSCOPE_UTC=1``) or local.
_UTC = [False]


def use_utc(on: bool) -> None:
    """Print times in UTC from now on (``on``) or in local time; set once by the group."""
    _UTC[0] = bool(on)


#: Whether tables print every cell whole (``--wide``) instead of fitting the terminal.
_WIDE = [False]


def use_wide(on: bool) -> None:
    """Print tables whole from now on (``on``: ``--wide``), or fit them to the terminal."""
    _WIDE[0] = bool(on)


def table_width() -> int | None:
    """The width tables must fit: ``$COLUMNS`` when set, else the terminal's when stdout is
    one; None (no limit) with ``--wide`` or when stdout is a pipe or a file, so that
    ``flowscope runs | grep`` sees every cell whole."""
    if _WIDE[0]:
        return None
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):  # no real stdout
        pass
    return None


def fit_widths(
    widths: Sequence[int], headers: Sequence[str], limit: int | None, fixed: Sequence[bool] = ()
) -> list[int]:
    """Column widths that fit ``limit`` characters with two spaces between columns.

    The widest columns give way first (one cap for all of them, as high as fits); a column
    never shrinks below a few characters, nor at all when ``fixed`` says so. A table that
    cannot fit even so keeps those minimums (and overflows): a readable table beats a
    fitting one. ``limit`` None: the widths as they are.
    """
    widths = list(widths)
    if limit is None or sum(widths) + 2 * (len(widths) - 1) <= limit:
        return widths
    keep = [bool(fixed[i]) if i < len(fixed) else False for i in range(len(widths))]
    mins = [w if keep[i] else min(w, 4) for i, w in enumerate(widths)]
    budget = limit - 2 * (len(widths) - 1)

    def used(cap: int) -> int:
        return sum(w if keep[i] else max(mins[i], min(w, cap)) for i, w in enumerate(widths))

    lo, hi = 0, max(widths)
    while lo < hi:  # the largest cap whose table fits
        mid = (lo + hi + 1) // 2
        if used(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    out = [w if keep[i] else max(mins[i], min(w, lo)) for i, w in enumerate(widths)]
    spare = budget - sum(out)
    for i, w in enumerate(widths):  # what the cap left over, to the columns it cut
        if spare <= 0:
            break
        if not keep[i] and out[i] < w:
            out[i] += 1
            spare -= 1
    return out


def _clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut with ``…``."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def zone_name() -> str:
    """``UTC`` or the local zone's abbreviation (``CET``), for headers that print times."""
    return "UTC" if _UTC[0] else (time.strftime("%Z") or "local")


def invocation_label(invocation_id: str) -> str:
    """An invocation's short label: the last 8 characters of its id. Ids are time-ordered
    (UUIDv7), so their first 8 are the same for every invocation of a minute."""
    return invocation_id[-8:]


def fmt_time(ts: float | None, *, zone: bool = False) -> str:
    """The time to the second, in UTC or local time (see :func:`use_utc`); ``zone`` names it."""
    if ts is None:
        return "-"
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts) if _UTC[0] else time.localtime(ts))
    return f"{text} {zone_name()}" if zone else text


def fmt_duration(s: float | None) -> str:
    """``12ms``, ``1.23s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    if s is None:
        return "-"
    if s < 0:
        s = 0.0
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 60:
        return f"{s:.2f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return one_line_text(", ".join(f"{k}={v}" for k, v in value.items())) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value) or "-"
    return one_line_text(str(value))


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def render_table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    *,
    color_key: str | None = None,
    empty: str = "(nothing)",
    max_width: int = 80,
    fixed: Sequence[str] = (),
) -> str:
    """A plain, aligned table. ``columns`` are ``(header, row -> value)``; the last column is not padded.

    It fits :func:`table_width` (the terminal), cells cut with ``…`` (``fixed`` names
    columns never cut); with ``--wide`` every cell is printed whole. Without ``--wide`` a
    cell longer than ``max_width`` is cut in any case, so one long value cannot push the
    rest of a piped table off the screen.
    """
    if not rows:
        return empty
    cells = [[_cell(fn(r)) for _h, fn in columns] for r in rows]
    if not _WIDE[0]:
        for line in cells:  # keep one very long cell from wrecking the layout
            for i, c in enumerate(line):
                if len(c) > max_width and i < len(line) - 1:
                    line[i] = _clip(c, max_width)
    headers = [h for h, _fn in columns]
    widths = [max(len(h), *(len(line[i]) for line in cells)) for i, h in enumerate(headers)]
    widths = fit_widths(widths, headers, table_width(), [h in fixed for h in headers])
    headers = [_clip(h, w) for h, w in zip(headers, widths)]
    cells = [[_clip(c, w) for c, w in zip(line, widths)] for line in cells]
    color_col = None
    if color_key is not None:
        color_col = next((i for i, (h, _f) in enumerate(columns) if h.lower() == color_key.lower()), None)
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for line in cells:
        parts = []
        for i, (c, w) in enumerate(zip(line, widths)):
            text = c if i == len(line) - 1 else c.ljust(w)
            if i == color_col and c in STATUS_COLORS:
                text = click.style(text, fg=STATUS_COLORS[c])
            parts.append(text)
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def render_json(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
    """A JSON list of objects with exactly ``keys``, in that order."""
    return json.dumps([{k: r.get(k) for k in keys} for r in rows], indent=2, ensure_ascii=False)


def _csv_value(value: Any) -> Any:
    if isinstance(value, dict):
        return ";".join(f"{k}={_csv_part(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ";".join(
            ":".join(_csv_part(x) for x in v.values()) if isinstance(v, dict) else _csv_part(v) for v in value
        )
    return _csv_part(value)


def _csv_part(value: Any) -> str:
    """A value inside a cell: as at the top (null empty, booleans ``true``/``false``), and
    one nested deeper as compact JSON, never Python's ``repr``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def render_csv(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
    """CSV with a header row of ``keys``; lists are ``;``-joined, dicts ``k=v;...``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(keys)
    for r in rows:
        w.writerow([_csv_value(r.get(k)) for k in keys])
    return buf.getvalue().rstrip("\n")


# --------------------------------------------------------------------------- waterfall


def _detail(r: dict[str, Any]) -> str:
    bits: list[str] = []
    status = r["status"]
    if status == "failed":
        origin = r.get("origin_path")
        if origin and origin != r["path"]:
            bits.append(f"{r.get('error_code')} (from {origin.rsplit('/', 1)[-1]})")
        else:
            # whole: the table cuts the cell with "…" to fit, and --wide prints it whole
            msg = one_line_text(r.get("error_message") or "")
            bits.append(f"{r.get('error_code')} {r.get('error_type')}: {msg}")
    if r.get("retries"):
        reasons = r.get("retried") or ()
        why = ""
        if reasons:
            why = (
                " ("
                + ", ".join(
                    f"{a['attempt']}: {a['error_type'] or 'Exception'} [{a['error_code']}]" for a in reasons
                )
                + ")"
            )
        bits.append(f"{r['retries']} retr{'y' if r['retries'] == 1 else 'ies'}{why}")
    if r.get("recoveries"):
        bits.append(f"recovered {r['recoveries']}x after a crash")
    segments = r.get("segments") or ()
    if len(segments) > 1:
        active = sum((s["ended_at"] or s["started_at"]) - s["started_at"] for s in segments)
        bits.append(f"ran in {len(segments)} invocations, {fmt_duration(active)} active")
    if status == "completed" and r.get("has_output") is False and r.get("kind") != "workflow":
        bits.append("returned nothing (completion marker)")
    jobs = r.get("jobs") or ()
    if jobs:
        bits.append("jobs: " + ", ".join(f"{j['job_id']} {j['result']}" for j in jobs))
    # a failed job's actionable pause has the interrupt id PATH#jobN.K: the jobs say it already
    given = set(r.get("answered_interrupts") or ())
    still = set(r.get("open_interrupts") or ())
    asked = [i for i in r.get("interrupts") or () if not (jobs and "#job" in i)]
    answered = [i for i in asked if i in given]
    if answered:
        bits.append("paused for " + ", ".join(answered) + " (answered)")
    unanswered = [i for i in asked if i not in given and i not in still]  # cancelled or failed meanwhile
    if unanswered:
        bits.append("paused for " + ", ".join(unanswered) + " (never answered)")
    if r.get("open_interrupts"):
        bits.append("WAITING for " + ", ".join(r["open_interrupts"]))
    if status == "running":
        beat = r.get("heartbeat_at")
        seen = f", last heartbeat {fmt_time(beat)}" if beat is not None else ""
        bits.append(f"no end recorded: running, or its worker died (flowscope stuck){seen}")
    return "; ".join(bits)


def waterfall_lines(
    rows: Sequence[dict[str, Any]],
    *,
    width: int | None = None,
    end_ts: float | None = None,
    windows: Sequence[tuple[float, float]] = (),
) -> list[str]:
    """The session's node runs as an indented timeline with proportional bars.

    A run with several ``segments`` (it ran in several invocations: paused, then resumed)
    is drawn as one bar piece per segment; ``windows`` (the invocations' start and end)
    let a long idle gap between invocations shrink to one ``:`` column.
    """
    if not rows:
        return ["(no node runs)"]
    if width is None:  # 32 columns of timeline, fewer in a narrow terminal
        limit = table_width()
        width = 32 if limit is None else max(10, min(32, limit - 64))
    starts = [r["started_at"] for r in rows if r.get("started_at") is not None]
    ends = [r["ended_at"] for r in rows if r.get("ended_at") is not None]
    t0: float = min(starts) if starts else 0.0
    t1: float = max(ends + starts + ([end_ts] if end_ts is not None else []))
    axis = Axis(t0, t1, windows, width)
    gaps = set(axis.gap_columns())
    table_rows = []
    for r in rows:
        start = r.get("started_at")
        bar = ""
        if start is not None:
            cells = [":" if i in gaps else " " for i in range(width)]
            segments = r.get("segments") or [{"started_at": start, "ended_at": r.get("ended_at")}]
            mark = _BAR.get(r["status"], "=")
            for seg in segments:
                seg_end: float = seg["ended_at"] if seg.get("ended_at") is not None else t1
                a = min(int(axis.x(seg["started_at"])), width - 1)
                b = min(max(a + 1, int(math.ceil(axis.x(seg_end)))), width)
                for i in range(a, b):
                    if i not in gaps:
                        cells[i] = mark
            bar = "|" + "".join(cells) + "|"
        name = "  " * r["depth"] + r["path"].rsplit("/", 1)[-1]
        table_rows.append({**r, "_name": name, "_bar": bar, "_detail": _detail(r)})
    columns: list[Column] = [
        ("NODE", lambda r: r["_name"]),
        (
            "START",
            lambda r: (
                "+" + fmt_duration(r.get("start_offset_s")) if r.get("start_offset_s") is not None else "-"
            ),
        ),
        ("DURATION", lambda r: fmt_duration(r.get("duration_s"))),
        ("STATUS", lambda r: r["status"]),
        ("ATT", lambda r: r["attempts"]),
        ("TIMELINE", lambda r: r["_bar"]),
        ("DETAIL", lambda r: r["_detail"]),
    ]
    return render_table(table_rows, columns, color_key="STATUS", max_width=120, fixed=("TIMELINE",)).split(
        "\n"
    )
