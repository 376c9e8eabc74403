"""The owner record and process identity: a process is the one that started at its start
id, whatever the wall clock did since."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from flowscope.ownership import Owner, process_alive, process_start_id, process_start_time, this_process
from flowscope.store.testing import step_wall_clock


@pytest.fixture
def child():
    """A live process of this host, killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(100):  # /proc may lag the fork by a moment
            if process_start_id(proc.pid) is not None:
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def owner_of(pid: int) -> Owner:
    return Owner("w", "h", pid, process_start_time(pid), start_id=process_start_id(pid))


@pytest.mark.parametrize("step_s", [3600.0, -3600.0, 2.0, -2.0])
def test_a_live_process_is_alive_however_far_the_wall_clock_steps(child, monkeypatch, step_s):
    owner = owner_of(child.pid)
    step_wall_clock(monkeypatch, step_s)
    assert process_alive(owner.pid, owner.started_at, owner.start_id)
    # the epoch start time moved with the clock: it names the process for people only
    assert process_start_time(child.pid) == pytest.approx(owner.started_at + step_s, abs=0.05)


def test_a_pid_that_started_at_another_tick_or_boot_is_another_process(child):
    owner = owner_of(child.pid)
    assert owner.start_id is not None
    boot, ticks = owner.start_id.rsplit(":", 1)
    # the epoch start time agrees; the start id decides
    assert not process_alive(child.pid, owner.started_at, f"{boot}:{int(ticks) + 1}")
    assert not process_alive(child.pid, owner.started_at, f"00000000-0000-0000-0000-000000000000:{ticks}")


def test_a_killed_process_is_gone(child):
    owner = owner_of(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert not process_alive(owner.pid, owner.started_at, owner.start_id)


def test_a_record_without_a_start_id_is_judged_by_its_epoch_start_time(child):
    # owners recorded before start ids (and where /proc is absent) still read
    started = process_start_time(child.pid)
    assert started is not None
    assert process_alive(child.pid, started)
    assert not process_alive(child.pid, started - 5.0)
    assert process_alive(child.pid, None)


def test_the_owner_record_keeps_its_start_id_and_reads_records_without_one():
    me = this_process("w-1")
    assert me.start_id == process_start_id(os.getpid()) and me.start_id is not None
    assert Owner.from_dict(me.to_dict()) == me
    old = {k: v for k, v in me.to_dict().items() if k != "start_id"}
    assert Owner.from_dict(old) == dataclasses.replace(me, start_id=None)
