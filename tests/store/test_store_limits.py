"""What the store can hold is what the engine lets in: one nesting limit
(``flowscope.jsontext.MAX_DEPTH``), checked where a value enters, before anything is written,
the same for ``Runner.run``, ``Runner.submit`` and ``flowscope start --input``. And a
SQLite ``-wal`` file deleted under a running process is named as such, with what to do."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time

import pytest
from click.testing import CliRunner

from flowscope import START, NodeContext, Runner, Workflow, node
from flowscope.cli import cli
from flowscope.errors import OutputNotSerializableError, StoreNotWritable, StoreWalRemoved
from flowscope.jsontext import MAX_DEPTH, too_deep
from flowscope.ownership import this_process
from flowscope.store import SqliteEventStore


@node
async def _echo(ctx: NodeContext, x):
    return x


WF = Workflow("echo", edges=[(START, _echo)])


def nested(levels: int) -> list:
    v: list = []
    for _ in range(levels - 1):
        v = [v]
    return v


def rows(path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM sessions").fetchone()[0])


def test_a_run_input_nested_980_levels_is_refused_before_anything_is_written(tmp_path):
    store = SqliteEventStore(tmp_path / "d.db")
    with pytest.raises(
        OutputNotSerializableError, match=f"nested too deeply: deeper than {MAX_DEPTH} levels"
    ):
        asyncio.run(Runner(WF, store).run(nested(980)))
    with pytest.raises(
        OutputNotSerializableError, match=f"nested too deeply: deeper than {MAX_DEPTH} levels"
    ):
        Runner(WF, store).submit(nested(980))
    store.close()
    assert rows(tmp_path / "d.db") == 0  # no empty sessions row


def test_flowscope_start_refuses_a_980_level_input_in_one_line_and_writes_nothing(tmp_path):
    db = tmp_path / "s.db"
    SqliteEventStore(db).close()
    r = CliRunner().invoke(cli, ["--db", str(db), "start", "echo", "--input", "[" * 980 + "]" * 980])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert lines == [f"flowscope: error: {too_deep('--input')}"]
    assert rows(db) == 0


def test_the_nesting_limit_is_the_same_for_start_and_run_and_what_is_let_in_is_read_back(tmp_path):
    db = tmp_path / "l.db"
    ok, too_deep = nested(MAX_DEPTH), nested(MAX_DEPTH + 1)
    with SqliteEventStore(db) as store:
        result = asyncio.run(Runner(WF, store).run(ok))
        assert result.output == ok
        with pytest.raises(OutputNotSerializableError):
            asyncio.run(Runner(WF, store).run(too_deep))
    text_ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    text_deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    good = CliRunner().invoke(
        cli, ["--db", str(db), "start", "echo", "--input", text_ok, "--session", "deep-ok"]
    )
    assert good.exit_code == 0, good.output
    bad = CliRunner().invoke(cli, ["--db", str(db), "start", "echo", "--input", text_deep])
    assert bad.exit_code == 2
    with SqliteEventStore(db) as store:
        assert asyncio.run(Runner(WF, store).resume("deep-ok")).output == ok
        assert rows(db) == 2  # the run, and the submitted one: nothing from the refusals


# ------------------------------------------------------------------- a -wal file deleted mid-run


@pytest.mark.slow
def test_a_wal_file_deleted_under_a_running_store_stops_its_writes_with_the_advice(tmp_path):
    """The process that has the database open keeps writing into the deleted -wal (its
    commits vanish when it exits): its next write is refused, nothing is committed, and the
    one line says what happened and what to do; another process opening the file gets the
    same diagnosis instead of a bare ``disk I/O error``."""
    db = tmp_path / "w.db"
    store = SqliteEventStore(db)
    before = asyncio.run(Runner(WF, store).run(1)).session_id
    os.unlink(f"{db}-wal")
    time.sleep(1.05)  # writes check the -wal file at most once a second
    with pytest.raises(StoreWalRemoved) as removed:
        asyncio.run(Runner(WF, store).run(2))
    assert isinstance(removed.value, StoreNotWritable)  # a worker backs off and stops on it
    msg = str(removed.value)
    assert "-wal was deleted or replaced while this process had the database open" in msg
    assert "never delete a database's -wal or -shm file while it is in use" in msg and "\n" not in msg
    assert [s.session_id for s in store.sessions()] == [before]  # nothing more was committed
    r = CliRunner().invoke(cli, ["--db", str(db), "runs"])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "its -wal file is missing or empty beside its -shm file" in lines[0], lines
    assert "stop every process using" in lines[0]
    store.close()


def test_a_wal_file_deleted_under_a_store_refuses_every_write_after_it_not_one_a_second(tmp_path):
    """The check runs at most once a second, and a write right after a refused one went
    through into the deleted file: a worker read that as the store taking writes again,
    ran on and never stopped for the outage."""
    db = tmp_path / "w.db"
    store = SqliteEventStore(db)
    asyncio.run(Runner(WF, store).run(1))
    os.unlink(f"{db}-wal")
    store._wal.checked = 0.0  # as if the last check were over a second ago
    owner = this_process("w")
    for _ in range(3):  # at once, one after another: none goes through
        with pytest.raises(StoreWalRemoved):
            store.workers_seen(owner, ["wf"], ts=time.time())
    store.close()
