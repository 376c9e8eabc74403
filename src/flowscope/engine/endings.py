"""How an invocation lets its session go: the mail that came while it ran, its lease.

The runner calls these at the edges of an invocation: :func:`read_mail` when the lease
keeper finds mail (a cancel stops the run now), :func:`let_go` when it ends (the mail taken
in, the lease released), :func:`release` wherever a lease is given up. Each is best
effort: a lease that is not released expires by itself, and mail left in the inbox is taken
in by the next owner.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..errors import LeaseHandedOff, StoreLocked, StoreNotWritable, StoreUnavailable, describe_exception
from ..ownership import Lease
from ..store.base import EventStore
from .inbox import read_inbox, take_in

if TYPE_CHECKING:  # pragma: no cover
    from .invocation import Invocation

__all__ = ["release", "read_mail", "let_go"]

log = logging.getLogger("flowscope.engine")


def release(store: EventStore, lease: Lease) -> None:
    """Release ``lease``; a failure is logged, never raised (an expired lease frees the
    session anyway)."""
    try:
        store.release(lease)
    except Exception as exc:
        # A store that refuses writes or does not answer is the caller's error already (a
        # worker says it once per episode): no second warning per session.
        level = logging.INFO if isinstance(exc, (StoreNotWritable, StoreUnavailable)) else logging.WARNING
        log.log(
            level, "could not release the lease of session %s: %s", lease.session_id, describe_exception(exc)
        )


def read_mail(store: EventStore, inv: Invocation) -> None:
    """The session's inbox has mail while it runs here: a cancel stops the run now (its
    runs are cancelled, never failed; the session ends cancelled); anything else waits for
    the invocation's end."""
    try:
        messages = store.inbox(inv.session_id)
    except Exception as exc:  # the next round tells us again
        log.warning("session %s: could not read its inbox: %s", inv.session_id, describe_exception(exc))
        return
    cancel = read_inbox(inv.ws, messages).cancel
    if cancel is not None and not inv.aborting:
        inv.abort(cancel, by_request=True)


async def let_go(store: EventStore, inv: Invocation, *, keep_on_fault: bool = False) -> None:
    """An invocation that ended takes in what was sent meanwhile (an answer given while
    another branch ran, a cancel it stopped for, a retry of the failure it just recorded),
    so the session is answered, over or queued again, then releases its lease. After a
    server that did not answer, the release alone, off the loop: it may wait out the pool's
    timeout, and a drain of many sessions must not wait for each in turn on the loop; after
    a hand-off (:class:`~flowscope.errors.LeaseHandedOff`), nothing; with ``keep_on_fault``
    (the lease came with a worker's claim), nothing after a halt by the store either."""
    halted = inv.halted
    if isinstance(halted, LeaseHandedOff):  # let go without a call: the lease expires by itself
        return
    if keep_on_fault and isinstance(halted, (StoreLocked, StoreNotWritable, StoreUnavailable)):
        # Halted by its store (a lock held on, a full disk, a server away): the lease is
        # kept, to expire by itself, and the worker takes the session back once the store
        # takes writes. Released (a full disk still takes that small write), it would read
        # as orphaned at once, and a claim, the worker's own included, would take it over
        # as a recovery; and a release would wait on the store too.
        return
    if isinstance(halted, StoreUnavailable):  # nothing to take in, and a call may wait it out
        await asyncio.get_running_loop().run_in_executor(None, release, store, inv.lease)
        return
    if inv.in_sync():
        try:
            take_in(store, inv.ws, inv.lease)
        except Exception as exc:
            log.warning(
                "session %s: could not take in its messages: %s", inv.session_id, describe_exception(exc)
            )
    release(store, inv.lease)
