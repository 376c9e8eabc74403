"""A command flowscope prints for the operator to run next acts, pasted as printed, on the
database it was printed for: it names that database with ``--db`` (through
``command_prefix``, a URL's password masked) unless a bare ``flowscope`` opens it anyway
(``./flowscope.db``, or ``$FLOWSCOPE_DB``). Without it a pasted ``flowscope worker`` creates
and serves a new ``./flowscope.db``, and a pasted ``resume`` finds no such session."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from commands import cli_env, run_cli
from flowscope import START, Runner, Workflow, node
from flowscope.cli import cli, views
from flowscope.cli.tables import pending_hint
from flowscope.events import NodeStarted, RunStarted
from flowscope.ownership import this_process
from flowscope.store import SqliteEventStore, rebuild
from flowscope.store.testing import ev, node_ev

OTHER = "flowscope --db other.db"


@node
async def first(ctx, x):
    return await ctx.request_input("first?", interrupt_id="first")


@node
async def second(ctx, x):
    return await ctx.request_input("second?", interrupt_id="second")


@node
async def export(ctx, x):
    return await ctx.await_job(lambda job: None, payload=x)


twice = Workflow("hints_twice", edges=[(START, first, second)])
exporting = Workflow("hints_export", edges=[(START, export)])


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def status(db: Path, session: str) -> str:
    with SqliteEventStore(db, readonly=True) as store:
        info = store.session_info(session)
    assert info is not None
    return info.status


def databases(where: Path) -> set[str]:
    return {p.name for p in where.glob("*.db")}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "env", "db", "prefix"),
    [
        (["--db", "other.db"], {}, "other.db", OTHER),
        ([], {}, "flowscope.db", "flowscope"),  # the default: the bare command opens it
        ([], {"FLOWSCOPE_DB": "other.db"}, "other.db", "flowscope"),  # so does it, in this environment
    ],
)
def test_the_hints_of_a_resume_that_pauses_again_answer_on_its_database(
    tmp_path, monkeypatch, options, env, db, prefix
):
    monkeypatch.chdir(tmp_path)
    with SqliteEventStore(tmp_path / db) as store:
        assert Runner(twice, store).run_sync(None, session_id="s1").status == "paused"
    done = invoke(
        *options, "resume", "s1", "--input", "first=true", "--workflow", "test_cli_hints:twice", env=env
    )
    assert done.exit_code == 0, done.output
    assert "paused again" in done.output
    [hint] = [line.strip() for line in done.output.splitlines() if "--input" in line]
    assert hint == f"{prefix} resume s1 --input 'second=JSON'"
    pasted = run_cli(*shlex.split(hint.replace("JSON", "true"))[1:], cwd=tmp_path, env=cli_env(**env))
    assert pasted.returncode == 0, pasted.stderr
    assert status(tmp_path / db, "s1") == "answered"  # answered there, and nowhere else
    assert databases(tmp_path) == {db}


@pytest.mark.slow
def test_a_hint_names_a_postgresql_database_with_its_password_masked(pg_cluster):
    from flowscope.store.postgres import PostgresEventStore
    from pg_cluster import PASSWORD, PASSWORD_ROLE

    name = f"hints_{os.getpid()}"
    with pg_cluster.admin() as admin:
        admin.execute(f"CREATE DATABASE {name} OWNER {PASSWORD_ROLE}")
    url = pg_cluster.url(name, user=PASSWORD_ROLE, password=PASSWORD)
    with PostgresEventStore(url) as store:
        assert Runner(twice, store).run_sync(None, session_id="s1").status == "paused"
    done = invoke("--db", url, "resume", "s1", "--input", "first=true", "--workflow", "test_cli_hints:twice")
    assert done.exit_code == 0, done.output
    [hint] = [line.strip() for line in done.output.splitlines() if "--input" in line]
    masked = url.replace(f":{PASSWORD}@", ":***@")
    assert hint == f"flowscope --db {shlex.quote(masked)} resume s1 --input 'second=JSON'"
    assert PASSWORD not in done.output


def _stuck_store(path: Path) -> SqliteEventStore:
    """A store with a run of every stuck state whose fix is a command: waiting for input,
    waiting for a job, orphaned (no owner, a heartbeat long gone) and queued."""
    store = SqliteEventStore(path)
    assert Runner(twice, store).run_sync(None, session_id="asks").status == "paused"
    assert Runner(exporting, store).run_sync(None, session_id="jobs").status == "paused"
    now = time.time()
    store.append(
        "gone",
        [
            ev(RunStarted, sid="gone", workflow="shop", ts=now - 3600),
            node_ev(NodeStarted, "shop@1/charge@1", ts=now - 3600, sid="gone"),
        ],
        0,
    )
    Runner(twice, store).submit(None, session_id="waits")
    return store


def test_every_command_stuck_suggests_names_the_database_it_was_given(tmp_path):
    with _stuck_store(tmp_path / "other.db") as store:
        rows = views.stuck_rows(store, 0.0, 60.0, now=time.time() + 1, prefix=OTHER)
    states = {r["session_id"]: r["state"] for r in rows}
    assert states == {"asks": "waiting_input", "jobs": "waiting_job", "gone": "orphaned", "waits": "queued"}
    actions = {r["session_id"]: r["action"] for r in rows}
    assert actions["asks"] == f"{OTHER} resume asks --input 'first=JSON'"
    assert actions["jobs"].startswith(f"{OTHER} resume jobs --job ")
    # not the demo's: resume runs it with its code, which the log does not name
    assert actions["gone"] == f"{OTHER} resume gone --workflow MODULE:ATTR"
    assert actions["waits"] == f"no live worker serves 'hints_twice': {OTHER} worker MODULE:ATTR"


def test_an_orphan_that_a_live_worker_serves_is_left_to_it(tmp_path):
    with _stuck_store(tmp_path / "other.db") as store:
        store.workers_seen(this_process("w-peer"), ["shop"])
        rows = views.stuck_rows(store, 0.0, 60.0, now=time.time() + 1, prefix=OTHER)
    (gone,) = [r for r in rows if r["session_id"] == "gone"]
    assert gone["state"] == "orphaned"
    assert gone["action"].startswith("a live worker serves it (w-peer on ")
    assert gone["action"].endswith("it takes it over at its next claim")


def test_every_resume_show_lists_under_waiting_on_names_the_database_it_was_given(tmp_path):
    with _stuck_store(tmp_path / "other.db") as store:
        lines = [
            line
            for sid in ("asks", "jobs")
            for line in pending_hint(rebuild(store.read(sid)), prefix=OTHER)
            if "->" in line
        ]
    assert len(lines) == 2
    assert all(f"   -> {OTHER} resume " in line for line in lines), lines


@pytest.mark.slow
def test_the_commands_the_demo_names_when_stopped_at_a_prompt_act_on_its_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stopped = invoke("--db", "other.db", "demo", "--interactive")  # no answer: end of input at the prompt
    assert stopped.exit_code == 130, stopped.output
    [line] = [line for line in stopped.stderr.splitlines() if "stopped at the prompt" in line]
    show, answer = line[line.index("(") + 1 : line.rindex(")")].split("; ")
    assert show.startswith(f"{OTHER} show ") and answer.startswith(f"{OTHER} resume "), line
    session = shlex.split(show)[-1]
    shown = run_cli(*shlex.split(show)[1:], cwd=tmp_path)
    assert shown.returncode == 0 and f"session {session}" in shown.stdout, shown.stderr
    assert databases(tmp_path) == {"other.db"}


@node
async def approve(ctx, x):
    return await ctx.request_input("approve?", interrupt_id="approval")


def test_a_workflow_of_yours_named_like_a_bundled_one_never_runs_the_bundled_code(tmp_path):
    """Only the sessions ``flowscope demo`` made run the bundled code by name: a session of
    your own ``order_fulfilment`` is answered for your worker, and the hints name yours."""
    db = tmp_path / "own.db"
    mine = Workflow("order_fulfilment", edges=[(START, approve)])  # the bundled demo's name
    with SqliteEventStore(db) as store:
        Runner(mine, store=store).run_sync(None, session_id="orders-1")
        Runner(mine, store=store).submit(None, session_id="orders-2")
    r = invoke("--db", str(db), "resume", "orders-1", "--input", "approval=true")
    assert r.exit_code == 0, r.output
    assert "recorded input approval for orders-1" in r.output and "worker MODULE:ATTR" in r.output
    assert "flowscope.examples" not in r.output
    with SqliteEventStore(db, readonly=True) as store:
        log = store.read("orders-1")
        assert [e.type for e in log].count("run_started") == 1  # nothing ran here
        assert rebuild(log).status == "answered"
    rows = invoke("--db", str(db), "stuck", "--older-than", "0s", "--format", "json")
    assert "flowscope.examples" not in rows.output and "worker MODULE:ATTR" in rows.output, rows.output


def test_stuck_says_how_a_bridges_engine_continues_its_session_never_a_flowscope_command(tmp_path):
    from console_workflows import make_bridge_sessions

    db = tmp_path / "bridged.db"
    with SqliteEventStore(db) as store:
        asking, orphaned = make_bridge_sessions(store)
        rows = {r["session_id"]: r for r in views.stuck_rows(store, 0.0, 60.0, prefix=OTHER)}
    assert (rows[asking]["state"], rows[orphaned]["state"]) == ("waiting_input", "orphaned")
    assert rows[asking]["action"].startswith("LangGraph continues it: graph.invoke(Command(resume=")
    assert rows[orphaned]["action"].startswith("ADK continues it: ")
    assert rows[asking]["waiting_on"] == ["approve"]
    printed = invoke("--db", str(db), "stuck", "--older-than", "0s")
    assert printed.exit_code == 0, printed.output
    assert "LangGraph continues it" in printed.output and "ADK continues it" in printed.output
    assert "resume" not in printed.output.replace("Command(resume=", ""), printed.output


@pytest.mark.parametrize("sid", ["x; touch PWNED", "$(touch PWNED)", "-x", "it's"])
def test_a_hint_pasted_as_printed_acts_on_its_session_whatever_its_id_and_runs_nothing_else(tmp_path, sid):
    db = tmp_path / "odd.db"
    now = time.time()
    with SqliteEventStore(db) as store:
        assert Runner(twice, store).run_sync(None, session_id=sid).status == "paused"
        store.append(  # and an orphan of the same kind of id
            sid + "!",
            [
                ev(RunStarted, sid=sid + "!", workflow="shop", ts=now - 3600),
                node_ev(NodeStarted, "shop@1/charge@1", ts=now - 3600, sid=sid + "!"),
            ],
            0,
        )
        rows = {r["session_id"]: r for r in views.stuck_rows(store, 0.0, 60.0, prefix="flowscope")}
    for session, row in rows.items():
        argv = shlex.split(row["action"].replace("=JSON", "=true"))  # as a POSIX shell reads it
        assert argv[0] == "flowscope" and argv[-1 if session.startswith("-") else 2] == session, argv
        assert not {";", "&&", "|"} & set(argv)  # one command
        done = invoke("--db", str(db), argv[1], "--dry-run", *argv[2:])
        said = (
            f"would resume 1 session(s):\n  {session}  "
            if row["state"] == "waiting_input"
            else f"would skip {session}:"
        )
        assert said in done.output and "Usage:" not in done.output, (
            argv,
            done.output,
        )  # its session, read whole
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()
