"""A table of hostile values (outputs, state values, exception types
and messages, ids, names) fed through one workflow on one SQLite file.

For each row: a clear error (the documented class and ``error_code``) or the documented
value; the session's log gap-free from seq 1; and every run that completed earlier in the
table still there, with its output.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import math
from collections.abc import Callable
from typing import Any

import pytest

from flowscope import START, Route, Runner, Workflow, node
from flowscope.errors import OutputNotSerializableError, RouteNotFoundError, StateNotSerializableError
from flowscope.store import SqliteEventStore, rebuild


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


class StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("broken __str__")


class CodeRaises(Exception):
    @property
    def error_code(self):
        raise RuntimeError("broken error_code")


class Coded(Exception):
    def __init__(self, code: Any) -> None:
        super().__init__("coded")
        self.error_code = code


def deep(n: int) -> list:
    v: list = []
    for _ in range(n):
        v = [v]
    return v


def circular() -> list:
    v: list = []
    v.append(v)
    return v


OK, FAIL, REFUSED = "ok", "fail", "refused"
_ = object()  # "any message"


def out(value: Any, expected: Any = _, code: str | None = None) -> tuple:
    """A node returns ``value``: completes with ``expected`` or fails with ``code``."""
    return ("output", lambda: value, expected, code)


def state(value: Any, code: str | None = None, key: Any = "k") -> tuple:
    return ("state", (key, value), value, code)


def exc(make: Callable[[], BaseException], code: str, message: Any = _) -> tuple:
    return ("raise", make, message, code)


ONS, SNS = "OUTPUT_NOT_SERIALIZABLE", "STATE_NOT_SERIALIZABLE"

TABLE: list[tuple[str, tuple]] = [
    # outputs: the documented value (as JSON keeps it) or OUTPUT_NOT_SERIALIZABLE
    ("int-key dict", out({1: "a"}, {"1": "a"})),
    ("tuple", out((1, 2), [1, 2])),
    ("nested tuples", out({"k": ((1,), {"t": (2,)})}, {"k": [[1], {"t": [2]}]})),
    ("nan", out(math.nan, code=ONS)),
    ("inf", out(math.inf, code=ONS)),
    ("-inf", out(-math.inf, code=ONS)),
    ("nan in a list", out([1.0, math.nan], code=ONS)),
    ("inf as a dict value", out({"x": math.inf}, code=ONS)),
    ("set", out({1, 2}, code=ONS)),
    ("bytes", out(b"\x00\xff", code=ONS)),
    ("object", out(object(), code=ONS)),
    ("datetime", out(datetime.datetime(2024, 1, 1), code=ONS)),
    ("decimal", out(decimal.Decimal("1.1"), code=ONS)),
    ("10,000 deep", out(deep(10_000), code=ONS)),
    ("circular list", out(circular(), code=ONS)),
    ("5,000-digit int", out(10**5000, code=ONS)),
    ("2**70", out(2**70, 2**70)),
    ("-0.0", out(-0.0, -0.0)),
    ("1e308", out(1e308, 1e308)),
    ("IntEnum", out(Color.RED, 1)),
    ("str subclass", out(Name("n"), "n")),
    ("lone surrogate in a str", out("a\ud800b", "a\ud800b")),
    ("NUL in a str", out("a\x00b", "a\x00b")),
    ("empty str", out("", "")),
    ("None: the completion marker", out(None, None)),
    ("a 1 MB str", out("x" * 1_000_000, "x" * 1_000_000)),
    ("tuple dict key", out({(1, 2): 3}, code=ONS)),
    ("route with no edge", ("route", lambda: Route("nowhere", 1), None, "ROUTE_NOT_FOUND")),
    ("route True is not 1", ("route", lambda: Route(True, 1), None, "ROUTE_NOT_FOUND")),
    ("route 1 matches key 1", ("route", lambda: Route(1, "one"), "one", None)),
    # state values
    ("state int", state(1)),
    ("state tuple", state((1, 2))),
    ("state nan", state(math.nan, SNS)),
    ("state set", state({1}, SNS)),
    ("state object", state(object(), SNS)),
    ("state int key", state(1, SNS, key=1)),
    ("state deep", state(deep(10_000), SNS)),
    # exceptions: types and messages
    ("5 MB message", exc(lambda: RuntimeError("m" * 5_000_000), "UNKNOWN_ERROR", "m" * 1024)),
    ("__str__ raises", exc(StrRaises, "UNKNOWN_ERROR", "StrRaises")),
    ("empty message", exc(lambda: ValueError(""), "UNKNOWN_ERROR", "ValueError")),
    ("error_code raises", exc(lambda: CodeRaises("c"), "UNKNOWN_ERROR", "c")),
    ("error_code int", exc(lambda: Coded(123), "UNKNOWN_ERROR", "coded")),
    ("error_code empty", exc(lambda: Coded(""), "UNKNOWN_ERROR", "coded")),
    ("error_code not a code", exc(lambda: Coded("not a code!"), "INVALID_ERROR_CODE", "coded")),
    ("error_code 10,000 chars", exc(lambda: Coded("C" * 10_000), "C" * 128, "coded")),
    (
        "api key in message",
        exc(lambda: RuntimeError("key sk-abcdef0123456789"), "UNKNOWN_ERROR", "key sk-***"),
    ),
    (
        "file path in message",
        exc(
            lambda: FileNotFoundError(2, "No such file", "/etc/secret/x"),
            "UNKNOWN_ERROR",
            "[Errno 2] No such file: '<path>'",
        ),
    ),
    (
        "url credentials",
        exc(lambda: RuntimeError("GET http://u:pw@h/x"), "UNKNOWN_ERROR", "GET http://***:***@h/x"),
    ),
    ("KeyError", exc(lambda: KeyError("k"), "UNKNOWN_ERROR", "'k'")),
    ("newlines in message", exc(lambda: RuntimeError("a\nb\r\nc"), "UNKNOWN_ERROR", "a\nb\r\nc")),
    ("surrogate in message", exc(lambda: RuntimeError("bad \udcff"), "UNKNOWN_ERROR", "bad \udcff")),
]

BAD_SESSION_IDS = ["s\ud800", "s\x00", "s" * 300, "s\x1b[31m", ""]
BAD_NODE_NAMES = ["n\ud800", "n\x00", "n" * 300, "a/b", "a@1", ""]


def workflow_for(kind: str, payload: Any) -> Workflow:
    if kind == "output":
        return Workflow(
            "t", edges=[(START, node(lambda x: payload(), name="f"), node(lambda x: x, name="echo"))]
        )
    if kind == "route":
        pick = node(lambda x: payload(), name="f")
        return Workflow(
            "t", edges=[(START, pick, {1: node(lambda x: x, name="one"), "a": node(lambda x: x, name="a")})]
        )
    if kind == "state":
        key, value = payload

        @node(name="f")
        def set_state(ctx, x):
            ctx.state[key] = value
            return "set"

        return Workflow("t", edges=[(START, set_state)])

    def raise_it(x):
        raise payload()

    return Workflow("t", edges=[(START, node(raise_it, name="f"))])


EXPECTED_ERRORS = {
    ONS: OutputNotSerializableError,
    SNS: StateNotSerializableError,
    "ROUTE_NOT_FOUND": RouteNotFoundError,
}


def check_log(store: SqliteEventStore, sid: str) -> None:
    events = store.read(sid)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), sid
    started = {e.path for e in events if e.type == "node_started"}
    ended = {
        e.path
        for e in events
        if e.type in ("node_completed", "node_error", "node_error_propagated", "node_cancelled")
    }
    assert started == ended, sid  # every run has its one terminal event
    assert events[-1].type == "run_finished", sid


@pytest.mark.slow
async def test_hostile_values_get_a_clear_answer_and_lose_nothing(tmp_path):
    assert len(TABLE) + len(BAD_SESSION_IDS) + len(BAD_NODE_NAMES) >= 40
    store = SqliteEventStore(tmp_path / "table.db")
    completed: dict[str, Any] = {}
    for i, (label, (kind, payload, expected, code)) in enumerate(TABLE):
        sid = f"row{i}"
        runner = Runner(workflow_for(kind, payload), store=store)
        if code is None:
            result = await runner.run(None, session_id=sid)
            assert result.status == "completed", label
            if kind == "state":
                assert rebuild(store.read(sid)).state == {
                    "k": [1, 2] if isinstance(expected, tuple) else expected
                }, label
            else:
                assert result.output == expected and type(result.output) is type(expected), label
                assert store.read(sid)[-1].output == expected, label  # RunFinished, as read back
            completed[sid] = result.output
        else:
            with pytest.raises(BaseException) as info:
                await runner.run(None, session_id=sid)
            if code in EXPECTED_ERRORS:
                assert isinstance(info.value, EXPECTED_ERRORS[code]), (label, info.value)
            (err,) = [e for e in store.read(sid) if e.type == "node_error"]
            assert (err.path, err.error_code) == ("t@1/f@1", code), label
            assert 0 < len(err.error_message) <= 1024, label
            if expected is not _ and kind == "raise":
                assert err.error_message == expected, label
        check_log(store, sid)
        for done, output in completed.items():  # every earlier completed run is kept
            events = store.read(done)
            assert rebuild(events).status == "completed" and events[-1].output == output, (label, done)

    wf = Workflow("t", edges=[(START, node(lambda x: x, name="f"))])
    before = {s.session_id for s in store.sessions()}
    for sid in BAD_SESSION_IDS[:-1]:  # "" means "make one up", as documented
        with pytest.raises(ValueError, match="session id"):
            await Runner(wf, store=store).run(1, session_id=sid)
    assert (
        await Runner(wf, store=store).run(1, session_id=BAD_SESSION_IDS[-1] or None)
    ).status == "completed"
    for name in BAD_NODE_NAMES:
        with pytest.raises(ValueError, match="node name"):
            node(lambda x: x, name=name)
    after = {s.session_id for s in store.sessions()}
    assert len(after - before) == 1  # only the made-up id: nothing appended for the bad ones
    for done in completed:
        check_log(store, done)
