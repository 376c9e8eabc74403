"""Bulk operator actions: ``retry`` and ``cancel`` over the sessions that ``--workflow``,
``--state`` and ``--older-than`` select, listed by ``--dry-run``, carried out with
``--yes`` and refused (exit 2, nothing changed) without it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from flowscope import START, Runner, Workflow, node
from flowscope.cli import cli
from flowscope.store import SqliteEventStore


@node
async def ask(ctx, x):
    return await ctx.request_input("go?", interrupt_id="go")


@node
async def boom(ctx, x):
    raise ValueError("boom")


asking = Workflow("asking", edges=[(START, ask)])
failing = Workflow("failing", edges=[(START, boom)])


def _db(tmp_path: Path) -> Path:
    db = tmp_path / "bulk.db"
    with SqliteEventStore(db) as store:
        for i in range(3):
            asyncio.run(Runner(asking, store).run(i, session_id=f"p{i}"))
            try:
                asyncio.run(Runner(failing, store).run(i, session_id=f"f{i}"))
            except ValueError:
                pass
    return db


def run(db: Path, *args: str):
    return CliRunner().invoke(cli, ["--db", str(db), *args], catch_exceptions=False)


def statuses(db: Path) -> dict[str, str]:
    with SqliteEventStore(db, readonly=True) as store:
        return {s.session_id: s.status for s in store.sessions()}


def test_a_bulk_action_lists_with_dry_run_and_needs_yes_to_act(tmp_path):
    db = _db(tmp_path)
    before = statuses(db)
    dry = run(db, "retry", "--workflow", "failing", "--state", "failed", "--dry-run")
    assert dry.exit_code == 0 and "would retry 3 session(s)" in dry.output
    assert all(f"f{i}" in dry.output for i in range(3)) and "p0" not in dry.output
    refused = run(db, "cancel", "--state", "paused")
    assert refused.exit_code == 2 and "3 session(s)" in refused.output and "--yes" in refused.output
    assert statuses(db) == before  # nothing changed
    done = run(db, "retry", "--workflow", "failing", "--state", "failed", "--yes")
    assert done.exit_code == 0 and done.output.count("queued f") == 3, done.output
    done = run(db, "cancel", "--state", "paused", "--yes")
    assert done.exit_code == 0 and done.output.count("cancelled p") == 3, done.output
    assert statuses(db) == {
        **{f"p{i}": "cancelled" for i in range(3)},
        **{f"f{i}": "queued" for i in range(3)},
    }


def test_a_bulk_action_wants_a_session_or_filters_not_both_and_not_neither(tmp_path):
    db = _db(tmp_path)
    for args in (["cancel"], ["retry"], ["cancel", "p0", "--state", "paused"]):
        r = run(db, *args)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, (args, r.output)
    r = run(db, "cancel", "--workflow", "nobody", "--yes")
    assert r.exit_code == 0 and "no session matches" in r.output
    r = run(db, "retry", "--state", "paused", "--older-than", "0s", "--yes")  # each is refused, one line each
    assert r.exit_code == 0 and r.output.count("skipped p") == 3 and "not failed" in r.output


def test_a_bulk_resume_answers_every_selected_session_and_skips_the_ones_it_cannot(tmp_path):
    db = _db(tmp_path)
    dry = run(db, "resume", "--state", "paused", "--input", "go=true", "--dry-run")
    assert dry.exit_code == 0 and "would resume 3 session(s)" in dry.output
    refused = run(db, "resume", "--state", "paused", "--input", "go=true")
    assert refused.exit_code == 2 and "--yes" in refused.output
    assert statuses(db) == {**{f"p{i}": "paused" for i in range(3)}, **{f"f{i}": "failed" for i in range(3)}}
    done = run(db, "resume", "--state", "paused", "--workflow", "asking", "--input", "go=true", "--yes")
    assert done.exit_code == 0 and done.output.count("recorded input go for p") == 3, done.output
    assert statuses(db) == {
        **{f"p{i}": "answered" for i in range(3)},
        **{f"f{i}": "failed" for i in range(3)},
    }
    again = run(
        db, "resume", "--state", "answered", "--input", "go=true", "--yes"
    )  # already answered: one line each
    assert again.exit_code == 0 and again.output.count("skipped p") == 3, again.output
    both = run(db, "resume", "p0", "--state", "paused")
    assert both.exit_code == 2 and "not both" in both.output
