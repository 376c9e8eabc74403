"""The console's attention tabs: which sessions need a person, by the rule ``stuck`` applies.

Every open run is classified by :func:`flowscope.liveness.classify_open_run` (with its
session's owner and status), so a tab holds the sessions ``flowscope stuck`` lists in
that state; the store's part is read once per store version (:func:`read_tabs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..cli.rowparts import classify_run, open_containers
from ..liveness import ORPHANED, OVERDUE, QUEUED, RUNNING, WAITING_INPUT, WAITING_JOB
from ..store.base import EventStore, NodeRun, SessionInfo, SessionQuery

__all__ = ["ATTENTION", "Tabs", "TabReads", "read_tabs", "attention_tabs"]

#: The attention tabs, in the order the page shows them, with their labels.
ATTENTION = {
    "failed": "Failed",
    "waiting_input": "Waiting for a person",
    "waiting_job": "Waiting for a job",
    "overdue": "Overdue",
    "orphaned": "Orphaned",
    "retrying": "Retrying",
    "queued_too_long": "Queued too long",
}


@dataclass(frozen=True, slots=True)
class Tabs:
    """The attention tabs at one moment: how many sessions each holds, and the query that
    selects them (failed sessions and long-queued ones by status and time; the rest by the
    ids of the sessions whose open runs the liveness rule put there)."""

    queries: Mapping[str, SessionQuery]
    counts: Mapping[str, int]
    #: Every session's count per status (the unfiltered list's total is their sum).
    statuses: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class TabReads:
    """What the attention tabs read from the store, once per store version: every status's
    count, the open runs, the sessions of the running ones (their owners), which open
    runs enclose another (:func:`flowscope.cli.rowparts.open_containers`), and the
    answered sessions (a worker's to resume: their waiting runs wait for it)."""

    statuses: Mapping[str, int]
    runs: Sequence[NodeRun]
    running: Mapping[str, SessionInfo]
    enclosing: frozenset[tuple[str, str]]
    answered: Mapping[str, SessionInfo] = dataclasses.field(default_factory=dict)


def read_tabs(store: EventStore) -> TabReads:
    """The store's part of :func:`attention_tabs`: only the open runs, never every session."""
    runs = store.open_runs()
    ids = frozenset(r.session_id for r in runs if r.status == RUNNING)
    running = {s.session_id: s for s in store.find_sessions(SessionQuery(session_ids=ids))} if ids else {}
    statuses = store.status_counts()
    answered = (
        {s.session_id: s for s in store.find_sessions(SessionQuery(statuses=frozenset({"answered"})))}
        if statuses.get("answered")
        else {}
    )
    return TabReads(statuses, runs, running, frozenset(open_containers(runs)), answered)


def attention_tabs(
    store: EventStore,
    *,
    now: float,
    stale_after_s: float,
    queued_after_s: float,
    reads: TabReads | None = None,
) -> Tabs:
    """Every attention tab: failed sessions; sessions with an open run waiting for a
    person, for a job, overdue, orphaned, or running a retry (by
    :func:`flowscope.liveness.classify_open_run`, the rule ``stuck`` applies, to the runs
    ``stuck`` lists: an enclosing run, whose open state is its descendant's, is left out
    by :func:`flowscope.cli.rowparts.open_containers`, so a session is not also under the
    enclosing workflow's state, e.g. waiting for a job when its one job is overdue; a
    retried enclosing run still puts its session under retrying); and queued
    sessions submitted more than ``queued_after_s`` ago, with answered ones (whose
    waiting runs the rule calls queued: a worker's to resume) answered that long ago.
    ``reads`` (:func:`read_tabs`, read now if not given) may be older than ``now``: the
    rule is applied at ``now``."""
    reads = read_tabs(store) if reads is None else reads
    long_queued = SessionQuery(statuses=frozenset({"queued"}), submitted_until=now - queued_after_s)
    long_answered: set[str] = set()
    ids: dict[str, set[str]] = {
        k: set() for k in ("waiting_input", "waiting_job", "overdue", "orphaned", "retrying")
    }
    for r in reads.runs:
        state = classify_run(
            r, reads.running.get(r.session_id) or reads.answered.get(r.session_id), now, stale_after_s
        )
        if state == QUEUED:
            answered_at = reads.answered[r.session_id].updated_at
            if answered_at is not None and answered_at <= now - queued_after_s:
                long_answered.add(r.session_id)
        elif state == RUNNING and r.retries:
            ids["retrying"].add(r.session_id)
        elif (
            state in (WAITING_INPUT, WAITING_JOB, OVERDUE, ORPHANED)
            and (r.session_id, r.path) not in reads.enclosing
        ):
            ids[state].add(r.session_id)  # an enclosing run's state is its descendant's, counted there
    if long_answered:  # rare (no worker for a while): the tab is a set of ids, its queued ones read
        if reads.statuses.get("queued"):
            long_answered.update(s.session_id for s in store.find_sessions(long_queued))
        long_queued = SessionQuery(session_ids=frozenset(long_answered))
    queries = {
        "failed": SessionQuery(statuses=frozenset({"failed"})),
        **{k: SessionQuery(session_ids=frozenset(v)) for k, v in ids.items()},
        "queued_too_long": long_queued,
    }
    counts = {
        "failed": reads.statuses.get("failed", 0),
        **{k: len(v) for k, v in ids.items()},
        "queued_too_long": sum(store.status_counts(long_queued).values())
        if reads.statuses.get("queued") or long_answered
        else 0,
    }
    return Tabs({k: queries[k] for k in ATTENTION}, {k: counts[k] for k in ATTENTION}, reads.statuses)
