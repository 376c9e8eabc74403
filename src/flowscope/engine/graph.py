"""Nodes and graphs: what a workflow is, before anything runs."""

from __future__ import annotations

import inspect
import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, overload

from ..errors import WorkflowError

__all__ = [
    "Node",
    "node",
    "JoinNode",
    "Workflow",
    "START",
    "Route",
    "RetryConfig",
    "label_matches",
    "check_name",
    "MAX_NODE_NAME",
    "MAX_SESSION_ID",
    "MAX_DEPTH",
    "check_depth",
    "is_number",
]

#: The longest node (or workflow) name, in characters: names are in every path.
MAX_NODE_NAME = 200
#: The longest session id, in characters.
MAX_SESSION_ID = 256
#: The deepest a run may be nested: the segments of its path, workflows in workflows and
#: dynamic children (``ctx.run_node``) together. Deeper is nearly always a workflow or a
#: node that runs itself without end, which Python's stack would cut off with a
#: ``RecursionError`` that no run records.
MAX_DEPTH = 100
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
#: What a sync node body usually returns: never awaitable, so no ``inspect.isawaitable``
#: (an ABC check, ten times the cost of this set lookup) on the node path.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes, list, dict, tuple})


def check_depth(parent_path: str, node: Node) -> None:
    """Refuse (``WorkflowError``, ``WORKFLOW_ERROR``) to run ``node`` under the run at
    ``parent_path`` when its deepest run would be nested past :data:`MAX_DEPTH`."""
    depth = parent_path.count("/") + 1 + node.depth
    if depth > MAX_DEPTH:
        raise WorkflowError(
            f"{node.name!r} would run {depth} deep; runs nest at most {MAX_DEPTH} deep "
            "(does a workflow or a node run itself without end?)"
        )


def check_name(value: object, what: str, limit: int) -> str:
    """``value`` if every store can keep it as a name or id, else a ``ValueError`` naming
    the problem: not a str, empty, longer than ``limit`` characters, a control character
    (NUL included: PostgreSQL text cannot hold one) or a lone surrogate (not UTF-8)."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > limit:
        raise ValueError(f"{what} is {len(value)} characters long; at most {limit} are allowed")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value[:40]!r} contains a lone surrogate: it is not valid UTF-8") from None
    bad = _CONTROL.search(value)
    if bad is not None:
        raise ValueError(f"{what} {value[:40]!r} contains the control character {bad.group()!r}")
    return value


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """How often and how soon a failed attempt is tried again.

    ``max_attempts`` counts every attempt, the first included. ``exceptions`` lists the
    exception class names (``type(e).__name__``) that may be retried; ``None`` means all.
    The delay before retry *n* is ``initial_delay * backoff_factor**(n-1)``, capped at
    ``max_delay`` and reduced by up to ``jitter`` (a fraction) at random, so that many
    runs failing together do not retry in lockstep.
    """

    max_attempts: int = 1
    initial_delay: float = 1.0
    max_delay: float = 60.0
    backoff_factor: float = 2.0
    jitter: float = 0.1
    exceptions: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int:  # 2.5 would make 3 attempts, "3" fail at the first retry
            raise TypeError(f"RetryConfig.max_attempts is a whole number, not {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError("RetryConfig.max_attempts must be at least 1")
        for field_name in ("initial_delay", "max_delay", "backoff_factor", "jitter"):
            value = getattr(self, field_name)
            if not is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RetryConfig.{field_name} is a number of 0 or more, not {value!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("RetryConfig.jitter is a fraction between 0 and 1")
        names = self.exceptions
        # a bare string would match by substring ("ValueErrors" retrying a ValueError), a
        # class never: both are mistakes, refused here rather than at the first failure
        if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
            raise TypeError(
                f"RetryConfig.exceptions takes exception class names (type(e).__name__), such as "
                f"('TimeoutError', 'ConnectionError'), not {names!r}"
            )

    def retries(self, error_type: str) -> bool:
        """May a failure of this exception type name be retried at all?"""
        return self.exceptions is None or error_type in self.exceptions

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed attempt."""
        d = min(self.max_delay, self.initial_delay * self.backoff_factor ** max(0, failures - 1))
        if self.jitter:
            d *= 1.0 - self.jitter * (rng or random).random()
        return max(0.0, d)


@dataclass(frozen=True, slots=True)
class Route:
    """Returned by a node to choose the outgoing edges labelled ``label``.

    A label matches an edge's label when both are equal and of the same type, as the edges
    declare them (``Route(1)`` takes the edge keyed ``1``, not ``"1"``). A label that matches
    no outgoing edge fails the node with ``ROUTE_NOT_FOUND`` (R12, docs/design.md).
    """

    label: str | int
    output: Any = None


def label_matches(edge_label: str | int | None, route: str | int | None) -> bool:
    """Does an edge fire for a run that chose ``route``? An unlabelled edge always fires;
    a labelled one when the route equals it and has its type (``True`` is not ``1``)."""
    return edge_label is None or (edge_label == route and type(edge_label) is type(route))


def is_number(value: object) -> bool:
    """An int or a float, not a bool: what a number of seconds, attempts or a factor is."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Start:
    __slots__ = ()
    name = "__start__"

    def __repr__(self) -> str:
        return "START"


START: Any = _Start()


class Node:
    """A unit of work in a workflow: a sync or async function of ``(ctx, input)`` or ``(input)``."""

    kind = "function"
    #: The segments its deepest run adds to a path: 1, a workflow's more (:data:`MAX_DEPTH`).
    depth = 1

    def __init__(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        retry: RetryConfig | None = None,
        timeout: float | None = None,
    ) -> None:
        if name is None:
            if fn is None:
                raise ValueError("a Node needs a name or a function")
            name = fn.__name__
        check_name(name, "node name", MAX_NODE_NAME)
        if "/" in name or "@" in name:
            raise ValueError(f"invalid node name {name!r}: it must be non-empty, without '/' or '@'")
        if timeout is not None and (not is_number(timeout) or not timeout > 0 or not math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds (or None), not {timeout!r}")
        if retry is not None and not isinstance(retry, RetryConfig):
            raise TypeError(
                f"retry takes a RetryConfig, e.g. retry=RetryConfig(max_attempts={retry!r}), not {type(retry).__name__}"
                if isinstance(retry, int) and not isinstance(retry, bool)
                else f"retry takes a RetryConfig (or None), not {type(retry).__name__}"
            )
        self.name = name
        self.fn = fn
        self.retry = retry
        self.timeout = timeout
        self._is_async = False
        self._arity = 0
        if fn is not None:
            self._is_async = inspect.iscoroutinefunction(fn)
            signature = inspect.signature(fn).parameters.values()
            params = [
                p
                for p in signature
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
            ]
            keyword_only = [p.name for p in signature if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
            if len(params) > 2 or keyword_only:
                # called with (ctx, input) at most: caught here, not as the node's TypeError at its first run
                wanted = ", ".join(p.name for p in params) + (
                    ", *, " + ", ".join(keyword_only) if keyword_only else ""
                )
                raise TypeError(
                    f"node {name!r}: its function takes ({wanted}); a node's function takes (ctx, input), "
                    "(input), (ctx) or nothing (a method: decorate it on its instance, not in the class)"
                )
            if len(params) >= 2:
                self._arity = 2
            elif len(params) == 1:
                self._arity = -1 if params[0].name == "ctx" else 1
            else:
                self._arity = 0

    @property
    def is_sync(self) -> bool:
        """A plain function body (not a coroutine function, not a graph, not the identity)."""
        return self.fn is not None and not self._is_async

    def call(self, ctx: Any, input: Any) -> Any:
        """Call the function with the arguments it takes; a coroutine function's call
        returns its coroutine."""
        fn = self.fn
        if fn is None:
            return input
        a = self._arity
        if a == 2:
            return fn(ctx, input)
        if a == 1:
            return fn(input)
        if a == -1:
            return fn(ctx)
        return fn()

    def begin(self, ctx: Any, input: Any) -> tuple[Any, bool]:
        """Start the body once (one attempt): ``(its value, False)`` for a body that is done
        (a plain function), or ``(an awaitable of its value, True)``. What :meth:`execute`
        awaits; the engine calls it directly, so a plain body runs without a coroutine."""
        if self.fn is None:
            return input, False
        r = self.call(ctx, input)
        return r, self._is_async or (type(r) not in _PLAIN and inspect.isawaitable(r))

    async def execute(self, ctx: Any, input: Any) -> Any:
        """Run the body once (one attempt)."""
        r, pending = self.begin(ctx, input)
        if pending:
            r = await r
        return r

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (handy in unit tests of a node)."""
        if self.fn is None:
            raise TypeError(f"node {self.name!r} has no function")
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


@overload
def node(
    fn: Callable[..., Any],
    *,
    name: str | None = ...,
    retry: RetryConfig | None = ...,
    timeout: float | None = ...,
) -> Node: ...
@overload
def node(
    fn: None = ..., *, name: str | None = ..., retry: RetryConfig | None = ..., timeout: float | None = ...
) -> Callable[[Callable[..., Any]], Node]: ...
def node(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retry: RetryConfig | None = None,
    timeout: float | None = None,
) -> Node | Callable[[Callable[..., Any]], Node]:
    """Decorator making a :class:`Node` of a function: ``@node`` or ``@node(name=..., retry=...)``."""
    if fn is not None:
        return Node(fn, name=name, retry=retry, timeout=timeout)
    return lambda f: Node(f, name=name, retry=retry, timeout=timeout)


class JoinNode(Node):
    """Waits for all its predecessors; its input is ``{predecessor_name: output}``.

    A predecessor that routing skipped is left out once nothing else can run, so a
    join after a route does not wait forever.
    """

    kind = "join"

    def __init__(self, name: str, fn: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        super().__init__(fn, name=name, **kwargs)


class Workflow(Node):
    """A graph of nodes. A workflow is itself a node and can be nested in another's edges.

    ``edges`` is a list of chains: ``(START, a, b)`` links START→a→b; a tuple in a chain
    fans out in parallel (``(a, (b, c))``) or fans in (``((b, c), join)``); a dict maps
    route labels to targets (``(check, {"ok": send, "no": notify})``). ``max_steps`` bounds
    the steps of one pass through this graph (a step runs every node activated together,
    however many), so a loop cannot run forever while a wide fan-out is one step.
    """

    kind = "workflow"

    def __init__(
        self,
        name: str,
        edges: Iterable[Sequence[Any]],
        *,
        retry: RetryConfig | None = None,
        timeout: float | None = None,
        max_steps: int = 10_000,
    ) -> None:
        super().__init__(None, name=name, retry=retry, timeout=timeout)
        if type(max_steps) is not int or max_steps < 1:
            raise ValueError(f"max_steps is a whole number of 1 or more, not {max_steps!r}")
        self.max_steps = max_steps
        self.nodes: dict[str, Node] = {}
        self.order: dict[Node, int] = {}  # declaration order, for deterministic scheduling
        # successors[node] = [(target, label or None), ...]; START is a key too
        self.successors: dict[Any, list[tuple[Node, str | int | None]]] = {START: []}
        self.predecessors: dict[Node, list[Node]] = {}
        self._edges: set[tuple[int, int, type, Any]] = set()
        self._preds: set[tuple[int, int]] = set()
        for chain in edges:
            self._add_chain(chain)
        if not self.successors[START]:
            raise WorkflowError(f"workflow {name!r} has no edge from START")
        self._check_reached()
        #: The nodes every edge out of which is labelled: one must return a Route, or its
        #: run would end the branch silently (a forgotten Route reads as a finished workflow).
        self.routed_only = frozenset(
            n for n, out in self.successors.items() if out and all(label is not None for _t, label in out)
        )
        self.depth = 1 + max(n.depth for n in self.nodes.values())
        if self.depth > MAX_DEPTH:
            raise WorkflowError(
                f"workflow {name!r} nests its runs {self.depth} deep; they nest at most {MAX_DEPTH} deep"
            )

    def _check_reached(self) -> None:
        """Refuse nodes no path from START reaches: they could never run, and an edge
        forgotten or mistyped would otherwise read as a workflow that finished early."""
        seen: set[Any] = {START}
        todo: list[Any] = [START]
        while todo:
            for dst, _label in self.successors[todo.pop()]:
                if dst not in seen:
                    seen.add(dst)
                    todo.append(dst)
        never = [n.name for n in self.nodes.values() if n not in seen]
        if never:
            listed = ", ".join(repr(n) for n in never[:5]) + (
                f" and {len(never) - 5} more" if len(never) > 5 else ""
            )
            raise WorkflowError(
                f"workflow {self.name!r}: no edge from START leads to {listed}; "
                "link it from START or from a node that runs, or remove its edges"
            )

    def _register(self, n: Any) -> Node:
        if n is START:
            raise WorkflowError(f"workflow {self.name!r}: START can only begin a chain")
        if not isinstance(n, Node):
            raise WorkflowError(f"workflow {self.name!r}: {n!r} is not a node (decorate it with @node)")
        known = self.nodes.get(n.name)
        if known is not None and known is not n:
            raise WorkflowError(f"workflow {self.name!r} has two different nodes named {n.name!r}")
        if known is None:
            self.nodes[n.name] = n
            self.order[n] = len(self.order)
            self.successors.setdefault(n, [])
            self.predecessors.setdefault(n, [])
        return n

    def _link(self, src: Any, dst: Node, label: str | int | None) -> None:
        # Membership through sets: a fan-out of 20,000 is 20,000 links, not 20,000² compares.
        key = (id(src), id(dst), type(label), label)
        if key in self._edges:
            return
        self._edges.add(key)
        self.successors[src].append((dst, label))
        if src is not START and (id(src), id(dst)) not in self._preds:
            self._preds.add((id(src), id(dst)))
            self.predecessors[dst].append(src)

    def _targets(self, element: Any) -> list[Node]:
        if isinstance(element, (tuple, list)):
            return [self._register(n) for n in element]
        return [self._register(element)]

    def _add_chain(self, chain: Sequence[Any]) -> None:
        if not isinstance(chain, (tuple, list)) or len(chain) < 2:
            raise WorkflowError(
                f"workflow {self.name!r}: an edge is a tuple of at least two elements, got {chain!r}"
            )
        first, *rest = chain
        tails: list[Any] = [START] if first is START else self._targets(first)
        for element in rest:
            new_tails: list[Node] = []
            if isinstance(element, dict):
                for label, target in element.items():
                    if type(label) is not str and type(label) is not int:
                        raise WorkflowError(
                            f"workflow {self.name!r}: route label {label!r} is a {type(label).__name__}; "
                            "a label is a str or an int"
                        )
                    for dst in self._targets(target):
                        for src in tails:
                            self._link(src, dst, label)
                        new_tails.append(dst)
            else:
                for dst in self._targets(element):
                    for src in tails:
                        self._link(src, dst, None)
                    new_tails.append(dst)
            tails = new_tails
