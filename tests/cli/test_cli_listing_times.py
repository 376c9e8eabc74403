"""What the listings say about time: ``runs`` lists the most recently *updated* session
first (not the most recently started), and a ``show`` duration spans a run's first start
to its last end, the pauses between its invocations included (docs/cli.md)."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from flowscope import START, Runner, Workflow, node
from flowscope.cli import cli
from flowscope.events import NodeStarted, RunStarted
from flowscope.store import SqliteEventStore
from flowscope.store.testing import ev, node_ev


def as_json(*args: str):
    r = CliRunner().invoke(cli, [*args, "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_runs_lists_the_most_recently_updated_session_first_not_the_latest_started(tmp_path):
    db = tmp_path / "order.db"
    now = time.time()
    with SqliteEventStore(db) as store:
        # early started first and was updated last; late started later and is quiet since
        for sid, started, updated in (("early", now - 300, now - 10), ("late", now - 200, now - 100)):
            store.append(
                sid,
                [
                    ev(RunStarted, sid=sid, workflow="wf", ts=started),
                    node_ev(NodeStarted, "wf@1", ts=updated, sid=sid, kind="workflow"),
                ],
                0,
            )
    rows = as_json("--db", str(db), "runs")
    assert [r["session_id"] for r in rows] == ["early", "late"]
    assert [r["session_id"] for r in as_json("--db", str(db), "runs", "--limit", "1")] == ["early"]


@node
async def ask(ctx, x):
    return await ctx.request_input("ok?", interrupt_id="ok")


asking = Workflow("listing_times_ask", edges=[(START, ask)])


def test_a_show_duration_spans_the_first_start_to_the_last_end_pauses_included(tmp_path):
    db = tmp_path / "paused.db"
    with SqliteEventStore(db) as store:
        assert Runner(asking, store).run_sync(None, session_id="p1").status == "paused"
        time.sleep(0.05)  # the pause: part of the run's duration
        assert Runner(asking, store).resume_sync("p1", inputs={"ok": True}).status == "completed"
    rows = {r["path"]: r for r in as_json("--db", str(db), "show", "p1")}
    run = rows["listing_times_ask@1/ask@1"]
    assert run["status"] == "completed" and run["duration_s"] >= 0.05
    assert run["duration_s"] == round(run["ended_at"] - run["started_at"], 3)
