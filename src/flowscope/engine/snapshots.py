"""A session's snapshot, as the runner reads and keeps it: only ever a cache of the fold
(:func:`flowscope.snapshot.snapshot_state`), read with the events after it, ignored (and the
whole log folded) when it cannot be read, never trusted half-way."""

from __future__ import annotations

import json
import logging

from ..errors import describe_exception
from ..fold import WorkflowState
from ..snapshot import restore_state, snapshot_state
from ..store.base import EventStore
from .invocation import Invocation

__all__ = ["load_snapshot", "save_snapshot"]

log = logging.getLogger("flowscope.engine")


def load_snapshot(store: EventStore, session_id: str) -> WorkflowState | None:
    """The session's state from its last snapshot plus the events after it, or None.

    A snapshot is only a cache of the fold: one that cannot be read is ignored (and the
    whole log folded instead), never trusted half-way.
    """
    snap = store.load_snapshot(session_id)
    if snap is None:
        return None
    seq, data = snap
    try:
        last = store.last_seq(session_id)
        if seq > last:  # of events the log does not hold: a resume from it could never append
            raise ValueError(f"it is at seq {seq}, the log at {last}")
        ws = restore_state(data)
        if ws.last_seq != seq:
            raise ValueError(f"it claims seq {ws.last_seq}, stored as {seq}")
        if ws.session_id != session_id:  # an adapter that mixed its rows up: another session's fold
            raise ValueError(f"it is the fold of session {ws.session_id!r}")
    # an index or a key it does not have, or JSON nested past the parser's depth, too
    except (ValueError, TypeError, LookupError, RecursionError) as exc:
        log.warning("ignoring the snapshot of session %s (%s); folding the whole log", session_id, exc)
        return None
    apply = ws.apply
    for e in store.read(session_id, seq):
        apply(e)
    return ws


def save_snapshot(store: EventStore, inv: Invocation, every: int) -> None:
    """After an invocation that left the session resumable, keep its fold if the log has
    grown by ``every`` events since the last snapshot."""
    ws = inv.ws
    if not inv.in_sync():
        return  # the live state is not exactly what the log holds
    if ws.last_seq - inv.snapshot_seq < every:
        return
    try:
        store.save_snapshot(
            inv.session_id, ws.last_seq, json.dumps(snapshot_state(ws), separators=(",", ":"))
        )
    except Exception as exc:  # a snapshot is an optimisation: never fail the run for it
        log.warning("could not save a snapshot of session %s: %s", inv.session_id, describe_exception(exc))
