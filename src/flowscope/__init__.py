"""flowscope: an async workflow engine you can operate.

Every node run passes through plugin hooks (OpenTelemetry spans, Prometheus metrics) and
is recorded in an event-sourced store, so a paused or crashed run resumes without
re-running finished work.
"""

from .actions import ActionReceipt, cancel, retry
from .answers import AnswerReceipt, answer
from .engine import (
    START,
    JoinNode,
    Node,
    NodeContext,
    NodeOutcome,
    RetryConfig,
    Route,
    RunInfo,
    Runner,
    RunResult,
    Workflow,
    node,
)
from .plugins import Plugin
from .store.memory import MemoryEventStore as _MemoryEventStore
from .worker import Worker

# The composition root: the engine knows only the EventStore port, so the package that
# ships both decides which store a Runner built without one gets.
Runner.default_store = _MemoryEventStore

__all__ = [
    "Workflow",
    "node",
    "Node",
    "JoinNode",
    "START",
    "Route",
    "RetryConfig",
    "NodeContext",
    "NodeOutcome",
    "RunInfo",
    "Runner",
    "RunResult",
    "Plugin",
    "Worker",
    "answer",
    "AnswerReceipt",
    "retry",
    "cancel",
    "ActionReceipt",
    "__version__",
]

__version__ = "0.1.0"
