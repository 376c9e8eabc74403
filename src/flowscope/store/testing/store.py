"""The whole port's contract: :class:`EventStoreContract`, every role and the rules across them."""

from __future__ import annotations

import dataclasses
import time

import pytest

from ...errors import ConcurrencyConflict, LeaseLost
from ...events import (
    JobDispatched,
    JobResultReceived,
    NodeCompleted,
    NodeStarted,
    RunFinished,
    RunStarted,
    RunSubmitted,
)
from ...ownership import Lease, this_process
from ..base import EventStore, JobResultGroup, SessionQuery
from .helpers import (
    dead_owner,
    ev,
    finished_session,
    node_ev,
    other_host_owner,
    run_of,
)
from .inbox import InboxContract
from .log import EventLogContract
from .ownership import OwnershipContract
from .upkeep import UpkeepContract

__all__ = ["EventStoreContract"]


class EventStoreContract(EventLogContract, OwnershipContract, InboxContract, UpkeepContract):
    """What every :class:`~flowscope.store.base.EventStore` must do: every role's
    contract, and the rules that cross roles (a pruned session takes its inbox and owner
    with it; group commit refuses a lost lease; the span follower's list)."""

    def create_store(self) -> EventStore:
        """A new, empty store for one test; ``self.tmp_path`` is a fresh directory."""
        raise NotImplementedError  # abstract

    def test_a_deleted_session_takes_its_inbox_with_it(self, store: EventStore) -> None:
        finished_session(store, "done", "completed")
        store.send("done", "answer", {"inputs": {"ok": True}, "jobs": {}})
        assert store.delete_sessions(["done"]) == ["done"]
        assert store.inbox("done") == []

    # ------------------------------------------------------------------ pruning: delete_sessions

    def test_delete_sessions_removes_the_owner_and_spares_a_live_one(self, store: EventStore) -> None:
        now = time.time()
        me = this_process("w-prune")  # this very process: alive while its lease lasts
        for sid in ("released", "held", "dead", "far-expired"):
            finished_session(store, sid, "completed")
        store.release(store.acquire("released", me, 15.0, now=now))
        store.acquire("held", me, 15.0, now=now)  # finished, but its owner still holds it
        store.acquire("dead", dead_owner(), 3600.0, now=now)  # the owner's process is gone
        store.acquire("far-expired", other_host_owner(), 10.0, now=now - 60.0)
        store.workers_seen(me, ["w"], ts=now)
        assert store.delete_sessions(["released", "held", "dead", "far-expired"]) == [
            "released",
            "dead",
            "far-expired",
        ]
        assert {s.session_id for s in store.sessions()} == {"held"}
        for sid in ("released", "dead", "far-expired"):
            assert store.session_info(sid) is None
            # the owner row went with the log: a new session of that id starts at epoch 1
            assert store.acquire(sid, me, 15.0, now=now).epoch == 1
        info = store.session_info("held")
        assert info is not None and info.owner == me and info.epoch == 1
        assert [w.worker_id for w in store.workers()] == [me.worker_id]  # workers are per worker: kept

    def test_append_many_keeps_the_good_batches_and_returns_each_refusal(self, store: EventStore) -> None:
        store.append("b", [ev(RunSubmitted, sid="b", workflow="w", ts=1.0)], 0)
        lease = store.acquire("c", this_process(), 30.0)
        store.append("c", [ev(RunSubmitted, sid="c", workflow="w", ts=1.0)], 0, epoch=lease.epoch)
        out = store.append_many([
            ("d", [ev(RunStarted, sid="d", workflow="w", ts=2.0)], 0, None),
            ("a", [ev(RunStarted, sid="a", workflow="w", ts=2.0), node_ev(NodeStarted, "w@1/x@1", ts=3.0, sid="a")], 0, None),
            ("b", [ev(RunStarted, sid="b", workflow="w", ts=2.0)], 0, None),  # the session is at 1: a conflict
            ("c", [ev(RunStarted, sid="c", workflow="w", ts=2.0)], 1, lease.epoch + 1),  # a superseded epoch: fenced
            ("a", [node_ev(NodeCompleted, "w@1/x@1", ts=4.0, sid="a")], 2, None),  # the same session again, in order
        ])  # fmt: skip
        assert len(out) == 5
        assert isinstance(out[2], ConcurrencyConflict) and isinstance(out[3], LeaseLost)
        assert [[e.seq for e in r] for r in (out[0], out[1], out[4]) if isinstance(r, list)] == [
            [1],
            [1, 2],
            [3],
        ]
        assert [store.last_seq(s) for s in "abcd"] == [3, 1, 1, 1]
        assert [e.type for e in store.read("a")] == ["run_started", "node_started", "node_completed"]
        assert run_of(store, "w@1/x@1", sid="a").status == "completed"  # the projection kept up
        assert store.read("b")[0].type == "run_submitted" and len(store.read("c")) == 1

    def test_unexported_lists_the_sessions_past_their_watermark_with_it(self, store: EventStore) -> None:
        assert store.unexported() == []
        for sid in ("a", "b", "c"):
            finished_session(store, sid, "completed")  # 4 events each
        assert sorted((i.session_id, m) for i, m in store.unexported()) == [("a", 0), ("b", 0), ("c", 0)]
        store.set_exported_seq("a", 4)  # all shipped
        store.set_exported_seq("b", 2)  # part
        got = sorted((i.session_id, i.last_seq, m) for i, m in store.unexported())
        assert got == [("b", 4, 2), ("c", 4, 0)]
        info = dict((i.session_id, i) for i, _m in store.unexported())["b"]
        assert info == store.session_info("b")
        store.acquire("new", this_process("w"), 15.0)  # owned, no event: no session yet
        assert "new" not in {i.session_id for i, _m in store.unexported()}

    def test_unexported_never_lists_a_session_without_events(self, store: EventStore) -> None:
        # acquired, or acquired by a run's start, before its first event: no log, no spans,
        # before any span was shipped from the store as after
        store.acquire("owned", this_process("w"), 15.0)
        store.acquire_new("starting", this_process("w"), 15.0)
        assert store.unexported() == []
        finished_session(store, "done", "completed")
        assert [(i.session_id, m) for i, m in store.unexported()] == [("done", 0)]
        store.set_exported_seq("done", 4)
        assert store.unexported() == []

    def test_unexported_lists_a_running_session_at_its_watermark(self, store: EventStore) -> None:
        # an invocation that no RunFinished ended: whoever shipped its spans up to its last
        # event left its open runs' spans, due once its owner is gone
        finished_session(store, "done", "completed")
        store.append(
            "open",
            [
                ev(RunStarted, sid="open", workflow="w", ts=1.0),
                node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="open"),
            ],
            0,
        )
        store.set_exported_seqs({"done": 4, "open": 2})
        assert [(i.session_id, i.status, m) for i, m in store.unexported()] == [("open", "running", 2)]
        store.set_exported_seq("open", 3)  # past it: its open spans, shipped as cut off
        assert store.unexported() == []

    def test_a_job_result_appended_after_a_prune_is_counted(self, store: EventStore) -> None:
        # the prune deletes the end of the log: what is appended next is counted all the same
        p = "etl@1/enrich@1"
        store.append(
            "old",
            [
                ev(RunStarted, sid="old", workflow="before", ts=1.0),
                node_ev(NodeStarted, p, ts=2.0, sid="old"),
                node_ev(JobDispatched, p, ts=3.0, sid="old", job_id="a"),
                node_ev(JobResultReceived, p, ts=4.0, sid="old", job_id="a", success=True, result="success"),
                node_ev(NodeCompleted, p, ts=5.0, sid="old"),
                ev(RunFinished, sid="old", status="completed", ts=6.0),
            ],
            0,
        )
        assert store.job_result_summary() == [JobResultGroup("before", "enrich", "success", 1)]
        assert store.delete_sessions(["old"]) == ["old"]
        store.append(
            "new",
            [
                ev(RunStarted, sid="new", workflow="after", ts=7.0),
                node_ev(JobResultReceived, p, ts=8.0, sid="new", job_id="b", success=True, result="success"),
            ],
            0,
        )
        assert JobResultGroup("after", "enrich", "success", 1) in store.job_result_summary()

    # ------------------------------------------------------------------ an invocation's first and last steps

    def test_acquire_new_takes_a_session_without_events_and_leaves_one_with_events(
        self, store: EventStore
    ) -> None:
        me, other = this_process("w-new"), other_host_owner()
        lease = store.acquire_new("fresh", me, 15.0)
        assert lease is not None and lease.epoch >= 1 and lease.owner == me
        info = store.session_info("fresh")
        assert info is None or info.last_seq == 0  # owned, no event: no session to list yet
        with pytest.raises(ConcurrencyConflict):  # a live owner holds it
            store.acquire_new("fresh", other, 15.0)
        store.append("fresh", [ev(RunStarted, sid="fresh", workflow="w", ts=1.0)], 0, epoch=lease.epoch)
        store.release(lease)
        assert store.acquire_new("fresh", other, 15.0) is None  # it has events: refused, nothing written
        later = store.acquire("fresh", me, 15.0)
        assert later.epoch == lease.epoch + 1  # acquire_new advanced no epoch

    def test_acquire_new_many_answers_each_session_as_acquire_new_would_and_refuses_none_for_another(
        self, store: EventStore
    ) -> None:
        me, far = this_process("w-many"), other_host_owner()
        held = store.acquire_new("held", far, 15.0)  # a live owner elsewhere: refused
        assert held is not None
        old = store.acquire_new("old", me, 15.0)  # events already: None
        assert old is not None
        store.append("old", [ev(RunStarted, sid="old", workflow="w", ts=1.0)], 0, epoch=old.epoch)
        store.release(old)
        got = store.acquire_new_many(["a", "held", "old", "b"], me, 15.0, now=1000.0)
        assert [type(g) for g in got] == [Lease, ConcurrencyConflict, type(None), Lease]
        a, b = got[0], got[3]
        assert isinstance(a, Lease) and isinstance(b, Lease)
        assert (a.session_id, a.owner, a.expires_at, b.session_id) == ("a", me, 1015.0, "b")
        assert f"pid {far.pid}" in str(got[1])
        info = store.session_info("held")
        assert info is None or (info.owner, info.epoch) == (far, held.epoch)  # the refusal wrote nothing
        old_info = store.session_info("old")
        assert old_info is not None and old_info.epoch == old.epoch  # nor did the None
        for lease in (a, b):  # each new session's first append is guarded on its row
            sid = lease.session_id
            store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1001.0)], 0, epoch=lease.epoch)
            assert store.acquire_new(sid, me, 15.0) is None
        assert store.acquire_new_many([], me, 15.0) == []

    def test_find_sessions_selects_by_owner_and_never_lists_a_session_without_events(
        self, store: EventStore
    ) -> None:
        owners = {
            "a": dataclasses.replace(this_process("W-Alpha-1"), host="Node-East"),
            "b": dataclasses.replace(this_process("w-beta-2"), host="node-west"),
            "c": None,
        }
        for sid, owner in owners.items():
            epoch = None if owner is None else store.acquire(sid, owner, 15.0).epoch
            store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1.0)], 0, epoch=epoch)
        store.acquire_new("owned-no-events", this_process("w-gamma"), 15.0)  # a row, no session
        every = store.sessions()
        assert sorted(s.session_id for s in every) == ["a", "b", "c"]
        assert store.status_counts() == {"running": 3}
        for needle, want in [
            ("alpha", {"a"}),
            ("W-", {"a", "b"}),
            ("EAST", {"a"}),
            ("node", {"a", "b"}),
            ("gamma", set()),
            ("zzz", set()),
        ]:
            query = SessionQuery(owner_contains=needle)
            got = store.find_sessions(query)
            assert {s.session_id for s in got} == want == {s.session_id for s in every if query.matches(s)}
            assert store.status_counts(query) == ({"running": len(want)} if want else {})

    def test_the_change_mark_moves_with_every_append_deletion_and_takeover(self, store: EventStore) -> None:
        store.append("m0", [ev(RunStarted, sid="m0", workflow="w", ts=1.0)], 0)
        marks = [store.change_mark()]
        store.append("m1", [ev(RunStarted, sid="m1", workflow="w", ts=1.0)], 0)
        marks.append(store.change_mark())
        assert store.change_mark() == marks[-1]  # nothing changed: the same mark
        store.append("m1", [ev(RunFinished, sid="m1", status="completed", ts=2.0)], 1)
        marks.append(store.change_mark())
        lease = store.acquire("m1", other_host_owner(), 15.0)  # a takeover, no event
        marks.append(store.change_mark())
        store.release(lease)
        assert store.delete_sessions(["m1"]) == ["m1"]
        marks.append(store.change_mark())
        # each change moves the mark from the one before (the deletion may bring back the
        # first: the sessions are then as they were)
        assert all(a != b for a, b in zip(marks, marks[1:])), marks

    def test_append_and_release_ends_the_leases_of_sessions_without_mail(self, store: EventStore) -> None:
        me, other = this_process("w-end"), other_host_owner()
        leases = {sid: store.acquire(sid, me, 15.0) for sid in ("quiet", "mailed", "fenced")}
        for sid, lease in leases.items():
            store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1.0)], 0, epoch=lease.epoch)
        store.send("mailed", "answer", {"inputs": {"ok": True}, "jobs": {}})
        taken = store.acquire("fenced", other, 15.0, force=True)  # taken over: its last append is fenced
        out, released = store.append_and_release(
            [
                (sid, [ev(RunFinished, sid=sid, ts=2.0, status="completed")], 1, lease.epoch)
                for sid, lease in leases.items()
            ],
            leases,
        )
        assert isinstance(out[2], LeaseLost) and [len(r) for r in out[:2] if isinstance(r, list)] == [1, 1]
        assert released == {"quiet"}  # "mailed" keeps its lease for its owner to take the message in
        assert store.acquire("quiet", other, 15.0).epoch == leases["quiet"].epoch + 1  # free at once
        with pytest.raises(ConcurrencyConflict):
            store.acquire("mailed", other, 15.0)
        assert store.acquire("fenced", other, 15.0).epoch == taken.epoch + 1  # the same owner takes it again
        one, ended = store.append_and_release(
            [("solo", [ev(RunStarted, sid="solo", workflow="w", ts=1.0)], 0, None)],
            {"solo": store.acquire("solo", me, 15.0)},
        )
        assert [e.seq for e in one[0]] == [1] and ended == {"solo"}  # type: ignore[union-attr]
