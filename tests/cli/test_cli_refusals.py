"""What an operator's command refuses, in one line with exit 2 and nothing changed:
``retry --from`` of a session that is not failed or completed (a running or paused one is
resumed or cancelled, never retried), and ``prune`` of a finished session that still has
an open run (docs/cli.md)."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from flowscope import START, Runner, Workflow, node
from flowscope.cli import cli
from flowscope.events import NodeStarted, RunFinished, RunStarted
from flowscope.store import SqliteEventStore
from flowscope.store.testing import ev, node_ev


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@node
async def ask(ctx, x):
    return await ctx.request_input("ok?", interrupt_id="ok")


asking = Workflow("refusals_ask", edges=[(START, ask)])


def _running(store: SqliteEventStore, sid: str) -> None:
    now = time.time()
    store.append(
        sid,
        [
            ev(RunStarted, sid=sid, workflow="refusals_ask", ts=now),
            node_ev(NodeStarted, "refusals_ask@1", ts=now, sid=sid, kind="workflow"),
            node_ev(NodeStarted, "refusals_ask@1/ask@1", ts=now, sid=sid, parent_path="refusals_ask@1"),
        ],
        0,
    )


@pytest.mark.parametrize("state", ["paused", "running"])
def test_retry_from_a_path_refuses_a_session_that_is_not_failed_or_completed(tmp_path, state):
    db = tmp_path / "retry.db"
    with SqliteEventStore(db) as store:
        if state == "paused":
            assert Runner(asking, store).run_sync(None, session_id="s").status == "paused"
        else:
            _running(store, "s")
        before = store.read("s")
    r = invoke("--db", str(db), "retry", "s", "--from", "refusals_ask@1/ask@1")
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.splitlines()
    assert line.startswith("flowscope: error: ") and f"is {state}, not failed" in line, line
    with SqliteEventStore(db, readonly=True) as store:
        assert store.read("s") == before and store.inbox("s") == []


def test_prune_never_lists_nor_deletes_a_finished_session_with_an_open_run(tmp_path):
    db = tmp_path / "prune.db"
    old = time.time() - 3600
    with SqliteEventStore(db) as store:
        store.append(
            "open",
            [
                ev(RunStarted, sid="open", workflow="wf", ts=old),
                node_ev(NodeStarted, "wf@1", ts=old, sid="open", kind="workflow"),
                node_ev(NodeStarted, "wf@1/step@1", ts=old, sid="open", parent_path="wf@1"),
                ev(RunFinished, sid="open", status="failed", ts=old),
            ],
            0,
        )
        assert store.session_info("open").status == "failed"
        assert "wf@1/step@1" in [r.path for r in store.open_runs()]
    dry = invoke("--db", str(db), "prune", "--older-than", "1m", "--dry-run", "--format", "json")
    assert dry.exit_code == 0 and json.loads(dry.stdout) == []
    done = invoke("--db", str(db), "prune", "--older-than", "1m", "--format", "json")
    assert done.exit_code == 0 and json.loads(done.stdout) == []
    with SqliteEventStore(db, readonly=True) as store:
        assert len(store.read("open")) == 4
