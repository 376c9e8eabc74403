"""The one liveness rule (flowscope.liveness): a waiting run whose session was answered
waits for a worker, not a person (``queued``), whatever else is known of it."""

from __future__ import annotations

import time

import pytest

from flowscope.liveness import QUEUED, WAITING_INPUT, WAITING_JOB, classify_open_run


@pytest.mark.parametrize("state", [WAITING_INPUT, WAITING_JOB])
def test_a_waiting_run_of_an_answered_session_is_queued(state):
    now = time.time()
    # what the console's tabs know of it: the session's status, not yet its open ids
    assert classify_open_run(state, now - 60, None, None, now, 60.0, session_status="answered") == QUEUED
    assert classify_open_run(state, now - 60, None, None, now, 60.0, session_status="paused") == state
