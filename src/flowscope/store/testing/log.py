"""The event log role's contract: :class:`EventLogContract` (its appends here, its
projections in :mod:`.projection`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ...errors import ConcurrencyConflict
from ...events import (
    InputRequested,
    JobDispatched,
    JobResultReceived,
    NodeCancelled,
    NodeCompleted,
    NodePaused,
    NodeStarted,
    RunFinished,
    RunStarted,
    RunSubmitted,
)
from ...fold import OPEN_STATES, containers
from ...liveness import ORPHANED, OVERDUE, classify_open_run
from ..base import (
    EventLog,
    JobResultGroup,
    OpenRunGroup,
    SessionInfo,
    SessionQuery,
    summarize_open_runs,
)
from .helpers import (
    LIVENESS_CASES,
    LIVENESS_NOW,
    LIVENESS_STALE_AFTER_S,
    SID,
    ev,
    liveness_log,
    nested_logs,
    node_ev,
    one_of_each,
)
from .projection import ProjectionContract

__all__ = ["EventLogContract"]


class EventLogContract(ProjectionContract):
    """What every :class:`~flowscope.store.log.EventLog` must do: append under optimistic
    concurrency, number, read, and keep the projections equal to the fold of the log."""

    def test_round_trip_of_every_event_type(self, store: EventLog) -> None:
        sample = one_of_each()
        stored = store.append(SID, sample, 0)
        assert [e.seq for e in stored] == list(range(1, len(sample) + 1))
        back = store.read(SID)
        assert back == stored
        for a, b in zip(back, sample):
            assert type(a) is type(b)
            assert dataclasses.replace(a, seq=0) == b
        paused = back[8]
        assert isinstance(paused, NodePaused)
        assert paused.interrupt_ids == ("a", "b")  # a tuple again, not a JSON list

    def test_an_event_read_back_is_not_changed_by_later_changes_to_the_objects_appended(
        self, store: EventLog
    ) -> None:
        """Events are immutable: a caller that goes on using a value it appended (a node
        editing its input, the run input's owner) does not change the log."""
        run_input = {"todo": [1, 2, 3]}
        output: dict[str, Any] = {"rows": [1]}
        answer = [{"ok": True}]
        store.append(
            SID,
            [
                ev(RunStarted, workflow="wf", input=run_input),
                node_ev(NodeCompleted, "wf@1/a@1", 1.0, output=output),
                node_ev(InputRequested, "wf@1/b@1", 2.0, interrupt_id="q", payload=answer),
            ],
            0,
        )
        run_input["todo"].pop()
        output["rows"].append(2)
        output["more"] = True
        answer[0]["ok"] = False
        back = store.read(SID)
        assert back[0].input == {"todo": [1, 2, 3]}  # type: ignore[attr-defined]
        assert back[1].output == {"rows": [1]}  # type: ignore[attr-defined]
        assert back[2].payload == [{"ok": True}]  # type: ignore[attr-defined]

    def test_a_change_to_an_event_read_back_is_not_in_the_log(self, store: EventLog) -> None:
        store.append(SID, [node_ev(NodeCompleted, "wf@1/a@1", 1.0, output={"rows": [1]})], 0)
        first = store.read(SID)[0]
        assert isinstance(first, NodeCompleted)
        first.output["rows"].append(2)
        assert store.read(SID)[0].output == {"rows": [1]}  # type: ignore[attr-defined]

    def test_seq_is_gap_free_from_one_across_batches(self, store: EventLog) -> None:
        events = [node_ev(NodeStarted, f"wf@1/n@{i}", ts=float(i)) for i in range(1, 11)]
        out = store.append(SID, events[:3], 0)
        assert [e.seq for e in out] == [1, 2, 3]
        out = store.append(SID, events[3:4], 3)
        assert [e.seq for e in out] == [4]
        out = store.append(SID, events[4:], 4)
        assert [e.seq for e in out] == list(range(5, 11))
        assert [e.seq for e in store.read(SID)] == list(range(1, 11))
        assert store.last_seq(SID) == 10

    def test_sessions_are_numbered_independently(self, store: EventLog) -> None:
        store.append("a", [ev(RunStarted, sid="a", workflow="w", ts=1.0)], 0)
        store.append("b", [ev(RunStarted, sid="b", workflow="w", ts=2.0)], 0)
        store.append("a", [ev(RunFinished, sid="a", ts=3.0)], 1)
        assert [e.seq for e in store.read("a")] == [1, 2]
        assert [e.seq for e in store.read("b")] == [1]

    def test_pre_numbered_events_that_continue_the_log_are_kept(self, store: EventLog) -> None:
        e1 = ev(RunStarted, workflow="w", ts=1.0, seq=1)
        e2 = node_ev(NodeStarted, "w@1/a@1", ts=2.0, seq=2)
        assert store.append(SID, [e1, e2], 0) == [e1, e2]
        assert store.read(SID) == [e1, e2]

    @pytest.mark.parametrize("bad_seq", [1, 2, 4, 7])
    def test_pre_numbered_events_that_do_not_continue_the_log_are_rejected(
        self, store: EventLog, bad_seq: int
    ) -> None:
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        before = (store.read(SID), store.sessions(), store.node_runs())
        with pytest.raises(ValueError):
            store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0, seq=bad_seq)], 2)
        # a valid first event does not let an invalid second one through
        with pytest.raises(ValueError):
            store.append(
                SID,
                [
                    node_ev(NodeCompleted, "w@1/a@1", ts=3.0, seq=3),
                    node_ev(NodeStarted, "w@1/b@1", ts=4.0, seq=3),
                ],
                2,
            )
        assert (store.read(SID), store.sessions(), store.node_runs()) == before

    def test_an_event_of_another_session_is_rejected(self, store: EventLog) -> None:
        with pytest.raises(ValueError):
            store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), ev(RunFinished, sid="other", ts=2.0)], 0)
        assert store.read(SID) == [] and store.read("other") == []
        assert store.last_seq(SID) == 0
        assert store.node_runs() == []

    @pytest.mark.parametrize("stale", [0, 1, 3, 9])
    def test_stale_expected_seq_raises_conflict_and_writes_nothing(self, store: EventLog, stale: int) -> None:
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0), node_ev(NodeStarted, "w@1/a@1", ts=2.0)], 0)
        before = (store.read(SID), store.sessions(), store.node_runs(), store.open_runs())
        with pytest.raises(ConcurrencyConflict):
            store.append(SID, [node_ev(NodeCompleted, "w@1/a@1", ts=3.0), ev(RunFinished, ts=4.0)], stale)
        assert (store.read(SID), store.sessions(), store.node_runs(), store.open_runs()) == before
        assert store.last_seq(SID) == 2

    def test_conflict_on_a_new_session_creates_nothing(self, store: EventLog) -> None:
        with pytest.raises(ConcurrencyConflict):
            store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 1)
        assert store.read(SID) == []
        assert store.last_seq(SID) == 0
        assert store.sessions() == []

    def test_the_second_of_two_writers_with_the_same_expected_seq_loses(self, store: EventLog) -> None:
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 0)
        seen = store.last_seq(SID)
        store.append(SID, [node_ev(NodeStarted, "w@1/a@1", ts=2.0)], seen)
        with pytest.raises(ConcurrencyConflict):
            store.append(SID, [node_ev(NodeStarted, "w@1/b@1", ts=2.0)], seen)
        assert [e.path for e in store.read(SID)] == ["", "w@1/a@1"]

    def test_read_after_seq(self, store: EventLog) -> None:
        events = store.append(SID, [node_ev(NodeStarted, f"wf@1/n@{i}", ts=float(i)) for i in range(1, 8)], 0)
        assert store.read(SID, 0) == events
        assert store.read(SID, 3) == events[3:]
        assert [e.seq for e in store.read(SID, 6)] == [7]
        assert store.read(SID, 7) == []
        assert store.read(SID, 50) == []
        assert store.read("nobody") == []

    def test_last_seq(self, store: EventLog) -> None:
        assert store.last_seq(SID) == 0
        assert not store.has_session(SID)
        store.append(SID, [ev(RunStarted, workflow="w", ts=1.0)], 0)
        assert store.last_seq(SID) == 1
        assert store.has_session(SID)
        store.append(SID, [ev(RunFinished, ts=2.0)] * 1, 1)
        assert store.last_seq(SID) == 2

    def test_sessions_follow_run_started_and_run_finished(self, store: EventLog) -> None:
        assert store.sessions() == []
        store.append(SID, [ev(RunStarted, workflow="orders", ts=10.0)], 0)
        [s] = store.sessions()
        assert s == SessionInfo(SID, "orders", "running", 10.0, 10.0, 1, 1)
        store.append(
            SID,
            [
                node_ev(NodeStarted, "orders@1/a@1", ts=11.0),
                node_ev(InputRequested, "orders@1/a@1", ts=12.0, interrupt_id="x"),
                ev(RunFinished, status="paused", ts=13.0),
            ],
            1,
        )
        [s] = store.sessions()
        assert (s.status, s.last_seq, s.updated_at, s.invocations) == ("paused", 4, 13.0, 1)
        # a resume: a second invocation, the workflow and start time stay those of the first
        store.append(
            SID, [ev(RunStarted, workflow="renamed", resumed=True, ts=20.0, invocation_id="inv-2")], 4
        )
        [s] = store.sessions()
        assert (s.workflow, s.status, s.started_at, s.invocations) == ("orders", "running", 10.0, 2)
        store.append(SID, [ev(RunFinished, status="completed", ts=21.0, invocation_id="inv-2")], 5)
        assert store.sessions() == [SessionInfo(SID, "orders", "completed", 10.0, 21.0, 6, 2)]

    def test_sessions_are_listed_most_recently_updated_first(self, store: EventLog) -> None:
        store.append("a", [ev(RunStarted, sid="a", workflow="wa", ts=1.0)], 0)
        store.append("b", [ev(RunStarted, sid="b", workflow="wb", ts=2.0)], 0)
        store.append("c", [ev(RunStarted, sid="c", workflow="wc", ts=3.0)], 0)
        store.append("a", [ev(RunFinished, sid="a", status="failed", ts=4.0)], 1)
        assert [(s.session_id, s.status) for s in store.sessions()] == [
            ("a", "failed"),
            ("c", "running"),
            ("b", "running"),
        ]

    def test_find_sessions_and_status_counts_select_what_the_query_rule_selects(
        self, store: EventLog
    ) -> None:
        # mixed-case ids (one not ASCII: the text filters fold ASCII letters only), three
        # workflows, every status a log gives, and distinct times
        plan = [
            ("Order-A1", "orders", "failed"),
            ("order-b2", "orders", "completed"),
            ("BILL-c3", "billing", "completed"),
            ("bill-d4", "billing", "failed"),
            ("etl-E5", "etl", None),
            ("ÉTÉ-6", "etl", "paused"),
            ("q-7", "orders", "queued"),
            ("q-8", "billing", "queued"),
        ]
        for i, (sid, wf, ended) in enumerate(plan):
            if ended == "queued":
                store.append(sid, [ev(RunSubmitted, sid=sid, workflow=wf, ts=5.0 + i)], 0)
                continue
            store.append(sid, [ev(RunStarted, sid=sid, workflow=wf, ts=10.0 + i)], 0)
            if ended is not None:
                store.append(sid, [ev(RunFinished, sid=sid, status=ended, ts=30.0 - i)], 1)
        every = store.sessions()
        assert len(every) == len(plan)
        queries = [
            None,
            SessionQuery(),
            SessionQuery(statuses=frozenset({"failed"})),
            SessionQuery(statuses=frozenset({"completed", "running"})),
            SessionQuery(statuses=frozenset({"queued"}), submitted_until=9.0),
            SessionQuery(statuses=frozenset()),
            SessionQuery(workflow="orders"),
            SessionQuery(workflow="nope"),
            SessionQuery(workflow="billing", statuses=frozenset({"failed", "queued"})),
            SessionQuery(updated_since=14.0),
            SessionQuery(updated_until=26.0),
            SessionQuery(updated_since=12.0, updated_until=27.0),
            SessionQuery(submitted_until=11.0),
            SessionQuery(id_contains="order"),
            SessionQuery(id_contains="BiLl"),
            SessionQuery(id_contains="e5"),
            SessionQuery(id_contains="été"),  # É is not an ASCII letter: no match
            SessionQuery(id_contains="ÉTÉ"),
            SessionQuery(id_contains="%"),  # no wildcard: text, literally
            SessionQuery(session_ids=frozenset({"q-7", "bill-d4", "ghost"})),
            SessionQuery(session_ids=frozenset()),
            SessionQuery(session_ids=frozenset({"Order-A1", "order-b2"}), id_contains="a1"),
            SessionQuery(owner_contains="w"),  # nobody owns a session here
        ]
        for query in queries:
            want = [s for s in every if query is None or query.matches(s)]
            assert store.find_sessions(query) == want, query
            for offset in (0, 1, 3):
                for limit in (None, 0, 1, 2, 10):
                    got = store.find_sessions(query, limit=limit, offset=offset)
                    cut = want[offset:] if limit is None else want[offset : offset + limit]
                    assert got == cut, (query, limit, offset)
            counts: dict[str, int] = {}
            for s in want:
                counts[s.status] = counts.get(s.status, 0) + 1
            assert store.status_counts(query) == counts, query

    # -- the summaries derived from the projections (metrics scrapes)

    def test_open_run_summary_agrees_with_the_liveness_rule(self, store: EventLog) -> None:
        store.append(SID, liveness_log(), 0)
        beats = {
            f"live@1/{name}@1": beat for name, _s, _st, beat, _d, _c in LIVENESS_CASES if beat is not None
        }
        for path, beat in beats.items():
            store.heartbeat(SID, [path], ts=beat)
        now, stale = LIVENESS_NOW, LIVENESS_STALE_AFTER_S
        runs = {r.node: r for r in store.node_runs(SID)}
        groups = {g.node: g for g in store.open_run_summary(now, stale)}
        assert len(groups) == len(LIVENESS_CASES) - 1  # the completed run is in no group
        for name, status, started, _beat, deadline, expected in LIVENESS_CASES:
            r = runs[name]
            assert (r.status, r.started_at, r.job_deadline_at) == (status, started, deadline), name
            cls = classify_open_run(r.status, r.started_at, r.heartbeat_at, r.job_deadline_at, now, stale)
            assert cls == expected, name
            if status not in OPEN_STATES:
                assert name not in groups
                continue
            g = groups[name]
            assert (g.workflow, g.state, g.count, g.oldest_started_at) == ("live", status, 1, started), name
            assert (g.orphaned, g.overdue) == (int(cls == ORPHANED), int(cls == OVERDUE)), name
        key = lambda g: (g.workflow, g.node, g.state)  # noqa: E731
        assert sorted(store.open_run_summary(now, stale), key=key) == sorted(
            summarize_open_runs(store.open_runs(), now, stale), key=key
        )

    def test_open_run_summary_counts_once_at_the_deepest_path(self, store: EventLog) -> None:
        """A run open only because a run below it is (a container) is in no group: one dead
        worker is one orphan, one pause one waiting run (docs/design.md, "Counting once")."""
        for sid, events in nested_logs(100.0).items():
            store.append(sid, events, 0)
        now, stale = 1000.0, 60.0  # every heartbeat (at 101) is stale: the running runs are orphaned
        key = lambda g: (g.workflow, g.node, g.state)  # noqa: E731
        got = sorted(store.open_run_summary(now, stale), key=key)
        assert got == [
            OpenRunGroup("bw", "bw", "running", 1, 101.0, 1, 0),
            OpenRunGroup("pw", "ask", "waiting_input", 1, 101.0, 0, 0),
            OpenRunGroup("wf", "inner", "running", 2, 101.0, 2, 0),  # inner@10 and inner@1-b
            OpenRunGroup("wf", "leaf", "running", 1, 101.0, 1, 0),
        ]
        assert got == sorted(summarize_open_runs(store.open_runs(), now, stale), key=key)
        by_session: dict[str, list[str]] = {}
        for r in store.open_runs():
            by_session.setdefault(r.session_id, []).append(r.path)
        assert {sid: containers(paths) for sid, paths in by_session.items()} == {
            "crashed": {"wf@1", "wf@1/inner@1"},
            "paused": {"pw@1"},
            "between": set(),
        }

    def test_open_run_summary_counts_a_run_whose_path_only_begins_like_another(self, store: EventLog) -> None:
        """Only a run at ``path/...`` is below ``path``: open runs at ``a@1``, ``a@1-b`` and
        ``a@1.c`` (characters that sort below ``/``) contain none of each other."""
        store.append(
            SID,
            [
                ev(RunStarted, workflow="wf", ts=1.0),
                *(node_ev(NodeStarted, f"wf@1/{name}", ts=2.0) for name in ("a@1", "a@1-b", "a@1.c")),
            ],
            0,
        )
        [group] = store.open_run_summary(now=10.0, stale_after_s=60.0)
        assert (group.node, group.state, group.count, group.orphaned) == ("a", "running", 3, 0)
        assert [group] == summarize_open_runs(store.open_runs(), 10.0, 60.0)

    def test_a_cancelled_session_is_listed_cancelled(self, store: EventLog) -> None:
        for sid in ("one-append", "two-appends"):
            store.append(sid, [ev(RunStarted, sid=sid, workflow="w", ts=1.0)], 0)
        store.append("one-append", [ev(RunFinished, sid="one-append", status="cancelled", ts=2.0)], 1)
        store.append("two-appends", [node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="two-appends")], 1)
        store.append(
            "two-appends",
            [
                node_ev(NodeCancelled, "w@1/a@1", ts=3.0, sid="two-appends", reason="aborted"),
                ev(RunFinished, sid="two-appends", status="cancelled", ts=3.0),
            ],
            2,
        )
        for sid in ("one-append", "two-appends"):
            info = store.session_info(sid)
            assert info is not None and info.status == "cancelled", sid
        assert {s.session_id: s.status for s in store.sessions()} == {
            "one-append": "cancelled",
            "two-appends": "cancelled",
        }
        assert store.status_counts() == {"cancelled": 2}

    def test_job_result_summary_counts_every_result_in_the_log(self, store: EventLog) -> None:
        assert store.job_result_summary() == []
        p = "etl@1/inner@1/enrich@1"
        store.append(
            "j1",
            [
                ev(RunStarted, sid="j1", workflow="etl", ts=1.0),
                node_ev(NodeStarted, p, ts=2.0, sid="j1"),
                node_ev(JobDispatched, p, ts=3.0, sid="j1", job_id="a"),
                node_ev(
                    JobResultReceived,
                    p,
                    ts=4.0,
                    sid="j1",
                    job_id="a",
                    success=True,
                    count=0,
                    result="empty",
                    invocation_id="answer-1",
                ),
            ],
            0,
        )
        assert store.job_result_summary() == [JobResultGroup("etl", "enrich", "empty", 1)]
        # appended later (another process's answer, another session): counted on the next call
        store.append(
            "j1",
            [
                node_ev(
                    JobResultReceived,
                    p,
                    ts=5.0,
                    sid="j1",
                    job_id="b",
                    success=True,
                    count=2,
                    result="success",
                )
            ],
            4,
        )
        store.append(
            "j2",
            [
                ev(RunStarted, sid="j2", workflow="etl", ts=1.0),
                node_ev(JobResultReceived, p, ts=6.0, sid="j2", job_id="c", success=False, result="failed"),
                node_ev(
                    JobResultReceived, p, ts=7.0, sid="j2", job_id="d", success=True, count=0, result="empty"
                ),
            ],
            0,
        )
        assert sorted(store.job_result_summary(), key=lambda g: g.result) == [
            JobResultGroup("etl", "enrich", "empty", 2),
            JobResultGroup("etl", "enrich", "failed", 1),
            JobResultGroup("etl", "enrich", "success", 1),
        ]
