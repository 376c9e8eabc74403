"""The projections part of the event log role's contract: :class:`ProjectionContract`."""

from __future__ import annotations

import dataclasses
import random
import time
from operator import attrgetter

from ...events import (
    InputReceived,
    InputRequested,
    JobDispatched,
    NodeCancelled,
    NodeCompleted,
    NodeErrorEvent,
    NodeStarted,
    RunStarted,
    StateUpdated,
    UnknownEvent,
)
from ...fold import OPEN_STATES, rebuild
from ..base import (
    EventLog,
    NodeRun,
    QueuedGroup,
    SessionInfo,
)
from ..log import group_node_runs
from .helpers import (
    INV,
    SID,
    answer_events,
    append_in_batches,
    ev,
    node_ev,
    paused_log,
    random_log,
    run_of,
    submitted_log,
    varied_sessions,
)
from .node_runs import NodeRunStatesContract

__all__ = ["ProjectionContract"]


class ProjectionContract(NodeRunStatesContract):
    """What every :class:`~flowscope.store.log.EventLog`'s projections must do: equal the fold
    of the log (sessions, node runs, open runs, heartbeats) and its summaries."""

    def create_store(self) -> EventLog:
        """A new, empty event log for one test; ``self.tmp_path`` is a fresh directory."""
        raise NotImplementedError  # abstract

    def test_node_runs_for_one_session_or_all(self, store: EventLog) -> None:
        store.append(
            "a",
            [
                ev(RunStarted, sid="a", workflow="wa", ts=1.0),
                node_ev(NodeStarted, "wa@1/x@1", sid="a", ts=2.0),
            ],
            0,
        )
        store.append(
            "b",
            [
                ev(RunStarted, sid="b", workflow="wb", ts=1.0),
                node_ev(NodeStarted, "wb@1/y@1", sid="b", ts=2.0),
                node_ev(NodeStarted, "wb@1/z@1", sid="b", ts=3.0),
            ],
            0,
        )
        assert [r.path for r in store.node_runs("a")] == ["wa@1/x@1"]
        assert [r.path for r in store.node_runs("b")] == ["wb@1/y@1", "wb@1/z@1"]
        assert sorted((r.session_id, r.workflow, r.path) for r in store.node_runs()) == [
            ("a", "wa", "wa@1/x@1"),
            ("b", "wb", "wb@1/y@1"),
            ("b", "wb", "wb@1/z@1"),
        ]
        assert store.node_runs("nobody") == []

    def test_heartbeat_changes_only_running_rows(self, store: EventLog) -> None:
        s = store
        s.append(
            SID,
            [
                ev(RunStarted, workflow="w", ts=1.0),
                node_ev(NodeStarted, "w@1/run@1", ts=2.0),
                node_ev(NodeStarted, "w@1/done@1", ts=2.0),
                node_ev(NodeCompleted, "w@1/done@1", ts=3.0),
                node_ev(NodeStarted, "w@1/wait@1", ts=2.0),
                node_ev(InputRequested, "w@1/wait@1", ts=3.0, interrupt_id="i"),
                node_ev(NodeStarted, "w@1/job@1", ts=2.0),
                node_ev(JobDispatched, "w@1/job@1", ts=3.0, job_id="j"),
            ],
            0,
        )
        before = {r.path: r for r in s.node_runs(SID)}
        s.heartbeat(SID, ["w@1/run@1", "w@1/done@1", "w@1/wait@1", "w@1/job@1", "w@1/nope@1"], ts=50.0)
        after = {r.path: r for r in s.node_runs(SID)}
        assert after["w@1/run@1"].heartbeat_at == 50.0
        assert after["w@1/run@1"] == dataclasses.replace(before["w@1/run@1"], heartbeat_at=50.0)
        for p in ("w@1/done@1", "w@1/wait@1", "w@1/job@1"):
            assert after[p] == before[p]
        assert set(after) == set(before)
        s.heartbeat("nobody", ["w@1/run@1"], ts=60.0)  # an unknown session is not an error
        s.heartbeat(SID, [], ts=60.0)
        assert run_of(s, "w@1/run@1").heartbeat_at == 50.0
        t0 = time.time()
        s.heartbeat(SID, ["w@1/run@1"])
        beat = run_of(s, "w@1/run@1").heartbeat_at
        assert beat is not None and t0 - 1 <= beat <= time.time() + 1
        assert s.read(SID)[-1].seq == 8  # heartbeats are not events

    def test_an_append_that_leaves_a_run_running_keeps_its_heartbeat(self, store: EventLog) -> None:
        # heartbeats are not events: an append that rewrites the run's row (its state set,
        # an unknown event, a sibling's step) must not take its heartbeat back to its start,
        # or a live run would read as orphaned
        p = "w@1/run@1"
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, p, ts=2.0)], 0)
        store.heartbeat(SID, [p], ts=50.0)
        store.append(
            SID,
            [
                node_ev(StateUpdated, p, ts=51.0, values={"k": 1}),
                node_ev(NodeStarted, "w@1/other@1", ts=52.0),
            ],
            2,
        )
        r = run_of(store, p)
        assert (r.status, r.heartbeat_at) == ("running", 50.0)
        [group] = [g for g in store.open_run_summary(now=100.0, stale_after_s=60.0) if g.node == "run"]
        assert (group.count, group.orphaned) == (1, 0)

    def test_heartbeat_many_beats_running_rows_of_several_sessions(self, store: EventLog) -> None:
        s = store
        for sid in ("a", "b"):
            s.append(
                sid,
                [
                    ev(RunStarted, sid=sid, workflow="w", ts=1.0),
                    node_ev(NodeStarted, "w@1/run@1", sid=sid, ts=2.0),
                    node_ev(NodeStarted, "w@1/done@1", sid=sid, ts=2.0),
                    node_ev(NodeCompleted, "w@1/done@1", sid=sid, ts=3.0),
                ],
                0,
            )
        s.heartbeat_many(
            {"a": ["w@1/run@1", "w@1/done@1"], "b": ["w@1/run@1"], "nobody": ["w@1/run@1"]}, ts=50.0
        )
        for sid in ("a", "b"):
            beats = {r.path: r.heartbeat_at for r in s.node_runs(sid)}
            assert beats == {"w@1/run@1": 50.0, "w@1/done@1": 2.0}, (sid, beats)
        s.heartbeat_many({}, ts=60.0)
        s.heartbeat_many({"a": []}, ts=60.0)
        assert {r.path: r.heartbeat_at for r in s.node_runs("a")}["w@1/run@1"] == 50.0

    def test_open_runs_lists_only_open_states_oldest_first(self, store: EventLog) -> None:
        s = store
        s.append(
            "a",
            [
                ev(RunStarted, sid="a", workflow="wa", ts=1.0),
                node_ev(NodeStarted, "wa@1/late@1", sid="a", ts=30.0),
                node_ev(NodeStarted, "wa@1/done@1", sid="a", ts=5.0),
                node_ev(NodeCompleted, "wa@1/done@1", sid="a", ts=6.0),
                node_ev(NodeStarted, "wa@1/bad@1", sid="a", ts=4.0),
                node_ev(NodeErrorEvent, "wa@1/bad@1", sid="a", ts=6.0),
                node_ev(NodeStarted, "wa@1/job@1", sid="a", ts=10.0),
                node_ev(JobDispatched, "wa@1/job@1", sid="a", ts=11.0, job_id="j", deadline_s=5.0),
            ],
            0,
        )
        s.append(
            "b",
            [
                ev(RunStarted, sid="b", workflow="wb", ts=1.0),
                node_ev(NodeStarted, "wb@1/wait@1", sid="b", ts=20.0),
                node_ev(InputRequested, "wb@1/wait@1", sid="b", ts=21.0, interrupt_id="i"),
                node_ev(NodeStarted, "wb@1/first@1", sid="b", ts=2.0),
                node_ev(NodeStarted, "wb@1/gone@1", sid="b", ts=3.0),
                node_ev(NodeCancelled, "wb@1/gone@1", sid="b", ts=7.0),
            ],
            0,
        )
        runs = s.open_runs()
        assert [(r.session_id, r.path, r.status) for r in runs] == [
            ("b", "wb@1/first@1", "running"),
            ("a", "wa@1/job@1", "waiting_job"),
            ("b", "wb@1/wait@1", "waiting_input"),
            ("a", "wa@1/late@1", "running"),
        ]
        assert all(r.status in OPEN_STATES for r in runs)
        assert runs[1].job_deadline_at == 16.0 and runs[1].workflow == "wa"
        # the open set shrinks as runs end
        s.append("b", [node_ev(NodeCompleted, "wb@1/first@1", sid="b", ts=40.0)], 6)
        assert [r.path for r in s.open_runs()] == ["wa@1/job@1", "wb@1/wait@1", "wa@1/late@1"]

    def test_unknown_event_types_round_trip_and_are_skipped_by_the_projection(self, store: EventLog) -> None:
        s = store
        unknown_run = UnknownEvent(
            type="run_annotated",
            session_id=SID,
            invocation_id=INV,
            ts=2.0,
            data={"note": "from a newer writer", "schema_version": 9},
        )
        unknown_node = UnknownEvent(
            type="node_progress",
            session_id=SID,
            invocation_id=INV,
            ts=3.5,
            path="w@1/a@1",
            node="a",
            data={"percent": 40},
        )
        unknown_new_path = UnknownEvent(
            type="node_progress",
            session_id=SID,
            invocation_id=INV,
            ts=3.6,
            path="w@1/ghost@1",
            node="ghost",
            data={},
        )
        stored = s.append(
            SID,
            [
                ev(RunStarted, workflow="w", ts=1.0),
                unknown_run,
                node_ev(NodeStarted, "w@1/a@1", ts=3.0),
                unknown_node,
                unknown_new_path,
                node_ev(NodeCompleted, "w@1/a@1", ts=4.0),
            ],
            0,
        )
        back = s.read(SID)
        assert back == stored
        run_note, node_note = back[1], back[3]
        assert type(run_note) is UnknownEvent and run_note.type == "run_annotated"
        assert run_note.data == {"note": "from a newer writer", "schema_version": 9}
        assert isinstance(node_note, UnknownEvent)
        assert node_note.data == {"percent": 40} and node_note.path == "w@1/a@1"
        assert [r.path for r in s.node_runs(SID)] == ["w@1/a@1"]  # no row for the unknown-only path
        assert run_of(s, "w@1/a@1").status == "completed"
        [info] = s.sessions()
        assert (info.status, info.last_seq, info.workflow) == ("running", 6, "w")
        assert rebuild(back).unknown_events == 3

    def test_projection_equals_the_fold_of_the_log(self, store: EventLog) -> None:
        rnd = random.Random(7)
        for k, sid in enumerate(("r1", "r2", "r3")):
            log = random_log(rnd, sid, 120, t0=1000.0 * (k + 1))
            append_in_batches(store, sid, log, rnd)
        for sid in ("r1", "r2", "r3"):
            events = store.read(sid)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            state = rebuild(events)
            assert store.node_runs(sid) == [
                NodeRun.from_state(sid, state.workflow, ns) for ns in state.nodes.values()
            ]
            [info] = [i for i in store.sessions() if i.session_id == sid]
            assert info == SessionInfo(
                sid,
                state.workflow,
                state.status,
                state.started_at,
                state.updated_at,
                state.last_seq,
                state.invocations,
            )
        open_runs = store.open_runs()
        assert open_runs == sorted(
            (r for r in store.node_runs() if r.status in OPEN_STATES), key=lambda r: r.started_at or 0.0
        )

    def test_find_node_runs_and_node_run_groups_select_and_count_what_node_runs_holds(
        self, store: EventLog
    ) -> None:
        varied_sessions(store, seed=11, sessions=3, events=100)  # nested workflows too
        every = store.node_runs()
        workflows = sorted({r.workflow for r in every})
        assert {r.status for r in every} >= {"completed", "failed", "running"}
        assert any(r.retries for r in every) and any("/" not in r.path for r in every)
        for statuses in (
            None,
            frozenset({"failed"}),
            frozenset(OPEN_STATES),
            frozenset({"cancelled", "completed"}),
        ):
            for workflow in (None, workflows[0], "nope"):
                for retried in (False, True):
                    want = [
                        r
                        for r in every
                        if (statuses is None or r.status in statuses)
                        and (workflow is None or r.workflow == workflow)
                        and (not retried or r.retries > 0)
                    ]
                    got = store.find_node_runs(statuses, workflow=workflow, retried=retried)
                    assert got == want, (statuses, workflow, retried)
        key = attrgetter("workflow", "root", "kind", "node")
        for workflow in (None, *workflows, "nope"):
            groups = group_node_runs(r for r in every if workflow is None or r.workflow == workflow)
            assert sorted(store.node_run_groups(workflow), key=key) == sorted(groups, key=key), workflow
        assert sum(g.runs for g in store.node_run_groups()) == len(every)

    def test_node_run_output_values_round_trip_exactly(self, store: EventLog) -> None:
        values = [
            None,
            0,
            -1,
            2**53 + 1,
            1.5,
            -0.25,
            1e300,
            "",
            "ünïcødé ✓ \u2028",
            "emoji \U0001f600",
            True,
            False,
            [],
            {},
            [1, [2, [3]]],
            {"a": {"b": None, "c": [True, 1.0]}},
        ]
        events = [node_ev(NodeCompleted, f"w@1/v@{i}", ts=float(i), output=v) for i, v in enumerate(values)]
        store.append(SID, events, 0)
        back = store.read(SID)
        completed = [e for e in back if isinstance(e, NodeCompleted)]
        assert len(completed) == len(back)
        assert [e.output for e in completed] == values
        assert [type(e.output) for e in completed] == [type(v) for v in values]

    # ------------------------------------------------------------------ ownership

    def test_status_goes_queued_running_paused_answered_running(self, store: EventLog) -> None:
        store.append(SID, submitted_log(SID, "orders", 5.0), 0)
        [s] = store.sessions()
        assert (s.status, s.workflow, s.submitted_at, s.started_at, s.invocations) == (
            "queued",
            "orders",
            5.0,
            None,
            0,
        )
        assert rebuild(store.read(SID)).input == {"n": SID}
        store.append(SID, paused_log(SID, "orders", 10.0), 1)
        [s] = store.sessions()
        assert (s.status, s.started_at, s.submitted_at, s.invocations) == ("paused", 10.0, 5.0, 1)
        store.append(SID, answer_events(SID, "orders", 20.0), 5)
        assert store.sessions()[0].status == "answered"
        store.append(SID, answer_events(SID, "orders", 21.0), 6)  # a second answer keeps it answered
        assert store.sessions()[0].status == "answered"
        store.append(
            SID, [ev(RunStarted, workflow="orders", resumed=True, ts=30.0, invocation_id="inv-2")], 7
        )
        assert store.sessions()[0].status == "running"
        assert rebuild(store.read(SID)).status == "running"
        # an input received inside an invocation is no answer
        store.append(
            "s2",
            paused_log("s2", "orders", 1.0)
            + [node_ev(InputReceived, "orders@1/ask@1", ts=5.0, sid="s2", interrupt_id="ok")],
            0,
        )
        info = store.session_info("s2")
        assert info is not None and info.status == "paused"

    def test_queued_summary(self, store: EventLog) -> None:
        assert store.queued_summary() == []
        store.append("a1", submitted_log("a1", "alpha", 30.0), 0)
        store.append("a2", submitted_log("a2", "alpha", 10.0), 0)
        store.append("b1", submitted_log("b1", "beta", 20.0), 0)
        store.append("r", paused_log("r", "alpha", 1.0), 0)
        assert store.queued_summary() == [QueuedGroup("alpha", 2, 10.0), QueuedGroup("beta", 1, 20.0)]
        store.append(
            "a2", [ev(RunStarted, sid="a2", workflow="alpha", ts=40.0)], 1
        )  # started: no longer queued
        assert store.queued_summary() == [QueuedGroup("alpha", 1, 30.0), QueuedGroup("beta", 1, 20.0)]
