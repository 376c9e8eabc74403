"""R13, the one redactor: every credential shape an exception carries is gone from the
log lines a worker writes and from the events it records; an exception whose ``__str__``
raises is one log line, never a logging traceback."""

from __future__ import annotations

import asyncio
import logging

import pytest

from flowscope import START, Runner, Worker, Workflow, node
from flowscope.engine.hooks import Plugin
from flowscope.errors import describe_exception, mask_url_credentials, redact_message, redact_value
from flowscope.store import SqliteEventStore
from leaky_workflows import PLANTED, SECRETS


@pytest.mark.parametrize(("text", "secret"), PLANTED, ids=[s for _t, s in PLANTED])
def test_the_default_redaction_removes_every_credential_shape(text, secret):
    out = redact_message(text)
    assert secret not in out, out
    assert "***" in out or "<path>" in out


def test_the_redaction_keeps_names_counts_and_quotes_around_what_it_hides():
    assert redact_message('{"password": "x1", "max_tokens": 5}') == '{"password": "***", "max_tokens": 5}'
    assert (
        redact_message("tokens: 3 and max_tokens=5 at w@1/check@1")
        == "tokens: 3 and max_tokens=5 at w@1/check@1"
    )


@pytest.mark.parametrize(
    "text",
    ["mode r:/w", "TCP:/ok", "a K:/x", "see http://host:8080/a/b at 12:30/45", "w@1/check@1 in 3/4 of runs"],
)
def test_the_redaction_leaves_what_is_no_absolute_path(text):
    assert redact_message(text) == text


def test_a_path_after_two_slashes_is_masked():
    assert redact_message("read //home/alice/.ssh/id_rsa failed") == "read <path> failed"


def test_a_url_whose_user_has_no_password_is_masked_whole_for_it_may_be_a_token():
    assert (
        redact_message("clone https://ghp_x1y2@github.com/org/repo")
        == "clone https://***@github.com/org/repo"
    )


def test_a_directory_with_a_space_in_its_name_is_masked_to_the_end_of_the_path():
    assert redact_message("open /home/alice/My Secrets/bank.txt: gone") == "open <path>: gone"
    assert redact_message(r"copy C:\Program Files\App\k.txt now") == "copy <path> now"
    # the part of a file name after its last space reads as the sentence's next word
    assert redact_message("open /srv/x/bank statement.txt") == "open <path> statement.txt"


def test_a_query_secret_is_masked_to_the_next_parameter_whatever_it_holds():
    assert mask_url_credentials("postgresql://bob@h/db?password=se#cret-tail&sslmode=require") == (
        "postgresql://bob@h/db?password=***&sslmode=require"
    )


def test_a_json_value_is_redacted_string_by_string_and_by_the_keys_that_name_secrets():
    value = {
        "detail": SECRETS,
        "items": [SECRETS, 3],
        "api_key": "k-123",
        "nested": {"Password": ["x"]},
        "n": 5,
    }
    out = redact_value(value)
    assert out["api_key"] == "***" and out["nested"] == {"Password": "***"} and out["n"] == 5
    assert out["items"][1] == 3 and out["detail"] == redact_message(SECRETS)
    for _text, secret in PLANTED:
        assert secret not in repr(out), secret


class _Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_an_exception_whose_str_raises_is_described_in_one_line():
    text = describe_exception(_Hostile())
    assert text == "_Hostile (its message could not be read: str() raised RuntimeError)"
    assert describe_exception(ValueError("password=p1 at /root/x")) == "ValueError: password=*** at <path>"
    assert describe_exception(KeyError()) == "KeyError"


ALL_SECRETS = SECRETS


@node
async def leaky(ctx, x):
    raise ValueError(ALL_SECRETS)


@node
async def hostile(ctx, x):
    raise _Hostile()


class _LeakyPlugin(Plugin):
    name = "leaky-plugin"

    async def before_node(self, ctx):
        raise RuntimeError(ALL_SECRETS)


def test_a_worker_logs_and_records_no_planted_secret_and_no_traceback(tmp_path, caplog):
    leaking = Workflow("leaking", edges=[(START, leaky)])
    broken = Workflow("broken_str", edges=[(START, hostile)])
    db = tmp_path / "w.db"
    with SqliteEventStore(db) as store:
        Runner(leaking, store).submit(1, session_id="leak")
        Runner(broken, store).submit(1, session_id="hostile")
        worker = Worker(store, [leaking, broken], plugins=[_LeakyPlugin()], lease_s=5.0, poll_s=0.05)

        async def serve() -> None:
            task = asyncio.ensure_future(worker.run())
            for _ in range(200):
                if sum(worker.outcomes.values()) >= 2:
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await task

        with caplog.at_level(logging.INFO, logger="flowscope"):
            asyncio.run(serve())
        events = store.read("leak") + store.read("hostile")
    assert sum(worker.outcomes.values()) == 2, worker.outcomes
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "failed" in logged and "leaky-plugin" in logged, logged
    assert not any(r.exc_info for r in caplog.records)
    recorded = "\n".join(repr(e) for e in events)
    for _text, secret in PLANTED:
        assert secret not in logged, (secret, logged)
        assert secret not in recorded, (secret, recorded)


@pytest.mark.parametrize(
    "reported",
    [
        {"success": False, "error": ALL_SECRETS},
        {"success": False, "error": {"detail": ALL_SECRETS, "more": [ALL_SECRETS]}},  # an object's text too
        {"success": "SUCC-SECRET-77", "error": None},  # no boolean: recorded by its type alone
    ],
)
def test_a_job_error_text_is_recorded_redacted_and_shown_so_by_events_and_show(tmp_path, reported):
    from click.testing import CliRunner

    from flowscope import answer
    from flowscope.cli import cli

    @node
    async def enrich(ctx, x):
        return await ctx.await_job(lambda job: None, payload=x)

    wf = Workflow("etl", edges=[(START, enrich)])
    db = tmp_path / "j.db"
    with SqliteEventStore(db) as store:
        paused = asyncio.run(Runner(wf, store).run(1, session_id="j"))
        (pending,) = paused.pending
        answer(store, "j", jobs={pending.job_id: reported})
        recorded = "\n".join(repr(e) for e in store.read("j"))
    outputs = [recorded]
    for args in (
        ["events", "j"],
        ["events", "j", "--format", "json"],
        ["show", "j"],
        ["show", "j", "--format", "json"],
    ):
        result = CliRunner().invoke(cli, ["--db", str(db), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    if reported["error"] is not None:
        assert "access_token=***" in recorded
    else:
        assert "success='<str>'" in recorded
    for out in outputs:
        assert "SUCC-SECRET-77" not in out, out
        for _text, secret in PLANTED:
            assert secret not in out, (secret, out)


def test_a_log_line_of_an_exception_is_one_line_whose_escapes_are_shown_not_obeyed():
    """A worker logs a failed session with describe_exception: a line break in the message
    would forge the next log line, an ESC sequence drive the terminal tailing the log."""
    forged = "boom\n2026-12-07 10:00:00 flowscope.worker WARNING all is well \x1b]0;owned\x07"
    assert describe_exception(ValueError(forged)) == (
        "ValueError: boom 2026-12-07 10:00:00 flowscope.worker WARNING all is well \\x1b]0;owned\\x07"
    )
