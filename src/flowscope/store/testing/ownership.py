"""The ownership role's contract: :class:`OwnershipContract`."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from ... import ownership
from ...errors import ConcurrencyConflict, LeaseLost
from ...events import (
    NodeCompleted,
    NodeStarted,
    RunFinished,
    RunStarted,
    StateUpdated,
)
from ...liveness import ORPHANED, RUNNING, classify_open_run
from ...ownership import Lease, Owner, this_process
from ..base import (
    EventStore,
    summarize_open_runs,
)
from .claim_limit import ClaimLimitContract
from .helpers import (
    SID,
    answer_events,
    dead_owner,
    ev,
    hold_running,
    node_ev,
    other_host_owner,
    paused_log,
    process_checks,
    run_of,
    submitted_log,
)
from .lease_end import LeaseEndContract
from .lease_start import LeaseStartContract

__all__ = ["OwnershipContract", "step_wall_clock"]


def step_wall_clock(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    """Step the wall clock by ``by_s`` seconds as :mod:`flowscope.ownership` reads it
    (``time.time`` and ``CLOCK_REALTIME``); the kernel's clocks since boot do not move."""
    real = time

    class Stepped:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def time(self) -> float:
            return real.time() + by_s

        def clock_gettime(self, clock: int) -> float:
            t = real.clock_gettime(clock)
            return t + by_s if clock == real.CLOCK_REALTIME else t

    monkeypatch.setattr(ownership, "time", Stepped())


class OwnershipContract(LeaseStartContract, LeaseEndContract, ClaimLimitContract):
    """What every :class:`~flowscope.store.ownership.Ownership` must do (over its event
    log): leases (starting when the session is taken: :class:`LeaseStartContract`, whose
    :meth:`~LeaseStartContract.hold_writes` an adapter gives; ending at their expiry:
    :class:`LeaseEndContract`), the fence on appends, claims (what one with a limit takes:
    :class:`ClaimLimitContract`), and the workers seen."""

    def create_store(self) -> EventStore:
        """A new, empty store for one test: ownership fences the log, so it is a whole store."""
        raise NotImplementedError  # abstract

    def open_again(self, store: EventStore) -> EventStore | None:
        """A second handle on ``store``'s data (another connection, as another process
        would have), or None if the store cannot have one (then the claim race runs
        on the one object from two threads). The caller closes it."""
        return None

    def test_acquire_records_owner_epoch_and_lease_on_the_session(self, store: EventStore) -> None:
        me = this_process("w-1")
        lease = store.acquire(SID, me, 15.0, now=1000.0)  # the session need not exist yet
        assert lease == Lease(SID, me, 1, 1015.0)
        assert store.sessions() == [] and store.session_info(SID) is None  # no event, no session
        store.append(SID, [ev(RunStarted, workflow="w", ts=1000.5)], 0, epoch=lease.epoch)
        [info] = store.sessions()
        assert (info.owner, info.epoch, info.lease_expires_at, info.status) == (me, 1, 1015.0, "running")
        assert store.session_info(SID) == info
        assert store.session_info("nobody") is None

    def test_a_session_its_owner_handed_back_is_claimed_as_no_recovery(self, store: EventStore) -> None:
        # A draining worker releases what it still runs, saying so in its owner record: the
        # next taker gets an orphan, told handed back, and no recovery is counted against
        # it (max_recoveries=0 would leave an orphan recovered once alone).
        now = 1000.0
        store.acquire("h", other_host_owner(), 10.0, now=now)
        store.append("h", [ev(RunStarted, sid="h", workflow="wf", ts=now)], 0, epoch=1)
        t = now
        for i in range(3):
            holder = other_host_owner(f"w-{i}", pid=10 + i)
            if i:
                store.acquire("h", holder, 10.0, now=t, force=True)
            store.acquire("h", dataclasses.replace(holder, handed_back=True), 0.0, now=t, force=True)
            info = store.session_info("h")
            assert info is not None and info.owner is not None and info.owner.handed_back
            t += 1.0
            [c] = store.claim(
                other_host_owner("w-next", pid=99), ["wf"], 10.0, limit=5, max_recoveries=0, now=t
            )
            assert (c.session_id, c.reason, c.handed_back) == ("h", "orphaned", True)
        t += 20.0  # that claimer's lease runs out: an orphan of a dead owner, recovered once
        [c] = store.claim(other_host_owner("w-last", pid=98), ["wf"], 10.0, limit=5, max_recoveries=0, now=t)
        assert (c.reason, c.handed_back) == ("orphaned", False)
        assert (
            store.claim(
                other_host_owner("w-more", pid=97), ["wf"], 10.0, limit=5, max_recoveries=0, now=t + 20
            )
            == []
        )

    def test_the_owner_record_keeps_whether_it_ships_its_own_spans(self, store: EventStore) -> None:
        shipper = dataclasses.replace(this_process("w-1"), ships_spans=True)
        lease = store.acquire("a", shipper, 15.0, now=1000.0)
        store.append("a", [ev(RunStarted, sid="a", workflow="w", ts=1000.5)], 0, epoch=lease.epoch)
        plain = store.acquire("b", this_process("w-2"), 15.0, now=1000.0)
        store.append("b", [ev(RunStarted, sid="b", workflow="w", ts=1000.5)], 0, epoch=plain.epoch)
        a, b = store.session_info("a"), store.session_info("b")
        assert a is not None and a.owner == shipper and a.owner.ships_spans
        assert b is not None and b.owner is not None and not b.owner.ships_spans

    def test_acquire_refuses_a_live_owner_naming_host_pid_and_lease_age(self, store: EventStore) -> None:
        now = time.time()
        holder = this_process("w-holder")  # this very process: alive
        store.acquire(SID, holder, 15.0, now=now - 2.0)
        with pytest.raises(ConcurrencyConflict) as err:
            store.acquire(SID, this_process("w-other"), 15.0, now=now)
        assert not isinstance(err.value, LeaseLost)
        msg = str(err.value)
        assert f"{holder.worker_id} on {holder.host} pid {holder.pid}" in msg, msg
        assert "renewed 2.0s ago" in msg and "expires in 13.0s" in msg, msg
        info = store.session_info(SID)
        assert info is None or info.epoch == 1  # nothing changed
        # a live owner on another host is refused too, while its lease lasts
        far = other_host_owner()
        store.acquire("s2", far, 10.0, now=now)
        with pytest.raises(ConcurrencyConflict, match=f"pid {far.pid}"):
            store.acquire("s2", this_process("w-other"), 10.0, now=now + 9.9)

    @pytest.mark.parametrize("step_s", [3600.0, -3600.0, 2.0])
    def test_a_live_owner_is_refused_after_the_wall_clock_steps(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch, step_s: float
    ) -> None:
        # An NTP step, a VM resumed from suspend, an operator's date -s: the owner's
        # process is the same process, however far the wall clock moved since it started.
        now = time.time()
        holder = this_process("w-holder")
        [running] = hold_running(store, holder, 1, now)
        store.acquire(SID, holder, 15.0, now=now)
        step_wall_clock(monkeypatch, step_s)
        other = this_process("w-other")
        with pytest.raises(ConcurrencyConflict, match=f"pid {holder.pid}"):
            store.acquire(SID, other, 15.0, now=now + 1.0)
        assert store.claim(other, ["wf"], 15.0, limit=10, now=now + 1.0) == []
        [group] = store.open_run_summary(now=now + 1.0, stale_after_s=60.0)
        assert (group.count, group.orphaned) == (1, 0)
        for sid in (SID, running):
            info = store.session_info(sid)
            assert info is None or (info.owner, info.epoch) == (holder, 1)

    def test_acquire_by_the_same_owner_or_with_force_advances_the_epoch(self, store: EventStore) -> None:
        now = time.time()
        a, b = this_process("w-a"), this_process("w-b")
        assert store.acquire(SID, a, 15.0, now=now).epoch == 1
        assert store.acquire(SID, a, 15.0, now=now + 1).epoch == 2
        lease = store.acquire(SID, b, 15.0, force=True, now=now + 2)
        assert (lease.owner, lease.epoch, lease.expires_at) == (b, 3, now + 17.0)

    def test_acquire_takes_over_a_dead_same_host_owner_at_once(self, store: EventStore) -> None:
        now = time.time()
        gone = dead_owner()
        store.acquire(SID, gone, 3600.0, now=now)  # a long lease, still current
        store.append(SID, [ev(RunStarted, workflow="w", ts=now)], 0, epoch=1)
        lease = store.acquire(SID, this_process("w-new"), 15.0, now=now + 0.1)
        assert lease.epoch == 2
        info = store.session_info(SID)
        assert info is not None and info.owner == lease.owner

    def test_acquire_takes_over_an_expired_lease_from_another_host(self, store: EventStore) -> None:
        far = other_host_owner()
        store.acquire(SID, far, 10.0, now=1000.0)
        with pytest.raises(ConcurrencyConflict):
            store.acquire(SID, this_process("w-here"), 10.0, now=1009.0)
        lease = store.acquire(SID, this_process("w-here"), 10.0, now=1010.0)  # expires_at <= now: expired
        assert lease.epoch == 2

    def test_append_under_a_superseded_epoch_raises_lease_lost_and_writes_nothing(
        self, store: EventStore
    ) -> None:
        first = store.acquire(SID, this_process("w-1"), 15.0, force=True)
        store.append(
            SID,
            [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)],
            0,
            epoch=first.epoch,
        )
        second = store.acquire(SID, this_process("w-2"), 15.0, force=True)
        assert second.epoch == first.epoch + 1
        before = (store.read(SID), store.sessions(), store.node_runs(), store.open_runs())
        with pytest.raises(LeaseLost) as err:
            store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0)], 2, epoch=first.epoch)
        assert isinstance(err.value, ConcurrencyConflict)
        assert "w-2" in str(err.value)
        assert (store.read(SID), store.sessions(), store.node_runs(), store.open_runs()) == before
        with pytest.raises(LeaseLost):  # an epoch on a session nobody acquired
            store.append("s2", [ev(RunStarted, sid="s2", workflow="w", ts=1.0)], 0, epoch=1)
        assert store.read("s2") == []
        # the current epoch, and no epoch at all (bridges), both append
        store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0)], 2, epoch=second.epoch)
        store.append(SID, [ev(RunFinished, ts=4.0)], 3)
        assert store.last_seq(SID) == 4

    def test_renew_extends_the_lease_and_refuses_a_superseded_one(self, store: EventStore) -> None:
        lease = store.acquire(SID, this_process("w-1"), 15.0, now=1000.0)
        renewed = store.renew(lease, 15.0, now=1010.0)
        assert renewed == dataclasses.replace(lease, expires_at=1025.0)
        store.append(SID, [ev(RunStarted, workflow="w", ts=1010.0)], 0)
        info = store.session_info(SID)
        assert info is not None and info.lease_expires_at == 1025.0
        store.acquire(SID, this_process("w-2"), 15.0, force=True, now=1011.0)
        with pytest.raises(LeaseLost):
            store.renew(renewed, 15.0, now=1012.0)
        info = store.session_info(SID)
        assert info is not None and (info.epoch, info.lease_expires_at) == (2, 1026.0)

    def test_renew_many_renews_the_held_and_reports_the_lost(self, store: EventStore) -> None:
        leases = {sid: store.acquire(sid, this_process("w-1"), 15.0, now=1000.0) for sid in ("a", "b", "c")}
        for sid in leases:
            store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1000.0)], 0, epoch=leases[sid].epoch)
        taker = store.acquire("b", this_process("w-2"), 15.0, force=True, now=1005.0)
        out = store.renew_many([leases["a"], leases["b"], leases["c"]], 15.0, now=1010.0)
        assert out[0] == dataclasses.replace(leases["a"], expires_at=1025.0)
        assert out[2] == dataclasses.replace(leases["c"], expires_at=1025.0)
        assert isinstance(out[1], LeaseLost)
        info_b = store.session_info("b")
        assert info_b is not None and info_b.epoch == taker.epoch  # the taker's lease is untouched
        expiries = {sid: store.session_info(sid) for sid in leases}
        assert {sid: i.lease_expires_at for sid, i in expiries.items() if i is not None} == {
            "a": 1025.0,
            "b": 1020.0,
            "c": 1025.0,
        }
        assert store.renew_many([], 15.0) == []

    def test_renew_from_another_thread(self, store: EventStore) -> None:
        lease = store.acquire(SID, this_process("w-1"), 15.0)
        store.append(SID, [ev(RunStarted, workflow="w", ts=time.time())], 0, epoch=lease.epoch)
        out: list[Any] = []

        def renew_loop() -> None:
            try:
                current = lease
                for _ in range(20):
                    current = store.renew(current, 30.0)
                out.append(current)
            except BaseException as exc:  # reported below
                out.append(exc)

        t = threading.Thread(target=renew_loop)
        t.start()
        for i in range(20):  # the owning thread keeps appending meanwhile
            store.append(
                SID,
                [node_ev(StateUpdated, "w@1/a@1", ts=time.time(), values={"i": i})],
                i + 1,
                epoch=lease.epoch,
            )
        t.join(30)
        [result] = out
        assert isinstance(result, Lease), result
        info = store.session_info(SID)
        assert info is not None and info.lease_expires_at == result.expires_at > lease.expires_at
        assert store.last_seq(SID) == 21

    def test_release_keeps_the_owner_and_lets_another_take_over_without_force(
        self, store: EventStore
    ) -> None:
        a = this_process("w-a")
        lease = store.acquire(SID, a, 15.0)
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), ev(RunFinished, status="paused", ts=2.0)], 0)
        store.release(lease)
        info = store.session_info(SID)
        assert info is not None and (info.owner, info.epoch, info.lease_expires_at) == (a, 1, 0.0)
        taken = store.acquire(SID, this_process("w-b"), 15.0)
        assert taken.epoch == 2
        store.release(lease)  # superseded: ignored, never raises
        info = store.session_info(SID)
        assert info is not None and info.owner == taken.owner and info.lease_expires_at == taken.expires_at

    def test_claim_takes_queued_answered_and_orphaned_sessions_oldest_first(self, store: EventStore) -> None:
        now = time.time()
        me = this_process("w-claimer")
        store.append("q-new", submitted_log("q-new", "wf", now - 10), 0)
        store.append("q-old", submitted_log("q-old", "wf", now - 50), 0)
        store.append(
            "answered", paused_log("answered", "wf", now - 40) + answer_events("answered", "wf", now - 30), 0
        )
        gone = dead_owner()
        store.acquire("orphan", gone, 3600.0, now=now - 20)
        store.append("orphan", [ev(RunStarted, sid="orphan", workflow="wf", ts=now - 20)], 0, epoch=1)
        far = other_host_owner()
        store.acquire("expired", far, 10.0, now=now - 100)  # ended at now - 90
        store.append("expired", [ev(RunStarted, sid="expired", workflow="wf", ts=now - 100)], 0, epoch=1)
        claims = store.claim(me, ["wf"], 15.0, limit=10, now=now)
        assert [(c.session_id, c.reason) for c in claims] == [
            ("expired", "orphaned"),
            ("q-old", "queued"),
            ("answered", "answered"),
            ("orphan", "orphaned"),
            ("q-new", "queued"),
        ]
        for c in claims:
            assert c.workflow == "wf" and c.lease.owner == me and c.lease.expires_at == now + 15.0
            info = store.session_info(c.session_id)
            assert info is not None and (info.owner, info.epoch) == (me, c.lease.epoch)
        assert {c.session_id: c.lease.epoch for c in claims} == {
            "expired": 2,
            "q-old": 1,
            "answered": 1,
            "orphan": 2,
            "q-new": 1,
        }
        assert (
            store.claim(this_process("w-second"), ["wf"], 15.0, limit=10, now=now + 1) == []
        )  # all held now

    def test_claim_orders_orphans_by_when_their_lease_ended(self, store: EventStore) -> None:
        # Oldest first is by when a session became claimable (takeover.claimable_since): an
        # orphan when its lease ended, about when its owner stopped, not at its last event
        # (a long node appends nothing for minutes while its lease is renewed).
        now = time.time()
        far = other_host_owner()
        store.acquire("silent-longer", far, 95.0, now=now - 100)  # its long lease ended 5 s ago
        store.append(
            "silent-longer", [ev(RunStarted, sid="silent-longer", workflow="wf", ts=now - 100)], 0, epoch=1
        )
        store.acquire("lease-ended-first", far, 10.0, now=now - 50)  # ended 40 s ago
        store.append(
            "lease-ended-first",
            [ev(RunStarted, sid="lease-ended-first", workflow="wf", ts=now - 50)],
            0,
            epoch=1,
        )
        store.append("queued", submitted_log("queued", "wf", now - 20), 0)
        claims = store.claim(this_process("w-claimer"), ["wf"], 15.0, limit=3, now=now)
        assert [(c.session_id, c.reason) for c in claims] == [
            ("lease-ended-first", "orphaned"),
            ("queued", "queued"),
            ("silent-longer", "orphaned"),
        ]

    def test_claim_orders_a_dead_owners_started_session_by_its_last_event_not_its_submission(
        self, store: EventStore
    ) -> None:
        now = time.time()
        gone = dead_owner()
        store.append("was-queued", submitted_log("was-queued", "wf", now - 200), 0)
        store.acquire("was-queued", gone, 3600.0, now=now - 30)  # its lease has not ended
        store.append("was-queued", [ev(RunStarted, sid="was-queued", workflow="wf", ts=now - 30)], 1, epoch=1)
        store.append("queued", submitted_log("queued", "wf", now - 100), 0)
        claims = store.claim(this_process("w-claimer"), ["wf"], 15.0, limit=2, now=now)
        assert [(c.session_id, c.reason) for c in claims] == [
            ("queued", "queued"),
            ("was-queued", "orphaned"),
        ]

    def test_claim_leaves_what_it_may_not_take(self, store: EventStore) -> None:
        now = time.time()
        me = this_process("w-claimer")
        store.append("other-wf", submitted_log("other-wf", "other", now - 60), 0)
        store.append("paused", paused_log("paused", "wf", now - 60), 0)
        store.append(
            "done",
            [
                ev(RunStarted, sid="done", workflow="wf", ts=now - 60),
                ev(RunFinished, sid="done", status="completed", ts=now - 59),
            ],
            0,
        )
        store.append("ownerless", [ev(RunStarted, sid="ownerless", workflow="wf", ts=now - 3600)], 0)
        live = this_process("w-live")
        store.acquire("held", live, 15.0, now=now)
        store.append("held", [ev(RunStarted, sid="held", workflow="wf", ts=now)], 0, epoch=1)
        store.acquire("held-queued", live, 15.0, now=now)
        store.append("held-queued", submitted_log("held-queued", "wf", now - 60), 0)
        store.append("q", submitted_log("q", "wf", now - 1), 0)
        assert store.claim(me, ["wf"], 15.0, limit=0, now=now) == []
        assert store.claim(me, [], 15.0, limit=5, now=now) == []
        [c] = store.claim(me, ["wf"], 15.0, limit=5, now=now)
        assert (c.session_id, c.reason) == ("q", "queued")
        # once the leases end (the live owner's, and the claim's own: it never started
        # "q"), the sessions can be claimed again
        later = store.claim(me, ["wf", "other"], 15.0, limit=5, now=now + 16)
        assert sorted((c.session_id, c.reason) for c in later) == [
            ("held", "orphaned"),
            ("held-queued", "queued"),
            ("other-wf", "queued"),
            ("q", "queued"),
        ]

    def test_claim_respects_the_limit_and_max_recoveries(self, store: EventStore) -> None:
        now = 1000.0
        for i in range(5):
            store.append(f"q{i}", submitted_log(f"q{i}", "wf", now - 100 + i), 0)
        a, b = this_process("w-a"), this_process("w-b")
        first = store.claim(a, ["wf"], 15.0, limit=2, now=now)
        second = store.claim(b, ["wf"], 15.0, limit=2, now=now)
        assert [c.session_id for c in first] == ["q0", "q1"] and [c.session_id for c in second] == [
            "q2",
            "q3",
        ]
        far = other_host_owner()
        store.acquire("crashy", far, 10.0, now=now)
        store.append("crashy", [ev(RunStarted, sid="crashy", workflow="crash", ts=now)], 0, epoch=1)
        t = now
        for _ in range(3):  # taken over as orphaned 3 times: its lease runs out each time
            t += 20.0
            [c] = store.claim(
                other_host_owner("w-x", pid=7), ["crash"], 10.0, limit=5, max_recoveries=2, now=t
            )
            assert (c.session_id, c.reason) == ("crashy", "orphaned")
        assert store.claim(a, ["crash"], 10.0, limit=5, max_recoveries=2, now=t + 20) == []
        [c] = store.claim(a, ["crash"], 10.0, limit=5, now=t + 20)  # no limit given
        assert c.lease.epoch == 5

    def test_a_claim_asks_whether_each_owner_is_alive_once_not_once_per_session(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A worker on this host holding thousands of sessions must cost a claim one check
        # of its process, not one per session (each reads /proc): the claim's cost grows
        # with what it takes, not with what the fleet runs.
        now = time.time()
        live = this_process("w-live")
        hold_running(store, live, 30, now)
        gone = dead_owner()
        for sid in ("orphan-1", "orphan-2"):
            store.acquire(sid, gone, 600.0, now=now)
            store.append(sid, [ev(RunStarted, sid=sid, workflow="wf", ts=now)], 0, epoch=1)
        asked = process_checks(monkeypatch)
        claims = store.claim(this_process("w-claimer"), ["wf"], 15.0, limit=10, now=now + 1)
        assert sorted((c.session_id, c.reason) for c in claims) == [
            ("orphan-1", "orphaned"),
            ("orphan-2", "orphaned"),
        ]
        assert asked.count(live.pid) <= 1, (
            f"the live owner's process was checked {asked.count(live.pid)} times"
        )

    def test_two_claimers_at_once_never_get_the_same_session(self, store: EventStore) -> None:
        other = self.open_again(store)
        second = other if other is not None else store
        try:
            for r in range(5):
                sids = [f"r{r}-{i}" for i in range(12)]
                for i, sid in enumerate(sids):
                    store.append(sid, submitted_log(sid, f"wf{r}", 1000.0 + i), 0)
                barrier = threading.Barrier(2)
                got: dict[str, list[str]] = {}

                def claim(
                    name: str,
                    s: EventStore,
                    r: int = r,
                    barrier: threading.Barrier = barrier,
                    got: dict[str, list[str]] = got,
                ) -> None:  # this round's barrier and results, bound now
                    barrier.wait()
                    for _ in range(6):
                        got.setdefault(name, []).extend(
                            c.session_id for c in s.claim(this_process(name), [f"wf{r}"], 60.0, limit=2)
                        )

                threads = [
                    threading.Thread(target=claim, args=("w-a", store)),
                    threading.Thread(target=claim, args=("w-b", second)),
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                taken = got.get("w-a", []) + got.get("w-b", [])
                assert sorted(taken) == sorted(sids), got  # every session once, none twice
                for sid in sids:
                    info = store.session_info(sid)
                    assert info is not None and info.epoch == 1
                    assert info.owner is not None and sid in got[info.owner.worker_id]
        finally:
            if other is not None:
                other.close()

    def test_workers_seen_and_workers(self, store: EventStore) -> None:
        assert store.workers() == []
        a, b = this_process("w-a"), other_host_owner("w-b", pid=99)
        store.workers_seen(a, ["orders", "billing"], ts=1000.0)
        store.workers_seen(b, ["orders"], ts=1001.0)
        assert [(w.worker_id, w.host, w.pid, w.workflows, w.seen_at) for w in store.workers()] == [
            ("w-b", b.host, 99, ("orders",), 1001.0),
            ("w-a", a.host, a.pid, ("billing", "orders"), 1000.0),
        ]
        store.workers_seen(a, ["orders"], ts=1002.0)  # each renewal updates the one row
        assert [(w.worker_id, w.workflows, w.seen_at) for w in store.workers()] == [
            ("w-a", ("orders",), 1002.0),
            ("w-b", ("orders",), 1001.0),
        ]
        store.workers_seen(a, ["orders"], ts=1001.0 + 86400.0 + 1)  # b not seen for a day: forgotten
        assert [w.worker_id for w in store.workers()] == ["w-a"]

    def test_open_run_summary_uses_the_owner_rule(self, store: EventStore) -> None:
        now = time.time()
        me, gone, far = this_process("w-me"), dead_owner(), other_host_owner()
        # (session, owner, lease from now, heartbeat age, expected class of its running run)
        cases: list[tuple[str, Owner | None, float | None, float, str]] = [
            ("live-stale-beat", me, 15.0, 3600.0, RUNNING),  # a blocked loop keeps its lease
            ("expired-fresh-beat", far, -1.0, 0.0, ORPHANED),
            ("dead-here", gone, 3600.0, 0.0, ORPHANED),  # at once, lease or not
            ("far-live", far, 15.0, 3600.0, RUNNING),
            ("released", me, None, 0.0, ORPHANED),  # released while running (a store fault)
            ("no-owner-fresh", None, None, 1.0, RUNNING),
            ("no-owner-stale", None, None, 3600.0, ORPHANED),
        ]
        for sid, owner, lease_in, age, _cls in cases:
            if owner is not None:
                lease = store.acquire(sid, owner, 3600.0, force=True, now=now - 7200)
                if lease_in is None:
                    store.release(lease)
                else:
                    store.renew(lease, lease_in, now=now)
            store.append(
                sid,
                [
                    ev(RunStarted, sid=sid, workflow="own", ts=now - 7200),
                    node_ev(NodeStarted, f"own@1/{sid}@1", ts=now - 7200, sid=sid),
                ],
                0,
            )
            store.heartbeat(sid, [f"own@1/{sid}@1"], ts=now - age)
        groups = {g.node: g for g in store.open_run_summary(now, 60.0)}
        owners = {s.session_id: (s.owner, s.lease_expires_at) for s in store.sessions()}
        for sid, _owner, _lease, _age, expected in cases:
            g = groups[sid]
            assert (g.state, g.count, g.orphaned) == ("running", 1, int(expected == ORPHANED)), sid
            r = run_of(store, f"own@1/{sid}@1", sid)
            owner, lease_end = owners[sid]
            got = classify_open_run(
                r.status,
                r.started_at,
                r.heartbeat_at,
                r.job_deadline_at,
                now,
                60.0,
                owner=owner,
                lease_expires_at=lease_end,
            )
            assert got == expected, sid
        key = lambda g: (g.workflow, g.node, g.state)  # noqa: E731
        owned = {sid: o for sid, o in owners.items() if o[0] is not None}
        assert sorted(store.open_run_summary(now, 60.0), key=key) == sorted(
            summarize_open_runs(store.open_runs(), now, 60.0, owned), key=key
        )

    # ------------------------------------------------------------------ the inbox: one writer per session
