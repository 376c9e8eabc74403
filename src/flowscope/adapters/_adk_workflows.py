"""The ADK bridge's record of a run's final failure on its way up, and of the retries of
the nested ``Workflow``\\ s it meets.

A run that fails for good is taken up by ADK workflow by workflow: each workflow it passes
through cancels the runs still going in it (its cleanup) and ends with the failure; the
nearest enclosing nested workflow with a ``retry_config`` that retries it (ADK's own
predicate, the bridge's count of its attempts) runs again, its completed children
replayed, else the invocation fails. The bridge sees a nested workflow only through its
children, so it follows the failure and records what the flowscope engine records for
the same graph, in the engine's order:

- a run ADK cancels meanwhile is cancelled because a sibling failed (``sibling_failed``);
  the cancellation of a run in a workflow higher up tells that the failure's workflows
  below it have ended: first their cancelled runs, then their ``NodeErrorPropagated``;
- the retried workflow's ``NodeRetrying`` waits until ADK has cancelled what ran in it,
  which the first run of its next attempt tells (or the invocation's end): the workflows
  the failure ended and the runs left open in it end first (a nested workflow cancelled
  with its runs: ``sibling_failed``);
- a final failure ends so at the invocation's end, up to the root's failure.

The workflows that ended start again at their next attempt when ADK's next run reaches
them (``BridgeRecorder.next_attempt``), as the engine's do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.adk.workflow._node_state import NodeState as AdkNodeState
from google.adk.workflow.utils._retry_utils import _get_retry_delay, _should_retry_node

from ._recorder import BridgeInvocation, BridgeRecorder, parent_of

__all__ = ["WorkflowRetries"]

#: The reason of a run ADK cancelled because a run beside it failed, as the engine says it.
SIBLING_FAILED = "sibling_failed"


class _Failure:
    """A run's final failure that ADK is taking up: ``origin``, the path of its error
    event; ``retried``, the nested workflow that retries it ("": none, the run fails)."""

    __slots__ = ("origin", "error", "retried", "delay")

    def __init__(self, origin: str, error: BaseException, retried: str, delay: float) -> None:
        self.origin, self.error, self.retried, self.delay = origin, error, retried, delay

    def stops(self, path: str, root: str) -> bool:
        """Is a cancellation of the run at ``path`` ADK's shutdown for this failure?"""
        top = (self.retried or root) + "/"
        return path.startswith(top) and not _on_path(path, self.origin)


def _on_path(path: str, origin: str) -> bool:
    """``path`` is ``origin``, one of its enclosing runs, or a run inside it."""
    return path == origin or origin.startswith(path + "/") or path.startswith(origin + "/")


def _common(a: str, b: str) -> str:
    """The deepest path enclosing both ``a`` and ``b``."""
    sa, sb = a.split("/"), b.split("/")
    n = 0
    while n < min(len(sa), len(sb)) and sa[n] == sb[n]:
        n += 1
    return "/".join(sa[:n])


class WorkflowRetries:
    """ADK's count of each nested workflow's attempts, and the failures on their way up.

    ``node_at``: the instrumented node a log path names; ``errors``: the bridge's ADK
    invocation id -> path of the run's failure (a retried failure is no longer the run's);
    ``runs``: its runs in flight, (ADK invocation id, ADK path) -> an object with ``ctx``
    (a run this ends is no longer in flight).
    """

    def __init__(
        self,
        recorder: BridgeRecorder,
        node_at: Callable[[str], Any],
        errors: dict[str, str],
        runs: dict[tuple[str, str], Any],
    ) -> None:
        self.recorder = recorder
        self.node_at = node_at
        self.errors = errors
        self.runs = runs
        self.attempts: dict[tuple[str, str], int] = {}  # (ADK invocation id, path) -> ADK's attempt
        self.failures: dict[str, list[_Failure]] = {}  # ADK invocation id -> failures on their way up

    def end(self, inv: BridgeInvocation | None, adk_id: str, failed: bool, error_path: str | None) -> None:
        """The invocation ends (``failed``: with the failure at ``error_path``): a retry
        ADK decided is recorded; the failure's runs end, up to the root (the caller's
        to end); ADK counts its workflows' attempts anew in the next invocation."""
        for key in [k for k in self.attempts if k[0] == adk_id]:
            del self.attempts[key]
        for f in self.failures.pop(adk_id, []):
            if inv is None:
                continue
            if f.retried:
                self._retry(inv, adk_id, f)
            elif failed and f.origin == error_path:
                self._ended(inv, adk_id, f, inv.root_path)
                self._cancel_in(inv, adk_id, inv.root_path, f.origin)

    def after_failure(
        self, inv: BridgeInvocation, adk_id: str, path: str, error: BaseException, origin: str
    ) -> None:
        """The final failure of the run at ``path`` (its error event at ``origin``): the
        nearest enclosing nested workflow ADK retries it with, its ``NodeRetrying`` once
        ADK has cancelled what ran in it. One failure at a time: a second one the same
        shutdown meets (a sibling's, or the failure again at a dynamic parent) is its."""
        failures = self.failures.setdefault(adk_id, [])
        if any(f.origin == origin or f.stops(path, inv.root_path) for f in failures):
            return
        parent = parent_of(path)
        while parent and parent != inv.root_path:
            delay = self._decide(inv, adk_id, parent, error)
            if delay is not None:
                failures.append(_Failure(origin, error, parent, delay))
                return
            parent = parent_of(parent)
        failures.append(_Failure(origin, error, "", 0.0))

    def retried(self, inv: BridgeInvocation, adk_id: str, path: str, error: BaseException) -> bool:
        """Is nested workflow ``path`` retried after its own ``error`` (its timeout, which
        cancelled all it ran)? If so, its ``NodeRetrying``."""
        delay = self._decide(inv, adk_id, path, error)
        if delay is not None:
            self.recorder.retrying(inv.open[path], inv.open[path].attempt, error, delay)
        return delay is not None

    def cancelling(self, inv: BridgeInvocation, adk_id: str, path: str) -> str:
        """The reason of ADK's cancellation of the run at ``path``: ``sibling_failed``
        while a failure takes the workflows around it down (the failure's workflows below
        the one that cancels it have ended: recorded first), else ``cancelled``."""
        for f in self.failures.get(adk_id, ()):
            if f.stops(path, inv.root_path):
                self._ended(inv, adk_id, f, _common(path, f.origin))
                return SIBLING_FAILED
        return "cancelled"

    def starting(self, inv: BridgeInvocation, adk_id: str, path: str) -> None:
        """A run at ``path`` starts: ADK's next attempt of a workflow it retried, if it is
        in one, which has cancelled all its previous attempt ran: its ``NodeRetrying``."""
        failures = self.failures.get(adk_id, [])
        for f in [f for f in failures if f.retried and path.startswith(f.retried + "/")]:
            failures.remove(f)
            self._retry(inv, adk_id, f)

    def completed(self, adk_id: str, path: str) -> None:
        """The run at ``path`` completed: a failure it caught (a dynamic child's) stops there."""
        failures = self.failures.get(adk_id, [])
        failures[:] = [f for f in failures if not f.origin.startswith(path + "/")]

    def _decide(self, inv: BridgeInvocation, adk_id: str, path: str, error: BaseException) -> float | None:
        """The delay before ADK's retry of nested workflow ``path`` after ``error`` (ADK's
        predicate, its ``retry_config``, ADK's count of its attempts), or None: no retry."""
        config = getattr(self.node_at(path), "retry_config", None)
        if path not in inv.open or config is None:
            return None
        key, prefix = (adk_id, path), path + "/"
        state = AdkNodeState(attempt_count=self.attempts.get(key, 1))
        if not _should_retry_node(error, config, state):
            return None
        self.attempts[key] = state.attempt_count + 1
        for below in [k for k in self.attempts if k[0] == adk_id and k[1].startswith(prefix)]:
            del self.attempts[below]  # ADK counts the attempts of its next run's workflows anew
        if self.errors.get(adk_id, "").startswith(prefix):
            del self.errors[adk_id]  # that failure is now an attempt's, not the run's
        return float(_get_retry_delay(config.model_copy(update={"jitter": 0.0}), state))

    def _retry(self, inv: BridgeInvocation, adk_id: str, f: _Failure) -> None:
        """The workflows ``f`` ended in ``f.retried`` and the runs left in it end, then
        its ``NodeRetrying``, as the engine's before its next attempt."""
        self._ended(inv, adk_id, f, f.retried)
        self._cancel_in(inv, adk_id, f.retried, f.origin)
        wctx = inv.open.get(f.retried)
        if wctx is not None:
            self.recorder.retrying(wctx, wctx.attempt, f.error, f.delay)

    def _ended(self, inv: BridgeInvocation, adk_id: str, f: _Failure, upto: str) -> None:
        """The nested workflows ``f`` passed through below ``upto`` have ended, innermost
        first: the runs still open in each end cancelled, then its ``NodeErrorPropagated``."""
        info = self.recorder.classify(f.error)
        parent = parent_of(f.origin)
        while parent.startswith(upto + "/"):
            ctx = inv.open.get(parent)
            if ctx is not None and ctx.kind == "workflow":
                self._cancel_in(inv, adk_id, parent, f.origin)
                self.recorder.propagate(inv, ctx, f.origin, info.code, info.type, info.qualname)
            parent = parent_of(parent)

    def _cancel_in(self, inv: BridgeInvocation, adk_id: str, path: str, origin: str) -> None:
        """The runs still open in ``path`` off ``origin``'s way up end ``sibling_failed``,
        deepest first: ADK's cleanup of ``path`` cancelled them (a nested workflow, seen
        only through its children; a run waiting out its retry backoff)."""
        below = [p for p in inv.open if p.startswith(path + "/") and not _on_path(p, origin)]
        for p in sorted(below, key=lambda p: -p.count("/")):
            self.recorder.cancel(inv, inv.open[p], SIBLING_FAILED)
        for key in [k for k, r in self.runs.items() if k[0] == adk_id and not r.ctx.open]:
            del self.runs[key]  # ended here, not by ADK's word on them
