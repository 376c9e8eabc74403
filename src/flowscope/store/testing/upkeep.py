"""The upkeep role's contract: :class:`UpkeepContract`."""

from __future__ import annotations

from ...events import (
    InputRequested,
    JobDispatched,
    NodeErrorEvent,
    NodeStarted,
    RunFinished,
    RunStarted,
)
from ..upkeep import Upkeep
from .base import ContractBase
from .helpers import (
    ev,
    finished_session,
    node_ev,
)

__all__ = ["UpkeepContract"]


class UpkeepContract(ContractBase):
    """What every :class:`~flowscope.store.upkeep.Upkeep` must do: prune only whole
    finished sessions, free their storage, and keep the span watermark moving forward."""

    def create_store(self) -> Upkeep:
        """A new, empty store with upkeep (an event log too) for one test."""
        raise NotImplementedError  # abstract

    def test_delete_sessions_removes_whole_finished_sessions_only(self, store: Upkeep) -> None:
        for sid, status in (("done", "completed"), ("bad", "failed"), ("gone", "cancelled")):
            finished_session(store, sid, status, with_snapshot=True)
        store.append(
            "open",
            [
                ev(RunStarted, sid="open", workflow="w", ts=1.0),
                node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="open"),
                node_ev(InputRequested, "w@1/a@1", ts=3.0, sid="open", interrupt_id="x"),
                ev(RunFinished, sid="open", status="paused", ts=4.0),
            ],
            0,
        )
        keep = store.read("open")
        assert store.delete_sessions(["open", "done", "nope", "bad", "done"]) == ["done", "bad"]
        for sid in ("done", "bad"):
            assert store.read(sid) == [] and store.last_seq(sid) == 0 and not store.has_session(sid)
            assert store.node_runs(sid) == [] and store.load_snapshot(sid) is None
        assert {s.session_id for s in store.sessions()} == {"gone", "open"}
        assert store.read("open") == keep  # a paused session is never deleted
        assert [r.session_id for r in store.open_runs()] == ["open"]
        # a deleted id starts again from seq 1
        finished_session(store, "done", "completed")
        assert store.last_seq("done") == 4

    def test_a_snapshot_is_kept_per_session_and_replaced_by_the_next(self, store: Upkeep) -> None:
        # Snapshots are optional (a store may keep none: load_snapshot is None); one that
        # keeps them keeps each session's own, or a resume would start from another's state.
        for sid in ("s1", "s2"):
            finished_session(store, sid, "completed")
        store.save_snapshot("s1", 4, '{"of": "s1"}')
        if store.load_snapshot("s1") is None:
            return
        store.save_snapshot("s2", 3, '{"of": "s2"}')
        assert store.load_snapshot("s1") == (4, '{"of": "s1"}')
        assert store.load_snapshot("s2") == (3, '{"of": "s2"}')
        assert store.load_snapshot("s3") is None
        store.save_snapshot("s2", 4, '{"of": "s2", "later": true}')
        assert store.load_snapshot("s2") == (4, '{"of": "s2", "later": true}')
        assert store.load_snapshot("s1") == (4, '{"of": "s1"}')

    def test_a_snapshot_loads_with_the_seq_it_was_saved_at(self, store: Upkeep) -> None:
        # the last one saved, whatever its seq: a resume folds the events after that seq
        # onto that data, so a seq and data of two saves would skip or repeat events
        finished_session(store, "s1", "completed")
        store.save_snapshot("s1", 4, '{"at": 4}')
        if store.load_snapshot("s1") is None:
            return  # a store that keeps no snapshot
        store.save_snapshot("s1", 2, '{"at": 2}')
        assert store.load_snapshot("s1") == (2, '{"at": 2}')

    def test_delete_sessions_never_deletes_a_failed_session_with_an_open_run(self, store: Upkeep) -> None:
        store.append(
            "f",
            [
                ev(RunStarted, sid="f", workflow="w", ts=1.0),
                node_ev(NodeStarted, "w@1/a@1", ts=2.0, sid="f"),
                node_ev(NodeStarted, "w@1/b@1", ts=2.0, sid="f"),
                node_ev(NodeErrorEvent, "w@1/b@1", ts=3.0, sid="f"),
                ev(RunFinished, sid="f", status="failed", ts=4.0),
            ],
            0,
        )
        assert store.delete_sessions(["f"]) == []
        assert store.last_seq("f") == 5

    def test_delete_sessions_never_deletes_a_finished_session_with_a_run_waiting(self, store: Upkeep) -> None:
        # a branch paused for input or a job while a sibling failed, or the run was cancelled
        for sid, waiting, status in (("f-input", "input", "failed"), ("c-job", "job", "cancelled")):
            p = "w@1/a@1"
            pause = (
                node_ev(InputRequested, p, ts=3.0, sid=sid, interrupt_id="x")
                if waiting == "input"
                else node_ev(JobDispatched, p, ts=3.0, sid=sid, job_id="j")
            )
            store.append(
                sid,
                [
                    ev(RunStarted, sid=sid, workflow="w", ts=1.0),
                    node_ev(NodeStarted, p, ts=2.0, sid=sid),
                    pause,
                    ev(RunFinished, sid=sid, status=status, ts=4.0),
                ],
                0,
            )
        assert store.delete_sessions(["f-input", "c-job"]) == []
        assert [store.last_seq(sid) for sid in ("f-input", "c-job")] == [4, 4]

    def test_delete_sessions_deletes_a_cancelled_session_as_a_completed_or_failed_one(
        self, store: Upkeep
    ) -> None:
        for sid, status in (("done", "completed"), ("bad", "failed"), ("gone", "cancelled")):
            finished_session(store, sid, status)
        assert store.delete_sessions(["gone", "bad", "done"]) == ["gone", "bad", "done"]
        assert store.sessions() == [] and store.read("gone") == []

    def test_storage_bytes_shrink_when_sessions_are_deleted(self, store: Upkeep) -> None:
        for i in range(20):
            finished_session(store, f"s{i}", "completed")
        before = store.storage_bytes()
        store.delete_sessions([f"s{i}" for i in range(20)])
        after = store.storage_bytes()
        if before is None:  # the memory store cannot tell
            assert after is None
        else:
            assert after is not None and after < before

    # ------------------------------------------------------------------ group commit, span watermark

    def test_the_span_watermark_only_moves_forward_and_goes_with_a_pruned_session(
        self, store: Upkeep
    ) -> None:
        assert store.exported_seq("s") == 0
        finished_session(store, "s", "completed")
        store.set_exported_seq("s", 3)
        store.set_exported_seq("s", 1)  # never moves back
        assert (store.exported_seq("s"), store.exported_seq("other")) == (3, 0)
        store.set_exported_seq("s", 4)
        assert store.exported_seq("s") == 4
        assert store.delete_sessions(["s"]) == ["s"]
        assert store.exported_seq("s") == 0  # a new session of that id ships its spans

    def test_watermarks_of_several_sessions_advance_in_one_call_and_never_move_back(
        self, store: Upkeep
    ) -> None:
        store.set_exported_seqs({})
        store.set_exported_seqs({"a": 3, "b": 2})
        store.set_exported_seqs({"a": 1, "b": 5, "c": 1})  # a stays: never moves back
        assert [store.exported_seq(s) for s in "abcd"] == [3, 5, 1, 0]
        store.set_exported_seq("c", 4)  # the one-session form is the same write
        assert store.exported_seq("c") == 4
