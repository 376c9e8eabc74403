"""The workflow engine: graphs, nodes, contexts and the runner.

It knows nothing of OpenTelemetry, Prometheus or SQL: it talks to a store through the
``EventStore`` port and to everything else through the hook port (``hooks.py``).

Modules, each importing only those listed before it: ``graph`` (what a workflow is),
``context`` (what a node and a plugin see), ``hooks`` (the plugin port), ``tasks`` (an
invocation's runs in flight and its abort), ``record`` (an invocation's record: emit and
flush under its lease), ``attempts`` and ``pauses`` (a node run's attempts; input and
jobs), ``invocation`` (the invocation composed of those parts, scheduling a graph in
steps), ``submit`` (the checks every entry point applies to a run's id and input),
``runner`` (the public ``Runner``: load, resume, snapshots).
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
