"""Who runs a session: the owner record, its lease, and whether its process still lives.

An owner is a process, named so that it can be recognised from another process and
another host: a ``worker_id``, the ``host`` (``FLOWSCOPE_HOST`` or the hostname), the
``pid`` and that process's start, so that a pid the kernel has reused for another
program is never taken for the owner. The start is compared as the kernel counts it
(:func:`process_start_id`), never through the wall clock, which may be stepped. A
:class:`Lease` is an owner's claim on one session until ``expires_at``, under an
``epoch`` that every takeover advances (the fence).
The rule that turns these into "alive" or "orphaned" lives in :mod:`flowscope.liveness`.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = [
    "Owner",
    "Lease",
    "owner_record",
    "this_host",
    "this_process",
    "process_start_time",
    "process_start_id",
    "process_alive",
]


@dataclass(frozen=True, slots=True)
class Owner:
    """The process that runs (or last ran) a session."""

    worker_id: str
    host: str
    pid: int
    #: The process's start time in epoch seconds (None where the platform cannot say).
    started_at: float | None
    #: The owner ships its sessions' spans itself and records what it shipped (a tracing
    #: plugin with a WatermarkExporter): span followers leave its live sessions to it.
    ships_spans: bool = False
    #: The process's start as the kernel counts it (:func:`process_start_id`), which no
    #: wall-clock step moves; None in records written before it and where /proc is absent.
    start_id: str | None = None
    #: The owner holds sessions only for the moment it takes their inbox in (an operator's
    #: answer, cancel or retry, ``flowscope.actions.deliver``), never to run them: another
    #: sender waits that moment out rather than take it for the session's live owner.
    sender: bool = False
    #: The owner handed the session back as it drained (a worker's SIGTERM): the runs it
    #: left running were cut off, not crashed, and whoever takes it next does not count
    #: them as recoveries. Written with the released lease, by the owner itself.
    handed_back: bool = False

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "worker_id": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "started_at": self.started_at,
        }
        if self.ships_spans:  # absent otherwise: records written before the flag read the same
            d["ships_spans"] = True
        if self.start_id is not None:
            d["start_id"] = self.start_id
        if self.sender:  # absent otherwise, as ships_spans
            d["sender"] = True
        if self.handed_back:  # absent otherwise, as ships_spans
            d["handed_back"] = True
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Owner:
        started = data.get("started_at")
        return cls(
            worker_id=str(data.get("worker_id") or ""),
            host=str(data.get("host") or ""),
            pid=int(data.get("pid") or 0),
            started_at=float(started) if started is not None else None,
            ships_spans=bool(data.get("ships_spans", False)),
            start_id=str(data["start_id"]) if data.get("start_id") is not None else None,
            sender=bool(data.get("sender", False)),
            handed_back=bool(data.get("handed_back", False)),
        )

    def describe(self) -> str:
        """``worker-id on host pid 1234``, for messages; an owner of no host (its record
        could not be read) is its id alone."""
        return f"{self.worker_id} on {self.host} pid {self.pid}" if self.host else self.worker_id


@dataclass(frozen=True, slots=True)
class Lease:
    """An owner's hold on a session until ``expires_at``, under fencing ``epoch``."""

    session_id: str
    owner: Owner
    epoch: int
    expires_at: float


def owner_record(owner: Owner) -> dict[str, Any]:
    """What an invocation's ``RunStarted.owner`` records of the process that runs it: enough
    to name the worker of each attempt (its id, host and pid), not the liveness details."""
    return {"worker_id": owner.worker_id, "host": owner.host, "pid": owner.pid}


def this_host() -> str:
    """``FLOWSCOPE_HOST`` when set (containers, tests posing as several hosts), else the hostname."""
    return os.environ.get("FLOWSCOPE_HOST") or socket.gethostname()


def _boot_time() -> float | None:
    """When this host booted, in epoch seconds, to about a millisecond, read afresh.

    The wall clock minus ``CLOCK_BOOTTIME``, the clock ``/proc/<pid>/stat`` counts start
    times on. Not the whole-second ``btime`` of ``/proc/stat``, and not cached: a wall-clock
    adjustment of a few milliseconds can move ``btime`` by a whole second, and an owner's
    start time written before it would then look like another process's (a live owner
    reported dead, its session claimed). Read this way, an adjustment shifts a start time
    by its own size. None where the platform has no such clock.
    """
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return None
    before = time.clock_gettime(boottime)
    wall = time.clock_gettime(time.CLOCK_REALTIME)
    after = time.clock_gettime(boottime)  # the midpoint halves the error of a preemption in between
    return wall - (before + after) / 2


def _stat(pid: int) -> tuple[bytes, int] | None:
    """Process ``pid``'s state letter and start (clock ticks since boot, field 22 of
    ``/proc/<pid>/stat``), or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


@lru_cache(maxsize=1)
def _boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``): ticks since boot name a start
    only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started, in epoch seconds, or None if unknown or not running.

    The start in ticks since boot plus the boot time (:func:`_boot_time`): for people and
    for records without a :func:`process_start_id`. Two reads of the same process agree to
    the tick unless the wall clock was adjusted in between (then they differ by the
    adjustment), which is why the liveness rule compares start ids instead.
    """
    boot = _boot_time()
    stat = _stat(pid)
    if boot is None or stat is None:
        return None
    return round(boot + stat[1] / os.sysconf("SC_CLK_TCK"), 2)


def process_start_id(pid: int) -> str | None:
    """Process ``pid``'s start as the kernel counts it, ``<boot id>:<ticks since boot>``, or
    None if unknown or not running. No wall clock is read, so an NTP step, a VM resumed
    from suspend or an operator's ``date -s`` leaves it unchanged: a live owner is never
    taken for a dead one because the clock moved (the epoch start time would move with it)."""
    stat = _stat(pid)
    return None if stat is None else _start_id(stat[1])


def _start_id(ticks: int) -> str | None:
    """The start id of a process of this boot that started ``ticks`` after it."""
    boot = _boot_id()
    return None if boot is None else f"{boot}:{ticks}"


def process_alive(pid: int, started_at: float | None, start_id: str | None = None) -> bool:
    """Whether the process ``pid`` that started at ``start_id`` (or, in a record without
    one, at epoch ``started_at``) is still running here.

    A zombie (killed, not yet reaped) counts as gone. A pid now used by a process that
    started at another time is a different process, so the owner is gone.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    stat = _stat(pid)
    if stat is not None and stat[0] in (b"Z", b"X"):
        return False
    if start_id is not None:
        now_id = None if stat is None else _start_id(stat[1])
        return now_id is None or now_id == start_id
    if started_at is None:
        return True
    now_started = process_start_time(pid)
    return now_started is None or abs(now_started - started_at) < 1.0


@lru_cache(maxsize=1)
def _this_pid_start() -> tuple[int, float | None, str | None]:
    pid = os.getpid()
    return pid, process_start_time(pid), process_start_id(pid)


def this_process(worker_id: str | None = None, *, ships_spans: bool = False) -> Owner:
    """The owner record of the calling process (a new ``worker_id`` unless one is given);
    ``ships_spans``: its plugins ship its sessions' spans (:attr:`Owner.ships_spans`)."""
    pid, started, start_id = _this_pid_start()
    if pid != os.getpid():  # forked since the cache was filled
        _this_pid_start.cache_clear()
        pid, started, start_id = _this_pid_start()
    return Owner(
        worker_id=worker_id or f"{this_host()}-{pid}-{uuid.uuid4().hex[:8]}",
        host=this_host(),
        pid=pid,
        started_at=started,
        ships_spans=ships_spans,
        start_id=start_id,
    )
