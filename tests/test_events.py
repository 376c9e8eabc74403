"""The event catalog and its JSON codec."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flowscope import events as ev
from flowscope.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    EventDecodeError,
    NodeCompleted,
    UnknownEvent,
    decode,
    encode,
    from_dict,
    to_dict,
)

COMMON = dict(session_id="s1", invocation_id="inv", seq=7, ts=1700000000.5, path="wf@1/a@1", node="a")

SAMPLES = [
    ev.RunStarted(
        **COMMON,
        workflow="wf",
        input={"x": 1},
        resumed=True,
        replayed=3,
        recovered=1,
        trace_context={"traceparent": "00-abc"},
        owner={"worker_id": "w-1", "host": "h", "pid": 42},
    ),
    ev.RunFinished(
        **COMMON, status="failed", output=None, error_code="E", error_path="wf@1/a@1", replayed=2, recovered=1
    ),
    ev.NodeStarted(**COMMON, attempt=2, kind="workflow", parent_path="wf@1", recovered=True),
    ev.NodeRetrying(
        **COMMON,
        attempt=1,
        error_type="ValueError",
        error_code="UNKNOWN_ERROR",
        error_message="boom",
        delay_s=0.5,
    ),
    ev.NodeCompleted(**COMMON, output=[1, {"a": None}], has_output=True, route="ok", attempt_count=3),
    ev.NodeErrorEvent(**COMMON, error_code="X", error_message="m", error_type="KeyError", attempt_count=3),
    ev.NodeErrorPropagated(
        **COMMON, origin_path="wf@1/a@1/b@1", error_code="X", error_type="KeyError", attempt_count=1
    ),
    ev.NodeCancelled(**COMMON, reason="sibling_failed"),
    ev.NodePaused(**COMMON, waiting="job", origin_path="wf@1/a@1/b@1", interrupt_ids=("i1", "i2")),
    ev.InputRequested(**COMMON, interrupt_id="approval", prompt="ok?", payload={"kind": "x"}),
    ev.InputReceived(**COMMON, interrupt_id="approval", value=True),
    ev.JobDispatched(
        **COMMON,
        job_id="j1",
        dispatch_attempt=2,
        idempotency_key="k",
        trace_context={"traceparent": "t"},
        deadline_s=60.0,
        expect_count=True,
        job_key="wf@1/a@1#job1",
    ),
    ev.JobResultReceived(
        **COMMON, job_id="j1", success=True, count=0, error=None, data={"rows": []}, result="empty"
    ),
    ev.StateUpdated(**COMMON, values={"k": [1, 2]}),
    ev.RunSubmitted(**COMMON, workflow="wf", input={"x": 2}),
]


def test_every_catalog_type_has_a_sample():
    assert {type(e) for e in SAMPLES} == set(EVENT_TYPES.values())


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.type)
def test_every_type_round_trips_through_json(event):
    text = encode(event)
    data = json.loads(text)
    assert data["type"] == event.type
    assert data["schema_version"] == SCHEMA_VERSION
    assert decode(text) == event
    assert from_dict(to_dict(event)) == event


def test_events_are_immutable():
    e = SAMPLES[0]
    with pytest.raises(AttributeError):
        e.seq = 9  # type: ignore[misc]


def test_catalog_type_names_are_the_spec_spelling():
    assert set(EVENT_TYPES) >= {
        "run_started",
        "node_started",
        "node_retrying",
        "node_completed",
        "node_error",
        "node_cancelled",
        "input_requested",
        "input_received",
        "job_dispatched",
        "job_result",
        "run_finished",
    }
    assert ev.UNKNOWN_ERROR == "UNKNOWN_ERROR"


def test_completion_marker_defaults():
    marker = NodeCompleted(output=None, has_output=False)
    assert marker.completed is True and marker.has_output is False


def test_unknown_type_decodes_to_a_generic_event_and_round_trips():
    raw = {
        "type": "node_teleported",
        "session_id": "s",
        "seq": 4,
        "path": "wf@1/x@1",
        "node": "x",
        "where": "mars",
        "schema_version": 9,
    }
    e = from_dict(raw)
    assert isinstance(e, UnknownEvent)
    assert e.type == "node_teleported" and e.seq == 4 and e.path == "wf@1/x@1"
    assert e.data["where"] == "mars"
    back = to_dict(e)
    assert back["where"] == "mars" and back["type"] == "node_teleported" and back["schema_version"] == 9


def test_extra_fields_from_a_newer_writer_are_ignored():
    d = to_dict(SAMPLES[2])
    d["field_from_the_future"] = 1
    assert from_dict(d) == SAMPLES[2]


@pytest.mark.parametrize("bad", ["{not json", "[]", '{"no_type": 1}', '{"type": 5}'])
def test_corrupt_input_is_a_clear_decode_error(bad):
    with pytest.raises(EventDecodeError):
        decode(bad)


def test_a_run_started_from_before_the_owner_field_reads_back_with_no_owner():
    from flowscope.fold import rebuild
    from flowscope.snapshot import restore_state, snapshot_state
    from flowscope.store import codec

    started = SAMPLES[0]
    old = to_dict(started)
    del old["owner"]
    assert from_dict(old).owner is None and from_dict(old).workflow == "wf"
    # the stores' row codec: a payload written without the field takes the default
    row = codec.encode("test.db", "s1", started)
    payload = json.loads(row[5])
    del payload["owner"]
    [back] = codec.decode("test.db", "s1", 6, [(*row[:5], json.dumps(payload))])
    assert back.owner is None and back == dataclasses.replace(started, owner=None)
    # the fold exposes the latest invocation's owner; a snapshot taken before it restores
    ws = rebuild([dataclasses.replace(started, path="", node="")])
    assert ws.owner == {"worker_id": "w-1", "host": "h", "pid": 42}
    snap = snapshot_state(ws)
    del snap["owner"]
    assert restore_state(json.dumps(snap)).owner is None


def test_a_run_started_names_its_engine_only_when_a_bridge_wrote_it():
    from flowscope.fold import rebuild
    from flowscope.snapshot import restore_state, snapshot_state
    from flowscope.store import codec

    started = SAMPLES[0]
    assert started.engine is None and "engine" not in to_dict(started)  # flowscope's own: no key
    bridged = dataclasses.replace(started, engine="langgraph")
    assert to_dict(bridged)["engine"] == "langgraph" and decode(encode(bridged)) == bridged
    row = codec.encode("test.db", "s1", bridged)
    [back] = codec.decode("test.db", "s1", 6, [row])
    assert back.engine == "langgraph"
    ws = rebuild([dataclasses.replace(bridged, path="", node="")])
    assert ws.engine == "langgraph" and restore_state(json.dumps(snapshot_state(ws))).engine == "langgraph"
    snap = snapshot_state(rebuild([dataclasses.replace(started, path="", node="")]))
    snap.pop("engine", None)  # a snapshot taken before the field
    assert restore_state(json.dumps(snap)).engine is None


def test_a_fast_init_builds_the_same_frozen_record_as_the_dataclass():
    """fast_init replaces a frozen dataclass's __init__ with one that fills the slots
    through their descriptors: the same signature, defaults, factories and instances."""
    import dataclasses

    from flowscope.engine.context import NodeOutcome
    from flowscope.events import fast_init

    @dataclasses.dataclass(frozen=True, slots=True)
    class Positional:
        a: int
        b: str = "b"
        c: list = dataclasses.field(default_factory=list)

    reference = Positional(1, c=[2])
    fast_init(Positional)
    assert Positional.__init__.__qualname__.endswith("Positional.__init__")
    assert Positional(1, c=[2]) == reference
    assert Positional(1).c == [] and Positional(1).c is not Positional(1).c
    with pytest.raises(TypeError):
        Positional()  # a required field stays required
    with pytest.raises(dataclasses.FrozenInstanceError):
        Positional(1).a = 2

    ev = NodeCompleted(session_id="s", seq=1)
    built = NodeOutcome("success", ev, 2, duration_s=0.5)
    assert (
        built.status,
        built.event,
        built.attempt_count,
        built.recovered,
        built.error,
        built.duration_s,
    ) == (
        "success",
        ev,
        2,
        False,
        None,
        0.5,
    )
    assert NodeOutcome(status="failure", event=ev, attempt_count=1) == NodeOutcome("failure", ev, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.status = "failure"
    with pytest.raises(TypeError):
        NodeCompleted("s")  # events stay keyword-only


def test_a_fast_init_leaves_a_class_it_cannot_build_for_alone():
    import dataclasses

    from flowscope.events import fast_init

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self):
            if self.a < 0:
                raise ValueError("a")

    @dataclasses.dataclass(frozen=True, slots=True)
    class Mixed:
        a: int
        b: int = dataclasses.field(default=0, kw_only=True)

    before = (Checked.__init__, Mixed.__init__)
    fast_init(Checked)
    fast_init(Mixed)
    assert (Checked.__init__, Mixed.__init__) == before
    with pytest.raises(ValueError):
        Checked(-1)


def test_what_a_log_written_before_final_and_engine_means_by_their_absence():
    from flowscope.fold import rebuild
    from flowscope.snapshot import restore_state, snapshot_state
    from flowscope.store import codec

    lg, adk, own = (
        "1f0e3c1a-2b4d-4c6e-8f00-123456789abc",
        "e-1f0e3c1a-2b4d-4c6e-8f00-123456789abc#2",
        "a" * 32,
    )

    def legacy(e: ev.Event, *dropped: str) -> list[ev.Event]:
        """``e`` as an earlier version wrote it (without ``dropped``), read back both ways."""
        d = to_dict(e)
        for name in dropped:
            d.pop(name, None)
        text = json.dumps(d)
        row = (
            "run_started" if isinstance(e, ev.RunStarted) else "run_finished",
            e.ts,
            e.invocation_id,
            "",
            "",
            text,
        )
        return [decode(text), codec.decode("old.db", e.session_id, e.seq - 1, [row])[0]]

    cancelled = ev.RunFinished(session_id="s", invocation_id=own, seq=9, ts=2.0, status="cancelled")
    assert [e.final for e in legacy(cancelled, "final")] == [True, True]  # every cancel was final then
    assert [e.final for e in legacy(cancelled)] == [False, False]  # written as not final: not final
    done = dataclasses.replace(cancelled, status="completed")
    assert [e.final for e in legacy(done, "final")] == [False, False]
    for iid, engine in ((lg, "langgraph"), (adk, "adk"), (own, None), ("inv-1", None)):
        started = ev.RunStarted(session_id="s", invocation_id=iid, seq=1, ts=1.0, workflow="w")
        assert [e.engine for e in legacy(started)] == [engine, engine], iid
    ws = rebuild([*legacy(ev.RunStarted(session_id="s", invocation_id=lg, seq=1, ts=1.0), "engine")[:1]])
    snap = snapshot_state(ws)
    snap.pop("engine")  # a snapshot an earlier version took of a bridge's session
    assert restore_state(json.dumps(snap)).engine == "langgraph"
    ws = rebuild([ev.RunStarted(session_id="s", invocation_id=own, seq=1, ts=1.0), cancelled])
    snap = snapshot_state(ws)
    snap.pop("final")  # and of a cancelled one
    assert ws.final is False and restore_state(json.dumps(snap)).final is True
