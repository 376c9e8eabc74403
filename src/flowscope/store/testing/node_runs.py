"""The node-runs projection through a run's states: :class:`NodeRunStatesContract`, a part of
:class:`~flowscope.store.testing.projection.ProjectionContract`."""

from __future__ import annotations

from ...events import (
    Event,
    InputReceived,
    InputRequested,
    JobDispatched,
    JobResultReceived,
    NodeCancelled,
    NodeCompleted,
    NodeErrorEvent,
    NodePaused,
    NodeRetrying,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from ...fold import rebuild
from ..base import (
    EventLog,
    NodeRun,
)
from .base import ContractBase
from .helpers import (
    SID,
    ev,
    node_ev,
    run_of,
)

__all__ = ["NodeRunStatesContract"]


class NodeRunStatesContract(ContractBase):
    """Each state a node run goes through, as the ``node_runs`` projection records it: the
    fold of the log, whatever the store kept of the run between its appends."""

    def create_store(self) -> EventLog:
        """A new, empty event log for one test; ``self.tmp_path`` is a fresh directory."""
        raise NotImplementedError  # abstract

    def test_node_runs_projection_follows_the_state_machine(self, store: EventLog) -> None:
        s = store
        p = "orders@1/fetch@1"
        seq = s.append(
            SID,
            [
                ev(RunStarted, workflow="orders", ts=100.0),
                node_ev(NodeStarted, p, ts=101.0, kind="function", parent_path="orders@1"),
            ],
            0,
        )[-1].seq
        r = run_of(s, p)
        assert (r.session_id, r.workflow, r.node, r.path, r.kind) == (SID, "orders", "fetch", p, "function")
        assert (r.status, r.attempt, r.retries, r.recoveries) == ("running", 1, 0, 0)
        assert (r.started_at, r.ended_at, r.heartbeat_at, r.error_code, r.error_type, r.job_deadline_at) == (
            101.0,
            None,
            101.0,
            None,
            None,
            None,
        )

        seq = s.append(
            SID,
            [
                node_ev(
                    NodeRetrying,
                    p,
                    ts=102.0,
                    attempt=1,
                    error_type="TimeoutError",
                    error_code="UPSTREAM_TIMEOUT",
                )
            ],
            seq,
        )[-1].seq
        r = run_of(s, p)
        assert (r.status, r.attempt, r.retries, r.heartbeat_at) == ("running", 2, 1, 102.0)
        seq = s.append(SID, [node_ev(NodeRetrying, p, ts=103.0, attempt=2, error_type="TimeoutError")], seq)[
            -1
        ].seq
        assert (run_of(s, p).attempt, run_of(s, p).retries) == (3, 2)

        seq = s.append(SID, [node_ev(NodeCompleted, p, ts=104.0, output={"rows": 3}, attempt_count=3)], seq)[
            -1
        ].seq
        r = run_of(s, p)
        assert (r.status, r.attempt, r.retries, r.started_at, r.ended_at) == ("completed", 3, 2, 101.0, 104.0)

        q = "orders@1/check@1"
        seq = s.append(
            SID,
            [
                node_ev(NodeStarted, q, ts=105.0),
                node_ev(
                    NodeErrorEvent,
                    q,
                    ts=106.0,
                    error_code="BAD_INPUT",
                    error_type="ValueError",
                    error_message="row 3",
                    attempt_count=1,
                ),
            ],
            seq,
        )[-1].seq
        r = run_of(s, q)
        assert (r.status, r.error_code, r.error_type, r.ended_at, r.attempt) == (
            "failed",
            "BAD_INPUT",
            "ValueError",
            106.0,
            1,
        )

        c = "orders@1/crm@1"
        seq = s.append(SID, [node_ev(NodeStarted, c, ts=107.0), node_ev(NodeCancelled, c, ts=108.0)], seq)[
            -1
        ].seq
        assert (run_of(s, c).status, run_of(s, c).ended_at) == ("cancelled", 108.0)

        i = "orders@1/approve@1"
        seq = s.append(
            SID,
            [
                node_ev(NodeStarted, i, ts=109.0),
                node_ev(InputRequested, i, ts=110.0, interrupt_id="ok", prompt="?"),
            ],
            seq,
        )[-1].seq
        assert run_of(s, i).status == "waiting_input"
        # resume: the input arrives and the run starts again, same attempt
        seq = s.append(
            SID,
            [
                node_ev(InputReceived, i, ts=111.0, interrupt_id="ok", value=True),
                node_ev(NodeStarted, i, ts=112.0, attempt=1),
            ],
            seq,
        )[-1].seq
        r = run_of(s, i)
        assert (r.status, r.attempt, r.started_at, r.ended_at) == ("running", 1, 109.0, None)

        j = "orders@1/enrich@1"
        seq = s.append(
            SID,
            [
                node_ev(NodeStarted, j, ts=113.0),
                node_ev(JobDispatched, j, ts=114.0, job_id="job-1", deadline_s=3600.0),
            ],
            seq,
        )[-1].seq
        r = run_of(s, j)
        assert (r.status, r.job_deadline_at) == ("waiting_job", 114.0 + 3600.0)
        seq = s.append(
            SID,
            [node_ev(JobResultReceived, j, ts=115.0, job_id="job-1", success=True, result="success")],
            seq,
        )[-1].seq
        assert run_of(s, j).job_deadline_at is None
        seq = s.append(SID, [node_ev(JobDispatched, j, ts=116.0, job_id="job-2")], seq)[-1].seq
        assert (run_of(s, j).status, run_of(s, j).job_deadline_at) == (
            "waiting_job",
            None,
        )  # no deadline given

        w = "orders@1/sub@1"
        seq = s.append(
            SID,
            [
                node_ev(NodeStarted, w, ts=117.0, kind="workflow"),
                node_ev(NodePaused, w, ts=118.0, waiting="job", origin_path=w + "/x@1"),
            ],
            seq,
        )[-1].seq
        assert (run_of(s, w).status, run_of(s, w).kind) == ("waiting_job", "workflow")

        # a crash: the next invocation recovers the running run with the next attempt
        seq = s.append(
            SID,
            [
                ev(RunStarted, workflow="orders", resumed=True, recovered=1, ts=120.0, invocation_id="i2"),
                node_ev(NodeStarted, i, ts=121.0, attempt=2, recovered=True, invocation_id="i2"),
            ],
            seq,
        )[-1].seq
        r = run_of(s, i)
        assert (r.status, r.attempt, r.recoveries, r.heartbeat_at) == ("running", 2, 1, 121.0)

        # the projection is the fold of the log
        _projection_is_the_fold(s)

    def test_a_run_awaiting_two_jobs_keeps_the_open_jobs_deadline_when_one_reports(
        self, store: EventLog
    ) -> None:
        # The invocation pauses before the results come (another process, or a resume,
        # appends them): the store folds them on the run as its row left it.
        s = store
        p = "w@1/n@1"
        s.append(
            SID,
            [
                *_one_run_started(p),
                node_ev(JobDispatched, p, ts=102.0, job_id="a", deadline_s=10.0),
                node_ev(JobDispatched, p, ts=103.0, job_id="b", deadline_s=60.0),
                node_ev(JobDispatched, p, ts=104.0, job_id="c"),  # no deadline
                node_ev(NodePaused, p, ts=105.0, waiting="job"),
                node_ev(NodePaused, "w@1", ts=105.0, waiting="job", origin_path=p),
                ev(RunFinished, ts=105.0, status="waiting_job"),
            ],
            0,
        )
        assert run_of(s, p).job_deadline_at == 112.0  # a's, the first
        deadlines = []
        for job in ("a", "c", "b"):
            s.append(
                SID, [node_ev(JobResultReceived, p, ts=110.0, job_id=job, result="success")], s.last_seq(SID)
            )
            _projection_is_the_fold(s)
            deadlines.append(run_of(s, p).job_deadline_at)
        assert deadlines == [163.0, 163.0, None]  # b's while b is out, then none

    def test_a_resumed_run_is_as_old_as_its_restart(self, store: EventLog) -> None:
        # Paused for an answer at 102, answered an hour later: the run that starts again at
        # 3702 has run for seconds, not an hour (what an alert on a run's age reads).
        s = store
        p = "w@1/n@1"
        s.append(
            SID,
            [
                *_one_run_started(p),
                node_ev(InputRequested, p, ts=102.0, interrupt_id="ok"),
                node_ev(NodePaused, "w@1", ts=102.0, waiting="input", origin_path=p),
                ev(RunFinished, ts=102.0, status="waiting_input"),
            ],
            0,
        )
        assert (run_of(s, p).started_at, run_of(s, p).restarted_at, run_of(s, p).last_started_at) == (
            101.0,
            None,
            101.0,
        )
        s.append(
            SID,
            [
                ev(RunStarted, workflow="w", ts=3700.0, resumed=True, invocation_id="inv-2"),
                node_ev(NodeStarted, "w@1", ts=3700.0, kind="workflow", invocation_id="inv-2"),
                node_ev(InputReceived, p, ts=3701.0, interrupt_id="ok", value=True, invocation_id="inv-2"),
                node_ev(NodeStarted, p, ts=3702.0, parent_path="w@1", invocation_id="inv-2"),
            ],
            6,
        )
        r = run_of(s, p)
        assert (r.status, r.started_at, r.restarted_at, r.last_started_at) == (
            "running",
            101.0,
            3702.0,
            3702.0,
        )
        _projection_is_the_fold(s)
        [group] = s.open_run_summary(now=3710.0, stale_after_s=60.0)  # the workflow's run contains it
        assert (group.node, group.state, group.count, group.oldest_started_at) == ("n", "running", 1, 3702.0)

    def test_a_failed_run_resumed_by_an_operator_keeps_numbering(self, store: EventLog) -> None:
        p = "w@1/a@1"
        s = store
        s.append(
            SID,
            [
                ev(RunStarted, workflow="w", ts=1.0),
                node_ev(NodeStarted, p, ts=2.0),
                node_ev(NodeRetrying, p, ts=3.0, attempt=1),
                node_ev(NodeRetrying, p, ts=4.0, attempt=2),
                node_ev(NodeErrorEvent, p, ts=5.0, attempt_count=3, error_code="X"),
            ],
            0,
        )
        assert (run_of(s, p).status, run_of(s, p).attempt, run_of(s, p).error_code) == ("failed", 3, "X")
        s.append(SID, [node_ev(NodeStarted, p, ts=6.0, attempt=4)], 5)
        r = run_of(s, p)
        assert (r.status, r.attempt, r.retries, r.error_code, r.error_type) == ("running", 4, 2, None, None)


def _one_run_started(path: str) -> list[Event]:
    """An invocation of workflow ``w`` at 100.0 and the start of its run ``path`` at 101.0."""
    return [
        ev(RunStarted, workflow="w", ts=100.0),
        node_ev(NodeStarted, "w@1", ts=100.0, kind="workflow"),
        node_ev(NodeStarted, path, ts=101.0, parent_path="w@1"),
    ]


def _projection_is_the_fold(store: EventLog, sid: str = SID) -> None:
    """The store's node runs of ``sid`` are the fold of its log, field for field."""
    state = rebuild(store.read(sid))
    assert store.node_runs(sid) == [
        NodeRun.from_state(sid, state.workflow, ns) for ns in state.nodes.values()
    ]
