"""Operator actions through the store: retries and cancels asked at the same moment are
each recorded (who asked and why), or refused, never told "done" and dropped."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from commands import start_cli
from flowscope import START, Runner, Workflow, node
from flowscope.actions import cancel, deliver, load, retry
from flowscope.answers import answer
from flowscope.engine.inbox import answer_body, take_in
from flowscope.errors import ResumeError
from flowscope.events import InputReceived, NodeCancelled, RunFinished, RunSubmitted
from flowscope.ownership import this_process
from flowscope.store import SqliteEventStore


@node
def boom(ctx, x):
    raise RuntimeError("the export broke")


@node
async def ask(ctx, x):
    return await ctx.request_input("go?", interrupt_id="go")


def failed_session(db: Path, sid: str = "s") -> SqliteEventStore:
    store = SqliteEventStore(db)
    with pytest.raises(RuntimeError):
        Runner(Workflow("nightly", edges=[(START, boom)]), store=store).run_sync(None, session_id=sid)
    return store


def submitted(store: SqliteEventStore, sid: str = "s") -> list[RunSubmitted]:
    return [e for e in store.read(sid) if isinstance(e, RunSubmitted) and e.reason is not None]


def test_retries_taken_in_together_record_every_reason(tmp_path):
    store = failed_session(tmp_path / "a.db")
    # another operator's retry, sent a moment before: still in the inbox when this one takes it in
    store.send("s", "retry", {"from_path": None, "reason": "the disk was full (retry, asked by ana@ops)"})
    receipt = retry(store, "s", reason="fixed the export")
    assert receipt.was == "failed" and not receipt.pending
    (queued,) = submitted(store)
    assert "the disk was full (retry, asked by ana@ops)" in queued.reason
    assert "fixed the export (retry, asked by" in queued.reason
    assert load(store, "s").status == "queued" and store.inbox("s") == []


def test_a_retry_that_arrives_after_another_queued_the_session_says_so(tmp_path):
    store = failed_session(tmp_path / "a.db")
    seen = load(store, "s")  # this operator saw it failed ...
    retry(store, "s", reason="first")  # ... and another queued it meanwhile
    with pytest.raises(ResumeError, match="queued to run again by another request"):
        deliver(store, seen, "retry", {"from_path": None, "reason": "second (retry, asked by bo@ops)"})
    (queued,) = submitted(store)
    assert "second" not in queued.reason and store.inbox("s") == []


def test_cancels_taken_in_together_record_every_reason(tmp_path):
    store = SqliteEventStore(tmp_path / "a.db")
    Runner(Workflow("w", edges=[(START, ask)]), store=store).run_sync(None, session_id="p")
    store.send("p", "cancel", {"reason": "wrong customer (asked by ana@ops)"})
    cancel(store, "p", reason="duplicate order")
    (finished,) = [e for e in store.read("p") if isinstance(e, RunFinished) and e.status == "cancelled"]
    cancelled = [e for e in store.read("p") if e.type == "node_cancelled"]
    assert cancelled and all(
        "wrong customer (asked by ana@ops)" in e.reason and "duplicate order (asked by" in e.reason
        for e in cancelled
    ), [e.reason for e in cancelled]
    assert finished.seq == store.last_seq("p")


def paused_session(db: Path, sid: str = "p") -> SqliteEventStore:
    store = SqliteEventStore(db)
    Runner(Workflow("w", edges=[(START, ask)]), store=store).run_sync(None, session_id=sid)
    return store


def inputs_given(store: SqliteEventStore, sid: str = "p") -> list[object]:
    return [e.value for e in store.read(sid) if isinstance(e, InputReceived)]


def test_a_retry_its_owner_takes_in_when_the_session_is_not_retryable_is_dropped_with_an_info_line(
    tmp_path, caplog
):
    store = paused_session(tmp_path / "a.db")
    lease = store.acquire("p", this_process(), 30.0)  # its owner, taking in what came as it paused
    store.send("p", "retry", {"from_path": None, "reason": "sent as it paused (retry, asked by ana@ops)"})
    with caplog.at_level(logging.INFO, logger="flowscope.engine"):
        assert take_in(store, load(store, "p"), lease) == []
    assert store.inbox("p") == [] and load(store, "p").status == "paused"
    assert [r.levelno for r in caplog.records if "retry was dropped" in r.getMessage()] == [logging.INFO]


def retry_body(seen, reason: str, from_path: str | None = None) -> dict[str, object]:
    """A retry message as ``flowscope.retry`` sends it, after its checks read ``seen``."""
    return {"from_path": from_path, "reason": f"{reason} (retry, asked by bo@ops)", "seen": seen.last_seq}


def test_a_retry_behind_another_that_queued_the_session_is_refused_even_when_a_worker_holds_it(tmp_path):
    store = failed_session(tmp_path / "a.db")
    seen = load(store, "s")  # this operator's checks pass: the session failed ...
    retry(store, "s", reason="first")  # ... another retry queues it at once ...
    store.acquire("s", this_process("worker"), 30.0)  # ... and a worker claims it
    with pytest.raises(ResumeError, match="retried by another request at the same moment"):
        deliver(store, seen, "retry", retry_body(seen, "second"))


def test_a_retry_whose_sender_saw_the_session_before_another_retry_is_dropped_when_that_run_failed_again(
    tmp_path, caplog
):
    store = failed_session(tmp_path / "a.db")
    seen = load(store, "s")
    retry(store, "s", reason="first")
    with pytest.raises(RuntimeError):  # a worker runs the first retry's run: it fails again ...
        Runner(Workflow("nightly", edges=[(START, boom)]), store=store).resume_sync("s")
    store.send("s", "retry", retry_body(seen, "second"))  # ... with the second still in the inbox
    lease = store.acquire("s", this_process("worker"), 30.0)
    with caplog.at_level(logging.INFO, logger="flowscope.engine"):
        assert take_in(store, load(store, "s"), lease) == []  # not run a second time
    assert load(store, "s").status == "failed" and store.inbox("s") == []
    assert [r.levelno for r in caplog.records if "retry was dropped" in r.getMessage()] == [logging.INFO]
    (queued,) = submitted(store)
    assert "second" not in queued.reason


def test_a_retry_with_no_path_of_a_completed_session_is_never_applied(tmp_path):
    store = paused_session(tmp_path / "a.db")
    answer(store, "p", {"go": "yes"})
    Runner(Workflow("w", edges=[(START, ask)]), store=store).resume_sync("p")
    lease = store.acquire("p", this_process("worker"), 30.0)
    store.send("p", "retry", {"from_path": None, "reason": "sent before it completed"})  # no seen either
    store.send("p", "retry", retry_body(load(store, "p"), "from the question", from_path="w@1/ask@1"))
    (queued,) = [e for e in take_in(store, load(store, "p"), lease) if isinstance(e, RunSubmitted)]
    assert queued.reason == "from the question (retry, asked by bo@ops)"  # the path given counts
    assert [e.path for e in store.read("p") if isinstance(e, NodeCancelled)] == ["w@1/ask@1", "w@1"]


def test_a_retry_of_a_completed_session_without_a_path_is_refused_and_nothing_is_sent(tmp_path):
    store = paused_session(tmp_path / "a.db")
    answer(store, "p", {"go": "yes"})
    Runner(Workflow("w", edges=[(START, ask)]), store=store).resume_sync("p")
    before = store.last_seq("p")
    sent: list[str] = []
    real_send = store.send

    def send(sid, kind, body):
        sent.append(kind)
        return real_send(sid, kind, body)

    store.send = send  # type: ignore[method-assign]
    with pytest.raises(ResumeError, match="completed; give a path to run it again from"):
        retry(store, "p")
    assert sent == [] and store.last_seq("p") == before and load(store, "p").status == "completed"


def test_a_retry_message_from_a_path_the_session_has_no_run_at_is_dropped_not_raised(tmp_path):
    # flowscope.retry checks the path; a message sent another way must not stop the take-in
    store = paused_session(tmp_path / "a.db")
    answer(store, "p", {"go": "yes"})
    Runner(Workflow("w", edges=[(START, ask)]), store=store).resume_sync("p")
    lease = store.acquire("p", this_process("worker"), 30.0)
    store.send("p", "retry", {"from_path": "w@1/nowhere@1", "reason": "a hand-made message"})
    assert take_in(store, load(store, "p"), lease) == []
    assert store.inbox("p") == [] and load(store, "p").status == "completed"


def test_a_retry_taken_in_with_a_cancel_of_a_session_already_over_is_applied(tmp_path):
    store = failed_session(tmp_path / "a.db")
    lease = store.acquire("s", this_process("worker"), 30.0)  # the owner that ran it, not yet let go
    store.send("s", "cancel", {"reason": "sent while it ran (asked by ana@ops)"})
    seen = load(store, "s")
    assert deliver(store, seen, "retry", retry_body(seen, "after it failed")).pending
    take_in(store, load(store, "s"), lease)
    (queued,) = submitted(store)
    assert "after it failed" in queued.reason and load(store, "s").status == "queued"


def test_an_answer_that_arrives_after_another_answered_the_same_request_says_so(tmp_path):
    store = paused_session(tmp_path / "a.db")
    seen = load(store, "p")  # this operator saw it waiting ...
    answer(store, "p", {"go": "bob says no"})  # ... and another answered meanwhile
    with pytest.raises(ResumeError, match="'go' was answered by another request at the same moment"):
        deliver(store, seen, "answer", answer_body({"go": "alice says yes"}, {}))
    assert inputs_given(store) == ["bob says no"] and store.inbox("p") == []


def test_an_answer_behind_another_for_the_same_request_in_a_live_owners_inbox_says_so(tmp_path):
    store = paused_session(tmp_path / "a.db")
    seen = load(store, "p")
    store.acquire("p", this_process(), 30.0)  # a live owner: it takes the inbox in later
    store.send("p", "answer", answer_body({"go": "bob says no"}, {}))  # sent a moment before
    with pytest.raises(ResumeError, match="its owner takes that answer in, and drops yours"):
        deliver(store, seen, "answer", answer_body({"go": "alice says yes"}, {}))
    # a request of another kind behind it is left to the owner, as before
    receipt = deliver(store, seen, "cancel", {"reason": "late (asked by ana@ops)"})
    assert receipt.pending


def test_an_answer_dropped_because_another_was_recorded_first_is_refused_even_when_a_worker_holds_the_session(
    tmp_path,
):
    store = paused_session(tmp_path / "a.db")
    seen = load(store, "p")  # this operator's checks pass: nothing answered yet ...
    answer(store, "p", {"go": "bob says no"})  # ... another answer is recorded at once ...
    lease = store.acquire("p", this_process("worker"), 30.0)  # ... and a worker claims the session
    with pytest.raises(ResumeError, match="'go' was answered by another request at the same moment"):
        deliver(store, seen, "answer", answer_body({"go": "alice says yes"}, {}))
    assert take_in(store, load(store, "p"), lease) == []  # the worker drops it, as it said
    assert inputs_given(store) == ["bob says no"]


@pytest.mark.parametrize("meanwhile", ["completed", "cancelled"])
def test_a_cancel_of_a_session_over_meanwhile_is_refused_even_when_its_owner_still_holds_it(
    tmp_path, meanwhile
):
    store = paused_session(tmp_path / "a.db")
    seen = load(store, "p")
    if meanwhile == "completed":
        answer(store, "p", {"go": "yes"})
        Runner(Workflow("w", edges=[(START, ask)]), store=store).resume_sync("p")
        expected = "'p' completed meanwhile; there was nothing left to cancel"
    else:
        cancel(store, "p", reason="first")
        expected = "cancelled by another request at the same moment"
    lease = store.acquire("p", this_process("worker"), 30.0)  # its owner, before it lets the session go
    with pytest.raises(ResumeError, match=expected):
        deliver(store, seen, "cancel", {"reason": "too late (asked by bo@ops)"})
    assert take_in(store, load(store, "p"), lease) == []  # the owner drops it, as it said
    assert not any("too late" in e.reason for e in store.read("p") if isinstance(e, NodeCancelled))


def test_a_cancel_of_a_session_a_live_owner_still_runs_is_left_to_it(tmp_path):
    store = paused_session(tmp_path / "a.db")
    seen = load(store, "p")
    answer(store, "p", {"go": "yes"})  # answered meanwhile: the session is not over
    lease = store.acquire("p", this_process("worker"), 30.0)
    assert deliver(store, seen, "cancel", {"reason": "stop it (asked by bo@ops)"}).pending
    assert [e.status for e in take_in(store, load(store, "p"), lease) if isinstance(e, RunFinished)] == [
        "cancelled"
    ]


def test_a_cancel_that_arrives_after_another_cancelled_the_session_says_so(tmp_path):
    store = paused_session(tmp_path / "a.db")
    seen = load(store, "p")
    cancel(store, "p", reason="first")
    with pytest.raises(ResumeError, match="cancelled by another request at the same moment"):
        deliver(store, seen, "cancel", {"reason": "second (asked by bo@ops)"})
    reasons = [e.reason for e in store.read("p") if isinstance(e, NodeCancelled)]
    assert reasons and not any("second" in r for r in reasons)


def test_a_cancel_of_a_session_that_ended_by_itself_meanwhile_says_so(tmp_path):
    store = paused_session(tmp_path / "a.db")
    seen = load(store, "p")
    answer(store, "p", {"go": "yes"})
    Runner(Workflow("w", edges=[(START, ask)]), store=store).resume_sync("p")
    with pytest.raises(ResumeError, match="'p' completed meanwhile; there was nothing left to cancel"):
        deliver(store, seen, "cancel", {"reason": "too late (asked by bo@ops)"})


@pytest.mark.slow
def test_another_senders_moment_on_the_session_is_waited_out_not_taken_for_its_live_owner(tmp_path):
    """A sender holds the session only while it takes the inbox in: one sent at that moment
    is taken in with it (or right after), and recorded, not left "pending" for a process
    that is no owner of the session."""
    db = tmp_path / "a.db"
    store = paused_session(db)
    other = store.acquire("p", replace(this_process("other-console"), sender=True), 30.0)

    def other_sender_takes_in() -> None:
        time.sleep(0.3)
        with SqliteEventStore(db) as own:
            take_in(own, load(own, "p"), other)
            own.release(other)

    t = threading.Thread(target=other_sender_takes_in)
    t.start()
    try:
        receipt = answer(store, "p", {"go": "alice says yes"})
    finally:
        t.join()
    assert not receipt.pending and receipt.owner is None
    assert inputs_given(store) == ["alice says yes"] and store.inbox("p") == []


def test_an_operator_reason_is_recorded_through_the_default_redaction(tmp_path):
    store = failed_session(tmp_path / "r.db")
    retry(store, "s", reason="key at /home/alice/.ssh/id_rsa password=hunter2")
    (queued,) = submitted(store)
    assert queued.reason.startswith("key at <path> password=*** (retry, asked by"), queued.reason
    cancel(store, "s", reason="see /home/alice/notes token=abc123")
    recorded = repr(store.read("s"))
    assert "alice" not in recorded and "hunter2" not in recorded and "abc123" not in recorded


def test_merged_reasons_name_each_once_and_count_the_rest():
    from flowscope.engine.inbox import MERGED_REASONS, merged_reasons

    assert merged_reasons(["a", "a", "b"]) == "a; also: b"
    many = [f"r{i}" for i in range(MERGED_REASONS + 2)]
    assert merged_reasons(many).endswith("; and 2 more") and f"r{MERGED_REASONS}" not in merged_reasons(many)


@pytest.mark.slow
def test_concurrent_retry_commands_are_each_recorded_or_refused(tmp_path):
    """Four ``flowscope retry`` processes at once: every one that says "queued" has its
    reason in the log, the others exit 2, and the session is queued once."""
    db = tmp_path / "a.db"
    failed_session(db).close()
    procs = [start_cli("--db", str(db), "retry", "s", "--reason", f"operator-{i}") for i in range(4)]
    outcomes = [(p.wait(timeout=60), p.communicate()) for p in procs]
    with SqliteEventStore(db, readonly=True) as store:
        (queued,) = submitted(store)
        assert store.inbox("s") == []
    ok = [i for i, (code, _) in enumerate(outcomes) if code == 0]
    assert ok, outcomes
    for i, (code, (out, err)) in enumerate(outcomes):
        if code == 0:
            assert f"operator-{i}" in queued.reason and "queued" in out, (i, out, err)
        else:
            assert code == 2 and f"operator-{i}" not in queued.reason, (i, code, err)
            assert len(err.strip().splitlines()) == 1 and err.startswith("flowscope: error:"), err
