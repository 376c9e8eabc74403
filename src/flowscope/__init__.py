"""flowscope: an async workflow engine you can operate.

Every node run passes through plugin hooks (OpenTelemetry spans, Prometheus metrics) and
is recorded in an event-sourced store, so a paused or crashed run resumes without
re-running finished work.
"""

from .engine import (
    START,
    JoinNode,
    Node,
    NodeContext,
    NodeOutcome,
    RetryConfig,
    Route,
    Runner,
    RunInfo,
    RunResult,
    Workflow,
    node,
)
from .plugins import Plugin

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
    "__version__",
]

__version__ = "0.1.0"
