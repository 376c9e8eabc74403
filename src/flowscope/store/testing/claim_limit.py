"""Which sessions a claim takes when there are more than its limit: :class:`ClaimLimitContract`,
part of the ownership contract."""

from __future__ import annotations

from ...events import RunStarted
from ...ownership import this_process
from ..base import EventStore
from .base import ContractBase
from .helpers import answer_events, ev, other_host_owner, paused_log, submitted_log

__all__ = ["ClaimLimitContract"]


class ClaimLimitContract(ContractBase):
    """A claim with a limit takes the oldest of what it may take, whatever the sessions' ids
    (queued by submission, answered by the answer), and what it may not take (past
    ``max_recoveries``) never takes the place of what it may."""

    def create_store(self) -> EventStore:
        raise NotImplementedError  # abstract

    def test_a_claim_with_a_limit_takes_the_oldest_whatever_their_ids(self, store: EventStore) -> None:
        now = 1000.0
        # the ids sort the other way round from the ages: "a" is the newest of each
        for i, sid in enumerate(("q-a", "q-b", "q-c", "q-d")):
            store.append(sid, submitted_log(sid, "wf", now - 100 + 10 * (3 - i)), 0)
        for i, sid in enumerate(("r-a", "r-b", "r-c")):
            t = now - 60 + 10 * (2 - i)
            store.append(sid, paused_log(sid, "ask", t) + answer_events(sid, "ask", t + 1), 0)
        me = this_process("w-claimer")
        queued = store.claim(me, ["wf"], 15.0, limit=2, now=now)
        assert [(c.session_id, c.reason) for c in queued] == [("q-d", "queued"), ("q-c", "queued")]
        answered = store.claim(me, ["ask"], 15.0, limit=2, now=now)
        assert [(c.session_id, c.reason) for c in answered] == [("r-c", "answered"), ("r-b", "answered")]

    def test_an_orphan_past_max_recoveries_never_takes_the_place_of_one_within_them(
        self, store: EventStore
    ) -> None:
        now = 1000.0
        far = other_host_owner()
        store.acquire("crashy", far, 10.0, now=now)
        store.append("crashy", [ev(RunStarted, sid="crashy", workflow="wf", ts=now)], 0, epoch=1)
        t = now
        for _ in range(3):  # taken over as orphaned 3 times: its lease runs out each time
            t += 20.0
            [c] = store.claim(other_host_owner("w-x", pid=7), ["wf"], 10.0, limit=1, now=t)
            assert c.session_id == "crashy"
        store.acquire("fresh", far, 15.0, now=t)  # its lease ends after crashy's (t + 10)
        store.append("fresh", [ev(RunStarted, sid="fresh", workflow="wf", ts=t)], 0, epoch=1)
        claims = store.claim(this_process("w-claimer"), ["wf"], 10.0, limit=1, max_recoveries=2, now=t + 20)
        assert [(c.session_id, c.reason) for c in claims] == [("fresh", "orphaned")]
