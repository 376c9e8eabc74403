"""Compact JSON text for what the log records: one encoder, made once.

``json.JSONEncoder.encode`` (and ``json.dumps`` with any non-default option) builds a new
C encoder on every call, which costs more than encoding a small event payload. The
encoders here are built once. They skip the circular-reference check: a cycle raises
``RecursionError`` instead of ``ValueError`` (callers treat both as "not JSON").
Otherwise the text is what ``json.dumps(value, separators=(",", ":"), allow_nan=...)``
writes, byte for byte.
"""

from __future__ import annotations

import json
from json import encoder as _encoder
from typing import Any, Callable

__all__ = ["dumps", "dumps_finite"]


def _default(o: Any) -> Any:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def _make(allow_nan: bool) -> Callable[[Any], str]:
    make = getattr(_encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another interpreter): the standard encoder
        return json.JSONEncoder(separators=(",", ":"), allow_nan=allow_nan, check_circular=False).encode
    c = make(None, _default, _encoder.encode_basestring_ascii, None, ":", ",", False, False, allow_nan)
    join = "".join

    def dumps(value: Any) -> str:
        return join(c(value, 0))

    return dumps


#: ``json.dumps(value, separators=(",", ":"))``: NaN and ±Infinity written as JavaScript does.
dumps = _make(allow_nan=True)
#: The same, refusing NaN and ±Infinity (``ValueError``): text that any JSON reader accepts.
dumps_finite = _make(allow_nan=False)
