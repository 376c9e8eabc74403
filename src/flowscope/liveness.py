"""The one liveness rule: when is an open run alive, orphaned or overdue.

``resume()``, ``flowscope stuck``, the ``StoreCollector`` and the stores' SQL all ask
the questions answered here, so a run is called the same thing everywhere. An SQL store
may evaluate the same predicates in a query for speed; it takes its cut-off from
:func:`stale_before` and the store contract (:mod:`flowscope.store.testing`) checks that
its answers equal :func:`classify_open_run` on a table of cases.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "resume_lease_s",
    "RUNNING",
    "ORPHANED",
    "WAITING_INPUT",
    "WAITING_JOB",
    "OVERDUE",
    "OPEN_RUN_CLASSES",
    "stale_before",
    "is_orphaned",
    "is_overdue",
    "classify_open_run",
]

DEFAULT_HEARTBEAT_INTERVAL_S = 5.0

#: What :func:`classify_open_run` calls an open run.
RUNNING = "running"
ORPHANED = "orphaned"
WAITING_INPUT = "waiting_input"
WAITING_JOB = "waiting_job"
OVERDUE = "overdue"
OPEN_RUN_CLASSES = (RUNNING, ORPHANED, WAITING_INPUT, WAITING_JOB, OVERDUE)


def resume_lease_s(heartbeat_interval: float) -> float:
    """How long a session stays owned after its last heartbeat: three missed beats.

    A ``resume()`` within that window is refused (another process may still be running
    the session); after it, the session is taken over. The floor of one second keeps a
    zero interval (heartbeats off) from making every session look abandoned at once.
    """
    return 3 * max(heartbeat_interval, 1.0)


def stale_before(now: float, stale_after_s: float) -> float:
    """The cut-off: a running run whose last sign of life is strictly before this is orphaned."""
    return now - stale_after_s


def is_orphaned(started_at: float | None, last_heartbeat: float | None, now: float, stale_after_s: float) -> bool:
    """A ``running`` run is orphaned when its last heartbeat (its start, if it never beat)
    is older than ``stale_after_s``, or when it has neither: its worker is gone."""
    beat = last_heartbeat if last_heartbeat is not None else started_at
    return beat is None or beat < stale_before(now, stale_after_s)


def is_overdue(job_deadline_at: float | None, now: float) -> bool:
    """A ``waiting_job`` run is overdue when its job has a deadline and ``now`` is past it."""
    return job_deadline_at is not None and job_deadline_at < now


def classify_open_run(
    state: str,
    started_at: float | None,
    last_heartbeat: float | None,
    deadline: float | None,
    now: float,
    stale_after_s: float,
) -> str:
    """``running``, ``orphaned``, ``waiting_input``, ``waiting_job`` or ``overdue``.

    ``state`` is the run's status in the fold (one of ``flowscope.fold.OPEN_STATES``);
    ``deadline`` is its job's ``job_deadline_at``. Any other status is returned as is.
    """
    if state == RUNNING:
        return ORPHANED if is_orphaned(started_at, last_heartbeat, now, stale_after_s) else RUNNING
    if state == WAITING_JOB:
        return OVERDUE if is_overdue(deadline, now) else WAITING_JOB
    return state
