"""When a granted lease starts: :class:`LeaseStartContract`, part of the ownership contract."""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from typing import Any

import pytest

from ...events import RunStarted
from ...ownership import Lease
from ..base import EventStore
from .base import ContractBase
from .helpers import SID, ev, other_host_owner

__all__ = ["LeaseStartContract"]

#: How far the wall clock moves while a take waits: far longer than any lease here.
_WAIT_S = 3600.0
_LEASE_S = 10.0


class LeaseStartContract(ContractBase):
    """A lease an acquire or a claim grants starts when the session is taken (once its
    row is locked), not when the call began: one that waited longer than the lease (for a
    lock another connection holds, a pooled connection, a slow server) still grants a
    whole lease, and a claim never counts a recovery for a lease over when granted."""

    def create_store(self) -> EventStore:
        raise NotImplementedError  # abstract

    def hold_writes(self, store: EventStore) -> AbstractContextManager[Any] | None:
        """A context in which something other than ``store`` (another connection, as
        another process or an operator's ``LOCK TABLE`` has) holds what an acquire or a
        claim on ``store`` must lock to take a session, so that one begun meanwhile waits
        until the context ends; None if the store has no such lock (then the tests that
        need it are skipped)."""
        return None

    @pytest.mark.parametrize("take", ["claim", "acquire", "acquire-unmade", "acquire_new"])
    def test_a_lease_granted_after_a_wait_starts_when_the_session_is_taken(
        self, store: EventStore, take: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        hold = self.hold_writes(store)
        if hold is None:
            pytest.skip("the store has no lock another connection can hold")
        began = time.time()
        if take in ("claim", "acquire"):  # an orphan: its owner on another host, its lease long over
            store.acquire(SID, other_host_owner(), 10.0, now=began - 100.0)
            store.append(SID, [ev(RunStarted, workflow="wf", ts=began - 100.0)], 0, epoch=1)
        me = other_host_owner("w-taker", pid=77)  # alive exactly while its lease lasts
        got: list[Lease | BaseException | None] = []

        def run() -> None:
            try:
                if take == "claim":
                    got.extend(c.lease for c in store.claim(me, ["wf"], _LEASE_S, limit=5, max_recoveries=0))
                elif take in ("acquire", "acquire-unmade"):
                    got.append(store.acquire(SID, me, _LEASE_S))
                else:
                    got.append(store.acquire_new(SID, me, _LEASE_S))
            except BaseException as exc:  # noqa: BLE001 (reported below)
                got.append(exc)

        taker = threading.Thread(target=run, daemon=True)
        real_time, offset = time.time, [0.0]
        read = threading.Event()  # the taker read the wall clock

        def wall() -> float:
            if threading.current_thread() is taker:
                read.set()
            return real_time() + offset[0]

        monkeypatch.setattr(time, "time", wall)
        with hold:
            taker.start()
            read.wait(0.1)  # a store may read no clock before it has the lock: that is the point
            time.sleep(0.05)  # it waits for the lock now
            offset[0] = _WAIT_S  # ... for longer than the lease
            taken_after = wall()
        taker.join(30)
        assert not taker.is_alive()
        [lease] = got
        assert isinstance(lease, Lease), lease
        assert lease.expires_at >= taken_after + _LEASE_S, (
            f"the lease granted ends {lease.expires_at - taken_after:.1f}s after the session was taken, "
            f"not {_LEASE_S}s: it was counted from before the wait"
        )
        if take == "claim":  # its taker holds it: no other claim takes it (nor counts a recovery)
            assert store.claim(other_host_owner("w-next", pid=78), ["wf"], _LEASE_S, limit=5) == []
        if take in ("claim", "acquire"):
            info = store.session_info(SID)
            assert info is not None and (info.owner, info.lease_expires_at) == (me, lease.expires_at)
