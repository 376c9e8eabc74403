"""The ADK bridge's record of a nested ``Workflow``'s retries.

ADK retries a nested workflow with a ``retry_config`` when a run in it fails for good (or
it overruns its own ``timeout``): it runs the workflow again, its completed children
replayed. The bridge sees a nested workflow only through its children, so it asks ADK's
own retry predicate which enclosing workflow retries a failure, and records what the
flowscope engine records for the same graph: the ``NodeErrorPropagated`` of each nested
workflow the failure ended on its way up, then the retried workflow's ``NodeRetrying``.
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


class WorkflowRetries:
    """ADK's count of each nested workflow's attempts, and the retries it decides.

    ``node_at``: the instrumented node a log path names; ``errors``: the bridge's ADK
    invocation id -> path of the run's failure (a retried failure is no longer the run's).
    """

    def __init__(
        self, recorder: BridgeRecorder, node_at: Callable[[str], Any], errors: dict[str, str]
    ) -> None:
        self.recorder = recorder
        self.node_at = node_at
        self.errors = errors
        self.attempts: dict[tuple[str, str], int] = {}  # (ADK invocation id, path) -> ADK's attempt

    def forget(self, adk_id: str) -> None:
        """The invocation ended: ADK counts its workflows' attempts anew in the next."""
        for key in [k for k in self.attempts if k[0] == adk_id]:
            del self.attempts[key]

    def after_failure(
        self, inv: BridgeInvocation, adk_id: str, path: str, error: BaseException, origin: str
    ) -> None:
        """The final failure of the run at ``path`` (its error event at ``origin``): the
        ``NodeRetrying`` of the nearest enclosing nested workflow ADK retries it with."""
        parent = parent_of(path)
        while parent and parent != inv.root_path and not self.retried(inv, adk_id, parent, error, origin):
            parent = parent_of(parent)

    def retried(
        self, inv: BridgeInvocation, adk_id: str, path: str, error: BaseException, origin: str
    ) -> bool:
        """Is nested workflow ``path`` retried after ``error`` (ADK's predicate, its
        ``retry_config``, ADK's count of its attempts)? If so, the nested workflows still
        open between it and ``origin`` end (``NodeErrorPropagated``, deepest first), as
        the engine's do before the retry, and ``path`` gets its ``NodeRetrying``."""
        wctx, config = inv.open.get(path), getattr(self.node_at(path), "retry_config", None)
        if wctx is None or config is None:
            return False
        key, prefix = (adk_id, path), path + "/"
        state = AdkNodeState(attempt_count=self.attempts.get(key, 1))
        if not _should_retry_node(error, config, state):
            return False
        self.attempts[key] = state.attempt_count + 1
        for below in [k for k in self.attempts if k[0] == adk_id and k[1].startswith(prefix)]:
            del self.attempts[below]  # ADK counts the attempts of its next run's workflows anew
        info = self.recorder.classify(error)
        ended = [c for p, c in inv.open.items() if p.startswith(prefix) and origin.startswith(p + "/")]
        for c in sorted((c for c in ended if c.kind == "workflow"), key=lambda c: -len(c.path)):
            self.recorder.propagate(inv, c, origin, info.code, info.type, info.qualname)
        delay = _get_retry_delay(config.model_copy(update={"jitter": 0.0}), state)
        self.recorder.retrying(wctx, wctx.attempt, error, delay)
        if self.errors.get(adk_id, "").startswith(prefix):
            del self.errors[adk_id]  # that failure is now an attempt's, not the run's
        return True
