"""Issue 14: bad input, odd values and hostile messages get a clear answer and lose nothing.

One test per bullet of the issue (routes, state, outputs across resume, redaction,
bounded labels, phantom failures, hostile exceptions, names and ids, wide fan-outs, the
store file under operations, the CLI's own output); the table of hostile values is in
``test_hostile_table.py``.
"""

from __future__ import annotations

import math
import sqlite3

import pytest

from conftest import of_type
from flowscope import START, RetryConfig, Route, Runner, Workflow, node
from flowscope.errors import OutputNotSerializableError, RouteNotFoundError, StateNotSerializableError
from flowscope.store import SqliteEventStore, rebuild


@pytest.fixture
def db(tmp_path):
    return SqliteEventStore(tmp_path / "h.db")


def invalid_json_rows(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT count(*) FROM events WHERE NOT json_valid(payload)").fetchone()[0]


# -- routes --------------------------------------------------------------------------------------


async def test_route_label_with_no_edge_fails_the_node_naming_the_labels(db):
    check = node(lambda x: Route("maybe", x), name="check")
    ok, no = node(lambda x: "ok", name="ok"), node(lambda x: "no", name="no")
    wf = Workflow("w", edges=[(START, check, {"yes": ok, "no": no})])
    with pytest.raises(RouteNotFoundError) as info:
        await Runner(wf, store=db).run(1, session_id="s")
    (err,) = of_type(db.read("s"), "node_error")
    assert (err.path, err.error_code) == ("w@1/check@1", "ROUTE_NOT_FOUND")
    assert "'maybe'" in err.error_message and "'yes'" in err.error_message and "'no'" in err.error_message
    assert str(info.value) == err.error_message
    assert [e.path for e in of_type(db.read("s"), "node_completed")] == []  # nothing ran on unrouted
    assert rebuild(db.read("s")).status == "failed"


async def test_route_labels_compare_as_the_edges_declare_them(db):
    pick = node(lambda x: Route(x), name="pick")
    one, two = node(lambda x: "int one", name="one"), node(lambda x: "str two", name="two")
    wf = Workflow("w", edges=[(START, pick, {1: one, "2": two})])
    runner = Runner(wf, store=db)
    assert (await runner.run(1, session_id="a")).output == "int one"
    assert (await runner.run("2", session_id="b")).output == "str two"
    with pytest.raises(RouteNotFoundError):  # "1" is not 1, and True is not 1
        await runner.run("1", session_id="c")
    with pytest.raises(RouteNotFoundError):
        await runner.run(True, session_id="d")


# -- state ---------------------------------------------------------------------------------------


async def test_state_value_not_json_fails_the_node_naming_the_key_and_keeps_valid_keys(tmp_path):
    path = tmp_path / "s.db"

    @node
    def setter(ctx, x):
        ctx.state["good"] = 1
        ctx.state["bad"] = {1, 2}
        return x

    wf = Workflow("w", edges=[(START, setter)])
    with pytest.raises(StateNotSerializableError):
        await Runner(wf, store=SqliteEventStore(path)).run(0, session_id="s")
    store = SqliteEventStore(path)
    (err,) = of_type(store.read("s"), "node_error")
    assert (err.path, err.error_code) == ("w@1/setter@1", "STATE_NOT_SERIALIZABLE")
    assert "'bad'" in err.error_message
    assert rebuild(store.read("s")).state == {"good": 1}  # the valid key is on record

    @node
    def mutator(ctx, x):  # a list made unserialisable after it was set
        ctx.state["items"] = []
        ctx.state["items"].append(object())
        return x

    with pytest.raises(StateNotSerializableError, match="'items'"):
        await Runner(Workflow("m", edges=[(START, mutator)]), store=store).run(0, session_id="m")
    assert of_type(store.read("m"), "node_error")[0].error_code == "STATE_NOT_SERIALIZABLE"


# -- outputs across resume -----------------------------------------------------------------------


async def test_outputs_are_the_same_live_and_after_resume(tmp_path):
    path = tmp_path / "o.db"
    seen: list = []

    @node
    def make(x):
        return {1: "one", "t": (1, 2), "n": [(3, {"k": (4,)})]}

    @node
    async def use(ctx, x):
        seen.append(x)
        await ctx.request_input("go?")
        return x

    wf = Workflow("w", edges=[(START, make, use)])
    first = await Runner(wf, store=SqliteEventStore(path)).run(None, session_id="s")
    assert first.status == "paused"
    done = await Runner(wf, store=SqliteEventStore(path)).resume("s", inputs={"w@1/use@1": True})
    expected = {"1": "one", "t": [1, 2], "n": [[3, {"k": [4]}]]}
    assert seen == [expected, expected]  # live, then replayed from the store
    assert done.output == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"x": [1.0, math.nan]}])
async def test_nan_and_infinity_are_refused_and_every_payload_stays_valid_json(tmp_path, bad):
    path = tmp_path / "n.db"
    wf = Workflow("w", edges=[(START, node(lambda x: bad, name="f"))])
    with pytest.raises(OutputNotSerializableError):
        await Runner(wf, store=SqliteEventStore(path)).run(0, session_id="s")
    (err,) = of_type(SqliteEventStore(path).read("s"), "node_error")
    assert err.error_code == "OUTPUT_NOT_SERIALIZABLE"
    assert invalid_json_rows(path) == 0
    with sqlite3.connect(path) as conn:  # the ad-hoc SQL the store documents works
        conn.execute("SELECT json_extract(payload, '$.error_code') FROM events").fetchall()


async def test_output_nested_10000_deep_is_not_serializable_and_not_retried(db):
    def deep(x):
        v: list = []
        for _ in range(10_000):
            v = [v]
        return v

    wf = Workflow("w", edges=[(START, node(deep, name="deep", retry=RetryConfig(max_attempts=3, initial_delay=0)))])
    with pytest.raises(OutputNotSerializableError, match="nested too deeply"):
        await Runner(wf, store=db).run(0, session_id="s")
    events = db.read("s")
    (err,) = of_type(events, "node_error")
    assert (err.error_code, err.attempt_count) == ("OUTPUT_NOT_SERIALIZABLE", 1)
    assert of_type(events, "node_retrying") == []
