"""The one liveness rule: when is an open run alive, orphaned or overdue.

``resume()``, ``flowscope stuck``, the ``StoreCollector``, a worker's claim and the
stores' SQL all ask the questions answered here, so a run is called the same thing
everywhere. A session with an owner recorded is alive while :func:`owner_alive` says so
(its lease is current and, on this host, its process exists); a session without one
(written by a bridge or an older flowscope) falls back to the age of its heartbeats. An SQL store
may evaluate the same predicates in a query for speed; it takes its cut-off from
:func:`stale_before` and the store contract (:mod:`flowscope.store.testing`) checks that
its answers equal :func:`classify_open_run` on a table of cases.
"""

from __future__ import annotations

from collections.abc import Sequence

from .ownership import Owner, process_alive, this_host

__all__ = [
    "owner_alive",
    "lease_held",
    "process_gone",
    "worker_alive",
    "WORKER_SEEN_WITHIN_S",
    "ships_own_spans",
    "SPAN_HANDOVER_S",
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "resume_lease_s",
    "RUNNING",
    "ORPHANED",
    "WAITING_INPUT",
    "WAITING_JOB",
    "OVERDUE",
    "QUEUED",
    "OPEN_RUN_CLASSES",
    "waits_for_worker",
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
#: What ``flowscope stuck`` calls work that waits for a worker to run it: a session
#: submitted and never started, or a waiting run whose wait is over (:func:`waits_for_worker`).
QUEUED = "queued"


def resume_lease_s(heartbeat_interval: float) -> float:
    """How long a session stays owned after its last heartbeat: three missed beats.

    A ``resume()`` within that window is refused (another process may still be running
    the session); after it, the session is taken over. The floor of one second keeps a
    zero interval (heartbeats off) from making every session look abandoned at once.
    """
    return 3 * max(heartbeat_interval, 1.0)


def owner_alive(
    owner: Owner | None, lease_expires_at: float | None, now: float, *, host: str | None = None
) -> bool:
    """Whether ``owner`` still holds its lease on a session: the one ownership rule.

    False without an owner or a lease, once the lease has expired (``lease_expires_at <=
    now``; a released lease is 0), and at once when the owner is on this host (``host``,
    default :func:`~flowscope.ownership.this_host`) and its process is gone. An owner on
    another host is taken at its lease's word.
    """
    if not lease_held(owner, lease_expires_at, now):
        return False
    assert owner is not None
    # same host: the lease is not enough, the process must still be there
    return not process_gone(owner, host=host)


def lease_held(owner: Owner | None, lease_expires_at: float | None, now: float) -> bool:
    """The lease half of :func:`owner_alive`: an owner, and a lease that has not ended
    (expiry after ``now``; a released lease is 0)."""
    return owner is not None and lease_expires_at is not None and lease_expires_at > now


def process_gone(owner: Owner, *, host: str | None = None) -> bool:
    """The process half of :func:`owner_alive`: ``owner`` is on this host (``host``,
    default :func:`~flowscope.ownership.this_host`) and its process is gone. An owner on
    another host is never judged gone here: its lease speaks for it."""
    return owner.host == (host or this_host()) and not process_alive(
        owner.pid, owner.started_at, owner.start_id
    )


#: How recently a worker must have recorded itself (``EventStore.workers_seen``) to count
#: as alive: one default lease (workers record themselves every third of theirs).
WORKER_SEEN_WITHIN_S = 15.0


def worker_alive(
    host: str,
    pid: int,
    seen_at: float,
    now: float,
    *,
    within_s: float = WORKER_SEEN_WITHIN_S,
    local: str | None = None,
) -> bool:
    """Whether a worker that recorded itself on ``host`` as ``pid`` at ``seen_at`` is alive:
    :func:`owner_alive` with its record as the lease (``seen_at + within_s``), so a worker
    not seen within a lease, or whose process is gone on this host (``local``, default
    :func:`~flowscope.ownership.this_host`), is not a worker that will pick anything up."""
    return owner_alive(Owner("", host, pid, None), seen_at + within_s, now, host=local)


#: How long after its last event a session whose owner ships its own spans is left to it
#: once the lease is released: the owner's batch processor may still hold the last spans.
SPAN_HANDOVER_S = 30.0


def ships_own_spans(
    owner: Owner | None,
    lease_expires_at: float | None,
    updated_at: float | None,
    now: float,
    *,
    grace_s: float = SPAN_HANDOVER_S,
    host: str | None = None,
) -> bool:
    """Whether a session's spans are its owner's to ship, not a follower's
    (``flowscope export --follow``, ``serve-metrics``): the owner ships spans itself
    (:attr:`~flowscope.ownership.Owner.ships_spans`) and holds its lease, or released it
    (expiry 0) less than ``grace_s`` before ``now`` with its process still alive (on this
    host; another host's is taken at its word). A dead owner's spans, or those of one whose
    lease ran out, are the follower's at once."""
    if owner is None or not owner.ships_spans:
        return False
    if owner_alive(owner, lease_expires_at, now, host=host):
        return True
    if lease_expires_at != 0 or updated_at is None or now - updated_at >= grace_s:
        return False
    if owner.host == (host or this_host()):
        return process_alive(owner.pid, owner.started_at, owner.start_id)
    return True


def stale_before(now: float, stale_after_s: float) -> float:
    """The cut-off: a running run whose last sign of life is strictly before this is orphaned."""
    return now - stale_after_s


def is_orphaned(
    started_at: float | None, last_heartbeat: float | None, now: float, stale_after_s: float
) -> bool:
    """A ``running`` run is orphaned when its last heartbeat (its start, if it never beat)
    is older than ``stale_after_s``, or when it has neither: its worker is gone."""
    beat = last_heartbeat if last_heartbeat is not None else started_at
    return beat is None or beat < stale_before(now, stale_after_s)


def is_overdue(job_deadline_at: float | None, now: float) -> bool:
    """A ``waiting_job`` run is overdue when its job has a deadline and ``now`` is past it."""
    return job_deadline_at is not None and job_deadline_at < now


def waits_for_worker(state: str, session_status: str | None, waiting_on: Sequence[str] | None = None) -> bool:
    """Whether a run in ``state`` waiting for a person or a job waits for a worker instead:
    its session is ``answered`` (its input or job result recorded, for the next invocation to
    take in) or, ``waiting_on`` known, nothing it waited on is open. An answer is given once,
    so ``resume --input`` or ``--job`` would be refused: a worker, or ``resume SESSION``,
    continues it, as it starts a queued session."""
    if state not in (WAITING_INPUT, WAITING_JOB):
        return False
    return session_status == "answered" or (waiting_on is not None and not waiting_on)


def classify_open_run(
    state: str,
    started_at: float | None,
    last_heartbeat: float | None,
    deadline: float | None,
    now: float,
    stale_after_s: float,
    *,
    owner: Owner | None = None,
    lease_expires_at: float | None = None,
    host: str | None = None,
    session_status: str | None = None,
    waiting_on: Sequence[str] | None = None,
) -> str:
    """``running``, ``orphaned``, ``waiting_input``, ``waiting_job``, ``overdue`` or ``queued``.

    ``state`` is the run's status in the fold (one of ``flowscope.fold.OPEN_STATES``);
    ``deadline`` is its job's ``job_deadline_at``. Any other status is returned as is.
    ``owner`` and ``lease_expires_at`` are its session's: a running run of a session with
    an owner is orphaned exactly when :func:`owner_alive` is false; without an owner, when
    its heartbeat is older than ``stale_after_s`` (:func:`is_orphaned`). A waiting run
    whose wait is over (:func:`waits_for_worker` of ``session_status``, its session's, and
    ``waiting_on``, its open request or job ids if known) is ``queued``: a worker resumes it.
    """
    if waits_for_worker(state, session_status, waiting_on):
        return QUEUED
    if state == RUNNING:
        if owner is not None:
            return RUNNING if owner_alive(owner, lease_expires_at, now, host=host) else ORPHANED
        return ORPHANED if is_orphaned(started_at, last_heartbeat, now, stale_after_s) else RUNNING
    if state == WAITING_JOB:
        return OVERDUE if is_overdue(deadline, now) else WAITING_JOB
    return state
