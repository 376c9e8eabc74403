"""flowscope.jsontext writes what json.dumps writes, without building an encoder per call."""

from __future__ import annotations

import json
import math

import pytest

from flowscope.jsontext import copy_json, dumps, dumps_finite

VALUES = [
    "abc", "é\u2028\x00\ud83d", 1, -(2**70), 1.5, 1e300, -0.0, True, None, [], {},
    [1, [2, {"a": "b"}]], {"k": [1.25, None, "x"], "ü": 1}, (1, 2),
    {1: "int key", 2.5: "float key", True: "bool key", None: "none key"},  # noqa: F601  (True is 1: the dump keeps one)
    {"attempt": 1, "kind": "task", "parent_path": "w@1", "recovered": False},
]  # fmt: skip


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_text_is_json_dumps_compact_byte_for_byte(value):
    assert dumps(value) == json.dumps(value, separators=(",", ":"))
    assert dumps_finite(value) == json.dumps(value, separators=(",", ":"), allow_nan=False)


@pytest.mark.parametrize("value", [math.nan, math.inf, [1, -math.inf], {"x": math.nan}], ids=repr)
def test_nan_and_infinity_are_written_by_dumps_and_refused_by_dumps_finite(value):
    assert dumps(value) == json.dumps(value, separators=(",", ":"))
    with pytest.raises(ValueError):
        dumps_finite(value)


@pytest.mark.parametrize("value", [object(), {"a": {1, 2}}, {(1, 2): 3}], ids=["object", "set", "tuple key"])
def test_what_json_cannot_hold_is_a_type_error(value):
    with pytest.raises(TypeError):
        dumps(value)


def test_a_cycle_is_a_recursion_error_and_the_encoder_still_works_after_it():
    loop: list = []
    loop.append(loop)
    with pytest.raises(RecursionError):
        dumps(loop)
    assert dumps({"after": [1]}) == '{"after":[1]}'  # no state left behind by the failed call


def test_a_json_copy_shares_no_list_or_dict_with_the_value():
    value = {"rows": [1, {"a": [2.5, None, True]}], "s": "x"}
    copy = copy_json(value)
    assert copy == value and copy is not value
    assert copy["rows"] is not value["rows"] and copy["rows"][1]["a"] is not value["rows"][1]["a"]
    assert copy_json("text") == "text" and copy_json(None) is None


def test_a_json_copy_of_a_value_marshal_cannot_hold_copies_its_lists_and_dicts():
    class Tag(str):
        pass

    inner = [Tag("t")]
    copy = copy_json({"k": inner})
    assert copy == {"k": ["t"]} and copy["k"] is not inner and type(copy["k"][0]) is Tag
