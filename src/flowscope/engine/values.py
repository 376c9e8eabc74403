"""Values as the store keeps them: :func:`json_value`, the one JSON boundary every value a
node hands the engine passes (outputs, ``ctx.state``, answers, job results), once, when it
is recorded (R12, docs/design.md)."""

from __future__ import annotations

import inspect
import json
from typing import Any

from ..errors import OutputNotSerializableError
from ..jsontext import depth_over, dumps_finite, too_deep

__all__ = ["json_value", "is_native"]

_dumps = dumps_finite  # built once (flowscope.jsontext)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # {1: a, "1": b}: both keys are "1" in JSON, and one value would vanish
        dup = next(k for i, (k, _v) in enumerate(pairs) if any(k == k2 for k2, _ in pairs[:i]))
        raise ValueError(f"two keys become {dup!r} in JSON")
    return out


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_unique_keys)


_JSON_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


_BIG = 1 << 63
_MAX_NATIVE_DEPTH = 64


def _native(v: Any, depth: int) -> bool:
    """Is ``v`` already what a JSON round trip would give back (same types, same value)?

    Exact types only (a str or int subclass is converted by the round trip), finite floats,
    ints JSON readers agree on, str keys; shallow enough that a cycle cannot hide. Cheaper
    than the round trip for the small dicts and lists nodes usually return.
    """
    t = type(v)
    if t is str or t is bool or v is None:
        return True
    if t is int:
        return -_BIG <= v < _BIG
    if t is float:
        return v - v == 0.0  # finite: nan - nan and inf - inf are nan
    if depth >= _MAX_NATIVE_DEPTH:
        return False
    if t is dict:
        d = depth + 1
        for k, x in v.items():
            if type(k) is not str or not _native(x, d):
                return False
        return True
    if t is list:
        d = depth + 1
        for x in v:
            if not _native(x, d):
                return False
        return True
    return False


def is_native(value: Any) -> bool:
    """Is ``value`` already what the store keeps (:func:`json_value` would return it as is)?"""
    return _native(value, 0)


def json_value(value: Any, what: str, error: type[Exception] = OutputNotSerializableError) -> Any:
    """The value as the store keeps it, or ``error`` naming ``what`` (R12, docs/design.md).

    Values pass the JSON boundary once, here, when they are recorded: what a node, a
    ``RunResult`` or a resumed run sees is this value, live and after resume alike (a
    tuple is a list, an int key a str key). NaN and ±Infinity are refused (they are not
    JSON), and so is anything nested deeper than ``MAX_DEPTH`` (flowscope.jsontext: one
    limit, for every value recorded, whoever records it). JSON scalars are returned as they
    and containers of them are returned as they are, without a round trip (a type check
    per element: the common case).
    """
    if _native(value, 0):
        return value
    try:
        text = _dumps(value)
        out = _loads(text)
    except _JSON_ERRORS as exc:
        if isinstance(exc, RecursionError):
            raise error(too_deep(what)) from None
        if inspect.isawaitable(value):  # `return ctx.request_input(...)`: the call was never awaited
            if inspect.iscoroutine(value):
                value.close()  # said here, in the error: not again as "never awaited" at exit
            raise error(
                f"{what} is a {type(value).__name__}, not a value: an await is missing "
                "(return await ctx.request_input(...), not return ctx.request_input(...))"
            ) from None
        raise error(
            f"{what} is a {type(value).__name__} that is not JSON-serialisable ({str(exc):.200}); "
            "return JSON data: dict with str keys, list, str, finite number, bool or None"
        ) from None
    if depth_over(out, text):
        raise error(too_deep(what))
    return out
