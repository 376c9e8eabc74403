"""The codec's fast payloads (NodeStarted, NodeCompleted) write the encoder's text, byte for byte."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from flowscope.events import NodeCompleted, NodeStarted
from flowscope.jsontext import dumps
from flowscope.store import codec

STRINGS = ["", "w@1", "w@1/a@2", 'quo"te', "back\\slash", "nl\nand\ttab", "é ü 漢字 🙂", "\x00\x1f\x7f"]
SCALARS: list[Any] = [None, True, False, 0, -1, 7, 2**70, -(2**70), *STRINGS]
OTHERS: list[Any] = [1.5, float("nan"), [1, "a"], {"k": [None]}, (1, 2)]


def generic(e: Any) -> str:
    return dumps({name: getattr(e, name) for name in codec._PAYLOAD_FIELDS[type(e)]})


@pytest.mark.parametrize(
    "kind,parent", list(itertools.product(["function", "join", "workflow", 'x"y'], STRINGS))
)
def test_node_started_payload_is_the_encoders(kind: str, parent: str) -> None:
    for attempt, recovered in itertools.product([1, 2, 10**20], [False, True]):
        e = NodeStarted(
            path="p", node="n", attempt=attempt, kind=kind, parent_path=parent, recovered=recovered
        )
        assert codec.encode("db", "s", e)[5] == generic(e)


def test_node_completed_payload_is_the_encoders() -> None:
    for output, route in itertools.product(SCALARS + OTHERS, [None, "yes", 3, 'r"t']):
        for has, count, done in itertools.product([True, False], [1, 4], [True, False]):
            e = NodeCompleted(
                path="p",
                node="n",
                output=output,
                has_output=has,
                route=route,
                attempt_count=count,
                completed=done,
            )
            assert codec.encode("db", "s", e)[5] == generic(e)


def test_values_the_fast_path_does_not_write_go_through_the_encoder() -> None:
    assert codec._node_completed(NodeCompleted(output=1.5)) is None  # a float: the encoder's repr rules
    assert codec._node_completed(NodeCompleted(output=[1])) is None
    assert codec._node_started(NodeStarted(attempt=True)) is None  # a bool where an int goes
    odd = NodeStarted(attempt="2")  # type: ignore[arg-type]  # not what the engine writes, still the encoder's text
    assert codec.encode("db", "s", odd)[5] == generic(odd)
