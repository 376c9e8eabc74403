"""Bulk operator actions: ``retry`` and ``cancel`` over the sessions that ``--workflow``,
``--state`` and ``--older-than`` select, listed by ``--dry-run``, carried out with
``--yes`` and refused (exit 2, nothing changed) without it. A dry run (of one SESSION too,
for ``resume``, ``retry`` and ``cancel`` alike) says what the action would do: the
sessions it would refuse are named with its reason, and a refused SESSION exits 2 as the
action does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowscope import START, Runner, Workflow, node
from flowscope.cli import cli
from flowscope.ownership import this_process
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


def logs(db: Path) -> dict[str, int]:
    """Each session's last event number: what a dry run must leave as it found it."""
    with SqliteEventStore(db, readonly=True) as store:
        return {s.session_id: s.last_seq for s in store.sessions()}


def refusals(output: str, said: str) -> dict[str, str]:
    """``{SID: why}`` of the lines ``{said} SID: why`` (``skipped``, ``would skip``)."""
    out = {}
    for line in output.splitlines():
        if line.startswith(said + " "):
            sid, _, why = line[len(said) + 1 :].partition(": ")
            out[sid] = why
    return out


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


def test_a_bulk_action_without_yes_counts_what_it_would_do_as_its_dry_run_does(tmp_path):
    db = _db(tmp_path)
    before = logs(db)
    r = run(db, "retry", "--older-than", "0s")  # three failed (retried), three paused (skipped)
    assert r.exit_code == 2 and "retry would act on 3 session(s) and skip 3" in r.output, r.output
    r = run(db, "cancel", "--state", "failed")  # over already: none it would act on
    assert r.exit_code == 2 and "cancel would act on 0 session(s) and skip 3" in r.output, r.output
    assert logs(db) == before


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


def test_a_bulk_resume_skips_a_session_a_live_owner_holds_and_resumes_the_rest(tmp_path):
    db = _db(tmp_path)
    with SqliteEventStore(db) as store:
        store.acquire("f1", this_process("w-live"), 600.0)  # this process: alive
    spec = ("--state", "failed", "--workflow", "test_cli_actions:failing")
    dry = run(db, "resume", *spec, "--dry-run")
    assert dry.exit_code == 0 and "would resume 2 session(s)" in dry.output, dry.output
    assert "would skip f1: session 'f1' is owned by w-live" in dry.output
    done = run(db, "resume", *spec, "--yes")
    assert done.exit_code == 1, done.output  # the two it ran failed again
    assert "skipped f1: session 'f1' is owned by w-live" in done.output
    assert done.output.count("resuming f") == 2 and "resuming f1" not in done.output
    with SqliteEventStore(db, readonly=True) as store:
        invocations = {sid: store.session_info(sid).invocations for sid in ("f0", "f1", "f2")}
    assert invocations == {"f0": 2, "f1": 1, "f2": 2}


@pytest.mark.parametrize(
    "args",
    [
        ["cancel", "f0"],  # failed: over already
        ["cancel", "no-such-session"],
        ["retry", "p0"],  # paused, not failed
        ["retry", "no-such-session"],
        ["resume", "p0"],  # paused, and no answer given
        ["resume", "p0", "--input", "nope=true"],  # no such request
    ],
)
def test_a_dry_run_of_a_session_the_action_refuses_says_why_and_exits_as_the_action_does(tmp_path, args):
    db = _db(tmp_path)
    before = logs(db)
    dry = run(db, *args, "--dry-run")
    assert logs(db) == before  # nothing written
    real = run(db, *args)
    assert real.exit_code == 2 and logs(db) == before
    assert dry.exit_code == real.exit_code, dry.output
    [line] = dry.output.strip().splitlines()
    why = real.output.strip().removeprefix("flowscope: error: ")
    assert line == f"flowscope: error: would skip {args[1]}: {why}"


def test_a_bulk_dry_run_lists_only_what_the_action_takes_and_skips_the_rest_with_its_reasons(tmp_path):
    db = _db(tmp_path)
    before = logs(db)
    dry = run(db, "cancel", "--older-than", "0s", "--dry-run")
    assert dry.exit_code == 0 and logs(db) == before
    assert "would cancel 3 session(s):" in dry.output
    assert all(f"  p{i}  asking  paused" in dry.output for i in range(3)), dry.output
    done = run(db, "cancel", "--older-than", "0s", "--yes")
    assert done.exit_code == 0 and done.output.count("cancelled p") == 3
    assert refusals(dry.output, "would skip") == refusals(done.output, "skipped")
    assert sorted(refusals(dry.output, "would skip")) == ["f0", "f1", "f2"]
    dry = run(db, "retry", "--state", "cancelled", "--dry-run")  # the action's own check: for good
    assert dry.exit_code == 0 and "would retry 0 session(s)" in dry.output
    assert all("over for good" in why for why in refusals(dry.output, "would skip").values())


def test_a_dry_run_of_a_session_the_action_takes_says_so_and_changes_nothing(tmp_path):
    db = _db(tmp_path)
    before, states = logs(db), statuses(db)
    for args, said in (
        (["cancel", "p0"], "would cancel 1 session(s):\n  p0  asking  paused"),
        (["retry", "f0"], "would retry 1 session(s):\n  f0  failing  failed"),
        (["resume", "p0", "--input", "go=true"], "would resume 1 session(s):\n  p0  asking  paused"),
        (
            ["resume", "f0", "--workflow", "test_cli_actions:failing"],
            "would resume 1 session(s):\n  f0  failing",
        ),
    ):
        dry = run(db, *args, "--dry-run")
        assert dry.exit_code == 0 and dry.output.startswith(said), (args, dry.output)
    assert logs(db) == before and statuses(db) == states


def test_a_dry_run_of_a_resume_a_live_owner_refuses_gives_the_stores_refusal(tmp_path):
    db = _db(tmp_path)
    with SqliteEventStore(db) as store:
        for sid in ("f0", "p0"):
            store.acquire(sid, this_process("w-live"), 600.0)  # this process: alive
        spec = ("--workflow", "test_cli_actions:failing")
        dry = run(db, "resume", "f0", *spec, "--dry-run")
        assert dry.exit_code == 2 and "is owned by w-live" in dry.output, dry.output
        real = run(db, "resume", "f0", *spec)
        assert real.exit_code == 2 and "is owned by w-live" in real.output
        assert "resuming" not in real.output, real.output  # refused before it says it resumes
        forced = run(db, "resume", "f0", *spec, "--force", "--dry-run")
        assert forced.exit_code == 0 and "would resume 1 session(s)" in forced.output
        dry = run(db, "cancel", "p0", "--dry-run")  # a live owner is asked to stop it: taken
        assert dry.exit_code == 0 and "would cancel 1 session(s)" in dry.output, dry.output
        asked = run(db, "cancel", "p0")
        assert asked.exit_code == 0 and "asked w-live" in asked.output


@pytest.mark.slow
def test_sessions_an_earlier_version_cancelled_or_a_bridge_recorded_are_refused_as_they_meant(tmp_path):
    """Logs written before ``RunFinished.final`` and ``RunStarted.engine``: a cancel was final
    then, and a bridge's session is its engine's, though neither says so in its payload."""
    import sqlite3
    import uuid

    from flowscope.events import InputRequested, NodeStarted, RunFinished, RunStarted
    from flowscope.store.testing import ev, node_ev

    db = _db(tmp_path)
    assert run(db, "cancel", "p0").exit_code == 0
    lg = str(uuid.uuid4())  # what LangGraph's bridge recorded as the invocation id: its run id
    with SqliteEventStore(db) as store:
        asking = "ab@1/ask@1"
        store.append(
            "lg",
            [
                ev(RunStarted, sid="lg", invocation_id=lg, workflow="ab", ts=1.0),
                node_ev(NodeStarted, asking, ts=2.0, sid="lg", invocation_id=lg),
                node_ev(InputRequested, asking, ts=3.0, sid="lg", invocation_id=lg, interrupt_id="go"),
                ev(RunFinished, sid="lg", invocation_id=lg, status="paused", ts=4.0),
            ],
            0,
        )
    with sqlite3.connect(db) as c:  # p0's cancel as an earlier version wrote it: no "final"
        changed = c.execute(
            "UPDATE events SET payload = json_remove(payload, '$.final') WHERE session_id = 'p0' AND type = 'run_finished'"
        ).rowcount
        # and the bridge's RunStarted as it wrote it then: no "engine"
        changed += c.execute(
            "UPDATE events SET payload = json_remove(payload, '$.engine') WHERE session_id = 'lg' AND type = 'run_started'"
        ).rowcount
    assert changed >= 2
    before = logs(db)
    done = run(db, "resume", "p0", "--workflow", "test_cli_actions:asking")  # an earlier version ran it again
    assert done.exit_code == 2 and "cancelled by an operator; it is over for good" in done.output
    done = run(db, "resume", "--state", "cancelled", "--dry-run")
    assert "would resume 0 session(s)" in done.output and "p0" in refusals(done.output, "would skip")
    for args in (("resume", "lg", "--input", "go=true"), ("cancel", "lg")):
        done = run(db, *args)
        assert done.exit_code == 2 and "run by langgraph" in done.output, (args, done.output)
    assert "LangGraph continues it" in run(db, "stuck", "--older-than", "0s").output
    assert logs(db) == before and statuses(db)["p0"] == "cancelled"


def test_a_bulk_action_skips_a_session_whose_log_cannot_be_read_and_acts_on_the_rest(tmp_path):
    import sqlite3

    db = _db(tmp_path)
    with sqlite3.connect(db) as c:
        c.execute("UPDATE events SET payload = 'not json{' WHERE session_id = 'f1' AND seq = 2")
    dry = run(db, "retry", "--state", "failed", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would retry 2 session(s)" in dry.output and "restore" in refusals(dry.output, "would skip")["f1"]
    done = run(db, "retry", "--state", "failed", "--yes")
    assert done.exit_code == 0, done.output
    assert "restore" in refusals(done.output, "skipped")["f1"]
    assert {sid: s for sid, s in statuses(db).items() if sid.startswith("f")} == {
        "f0": "queued",
        "f1": "failed",
        "f2": "queued",
    }


@pytest.mark.slow
def test_a_write_command_whose_output_cannot_be_printed_still_makes_its_change(tmp_path):
    """Its reader gone (``| true``) or its disk full (``> /dev/full``): the answer or the
    cancel is recorded all the same, exit 0; only a full disk is said, on stderr."""
    import os
    import subprocess

    from commands import FLOWSCOPE, cli_env

    db = _db(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away before a line was printed
    try:
        answered = subprocess.run(
            [FLOWSCOPE, "--db", str(db), "resume", "p0", "--input", "go=true"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert answered.returncode == 0 and answered.stderr == "", answered.stderr
    with open(os.devnull if not os.path.exists("/dev/full") else "/dev/full", "w") as full:
        cancelled = subprocess.run(
            [FLOWSCOPE, "--db", str(db), "cancel", "p1"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            timeout=60,
        )
    assert cancelled.returncode == 0, cancelled.stderr
    assert "not printed (No space left on device); the command itself completed" in cancelled.stderr
    with SqliteEventStore(db, readonly=True) as store:
        assert [e.value for e in store.read("p0") if e.type == "input_received"] == [True]  # recorded
    assert statuses(db)["p1"] == "cancelled"
