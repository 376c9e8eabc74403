"""Who runs a session: the owner record, its lease, and whether its process still lives.

An owner is a process, named so that it can be recognised from another process and
another host: a ``worker_id``, the ``host`` (``FLOWSCOPE_HOST`` or the hostname), the
``pid`` and that process's start time, so that a pid the kernel has reused for another
program is never taken for the owner. A :class:`Lease` is an owner's claim on one session
until ``expires_at``, under an ``epoch`` that every takeover advances (the fence).
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

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "worker_id": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "started_at": self.started_at,
        }
        if self.ships_spans:  # absent otherwise: records written before the flag read the same
            d["ships_spans"] = True
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
        )

    def describe(self) -> str:
        """``worker-id on host pid 1234``, for messages."""
        return f"{self.worker_id} on {self.host} pid {self.pid}"


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


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started, in epoch seconds, or None if unknown or not running.

    Read from ``/proc/<pid>/stat`` (field 22, clock ticks since boot) and the boot time
    (:func:`_boot_time`). Two reads of the same process agree to the tick unless the wall
    clock was adjusted in between (then they differ by the adjustment), so a value a second
    or more away means a different process.
    """
    boot = _boot_time()
    if boot is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        ticks = int(fields[19])
    except (IndexError, ValueError):
        return None
    return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 2)


def process_alive(pid: int, started_at: float | None) -> bool:
    """Whether the process ``pid`` that started at ``started_at`` is still running here.

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
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        state = raw[raw.rfind(b")") + 2 :].split()[0]
        if state in (b"Z", b"X"):
            return False
    except (OSError, IndexError):
        pass
    if started_at is None:
        return True
    now_started = process_start_time(pid)
    return now_started is None or abs(now_started - started_at) < 1.0


@lru_cache(maxsize=1)
def _this_pid_start() -> tuple[int, float | None]:
    pid = os.getpid()
    return pid, process_start_time(pid)


def this_process(worker_id: str | None = None, *, ships_spans: bool = False) -> Owner:
    """The owner record of the calling process (a new ``worker_id`` unless one is given);
    ``ships_spans``: its plugins ship its sessions' spans (:attr:`Owner.ships_spans`)."""
    pid, started = _this_pid_start()
    if pid != os.getpid():  # forked since the cache was filled
        _this_pid_start.cache_clear()
        pid, started = _this_pid_start()
    return Owner(
        worker_id=worker_id or f"{this_host()}-{pid}-{uuid.uuid4().hex[:8]}",
        host=this_host(),
        pid=pid,
        started_at=started,
        ships_spans=ships_spans,
    )
