"""``flowscope.answer()``: an answer is recorded once; a second answer to a request that
another one already answers is refused, also while that first answer waits in the inbox
for the session's live owner (the log does not show it yet)."""

from __future__ import annotations

import os

import pytest

from flowscope import START, Runner, Workflow, node
from flowscope.answers import answer
from flowscope.errors import ResumeError
from flowscope.ownership import Owner, process_start_id, process_start_time, this_host
from flowscope.store import SqliteEventStore


@node
async def ask(ctx, x):
    return await ctx.request_input("go?", interrupt_id="go")


def paused(tmp_path) -> SqliteEventStore:
    store = SqliteEventStore(tmp_path / "a.db")
    Runner(Workflow("w", edges=[(START, ask)]), store=store).run_sync(None, session_id="p")
    return store


def test_a_second_answer_while_the_first_waits_for_the_live_owner_is_refused(tmp_path):
    store = paused(tmp_path)
    pid = os.getpid()  # a live process on this host owns the session: answers go to its inbox
    owner = Owner("live-worker", this_host(), pid, process_start_time(pid), start_id=process_start_id(pid))
    store.acquire("p", owner, 60.0)
    first = answer(store, "p", inputs={"go": "yes"})
    assert first.pending
    with pytest.raises(ResumeError, match="'go' was already answered by another request"):
        answer(store, "p", inputs={"go": "no"})
    [msg] = store.inbox("p")  # only the first answer is there for the owner
    assert msg.body["inputs"] == {"go": "yes"}


def test_a_second_answer_after_the_first_is_in_the_log_is_refused(tmp_path):
    store = paused(tmp_path)
    assert not answer(store, "p", inputs={"go": "yes"}).pending  # no owner: taken in at once
    with pytest.raises(ResumeError, match="already answered"):
        answer(store, "p", inputs={"go": "no"})
    assert [e.value for e in store.read("p") if e.type == "input_received"] == ["yes"]


def test_an_answer_or_a_run_input_that_is_not_unicode_text_is_refused(tmp_path):
    from flowscope.errors import OutputNotSerializableError

    store = paused(tmp_path)
    before = store.last_seq("p")
    with pytest.raises(OutputNotSerializableError, match="lone surrogate"):
        answer(store, "p", inputs={"go": {"note": "\ud800"}})  # PostgreSQL's jsonb refuses it
    with pytest.raises(OutputNotSerializableError, match="lone surrogate"):
        Runner(Workflow("w", edges=[(START, ask)]), store=store).run_sync(["\udc80"], session_id="q")
    assert store.last_seq("p") == before and store.inbox("p") == [] and not store.has_session("q")


@node
async def dispatch(ctx, x):
    return await ctx.await_job(lambda job: None, payload=x)


def test_a_job_result_that_is_not_unicode_text_is_refused(tmp_path):
    from flowscope.errors import OutputNotSerializableError

    store = SqliteEventStore(tmp_path / "j.db")
    paused = Runner(Workflow("w", edges=[(START, dispatch)]), store=store).run_sync(None, session_id="j")
    (job_id,) = [p.job_id for p in paused.pending]
    before = store.last_seq("j")
    with pytest.raises(OutputNotSerializableError, match="the result of job .* lone surrogate"):
        answer(store, "j", jobs={job_id: {"success": True, "data": {"note": "\udc80"}}})
    assert store.last_seq("j") == before and store.inbox("j") == []
    assert answer(store, "j", jobs={job_id: {"success": True, "data": "ok"}}).jobs == (job_id,)
