"""Group commit across sessions: the appends of a runner's invocations, batched per loop turn.

An invocation alone on its runner appends at once, in its own transaction. When several
are active, each flush is queued, and one callback at the end of the loop turn hands every
queued batch to :meth:`~flowscope.store.base.EventStore.append_many` (SQLite: one
transaction, one fsync, for all of them). A flush still returns only once its batch is
committed, so each session's next node waits for its terminal event to be on record. A
batch its store refused (a conflict, a lost lease) or a store error that failed them all
halts that invocation with the store's own exception, as a failed ``append`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..events import Event

if TYPE_CHECKING:  # pragma: no cover
    from ..store.base import EventStore

__all__ = ["GroupCommit", "Committing"]


class Committing(Protocol):
    """What the committer tells a recorder when its batch is settled."""

    def committed(self, batch: Sequence[Event], error: BaseException | None) -> None: ...


class _Queued(NamedTuple):
    """A flush waiting for the end of the loop turn: its batch, and whom to tell."""

    rec: Committing
    session_id: str
    batch: list[Event]
    expected: int
    epoch: int | None
    done: asyncio.Future[None]


class GroupCommit:
    """The appends of one runner's invocations (``active`` counts those running)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.active = 0
        self._queue: list[_Queued] = []

    def submit(
        self, rec: Committing, session_id: str, batch: list[Event], expected: int, epoch: int | None
    ) -> asyncio.Future[None] | None:
        """Append ``batch`` now (returns None) or at the end of this loop turn (returns the
        future to await). Either way ``rec.committed`` is called with the outcome, also when
        the awaiting task is cancelled meanwhile."""
        if self.active <= 1 and not self._queue:
            try:
                self.store.append(session_id, batch, expected, epoch=epoch)
            except BaseException as exc:  # a lock, a full disk, a lost lease: the recorder halts
                rec.committed(batch, exc)
            else:
                rec.committed(batch, None)
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._commit)
        self._queue.append(_Queued(rec, session_id, batch, expected, epoch, fut))
        return fut

    def _commit(self) -> None:
        queue, self._queue = self._queue, []
        try:
            results = self.store.append_many([(q.session_id, q.batch, q.expected, q.epoch) for q in queue])
        except BaseException as exc:  # the store failed the transaction: every batch in it failed
            outcome: list[BaseException | None] = [exc] * len(queue)
        else:
            outcome = [r if isinstance(r, BaseException) else None for r in results]
        for q, error in zip(queue, outcome):
            q.rec.committed(q.batch, error)
            if not q.done.done():
                q.done.set_result(None)
