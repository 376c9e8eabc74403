"""``ctx.state``: what a node run changed is recorded when it ends, whichever run set the key,
and the state is the same live and after resume (R12, docs/design.md)."""

from __future__ import annotations

import asyncio
import math

import pytest

from conftest import of_type
from flowscope import START, Runner, Workflow, node
from flowscope.engine.record import TrackedState
from flowscope.errors import StateNotSerializableError
from flowscope.store import MemoryEventStore, SqliteEventStore, rebuild


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request, tmp_path):
    """A store, and the same store opened again (a new process resuming: for SQLite, the file)."""
    if request.param == "memory":
        mem = MemoryEventStore()
        return lambda: mem
    return lambda: SqliteEventStore(tmp_path / "state.db")


def updates(store, sid):
    return [(u.path, u.values) for u in of_type(store.read(sid), "state_updated")]


@node
def setup(ctx, x):
    ctx.state["items"] = []
    ctx.state["cfg"] = {"n": 0}
    return x


# every accessor that hands a value out, as a node body uses it to change one in place
CHANGES = {
    "index": lambda s: (s["items"].append("b"), s["cfg"].update(n=1)),
    "get": lambda s: (s.get("items").append("b"), s.get("cfg").update(n=1)),
    "setdefault": lambda s: (s.setdefault("items", []).append("b"), s.setdefault("cfg", {}).update(n=1)),
    "values": lambda s: [v.append("b") if type(v) is list else v.update(n=1) for v in s.values()],
    "items": lambda s: [v.append("b") if k == "items" else v.update(n=1) for k, v in s.items()],
    "copy": lambda s: (s.copy()["items"].append("b"), s.copy()["cfg"].update(n=1)),
}


@pytest.mark.parametrize("how", sorted(CHANGES))
async def test_a_value_changed_in_place_by_a_later_node_is_recorded_and_survives_resume(make_store, how):
    seen = []

    @node
    def change(ctx, x):
        CHANGES[how](ctx.state)
        return x

    @node
    async def use(ctx, x):
        seen.append((list(ctx.state["items"]), dict(ctx.state["cfg"])))
        await ctx.request_input("go?", interrupt_id="go")
        return x

    wf = Workflow("w", edges=[(START, setup, change, use)])
    await Runner(wf, store=make_store()).run(0, session_id="s")
    store = make_store()
    result = await Runner(wf, store=store).resume("s", inputs={"go": True})
    assert result.status == "completed"
    assert seen == [(["b"], {"n": 1})] * 2  # live, then after resume: the same
    assert updates(store, "s")[1] == ("w@1/change@1", {"items": ["b"], "cfg": {"n": 1}})
    assert len(updates(store, "s")) == 2
    assert rebuild(store.read("s")).state == {"items": ["b"], "cfg": {"n": 1}}


WRITES = {
    "|=": lambda s: s.__ior__({"n": 2}),  # ``state |= ...`` on a name bound to ctx.state
    "popitem": lambda s: s.popitem(),  # the last key set: "cfg"
    "del": lambda s: s.__delitem__("cfg"),
    "pop": lambda s: s.pop("cfg"),
    "set None": lambda s: s.__setitem__("cfg", None),
}


@pytest.mark.parametrize("how", sorted(WRITES))
async def test_every_write_is_recorded_and_a_deleted_key_stays_deleted_after_resume(make_store, how):
    seen = []

    @node
    def write(ctx, x):
        WRITES[how](ctx.state)
        return x

    @node
    async def use(ctx, x):
        seen.append(dict(ctx.state))
        await ctx.request_input("go?", interrupt_id="go")
        return x

    wf = Workflow("w", edges=[(START, setup, write, use)])
    await Runner(wf, store=make_store()).run(0, session_id="s")
    store = make_store()
    await Runner(wf, store=store).resume("s", inputs={"go": True})
    want = {"items": [], "n": 2, "cfg": {"n": 0}} if how == "|=" else {"items": []}
    if how == "set None":
        want = {"items": [], "cfg": None}
    assert seen == [want, want]  # live, then after resume: the same
    assert rebuild(store.read("s")).state == want


async def test_a_value_changed_in_place_in_a_nested_workflow_is_recorded_under_its_node(store):
    @node
    def change(ctx, x):
        ctx.state["items"].append("inner")
        return x

    inner = Workflow("inner", edges=[(START, change)])
    wf = Workflow("w", edges=[(START, setup, inner)])
    await Runner(wf, store=store).run(0, session_id="s")
    assert updates(store, "s")[1:] == [("w@1/inner@1/change@1", {"items": ["inner"]})]


async def test_reading_the_state_records_nothing(make_store):
    def read(ctx, x):
        s = ctx.state
        got = (s["items"], s.get("cfg"), s.setdefault("cfg", {}), list(s.values()), dict(s.items()), s.copy())
        assert got[0] == [] and "cfg" in s and len(s) == 2
        return x

    store = make_store()
    wf = Workflow("w", edges=[(START, setup, node(read, name="read"), node(read, name="again"))])
    await Runner(wf, store=store).run(0, session_id="s")
    assert updates(store, "s") == [("w@1/setup@1", {"items": [], "cfg": {"n": 0}})]


async def test_a_parallel_reader_changing_a_value_after_a_sibling_ended_is_recorded_at_its_own_end(
    make_store,
):
    sibling_done = asyncio.Event()

    @node
    async def slow(ctx, x):
        items = ctx.state["items"]  # read before the sibling ends
        await sibling_done.wait()
        for _ in range(3):  # the sibling's run end (and its comparison) comes first
            await asyncio.sleep(0)
        items.append("slow")  # no output: the branches need no join

    @node
    def fast(ctx, x):
        assert ctx.state["items"] == []  # read too: its run end compares what is lent
        sibling_done.set()

    store = make_store()
    await Runner(Workflow("w", edges=[(START, setup), (setup, slow), (setup, fast)]), store=store).run(
        0, session_id="s"
    )
    events = store.read("s")
    (fast_done,) = [e.seq for e in of_type(events, "node_completed") if e.node == "fast"]
    ((seq, values),) = [(u.seq, u.values) for u in of_type(events, "state_updated") if u.node == "slow"]
    assert values == {"items": ["slow"]} and seq > fast_done
    assert [u.node for u in of_type(events, "state_updated")] == ["setup", "slow"]
    assert rebuild(events).state["items"] == ["slow"]


async def test_a_value_changed_in_place_into_one_json_cannot_hold_fails_the_run_naming_the_key(tmp_path):
    @node
    def spoil(ctx, x):
        ctx.state["items"].append(object())
        ctx.state["cfg"]["n"] = 1  # a valid change beside it is kept
        return x

    store = SqliteEventStore(tmp_path / "bad.db")
    with pytest.raises(StateNotSerializableError, match="'items'"):
        await Runner(Workflow("w", edges=[(START, setup, spoil)]), store=store).run(0, session_id="s")
    (err,) = of_type(store.read("s"), "node_error")
    assert (err.path, err.error_code) == ("w@1/spoil@1", "STATE_NOT_SERIALIZABLE")
    assert updates(store, "s")[1:] == [("w@1/spoil@1", {"cfg": {"n": 1}})]
    assert rebuild(store.read("s")).state == {"items": [], "cfg": {"n": 1}}


async def test_a_failing_run_whose_value_json_cannot_hold_drops_the_key_and_keeps_its_own_error(tmp_path):
    @node
    def spoil(ctx, x):
        ctx.state["items"].append(math.nan)
        raise ValueError("its own failure")

    store = SqliteEventStore(tmp_path / "bad.db")
    with pytest.raises(ValueError, match="its own failure"):
        await Runner(Workflow("w", edges=[(START, setup, spoil)]), store=store).run(0, session_id="s")
    assert [e.error_type for e in of_type(store.read("s"), "node_error")] == ["ValueError"]
    assert updates(store, "s")[1:] == []  # not recorded: dropped, as a key set so is
    assert rebuild(store.read("s")).state == {"items": [], "cfg": {"n": 0}}


def test_a_lent_value_is_compared_until_no_body_that_could_hold_it_runs():
    state = TrackedState({"items": []})
    assert not state.pending  # nothing read: a run end checks one attribute
    state["items"].append(1)
    assert state.take_changes(oldest=0.0) == ({"items": [1]}, [], [])  # a body older than the read runs
    assert "items" in state.lent and state.pending
    dict.__getitem__(state, "items").append(2)  # that body changes it after the first comparison
    assert state.take_changes() == ({"items": [1, 2]}, [], [])  # no body runs: compared, then forgotten
    assert state.lent == {} and not state.pending
    dict.__getitem__(state, "items").append(3)  # not lent: the engine's own read
    assert state.take_changes() == ({}, [], [])
