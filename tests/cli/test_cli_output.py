"""Output that an operator can use as printed: tables that fit the terminal (``--wide`` for
every cell), hints that are valid shell and JSON when pasted, one piece of advice per error
and the right one, and a waterfall that does not call an unanswered pause answered."""

from __future__ import annotations

import json
import re
import shlex
import socket
import uuid
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from flowscope import START, Runner, Workflow, node
from flowscope.cli import cli
from flowscope.cli.failures import to_cli_error
from flowscope.errors import NotAFlowscopeDatabase, StoreCorrupt
from flowscope.store import SqliteEventStore

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str, columns: int | None = None):
    env = {"COLUMNS": str(columns)} if columns is not None else {"COLUMNS": ""}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


LONG = "reconcile_the_quarterly_ledger_against_every_regional_subsidiary"


@node(name=LONG)
def long_node(x):
    raise ValueError("the ledger of subsidiary " + "ACME-" * 30 + " does not balance")


@node(name="approve_" + LONG)
async def approve(ctx, x):
    return await ctx.request_input(
        "approve the quarter-end close for every region?", interrupt_id="approval_" + LONG
    )


FLOWS = """
from flowscope import START, Workflow, node

@node
async def ask(ctx, x):
    return await ctx.request_input("go?", interrupt_id="go")

@node
async def enrich(ctx, x):
    return await ctx.await_job(lambda job: None, payload=x, expect_count=True)

ask_then_job = Workflow("ask_then_job", edges=[(START, ask, enrich)])
"""


@pytest.fixture(scope="module")
def wide_db(tmp_path_factory):
    """Sessions whose names, ids and messages are far wider than 80 columns."""
    db = tmp_path_factory.mktemp("wide") / "wide.db"
    with SqliteEventStore(db) as store:
        with pytest.raises(ValueError):
            Runner(Workflow("ledger_" + LONG, edges=[(START, long_node)]), store).run_sync(
                1, session_id="failed-" + "x" * 40
            )
        Runner(Workflow("approval_" + LONG, edges=[(START, approve)]), store).run_sync(
            1, session_id="paused-" + "y" * 40
        )
    return db


COMMANDS = {
    "runs": ["runs"],
    "show": ["show", "failed-" + "x" * 40],
    "show_paused": ["show", "paused-" + "y" * 40],
    "stuck": ["stuck", "--older-than", "0s"],
    "events": ["events", "failed-" + "x" * 40],
    "audit": ["audit"],
    "audit_by_run": ["audit", "--by", "run"],
}


def table_lines(text: str) -> list[str]:
    """What must fit: every line but a show's hints (commands to paste are never cut)."""
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    if "waiting on:" in lines:
        lines = lines[: lines.index("waiting on:")]
    return lines


@pytest.mark.parametrize("name", list(COMMANDS))
def test_tables_fit_the_terminal_and_wide_prints_every_cell(wide_db, name):
    narrow = invoke("--db", str(wide_db), *COMMANDS[name], columns=80)
    assert narrow.exit_code == 0, narrow.output
    lines = table_lines(narrow.stdout)
    if name == "stuck":  # its NEXT commands are whole: the rest of each row fits
        rows = json.loads(invoke("--db", str(wide_db), *COMMANDS[name], "--format", "json").stdout)
        for row in rows:
            [line] = [line for line in lines if line.endswith(row["action"])]
            assert len(line) - len(row["action"]) <= 80 - 4, line  # at least 4 columns for NEXT
        lines = lines[:1]
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "…" in narrow.stdout
    wide = invoke("--db", str(wide_db), *COMMANDS[name], "--wide", columns=80)
    assert wide.exit_code == 0, wide.output
    assert "…" not in wide.stdout
    assert max(len(line) for line in table_lines(wide.stdout)) > 80
    if name == "show":  # the failure's message in DETAIL too, not cut on a table of its own
        message = "the ledger of subsidiary " + "ACME-" * 30 + " does not balance"
        assert message in [line.split("ValueError: ", 1)[-1].rstrip() for line in table_lines(wide.stdout)]


def test_a_pipe_without_columns_gets_every_cell_whole(wide_db):
    """No terminal and no $COLUMNS: nothing to fit (``flowscope runs | grep`` sees it all)."""
    out = invoke("--db", str(wide_db), "runs").stdout
    assert "…" not in out and "ledger_" + LONG in out


def _pasted(line: str, option: str) -> object:
    """The value a printed ``flowscope [--db DB] resume ... OPTION 'ID=VALUE'`` hint gives,
    parsed as a shell (shlex) and then as JSON, as the command itself would."""
    words = shlex.split(line[line.index("flowscope ") :])
    assert "resume" in words, line
    _id, _, value = words[words.index(option) + 1].partition("=")
    return json.loads(value)


def test_every_printed_job_hint_is_valid_shell_and_json(tmp_path, monkeypatch):
    module = f"hint_flows_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(FLOWS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = str(tmp_path / "h.db")
    assert invoke("--db", db, "start", "ask_then_job", "--session", "h1").exit_code == 0
    first = invoke("--db", db, "resume", "h1", "--workflow", f"{module}:ask_then_job")  # pauses on the input
    assert "paused again" in first.stdout, first.output
    (ask_hint,) = [line for line in first.stdout.splitlines() if "--input" in line]
    assert shlex.split(ask_hint.strip())[-1] == "go=JSON"  # the placeholder, quoted for the shell
    again = invoke("--db", db, "resume", "h1", "--input", "go=1", "--workflow", f"{module}:ask_then_job")
    assert "paused again" in again.stdout, again.output
    hints = [line for line in again.stdout.splitlines() if "--job" in line]
    hints += [line for line in invoke("--db", db, "show", "h1").stdout.splitlines() if "--job" in line]
    stuck = json.loads(invoke("--db", db, "stuck", "--older-than", "0s", "--format", "json").stdout)
    hints += [row["action"] for row in stuck]
    assert len(hints) == 3
    for hint in hints:
        result = _pasted(hint, "--job")
        assert result == {"success": True, "count": 1, "data": {}}, hint
    # pasted as printed (its --db included), the hint reports the job
    words = shlex.split(hints[0][hints[0].index("flowscope ") :])
    assert words[1:3] == ["--db", db], words
    done = invoke(*words[1:], "--workflow", f"{module}:ask_then_job")
    assert done.exit_code == 0 and "completed" in done.stdout, done.output


def test_a_job_result_with_a_text_count_is_refused_with_a_clear_line(tmp_path, monkeypatch):
    module = f"count_flows_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(FLOWS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = str(tmp_path / "c.db")
    invoke("--db", db, "start", "ask_then_job", "--session", "c1")
    invoke("--db", db, "resume", "c1", "--workflow", f"{module}:ask_then_job")
    out = invoke("--db", db, "resume", "c1", "--input", "go=1", "--workflow", f"{module}:ask_then_job").stdout
    job_id = re.search(r"job (job-[0-9a-f]+)", out).group(1)
    with SqliteEventStore(db, readonly=True) as store:
        before = store.last_seq("c1")
    result = CliRunner().invoke(
        cli, ["--db", db, "resume", "c1", "--job", f'{job_id}={{"success": true, "count": "3"}}']
    )
    assert result.exit_code == 2
    assert '\'count\' is "3" (str); it must be a number (3, not "3")' in result.stderr
    with SqliteEventStore(db, readonly=True) as store:
        assert store.last_seq("c1") == before


def test_a_corrupt_file_is_told_to_restore_from_a_backup_once(tmp_path):
    db = tmp_path / "broken.db"
    with SqliteEventStore(db) as store:
        for i in range(40):
            Runner(Workflow("w", edges=[(START, node(lambda x: x, name="n"))]), store).run_sync(
                "z" * 2000, session_id=f"s{i}"
            )
    raw = bytearray(db.read_bytes())
    raw[200:] = b"\xa5" * (len(raw) - 200)
    db.write_bytes(bytes(raw))
    result = CliRunner().invoke(cli, ["--db", str(db), "runs"])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.count("from a backup") == 1, line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_postgresql_server_gets_its_own_advice_not_the_demos():
    pytest.importorskip("psycopg")
    url = f"postgresql://flowscope@127.0.0.1:{_free_port()}/flowscope"
    result = CliRunner().invoke(cli, ["--db", url, "runs"])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "flowscope demo" not in line and "is the server running" in line, line


@node
async def ask_approval(ctx, x):
    return await ctx.request_input("ok?", interrupt_id="approval")


def test_show_of_a_cancelled_session_does_not_call_its_pause_answered(tmp_path):
    db = tmp_path / "cancel.db"
    with SqliteEventStore(db) as store:
        Runner(Workflow("asking", edges=[(START, ask_approval)]), store).run_sync(None, session_id="k1")
    assert invoke("--db", str(db), "cancel", "k1").exit_code == 0
    shown = click.unstyle(invoke("--db", str(db), "show", "k1", "--wide").stdout)
    assert "(answered)" not in shown
    assert "paused for approval (never answered)" in shown
    rows = json.loads(invoke("--db", str(db), "show", "k1", "--format", "json").stdout)
    (row,) = [r for r in rows if r["path"] == "asking@1/ask_approval@1"]
    assert (row["interrupts"], row["answered_interrupts"], row["open_interrupts"]) == (["approval"], [], [])


@pytest.mark.parametrize("name", ["worker", "start"])
def test_cli_md_documents_every_option_and_the_exit_codes_of_worker_and_start(name):
    text = DOCS.read_text()
    match = re.search(rf"^## `flowscope {name}\b.*?(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/cli.md has no section for flowscope {name}"
    section = match.group(0)
    command = cli.commands[name]
    for param in command.params:
        for opt in getattr(param, "opts", []):
            if opt.startswith("--") and opt != "--help":
                assert f"`{opt}" in section, (name, opt)
    assert "Exit code" in section or "exit code" in section


def test_a_message_with_terminal_escapes_is_shown_not_obeyed(tmp_path):
    """An error message is the user's text: ESC (clear the screen, set the window title),
    a carriage return (overwrite the line) and the other controls are printed as \\xNN."""
    hostile = "boom\x1b[2J\x1b]0;owned\x07 \rover \x9b31m"

    @node
    async def explodes(ctx, x):
        raise ValueError(hostile)

    db = tmp_path / "esc.db"
    with SqliteEventStore(db) as store:
        with pytest.raises(ValueError):
            Runner(Workflow("esc", edges=[(START, explodes)]), store).run_sync(None, session_id="e")
    shown = CliRunner().invoke(cli, ["--db", str(db), "show", "e", "--wide"]).output
    assert "boom\\x1b[2J\\x1b]0;owned\\x07 over \\x9b31m" in shown, shown
    for args in (["show", "e"], ["runs"], ["stuck", "--older-than", "0s"], ["audit"]):
        out = CliRunner().invoke(cli, ["--db", str(db), *args]).output
        assert not {"\x1b", "\x07", "\r", "\x9b"} & set(out), (args, out)


def test_csv_encodes_values_inside_a_cell_as_its_top_level_ones_never_as_python_text():
    from flowscope.cli.render import render_csv

    row = {
        "owner": {"worker_id": "w-1", "alive": False, "lease_expires_at": None},
        "segments": [{"invocation_id": "i1", "owner": {"worker_id": "w-1", "pid": 7}, "resumed": True}],
        "jobs": [{"job_id": "j-1", "dispatch_attempt": 1, "idempotency_key": "k-1", "result": "pending"}],
        "open": True,
    }
    text = render_csv([row], list(row))
    assert text.splitlines()[1] == (
        'worker_id=w-1;alive=false;lease_expires_at=,"i1:{""worker_id"":""w-1"",""pid"":7}:true",'
        "j-1:1:k-1:pending,true"
    )
    assert "False" not in text and "'" not in text


def test_two_invocations_of_one_minute_get_two_labels_in_events(tmp_path):
    # Invocation ids are time-ordered (UUIDv7): their first 8 characters are one minute's
    @node
    async def ask(ctx, x):
        return await ctx.request_input("ok?", interrupt_id="ok")

    db = tmp_path / "two.db"
    with SqliteEventStore(db) as store:
        runner = Runner(Workflow("two", edges=[(START, ask)]), store)
        runner.run_sync(None, session_id="s")
        runner.resume_sync("s", inputs={"ok": True})
        ids = sorted({e.invocation_id for e in store.read("s")})
    assert len(ids) == 2
    rows = invoke("--db", str(db), "events", "s", columns=200).output.splitlines()[1:]
    labels = {row.split()[4] for row in rows if row.strip()}
    assert labels == {i[-8:] for i in ids}


@pytest.mark.parametrize(
    "error",
    [
        NotAFlowscopeDatabase("the database has no flowscope meta table"),
        StoreCorrupt("a row of the log cannot be decoded"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_postgresql_databases_error_gets_postgresql_advice_never_a_sqlite_files(error):
    url = "postgresql://ops@db.example/flows"
    pg = to_cli_error(error, url).message
    assert pg.startswith(str(error) + ": ") and pg != str(error), pg  # advice follows, once
    assert "flowscope demo" not in pg and "sqlite3" not in pg, pg
    assert pg != to_cli_error(error, "flowscope.db").message  # the SQLite file's advice differs
