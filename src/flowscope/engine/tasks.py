"""The runs of one invocation in flight: their contexts, their tasks, and the abort.

:class:`RunTasks` is the part of an invocation that knows what runs now: the context of
every node run that started and has not ended (the lease keeper writes their heartbeats),
the root task :meth:`Runner.abort <flowscope.engine.runner.Runner.abort>` cancels, and
the tasks of the parallel branches a lost lease cancels at once. It records nothing: the
runs record how they ended (``attempts.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from .context import NodeContext

__all__ = ["RunTasks", "take_back_cancels", "settle_cancels", "others_ready"]


class RunTasks:
    """The node runs in flight, the root and branch tasks, and whether they are aborted."""

    def __init__(self) -> None:
        self._in_flight: dict[str, NodeContext] = {}
        #: The task the root workflow's run runs in: the caller's own (:meth:`enter`).
        self._root: asyncio.Task[Any] | None = None
        self._walking = False  # the root run is running in it now
        self._cancels = 0  # cancel() calls made on the caller's task for the run
        #: The tasks of parallel branches running now: a lost lease cancels them at once,
        #: not only when the root task gets to it.
        self._branches: set[asyncio.Task[Any]] | None = None  # made by the first step with branches
        self._aborting = False
        self._abort_reason = "aborted"
        self._by_request = False

    # -- runs in flight ----------------------------------------------------------------

    @property
    def in_flight(self) -> dict[str, NodeContext]:
        """The runs started and not ended, by path (the lease keeper copies its keys from
        its thread: a dict, mutated only on the loop). The engine's parts add a run when its
        ``NodeStarted`` is emitted and remove it when it ends, directly, on their hot path."""
        return self._in_flight

    def ended(self, path: str) -> bool:
        """The run at ``path`` ended; False if it was not in flight."""
        return self._in_flight.pop(path, None) is not None

    # -- tasks -------------------------------------------------------------------------

    def enter(self, task: asyncio.Task[Any]) -> None:
        """The root workflow's run runs in the caller's own ``task`` from now on, until
        :meth:`leave`: an abort or a lost lease cancels that task while it does (no task of
        its own, and no loop turn to start and finish one)."""
        self._root = task
        self._walking = True

    def leave(self) -> int:
        """The root run is over (:meth:`enter`); returns how many times its task was
        cancelled for it meanwhile (the caller takes those cancellations back)."""
        self._walking = False
        cancels, self._cancels = self._cancels, 0
        return cancels

    def add_branches(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        if self._branches is None:
            self._branches = set()
        self._branches.update(tasks)

    def drop_branches(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        if self._branches is not None:
            self._branches.difference_update(tasks)

    def _cancel_root(self, spare: asyncio.Task[Any] | None = None) -> bool:
        """Cancel the root run's task (not ``spare``); False if it is not running."""
        root = self._root
        if root is None or root is spare or not self._walking:  # past its run: not ours to cancel
            return False
        self._cancels += 1
        root.cancel()
        return True

    def cancel_all(self, spare: asyncio.Task[Any] | None = None) -> None:
        """Cancel the root run's task and every branch task but ``spare``."""
        self._cancel_root(spare)
        for task in self._branches or ():
            if task is not spare and not task.done():
                task.cancel()

    # -- the abort ---------------------------------------------------------------------

    @property
    def aborting(self) -> bool:
        """Is the invocation being aborted (its runs end as cancellations, R3)?"""
        return self._aborting

    @property
    def abort_reason(self) -> str:
        """The ``NodeCancelled`` reason of an abort."""
        return self._abort_reason

    @property
    def by_request(self) -> bool:
        """Was the abort asked for by a cancel message (``flowscope.cancel``)?"""
        return self._by_request

    def abort(self, reason: str, *, by_request: bool = False) -> bool:
        """Abort the runs: cancel the root run's task, recording ``reason``. False if the
        root run is not running (nothing to abort)."""
        if by_request:
            self._by_request = True
        if self._root is None or not self._walking:
            return False
        self._aborting = True
        self._abort_reason = reason
        self._cancel_root()
        return True

    def aborted_inside(self) -> None:
        """A run raised ``InvocationAbortedError`` itself: the others end as an abort's."""
        self._aborting = True


def take_back_cancels(task: asyncio.Task[Any], cancels: int) -> bool:
    """Take back the ``cancels`` cancellations an invocation requested of the caller's
    ``task`` for its run (an abort, a lost lease: :meth:`RunTasks.leave`); True if they were
    all there was (no one else cancelled the task meanwhile) and there was one."""
    for _ in range(cancels):
        task.uncancel()
    return cancels > 0 and task.cancelling() == 0


async def settle_cancels(task: asyncio.Task[Any], cancels: int) -> None:
    """The run ended without the ``cancels`` it requested of ``task`` reaching it as a
    ``CancelledError`` (requested in the step that ended the run, or turned into another
    error by a body): a cancellation still pending lands here and is taken back, with the
    others. A cancellation of the caller's own (``Task.cancelling``) still stands: raised."""
    if getattr(task, "_must_cancel", False):  # requested of the running task: lands at its next await
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass
    for _ in range(cancels):
        task.uncancel()
    if task.cancelling():
        raise asyncio.CancelledError


def others_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether other callbacks wait to run in ``loop``'s next turn (other tasks may be about
    to start invocations). Read from the loop's ready queue where it has the standard
    library's (``_ready``); True where it cannot be told."""
    ready = getattr(loop, "_ready", None)
    return ready is None or len(ready) > 0
