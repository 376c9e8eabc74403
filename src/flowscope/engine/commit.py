"""Group commit across sessions: the appends of a runner's invocations, batched per loop turn.

An invocation alone on its runner appends at once, in its own transaction. When several
are active, each flush is queued, and one callback at the end of the loop turn hands every
queued batch to :meth:`~flowscope.store.base.EventStore.append_many` (SQLite: one
transaction, one fsync, for all of them). A flush still returns only once its batch is
committed, so each session's next node waits for its terminal event to be on record. A
batch its store refused (a conflict, a lost lease) or a store error that failed them all
halts that invocation with the store's own exception, as a failed ``append`` does. New
sessions that start while others run take their leases the same way, together
(:meth:`~flowscope.store.base.EventStore.acquire_new_many`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..events import Event
from ..fold import gc_paused
from ..ownership import Lease, Owner

if TYPE_CHECKING:  # pragma: no cover
    from ..store.base import EventStore

__all__ = ["GroupCommit", "Committing", "TurnWait"]


class Committing(Protocol):
    """What the committer tells a recorder when its batch is settled."""

    def committed(
        self, batch: Sequence[Event], error: BaseException | None, released: bool = False
    ) -> None: ...


class TurnWait:
    """What a queued flush awaits: the group commit's callback, which the first flush of the
    loop turn scheduled (``call_soon``) before any of the turn's flushes yielded, so it runs
    before their tasks resume (the loop runs callbacks in the order they were scheduled).
    Awaiting it is a bare yield (as ``asyncio.sleep(0)``), repeated until the commit marks it
    settled: no future, no done-callback, no wake-up method per flush. A cancellation of the
    waiting task lands at the ``await``, as it would on a future; the commit still tells the
    recorder how its batch ended."""

    __slots__ = ("settled",)

    def __init__(self) -> None:
        self.settled = False

    def __await__(self) -> Generator[None, None, None]:
        return self  # type: ignore[return-value]  # an iterator, as a generator would be

    def __iter__(self) -> TurnWait:
        return self

    def __next__(self) -> None:
        if self.settled:
            raise StopIteration
        return None  # a bare yield: the task steps again in the next loop turn


class _Queued(NamedTuple):
    """A flush waiting for the end of the loop turn: its batch, whom to tell, and the lease
    to end with it (an invocation's last flush)."""

    rec: Committing
    session_id: str
    batch: list[Event]
    expected: int
    epoch: int | None
    done: TurnWait
    release: Lease | None


class _Start:
    """A new session's lease request waiting for the end of the loop turn, and its answer."""

    __slots__ = ("session_id", "done", "result")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.done = TurnWait()
        self.result: Lease | BaseException | None = None


class GroupCommit:
    """The appends of one runner's invocations (``active`` counts those running)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.active = 0
        self._queue: list[_Queued] = []
        self._starts: dict[tuple[Owner, float], list[_Start]] = {}

    async def acquire_new(
        self, session_id: str, owner: Owner, lease_s: float, release: Callable[[Lease], None]
    ) -> Lease | None:
        """``store.acquire_new``: at once when no invocation runs, else at the end of this
        loop turn with the other sessions starting in it, in one step (a thousand sessions
        started together pay one transaction for their leases, not a thousand). Raises the
        store's refusal or error as ``acquire_new`` does; ``release`` ends the lease of a
        start cancelled while it waited."""
        if self.active == 0 and not self._starts:
            return self.store.acquire_new(session_id, owner, lease_s)
        start = _Start(session_id)
        if not self._starts:
            asyncio.get_running_loop().call_soon(self._start_queued)
        self._starts.setdefault((owner, lease_s), []).append(start)
        try:
            await start.done
        except BaseException:  # cancelled: the step ran first (it was scheduled before this
            # task's next step), so the lease it took for this session is let go here
            if isinstance(start.result, Lease):
                release(start.result)
            raise
        if isinstance(start.result, BaseException):
            raise start.result
        return start.result

    def _start_queued(self) -> None:
        starts, self._starts = self._starts, {}
        with gc_paused():
            for (owner, lease_s), queued in starts.items():
                results: list[Lease | BaseException | None]
                try:
                    results = list(
                        self.store.acquire_new_many([s.session_id for s in queued], owner, lease_s)
                    )
                except BaseException as exc:  # the store failed the transaction: every start failed
                    results = [exc] * len(queued)
                for start, result in zip(queued, results):
                    start.result = result
                    start.done.settled = True

    def submit(
        self,
        rec: Committing,
        session_id: str,
        batch: list[Event],
        expected: int,
        epoch: int | None,
        release: Lease | None = None,
    ) -> TurnWait | None:
        """Append ``batch`` now (returns None) or at the end of this loop turn (returns the
        :class:`TurnWait` to await). Either way ``rec.committed`` is called with the outcome,
        also when the awaiting task is cancelled meanwhile. With ``release`` (an invocation's last
        flush), the lease ends in the same step unless the session has mail
        (``EventStore.append_and_release``); ``committed`` is told whether it did."""
        if self.active <= 1 and not self._queue:
            released = False
            try:
                if release is None:
                    self.store.append(session_id, batch, expected, epoch=epoch)
                else:
                    results, ended = self.store.append_and_release(
                        [(session_id, batch, expected, epoch)], {session_id: release}
                    )
                    if isinstance(results[0], BaseException):
                        raise results[0]
                    released = session_id in ended
            except BaseException as exc:  # a lock, a full disk, a lost lease: the recorder halts
                rec.committed(batch, exc)
            else:
                rec.committed(batch, None, released)
            return None
        wait = TurnWait()
        if not self._queue:
            asyncio.get_running_loop().call_soon(self._commit)  # before this flush's task yields
        self._queue.append(_Queued(rec, session_id, batch, expected, epoch, wait, release))
        return wait

    def _commit(self) -> None:
        # One callback for every queued session: its per-batch rows and results are dead when
        # it returns, none in a cycle; the collector would only promote them on their way
        # (with thousands of sessions, to the oldest generation, which it then walks whole).
        with gc_paused():
            self._commit_queued()

    def _commit_queued(self) -> None:
        queue, self._queue = self._queue, []
        batches = [(q.session_id, q.batch, q.expected, q.epoch) for q in queue]
        leases = {q.session_id: q.release for q in queue if q.release is not None}
        ended: set[str] = set()
        try:
            if leases:
                results, ended = self.store.append_and_release(batches, leases)
            else:
                results = self.store.append_many(batches)
        except BaseException as exc:  # the store failed the transaction: every batch in it failed
            outcome: list[BaseException | None] = [exc] * len(queue)
        else:
            outcome = [r if isinstance(r, BaseException) else None for r in results]
        for q, error in zip(queue, outcome):
            q.rec.committed(q.batch, error, q.release is not None and q.session_id in ended)
            q.done.settled = True
