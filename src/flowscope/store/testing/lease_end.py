"""When a lease ends, and what its epoch fences: :class:`LeaseEndContract`, part of the
ownership contract."""

from __future__ import annotations

import time

import pytest

from ...errors import LeaseLost
from ...events import Event, InputRequested, NodeCompleted, NodeStarted, RunFinished, RunStarted
from ...liveness import ORPHANED, RUNNING, classify_open_run
from ...ownership import this_process
from ..base import EventStore, summarize_open_runs
from .base import ContractBase
from .helpers import SID, answer_events, dead_owner, ev, node_ev, other_host_owner, run_of, submitted_log

__all__ = ["LeaseEndContract"]


class LeaseEndContract(ContractBase):
    """A lease has ended at the instant ``lease_expires_at == now``, or at once when its
    owner's process on this host is gone (:func:`~flowscope.liveness.owner_alive`), for a
    claim and for the open-run summary alike; an append under the epoch a takeover superseded writes nothing, whatever the
    handle that appended last under it kept; and an owner's appends move its session's
    status as any append does."""

    def create_store(self) -> EventStore:
        raise NotImplementedError  # abstract

    def test_a_claim_takes_a_session_whose_lease_ends_at_the_claims_now(self, store: EventStore) -> None:
        far = other_host_owner()
        store.acquire("orphan", far, 10.0, now=1000.0)  # ends at 1010
        store.append("orphan", [ev(RunStarted, sid="orphan", workflow="wf", ts=1000.0)], 0, epoch=1)
        store.append("queued", submitted_log("queued", "wf", 990.0), 0)
        store.acquire("queued", far, 10.0, now=1000.0)  # a claimer's lease that never started it
        me = this_process("w-claimer")
        assert store.claim(me, ["wf"], 15.0, limit=5, now=1009.9) == []
        claims = store.claim(me, ["wf"], 15.0, limit=5, now=1010.0)
        assert sorted((c.session_id, c.reason) for c in claims) == [
            ("orphan", "orphaned"),
            ("queued", "queued"),
        ]

    def test_a_claim_takes_a_dead_owners_sessions_of_its_own_workflows_only(self, store: EventStore) -> None:
        now = time.time()
        gone = dead_owner()
        for sid, workflow in (("mine", "wf"), ("theirs", "other")):
            store.acquire(sid, gone, 3600.0, now=now)  # a lease not ended: the process is gone
            store.append(sid, [ev(RunStarted, sid=sid, workflow=workflow, ts=now)], 0, epoch=1)
        for sid, workflow in (("mine-q", "wf"), ("theirs-q", "other")):
            store.append(sid, submitted_log(sid, workflow, now - 10), 0)
            store.acquire(sid, gone, 3600.0, now=now)
        claims = store.claim(this_process("w-claimer"), ["wf"], 15.0, limit=10, now=now + 1)
        assert sorted((c.session_id, c.reason) for c in claims) == [
            ("mine", "orphaned"),
            ("mine-q", "queued"),
        ]
        for sid in ("theirs", "theirs-q"):
            info = store.session_info(sid)
            assert info is not None and (info.owner, info.epoch) == (gone, 1), sid

    def test_open_run_summary_orphans_a_run_at_the_instant_its_owners_lease_ends(
        self, store: EventStore
    ) -> None:
        far = other_host_owner()
        store.acquire(SID, far, 10.0, now=1000.0)  # ends at 1010
        store.append(
            SID,
            [ev(RunStarted, workflow="wf", ts=1000.0), node_ev(NodeStarted, "wf@1/a@1", ts=1000.0)],
            0,
            epoch=1,
        )
        store.heartbeat(SID, ["wf@1/a@1"], ts=1010.0)  # a fresh heartbeat: the lease alone decides
        info = store.session_info(SID)
        assert info is not None
        r = run_of(store, "wf@1/a@1")
        for now, expected in ((1009.9, RUNNING), (1010.0, ORPHANED)):
            cls = classify_open_run(
                r.status,
                r.started_at,
                r.heartbeat_at,
                r.job_deadline_at,
                now,
                60.0,
                owner=far,
                lease_expires_at=1010.0,
            )
            assert cls == expected, now
            [group] = store.open_run_summary(now, 60.0)
            assert (group.count, group.orphaned) == (1, int(expected == ORPHANED)), now
            owners = {SID: (info.owner, info.lease_expires_at)}
            assert [group] == summarize_open_runs(store.open_runs(), now, 60.0, owners), now

    @pytest.mark.parametrize("last", ["advances", "moves the status"])
    def test_an_append_under_the_epoch_a_claim_took_over_raises_lease_lost_and_writes_nothing(
        self, store: EventStore, last: str
    ) -> None:
        # The old owner appended its last batch through this very store object; a claim took
        # the session over since (its lease ran out), and nothing told that object.
        far = other_host_owner()
        lease = store.acquire(SID, far, 10.0, now=1000.0)
        store.append(
            SID,
            [ev(RunStarted, workflow="wf", ts=1000.0), node_ev(NodeStarted, "wf@1/a@1", ts=1001.0)],
            0,
            epoch=lease.epoch,
        )
        [c] = store.claim(this_process("w-taker"), ["wf"], 15.0, limit=5, now=1020.0)
        assert (c.session_id, c.reason, c.lease.epoch) == (SID, "orphaned", lease.epoch + 1)
        before = (store.read(SID), store.sessions(), store.node_runs(), store.open_runs())
        events: list[Event] = [node_ev(NodeCompleted, "wf@1/a@1", ts=1021.0)]
        if last == "moves the status":
            events.append(ev(RunFinished, status="completed", ts=1022.0))
        with pytest.raises(LeaseLost):
            store.append(SID, events, 2, epoch=lease.epoch)
        assert (store.read(SID), store.sessions(), store.node_runs(), store.open_runs()) == before
        store.append(SID, events, 2, epoch=c.lease.epoch)  # the taker's epoch appends
        assert store.last_seq(SID) == 2 + len(events)

    def test_an_owners_appends_move_the_session_status(self, store: EventStore) -> None:
        lease = store.acquire(SID, this_process("w-owner"), 15.0)
        p = "wf@1/ask@1"
        steps: list[tuple[list[Event], str]] = [
            ([ev(RunStarted, workflow="wf", ts=1.0), node_ev(NodeStarted, p, ts=2.0)], "running"),
            (
                [
                    node_ev(InputRequested, p, ts=3.0, interrupt_id="ok"),
                    ev(RunFinished, status="paused", ts=3.0),
                ],
                "paused",
            ),
            (answer_events(SID, "wf", 4.0), "answered"),
            ([ev(RunStarted, workflow="wf", resumed=True, ts=5.0, invocation_id="inv-2")], "running"),
            ([node_ev(NodeStarted, p, ts=5.0, invocation_id="inv-2")], "running"),
            ([node_ev(NodeCompleted, p, ts=6.0), ev(RunFinished, status="completed", ts=7.0)], "completed"),
        ]
        seq = 0
        for events, status in steps:
            seq = store.append(SID, events, seq, epoch=lease.epoch)[-1].seq
            info = store.session_info(SID)
            assert info is not None and (info.status, info.last_seq) == (status, seq), status
            assert [(s.session_id, s.status) for s in store.sessions()] == [(SID, status)]
