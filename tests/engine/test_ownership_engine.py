"""Engine side, with real processes on a real SQLite file: a killed owner is
orphaned at once, a blocked owner keeps its lease, a stopped owner is fenced off."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from commands import cli_ok
from flowscope import Runner
from flowscope.errors import ConcurrencyConflict
from flowscope.liveness import owner_alive
from flowscope.store.sqlite import SqliteEventStore
from waiting import wait_for

HERE = Path(__file__).resolve().parents[1]
PROC = str(HERE / "ownership_proc.py")

pytestmark = pytest.mark.slow


def start(db: Path, effects: Path, mode: str, lease_s: float, session: str = "s") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, PROC, str(db), str(effects), session, mode, str(lease_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """:func:`~waiting.wait_for` ``path`` to exist, failing at once if ``proc`` ends first."""

    def there() -> bool:
        if path.exists():
            return True
        if proc.poll() is not None:
            raise AssertionError(f"the process ended before {path.name}: {proc.communicate()}")
        return False

    wait_for(there, timeout, f"{path.name}", interval=0.01)


def effects_of(effects: Path) -> list[tuple[int, str, int]]:
    out = []
    for line in effects.read_text().splitlines():
        pid, path, attempt = line.split()
        out.append((int(pid), path, int(attempt)))
    return out


def completions(events) -> Counter[str]:
    return Counter(e.path for e in events if e.type == "node_completed")


def kill_mid_node(tmp_path: Path) -> tuple[Path, Path, int]:
    db, effects = tmp_path / "kill.db", tmp_path / "kill.effects"
    owner = start(db, effects, "run-hang", 15.0)
    wait_for_file(Path(str(effects) + ".hanging"), owner)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    return db, effects, owner.pid


def test_a_killed_owner_is_orphaned_at_once_and_resumed_without_force(tmp_path):
    db, effects, pid = kill_mid_node(tmp_path)
    info = SqliteEventStore(db).session_info("s")
    assert info is not None and info.status == "running" and info.owner is not None and info.owner.pid == pid
    now = time.time()
    assert (
        info.lease_expires_at is not None and info.lease_expires_at > now + 10
    )  # the lease has ~15 s left...
    assert not owner_alive(info.owner, info.lease_expires_at, now)  # ...but its process is gone: orphaned
    launched = time.time()
    resumer = start(db, effects, "resume", 15.0)
    out, err = resumer.communicate(timeout=60)
    assert out.split()[:2] == ["completed", "4"], (out, err)
    # the new process took the session as soon as it was up: no lease to wait out, no force
    events = SqliteEventStore(db).read("s")
    started = [e for e in events if e.type == "run_started"]
    assert len(started) == 2 and started[1].resumed
    assert started[1].ts - launched < 1.0
    assert sorted(completions(events).values()) == [1, 1, 1, 1]
    hang = [(p, a) for p, path, a in effects_of(effects) if "/hang@" in path]
    assert [a for _, a in hang] == [1, 2] and hang[0][0] == pid and hang[1][0] != pid


def test_flowscope_stuck_lists_a_killed_owners_run_as_orphaned(tmp_path):
    db, _effects, _pid = kill_mid_node(tmp_path)
    rows = json.loads(cli_ok("stuck", "--db", str(db), "--format", "json", "--older-than", "0s"))
    states = {r["path"]: r["state"] for r in rows if r["session_id"] == "s"}
    assert states.get("owned@1/hang@1") == "orphaned" and set(states.values()) == {"orphaned"}, rows


def test_a_sync_node_that_blocks_the_loop_keeps_its_lease(tmp_path):
    """3 x lease_s with the loop blocked: another process's resume() is refused every time,
    and the blocked node's side effect happens once."""
    db, effects = tmp_path / "block.db", tmp_path / "block.effects"
    lease_s = 1.0
    owner = start(db, effects, "run-block", lease_s)
    wait_for_file(Path(str(effects) + ".blocking"), owner)
    sys.path.insert(0, str(HERE))
    import ownership_proc

    runner = Runner(ownership_proc.build(str(effects), lease_s), store=SqliteEventStore(db), lease_s=lease_s)
    refusals = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.5 * lease_s:  # well past the lease the owner took
        with pytest.raises(ConcurrencyConflict) as info:
            runner.resume_sync("s")
        refusals.append(str(info.value))
        time.sleep(0.4)
    assert len(refusals) >= 3  # every try refused, however slow the machine makes each
    assert f"pid {owner.pid}" in refusals[-1] and "ago" in refusals[-1]
    out, err = owner.communicate(timeout=60)
    assert out.split()[:2] == ["completed", "4"], (out, err)
    assert [(path.split("/")[-1], a) for _, path, a in effects_of(effects)] == [
        ("first@1", 1),
        ("block@1", 1),
        ("last@1", 1),
    ]
    events = SqliteEventStore(db).read("s")
    assert len([e for e in events if e.type == "run_started"]) == 1


def test_a_stopped_owner_is_fenced_off_after_its_lease(tmp_path):
    """SIGSTOP past the lease: another process takes over and completes; after SIGCONT the
    first gets LeaseLost and appends nothing; every node has one completion."""
    db, effects = tmp_path / "stop.db", tmp_path / "stop.effects"
    lease_s = 1.0
    owner = start(db, effects, "run-hang", lease_s)
    wait_for_file(Path(str(effects) + ".hanging"), owner)
    owner.send_signal(signal.SIGSTOP)
    try:
        time.sleep(lease_s * 1.6)
        taker = start(db, effects, "resume", lease_s)
        out, err = taker.communicate(timeout=60)
        assert out.split()[:2] == ["completed", "4"], (out, err)
        before = SqliteEventStore(db).read("s")
    finally:
        owner.send_signal(signal.SIGCONT)
    out, err = owner.communicate(timeout=60)
    assert out.strip() == "lease_lost", (out, err)
    events = SqliteEventStore(db).read("s")
    assert [e.seq for e in events] == [e.seq for e in before]  # the fenced owner appended nothing
    first_inv = events[0].invocation_id
    taken_at = next(e.seq for e in events if e.type == "run_started" and e.invocation_id != first_inv)
    assert all(e.seq < taken_at for e in events if e.invocation_id == first_inv)
    assert sorted(completions(events).values()) == [1, 1, 1, 1]  # owned@1, first, hang, last
    assert not any(e.type == "node_error" for e in events)
