"""The workflow engine: graphs, nodes, contexts and the runner.

It knows nothing of OpenTelemetry, Prometheus or SQL: it talks to a store through the
``EventStore`` port and to everything else through plugins.
"""

from .context import NodeContext, NodeOutcome, PauseSignal, RunInfo
from .graph import START, JoinNode, Node, RetryConfig, Route, Workflow, node
from .runner import Runner, RunResult

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
    "PauseSignal",
    "Runner",
    "RunResult",
]
