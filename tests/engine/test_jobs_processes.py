"""The job contract across processes on SQLite: dispatch in one process, the result and the
resume in another, a retry through the actionable pause, then success."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flowscope.store import SqliteEventStore, rebuild

# Every test here starts processes or servers, or runs the demo end to end.
pytestmark = pytest.mark.slow

WORKER = str(Path(__file__).resolve().parents[1] / "job_worker.py")


def step(db, dispatched, *args):
    proc = subprocess.run(
        [sys.executable, WORKER, str(db), str(dispatched), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_dispatch_result_retry_and_success_each_in_its_own_process(tmp_path):
    db, queue = tmp_path / "jobs.db", tmp_path / "queue.jsonl"
    first = step(db, queue, "run")
    assert first["status"] == "paused"
    jobs = [json.loads(line) for line in queue.read_text().splitlines()]
    assert len(jobs) == 1 and first["pending"] == [jobs[0]["job_id"]]

    # the worker reports "success" with nothing done: another process delivers it
    empty = step(
        db, queue, "resume", "--job", f"{jobs[0]['job_id']}={json.dumps({'success': True, 'count': 0})}"
    )
    assert empty["status"] == "paused"
    (interrupt,) = empty["pending"]
    state = rebuild(SqliteEventStore(db).read("s"))
    request = state.nodes["etl@1/enrich@1"].requests[interrupt]
    assert request.payload["kind"] == "job_failed" and request.payload["result"] == "empty"

    # an operator answers "retry" from a third process: a new job is dispatched
    retried = step(db, queue, "resume", "--input", f'{interrupt}="retry"')
    jobs = [json.loads(line) for line in queue.read_text().splitlines()]
    assert retried["status"] == "paused" and len(jobs) == 2
    assert jobs[1]["dispatch_attempt"] == 2 and jobs[1]["job_id"] != jobs[0]["job_id"]
    assert jobs[1]["idempotency_key"] != jobs[0]["idempotency_key"]

    done = step(
        db,
        queue,
        "resume",
        "--job",
        f"{jobs[1]['job_id']}={json.dumps({'success': True, 'count': 3, 'data': [7, 8, 9]})}",
    )
    assert done == {"status": "completed", "pending": [], "output": {"rows": [7, 8, 9]}}
    assert len(queue.read_text().splitlines()) == 2  # no dispatch was repeated

    events = SqliteEventStore(db).read("s")
    assert [e.dispatch_attempt for e in events if e.type == "job_dispatched"] == [1, 2]
    assert [e.result for e in events if e.type == "job_result"] == ["empty", "success"]
    assert len({e.invocation_id for e in events}) == 4  # four processes, four invocations
