"""The inbox role's contract: :class:`InboxContract`."""

from __future__ import annotations

import time

import pytest

from ...errors import ConcurrencyConflict, LeaseLost
from ...events import (
    RunFinished,
    RunStarted,
)
from ...ownership import this_process
from ..base import EventStore
from .base import ContractBase
from .helpers import (
    SID,
    answer_events,
    ev,
    paused_log,
)

__all__ = ["InboxContract"]


class InboxContract(ContractBase):
    """What every :class:`~flowscope.store.inbox.Inbox` must do: keep messages until they
    are taken in with their events, and make a paused or failed session claimable."""

    def create_store(self) -> EventStore:
        """A new, empty store for one test: taking messages in is under an owner's lease, so a whole store."""
        raise NotImplementedError  # abstract

    def test_a_message_is_kept_in_order_until_taken_in_with_its_events(self, store: EventStore) -> None:
        store.append(SID, paused_log(SID, "orders", 10.0), 0)
        first = store.send(SID, "answer", {"inputs": {"ok": True}, "jobs": {}}, ts=11.0)
        second = store.send(SID, "answer", {"inputs": {"ok": False}, "jobs": {}}, ts=12.0)
        store.send("other", "answer", {"inputs": {"x": 1}, "jobs": {}}, ts=12.5)
        assert first.message_id < second.message_id
        assert [(m.message_id, m.kind, dict(m.body), m.sent_at) for m in store.inbox(SID)] == [
            (first.message_id, "answer", {"inputs": {"ok": True}, "jobs": {}}, 11.0),
            (second.message_id, "answer", {"inputs": {"ok": False}, "jobs": {}}, 12.0),
        ]
        lease = store.acquire(SID, this_process("w-owner"), 15.0)
        with pytest.raises(LeaseLost):  # a superseded owner takes nothing in
            store.take_in(
                SID, answer_events(SID, "orders", 13.0), 4, [first.message_id], epoch=lease.epoch - 1
            )
        with pytest.raises(ConcurrencyConflict):  # nor one behind the log
            store.take_in(SID, answer_events(SID, "orders", 13.0), 3, [first.message_id], epoch=lease.epoch)
        assert len(store.inbox(SID)) == 2 and store.last_seq(SID) == 4  # nothing written
        stored = store.take_in(
            SID,
            answer_events(SID, "orders", 13.0),
            4,
            [first.message_id, second.message_id],
            epoch=lease.epoch,
        )
        assert [e.seq for e in stored] == [5] and store.last_seq(SID) == 5
        assert store.inbox(SID) == [] and [m.session_id for m in store.inbox("other")] == ["other"]
        assert store.session_info(SID).status == "answered"  # type: ignore[union-attr]
        # messages that no longer apply are taken in with no event
        late = store.send(SID, "answer", {"inputs": {"ok": True}, "jobs": {}})
        assert store.take_in(SID, [], 5, [late.message_id], epoch=lease.epoch) == []
        assert store.inbox(SID) == [] and store.last_seq(SID) == 5

    def test_a_message_body_comes_back_as_sent(self, store: EventStore) -> None:
        # what an operator typed: the keys in their order, a float past 2**53 and a NUL in a
        # string (valid JSON) are kept, as the session's answer will record them
        body = {"inputs": {"ok": {"zeta": 1, "aa": 2, "big": 1e16, "nul": "x\u0000y"}}, "jobs": {}}
        sent = store.send(SID, "answer", body, ts=11.0)
        (kept,) = store.inbox(SID)
        for message in (sent, kept):
            value = message.body["inputs"]["ok"]
            assert value == body["inputs"]["ok"] and list(value) == ["zeta", "aa", "big", "nul"]
            assert type(value["big"]) is float

    def test_a_session_with_a_message_is_claimed_paused_as_answered_failed_as_queued(
        self, store: EventStore
    ) -> None:
        now = time.time()
        store.append("mailed", paused_log("mailed", "wf", now - 50), 0)
        store.append("quiet", paused_log("quiet", "wf", now - 60), 0)
        store.append("held", paused_log("held", "wf", now - 70), 0)
        store.acquire("held", this_process("w-live"), 15.0, now=now)  # a live owner keeps its mail
        store.append(
            "failed",
            [
                ev(RunStarted, sid="failed", workflow="wf", ts=now - 45),
                ev(RunFinished, sid="failed", status="failed", ts=now - 44),
            ],
            0,
        )
        store.send("mailed", "answer", {"inputs": {"ok": True}, "jobs": {}})
        store.send("held", "answer", {"inputs": {"ok": True}, "jobs": {}})
        store.send("failed", "retry", {"from_path": None, "reason": "again"})
        claims = store.claim(this_process("w-claimer"), ["wf"], 15.0, limit=5, now=now)
        assert sorted((c.session_id, c.reason) for c in claims) == [
            ("failed", "queued"),
            ("mailed", "answered"),
        ]
        assert store.claim(this_process("w-other"), ["other"], 15.0, limit=5, now=now) == []

    def test_a_superseded_owner_takes_no_message_in_even_without_events(self, store: EventStore) -> None:
        # messages that no longer apply are taken in with no event: the fence holds for the
        # deletion alone too, or a taken-over owner would drop the new owner's mail
        store.append(SID, paused_log(SID, "orders", 10.0), 0)
        old = store.acquire(SID, this_process("w-old"), 15.0)
        msg = store.send(SID, "cancel", {"reason": "stop"}, ts=11.0)
        new = store.acquire(SID, this_process("w-new"), 15.0, force=True)
        with pytest.raises(LeaseLost):
            store.take_in(SID, [], 4, [msg.message_id], epoch=old.epoch)
        assert [m.message_id for m in store.inbox(SID)] == [msg.message_id]
        with pytest.raises(LeaseLost):  # nor does anyone on a session nobody acquired
            store.take_in("nobody", [], 0, [msg.message_id], epoch=1)
        assert store.take_in(SID, [], 4, [msg.message_id], epoch=new.epoch) == []
        assert store.inbox(SID) == [] and store.last_seq(SID) == 4

    def test_a_completed_session_with_a_retry_message_is_claimed_as_queued(self, store: EventStore) -> None:
        now = time.time()
        for sid in ("retried", "done"):
            store.append(
                sid,
                [
                    ev(RunStarted, sid=sid, workflow="wf", ts=now - 30),
                    ev(RunFinished, sid=sid, status="completed", ts=now - 29),
                ],
                0,
            )
        store.send("retried", "retry", {"from_path": "wf@1/a@1", "reason": "again"})
        claims = store.claim(this_process("w-claimer"), ["wf"], 15.0, limit=5, now=now)
        assert [(c.session_id, c.reason) for c in claims] == [("retried", "queued")]

    def test_sessions_with_mail_names_each_session_with_a_message(self, store: EventStore) -> None:
        for sid in ("a", "b", "c", "d"):
            store.append(sid, paused_log(sid, "wf", 10.0), 0)
        for sid in ("a", "c", "c"):
            store.send(sid, "answer", {"inputs": {"ok": True}, "jobs": {}}, ts=11.0)
        assert store.sessions_with_mail([]) == set()
        assert store.sessions_with_mail(["a", "b", "c", "d", "nobody"]) == {"a", "c"}
        lease = store.acquire("c", this_process("w-owner"), 15.0)
        store.take_in("c", [], 4, [m.message_id for m in store.inbox("c")], epoch=lease.epoch)
        assert store.sessions_with_mail(["d", "c", "a"]) == {"a"}
