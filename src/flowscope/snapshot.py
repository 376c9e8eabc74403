"""A session's fold as JSON and back: :func:`snapshot_state` and :func:`restore_state`.

A snapshot is only a cache of :func:`flowscope.fold.rebuild` (the runner keeps one per
session, :mod:`flowscope.engine.snapshots`), so a long session resumes from it and the
events after it instead of its whole log.
"""

from __future__ import annotations

import base64
import json
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from operator import attrgetter
from typing import Any, TypeVar

from .events import (
    Event,
    InputRequested,
    JobDispatched,
    JobResultReceived,
    RunFinished,
    RunStarted,
    from_dict,
    implied_fields,
    to_dict,
)
from .fold import NodeState, WorkflowState, gc_paused

__all__ = ["snapshot_state", "restore_state", "SNAPSHOT_FORMAT"]

E = TypeVar("E", bound=Event)

# -- snapshots ---------------------------------------------------------------------------------
#
# A snapshot is the fold of a session's first ``last_seq`` events, so that resuming a long
# session reads the snapshot and the events after it instead of the whole log. It is only
# ever a cache: ``restore_state(snapshot_state(rebuild(events)))`` equals
# ``rebuild(events)``, and a snapshot that cannot be used is ignored.
#
# Format 3 keeps the node runs by column, and their four times as IEEE doubles in one base64
# string: parsing decimal floats was half of a large snapshot's JSON time, and 64 bits each
# restore them exactly. A time that is None is stored as NaN, so a snapshot whose times
# include a NaN (the clock never gives one) is written in format 2, rows with every field
# in JSON, which restore_state still reads. Either keeps the few runs that started again
# (``restarted_at``) under a key of its own, "restarted"; a snapshot without it was written
# by an earlier version, which did not keep them, and is not used (the log is folded).

SNAPSHOT_FORMAT = 3
_ROWS_FORMAT = 2
_NODE_FIELDS = tuple(f.name for f in fields(NodeState))
_NODE_SCALARS = _NODE_FIELDS[: _NODE_FIELDS.index("inputs")]  # positional, in field order
_INVOCATION = _NODE_SCALARS.index("invocation_id")
_TIMES = ("started_at", "ended_at", "heartbeat_at", "job_deadline_at")
_FIRST_TIME = _NODE_SCALARS.index(_TIMES[0])
if _NODE_SCALARS[_FIRST_TIME:] != (*_TIMES, "invocation_id"):  # pragma: no cover - a field moved
    raise ImportError("NodeState's four times must be the fields just before invocation_id, its last scalar")
_RUN_FIELDS = tuple(f.name for f in fields(WorkflowState) if f.name not in ("nodes", "snapshot_seq"))
_NAN = float("nan")
#: A run's four times, in ``_TIMES``'s order.
_times: Callable[[NodeState], tuple[float | None, ...]] = attrgetter(*_TIMES)


def _extras(ns: NodeState) -> list[Any] | None:
    """A run's inputs, requests, jobs and job results, or None when it has none."""
    if not (ns.inputs or ns.requests or ns.jobs or ns.job_results):
        return None
    return [
        ns.inputs,
        [to_dict(e) for e in ns.requests.values()],
        [to_dict(e) for e in ns.jobs.values()],
        [to_dict(e) for e in ns.job_results.values()],
    ]


def snapshot_state(ws: WorkflowState) -> dict[str, Any]:
    """A JSON-ready form of a session's state (format 3: node runs by column)."""
    d = {f: getattr(ws, f) for f in _RUN_FIELDS}
    # Each invocation id once, rows refer to it by index: a third of a large snapshot's
    # bytes otherwise, and JSON decoding time follows the bytes.
    invocations: dict[str, int] = {}
    if _has_nan_time(ws):
        d["format"] = _ROWS_FORMAT
        d["nodes"] = _rows(ws, invocations)
        d["invocation_ids"] = list(invocations)
        d["restarted"] = _restarts(ws)
        return d
    columns: list[list[Any]] = [[] for _ in range(_FIRST_TIME)]
    invocation_col: list[int] = []
    times = array("d")
    extras: list[list[Any]] = []
    for i, ns in enumerate(ws.nodes.values()):
        for col, f in zip(columns, _NODE_SCALARS):
            col.append(getattr(ns, f))
        invocation_col.append(invocations.setdefault(ns.invocation_id, len(invocations)))
        times.extend([_NAN if t is None else t for t in _times(ns)])
        extra = _extras(ns)
        if extra is not None:
            extras.append([i, extra])
    d["invocation_ids"] = list(invocations)
    if sys.byteorder != "little":  # pragma: no cover - the bytes are little-endian everywhere
        times.byteswap()
    d["format"] = SNAPSHOT_FORMAT
    d["restarted"] = _restarts(ws)
    d["columns"] = [*columns, invocation_col]
    d["times"] = base64.b64encode(times.tobytes()).decode("ascii")
    d["extras"] = extras
    return d


def _restarts(ws: WorkflowState) -> list[list[Any]]:
    """``[index, restarted_at]`` of the runs that started more than once (few: a key of its
    own; a snapshot of an earlier version lacks it and is not used)."""
    return [[i, ns.restarted_at] for i, ns in enumerate(ws.nodes.values()) if ns.restarted_at is not None]


def _restore_restarts(states: Sequence[NodeState], d: dict[str, Any]) -> None:
    for i, at in d["restarted"]:
        states[i].restarted_at = float(at)


def _has_nan_time(ws: WorkflowState) -> bool:
    """Does a run have a time that is NaN (format 3 stores None as NaN)?"""
    return any(t is not None and t != t for ns in ws.nodes.values() for t in _times(ns))


def _rows(ws: WorkflowState, invocations: dict[str, int]) -> list[list[Any]]:
    """The node runs as rows (format 2): every scalar field in JSON, the extras last."""
    rows = []
    for ns in ws.nodes.values():
        row: list[Any] = [getattr(ns, f) for f in _NODE_SCALARS]
        row[_INVOCATION] = invocations.setdefault(ns.invocation_id, len(invocations))
        extra = _extras(ns)
        if extra is not None:
            row.append(extra)
        rows.append(row)
    return rows


def _decode_all(cls: type[E], items: Iterable[dict[str, Any]]) -> list[E]:
    """Decode the events a snapshot keeps for a node run, each of the class expected."""
    out: list[E] = []
    for d in items:
        e = from_dict(d)
        if not isinstance(e, cls):
            raise ValueError(f"expected a {cls.type} event in the snapshot, found {e.type}")
        out.append(e)
    return out


def restore_state(text: str | bytes) -> WorkflowState:
    """The inverse of :func:`snapshot_state` from its JSON text (format 3, or format 2 as
    earlier versions wrote it); raises ``ValueError`` (or ``TypeError``, ``LookupError``)
    on a snapshot it cannot read."""
    with gc_paused():
        d = json.loads(text)
        fmt = d.get("format") if isinstance(d, dict) else None
        if fmt != SNAPSHOT_FORMAT and fmt != _ROWS_FORMAT:
            raise ValueError("unknown snapshot format")
        if "restarted" not in d:  # which runs started again, an earlier version did not keep
            raise ValueError("a snapshot of an earlier version, without the runs' restarts")
        # a run-level field added since the snapshot was taken keeps its default, or what
        # the events it folded imply of it (implied_fields: the last RunStarted, RunFinished)
        ws = WorkflowState(**{f: d[f] for f in _RUN_FIELDS if f in d})
        for cls, given in ((RunFinished, {"status": ws.status}), (RunStarted, {})):
            for name, value in (implied_fields(cls, given, ws.invocation_id or "") or {}).items():
                if name not in d:
                    setattr(ws, name, value)
        ws.snapshot_seq = ws.last_seq
        nodes = ws.nodes
        ids = d["invocation_ids"]
        if fmt == _ROWS_FORMAT:
            n = len(_NODE_SCALARS)
            rows = []
            for row in d["nodes"]:
                row[_INVOCATION] = ids[row[_INVOCATION]]
                ns = NodeState(*row) if len(row) == n else NodeState(*row[:n])
                if len(row) > n:
                    _restore_extras(ns, row[n])
                rows.append(ns)
            _restore_restarts(rows, d)
            for ns in rows:
                nodes[ns.path] = ns
            return ws
        columns = d["columns"]
        if len(columns) != _FIRST_TIME + 1:
            raise ValueError(f"expected {_FIRST_TIME + 1} columns in the snapshot, found {len(columns)}")
        times = array("d")
        times.frombytes(base64.b64decode(d["times"], validate=True))
        if sys.byteorder != "little":  # pragma: no cover
            times.byteswap()
        count = len(columns[0])
        if len(times) != 4 * count or any(len(c) != count for c in columns):
            raise ValueError("the snapshot's columns and times are not of one length")
        t = [None if x != x else x for x in times.tolist()]
        invocation = [ids[i] for i in columns[-1]]
        states = list(map(NodeState, *columns[:-1], t[0::4], t[1::4], t[2::4], t[3::4], invocation))
        for i, extra in d["extras"]:
            _restore_extras(states[i], extra)
        _restore_restarts(states, d)
        for ns in states:
            nodes[ns.path] = ns
    return ws


def _restore_extras(ns: NodeState, extra: list[Any]) -> None:
    """Give a restored run its inputs, requests, jobs and job results (:func:`_extras`)."""
    inputs, requests, jobs, results = extra
    ns.inputs = inputs
    ns.requests = {e.interrupt_id: e for e in _decode_all(InputRequested, requests)}
    ns.jobs = {e.job_id: e for e in _decode_all(JobDispatched, jobs)}
    ns.job_results = {e.job_id: e for e in _decode_all(JobResultReceived, results)}
