"""How the outputs of one step of a graph become the activations of the next.

Two rules live here:

- **A join runs once per complete set of its predecessors' outputs.** Its inputs wait in
  a queue of buffers ``{predecessor_name: output}``: an output goes to the oldest buffer
  that has none from its predecessor yet, so a second run of a predecessor (a node reached
  by two branches, a loop) starts the next buffer instead of overwriting the first. The
  oldest buffer is the first to fill, and fires; when nothing else can run, each join
  fires its oldest incomplete buffer (routing skipped a predecessor). Outputs are taken in
  the step's declaration order, so the activations are the same whatever the timing
  (docs/concepts.md, joins).
- **One value handed to several activations is copied for each after the first**
  (:func:`~flowscope.jsontext.copy_json`, for a list or dict): parallel branches never
  share one, so what a branch does to its input no sibling sees, live or after resume,
  where each reads its own from the log (R12, docs/design.md). A chain hands the output
  on as it is, at no cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..jsontext import copy_json
from .graph import START, Node, Workflow, label_matches
from .record import NodeResult

__all__ = ["Activation", "JoinBuffers", "first_activations", "next_activations"]

_new = tuple.__new__  # a NamedTuple from a tuple, one C call


class Activation(NamedTuple):
    """A node activated in a step of a graph, and the input it is activated with."""

    node: Node
    input: Any


class JoinBuffers:
    """The inputs of a graph pass's joins that are not complete yet: per join, a queue of
    buffers, oldest first. Each buffer holds the predecessor names of the one after it
    (an output goes to the oldest buffer without its name), so the oldest fills first."""

    __slots__ = ("_queues", "_filled", "_predecessors")

    def __init__(self, predecessors: Mapping[Node, Sequence[Node]]) -> None:
        self._queues: dict[Node, list[dict[str, Any]]] = {}
        #: per join, how many buffers hold each predecessor's output: the first that many
        #: (buffers fill oldest first), so an output finds its buffer without a scan
        self._filled: dict[Node, dict[str, int]] = {}
        self._predecessors = predecessors

    def __bool__(self) -> bool:
        return bool(self._queues)

    def arrive(self, join: Node, name: str, output: Any) -> dict[str, Any] | None:
        """The output of predecessor ``name`` reaches ``join``: the buffer it completes
        (the join's next input), or None."""
        queue = self._queues.get(join)
        if queue is None:
            queue = self._queues[join] = []
            filled = self._filled[join] = {}
        else:
            filled = self._filled[join]
        i = filled.get(name, 0)
        if i == len(queue):
            buf: dict[str, Any] = {}
            queue.append(buf)
        else:
            buf = queue[i]
        filled[name] = i + 1
        buf[name] = output
        if len(buf) < len(self._predecessors[join]):
            return None
        return self._take_oldest(join)  # buf: a complete buffer is the oldest (those before it would be)

    def _take_oldest(self, join: Node) -> dict[str, Any]:
        queue, filled = self._queues[join], self._filled[join]
        buf = queue.pop(0)
        for name in buf:
            filled[name] -= 1
        if not queue:
            del self._queues[join], self._filled[join]
        return buf

    def flush(self, order: Mapping[Node, int]) -> list[Activation]:
        """Nothing else can run: each join's oldest buffer, incomplete, in declaration order."""
        return [
            _new(Activation, (join, self._take_oldest(join)))
            for join in sorted(self._queues, key=order.__getitem__)
        ]


def first_activations(wf: Workflow, input: Any) -> list[Activation]:
    """The first step of ``wf``'s graph: the nodes after ``START``, each with its own input."""
    return [
        _new(Activation, (n, copy_json(input) if i else input))
        for i, (n, _label) in enumerate(wf.successors[START])
    ]


def next_activations(
    wf: Workflow,
    acts: Sequence[Activation],
    results: Sequence[NodeResult],
    joins: JoinBuffers,
    terminals: list[tuple[str, Any]],
) -> list[Activation]:
    """The next step of ``wf``'s graph after ``acts`` ended with ``results``; an output no
    edge takes is added to ``terminals``."""
    successors = wf.successors
    nxt: list[Activation] = []
    for act, r in zip(acts, results):
        n = act.node
        out = r.output
        fired = False
        for target, label in successors[n]:
            if label is not None and not label_matches(label, r.route):
                continue
            value = copy_json(out) if fired else out  # each activation its own value
            fired = True
            if target.kind == "join":
                ready = joins.arrive(target, n.name, value)
                if ready is not None:
                    nxt.append(_new(Activation, (target, ready)))
            else:
                nxt.append(_new(Activation, (target, value)))
        if not fired and r.has_output:
            terminals.append((n.name, out))
    if not nxt and joins:
        # Routing skipped some predecessors and nothing else can run: the joins fire with
        # the inputs they have.
        nxt = joins.flush(wf.order)
    return nxt
