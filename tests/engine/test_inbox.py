"""Taking in a session's inbox (engine/inbox.py): what others sent its owner becomes events
in its log, each answer once."""

from __future__ import annotations

from conftest import asking, of_type
from flowscope import START, Runner, Workflow


async def test_two_messages_answering_one_request_are_taken_in_once_the_first_counting(store):
    """Two operators answered ``approval`` while the session was not theirs: the owner that
    takes the session records the first answer and drops the second, not both."""
    runner = Runner(Workflow("w", edges=[(START, asking("approve", "approval"))]), store=store)
    assert (await runner.run(None, session_id="s")).status == "paused"
    store.send("s", "answer", {"inputs": {"approval": "first"}, "jobs": {}})
    store.send("s", "answer", {"inputs": {"approval": "second"}, "jobs": {}})
    result = await runner.resume("s")
    assert result.status == "completed" and result.output == "first"
    assert [e.value for e in of_type(store.read("s"), "input_received")] == ["first"]
    assert store.inbox("s") == []
