"""The runs of one invocation in flight: their contexts, their tasks, and the abort.

:class:`RunTasks` is the part of an invocation that knows what runs now: the context of
every node run that started and has not ended (the lease keeper writes their heartbeats),
the root task :meth:`Runner.abort <flowscope.engine.runner.Runner.abort>` cancels, and
the tasks of the parallel branches a lost lease cancels at once. It records nothing: the
runs record how they ended (``attempts.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any

from .context import NodeContext

__all__ = ["RunTasks"]


class RunTasks:
    """The node runs in flight, the root and branch tasks, and whether they are aborted."""

    def __init__(self) -> None:
        self._in_flight: dict[str, NodeContext] = {}
        self._root: asyncio.Future[Any] | None = None
        #: The tasks of parallel branches running now: a lost lease cancels them at once,
        #: not only when the root task gets to it.
        self._branches: set[asyncio.Task[Any]] = set()
        self._aborting = False
        self._abort_reason = "aborted"
        self._by_request = False

    # -- runs in flight ----------------------------------------------------------------

    @property
    def in_flight(self) -> dict[str, NodeContext]:
        """The runs started and not ended, by path (the lease keeper copies its keys from
        its thread: a dict, mutated only on the loop). The engine's parts add and remove
        runs in it directly on their hot path, as :meth:`started` and :meth:`ended` do."""
        return self._in_flight

    def started(self, ctx: NodeContext) -> None:
        """``ctx``'s run started (its ``NodeStarted`` emitted)."""
        self._in_flight[ctx.path] = ctx

    def ended(self, path: str) -> bool:
        """The run at ``path`` ended; False if it was not in flight."""
        return self._in_flight.pop(path, None) is not None

    # -- tasks -------------------------------------------------------------------------

    def start_root(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Run the root workflow's run as the task an abort cancels."""
        task = self._root = asyncio.ensure_future(coro)
        return task

    def add_branches(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        self._branches.update(tasks)

    def drop_branches(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        self._branches.difference_update(tasks)

    def cancel_all(self, spare: asyncio.Task[Any] | None = None) -> None:
        """Cancel the root task and every branch task but ``spare``."""
        for task in (self._root, *self._branches):
            if task is not None and task is not spare and not task.done():
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
        """Abort the runs: cancel the root task, recording ``reason``. False if the root
        is not running (nothing to abort)."""
        if by_request:
            self._by_request = True
        root = self._root
        if root is None or root.done():
            return False
        self._aborting = True
        self._abort_reason = reason
        root.cancel()
        return True

    def aborted_inside(self) -> None:
        """A run raised ``InvocationAbortedError`` itself: the others end as an abort's."""
        self._aborting = True
