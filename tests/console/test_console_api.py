"""The console's API and its guard, over a real SQLite file through Starlette's TestClient:
``/api/`` serves the rows of the CLI's ``--format json``; a foreign ``Host``, a request
without the per-start token, a write from another origin and any write of a read-only
console are refused, with nothing recorded; the writes are the operator actions. The
attention tabs and a session's page say what ``stuck`` says; a database file deleted or
replaced under the console is a 503."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

try:
    import starlette  # noqa: F401
except ImportError:  # CI installs the extra: there a missing one is a failure, never a skip
    if os.environ.get("CI"):
        raise
    pytest.skip("the console's extra is not installed: pip install -e '.[ui]'", allow_module_level=True)

from starlette.testclient import TestClient  # noqa: E402

from console_workflows import APPROVAL_SESSION, FAILED_SESSION, PAUSED_SESSION, make_operator_sessions  # noqa: E402
from flowscope.cli import cli  # noqa: E402
from flowscope.cli.app import command_prefix  # noqa: E402
from flowscope.cli.waterfall import Axis, waterfall_layout  # noqa: E402
from flowscope.console.app import ConsoleConfig, create_app  # noqa: E402
from flowscope.console.live import ChangeFeed  # noqa: E402
from flowscope.engine.submit import submit_run as submit  # noqa: E402
from flowscope.store import SqliteEventStore  # noqa: E402

BASE = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("console") / "ops.db"
    with SqliteEventStore(path) as store:
        make_operator_sessions(store, pause_s=0.0)
    return path


@pytest.fixture
def fresh(db, tmp_path) -> Path:
    """A copy of the module's database that a test may change."""
    copy = tmp_path / "ops.db"
    copy.write_bytes(db.read_bytes())
    return copy


def client(path: Path, *, read_only: bool = False, **config: Any) -> tuple[TestClient, ConsoleConfig]:
    store = SqliteEventStore(path, readonly=read_only)
    cfg = ConsoleConfig(store=store, db_shown=str(path), port=8765, read_only=read_only, **config)
    c = TestClient(create_app(cfg), base_url=BASE)
    c.headers["x-flowscope-token"] = cfg.token
    return c, cfg


def cli_json(path: Path, *args: str) -> Any:
    r = CliRunner().invoke(cli, ["--db", str(path), *args, "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def statuses(path: Path) -> dict[str, str]:
    with SqliteEventStore(path, readonly=True) as s:
        return {i.session_id: i.status for i in s.sessions()}


# --------------------------------------------------------------------------- one set of views


def test_api_rows_are_the_cli_json_rows_for_the_same_store(db):
    c, _ = client(db, prefix=command_prefix(str(db)))  # as flowscope ui --db sets it
    assert c.get("/api/sessions", params={"limit": 500}).json() == cli_json(db, "runs", "--limit", "0")
    for sid in (APPROVAL_SESSION, FAILED_SESSION):
        assert c.get(f"/api/sessions/{sid}").json() == cli_json(db, "show", sid)
        assert c.get(f"/api/sessions/{sid}/events").json() == cli_json(db, "events", sid)
    assert c.get("/api/audit").json() == cli_json(db, "audit")
    assert c.get("/api/audit", params={"by": "run"}).json() == cli_json(db, "audit", "--by", "run")
    moving = ("age_s", "heartbeat_age_s")  # measured against the clock at each call
    api_stuck = [{k: v for k, v in r.items() if k not in moving} for r in c.get("/api/stuck").json()]
    cli_stuck = [
        {k: v for k, v in r.items() if k not in moving} for r in cli_json(db, "stuck", "--older-than", "0s")
    ]
    assert api_stuck == cli_stuck and {r["session_id"] for r in api_stuck} == {
        APPROVAL_SESSION,
        PAUSED_SESSION,
    }


def test_the_session_list_filters_pages_and_counts_attention_on_the_server(db):
    c, _ = client(db)
    everything = c.get("/api/sessions").json()
    assert [r["session_id"] for r in everything] == [
        r["session_id"] for r in cli_json(db, "runs")
    ]  # newest first
    r = c.get("/api/sessions", params={"status": "failed"})
    assert [x["session_id"] for x in r.json()] == [FAILED_SESSION] and r.headers["x-total-count"] == "1"
    assert [
        x["session_id"] for x in c.get("/api/sessions", params={"error_code": "UNKNOWN_ERROR"}).json()
    ] == [FAILED_SESSION]
    assert c.get("/api/sessions", params={"error_code": "NO_SUCH_CODE"}).json() == []
    assert [x["session_id"] for x in c.get("/api/sessions", params={"q": "APPROV"}).json()] == [
        APPROVAL_SESSION
    ]
    assert {x["workflow"] for x in c.get("/api/sessions", params={"workflow": "big"}).json()} == {"big"}
    assert c.get("/api/sessions", params={"since": "1h"}).headers["x-total-count"] == "3"
    assert c.get("/api/sessions", params={"until": "2001-01-01"}).json() == []
    assert c.get("/api/sessions", params={"owner": "no-such-worker"}).json() == []
    page1 = c.get("/api/sessions", params={"limit": 2}).json()
    page2 = c.get("/api/sessions", params={"limit": 2, "offset": 2}).json()
    assert [x["session_id"] for x in page1 + page2] == [x["session_id"] for x in everything]
    tabs = json.loads(r.headers["x-attention"])
    assert tabs["failed"] == 1 and tabs["waiting_input"] == 2 and tabs["orphaned"] == 0
    waiting = c.get("/api/sessions", params={"attention": "waiting_input"}).json()
    assert {x["session_id"] for x in waiting} == {APPROVAL_SESSION, PAUSED_SESSION}
    bad = c.get("/api/sessions", params={"status": "exploded"})
    assert bad.status_code == 400 and "status must be one of" in bad.json()["error"]


def test_a_session_waterfall_has_a_row_per_path_and_its_waiting_form(db):
    c, _ = client(db)
    w = c.get(f"/api/sessions/{APPROVAL_SESSION}/waterfall").json()
    shown = [r["path"] for r in c.get(f"/api/sessions/{APPROVAL_SESSION}").json()]
    assert [r[0] for r in w["rows"]] == shown  # the same rows, in show's order
    assert w["invocations"] == 2 and w["waiting"][0]["interrupt_id"] == "approval"
    assert w["session"]["engine"] is None and w["session"]["continued_in"] is None  # flowscope's own
    assert all(0 <= x0 <= x1 <= w["axis"]["width"] for r in w["rows"] for x0, x1 in r[10])
    again = c.get(f"/api/sessions/{APPROVAL_SESSION}/waterfall", params={"since": w["last_seq"]}).json()
    assert again == {"unchanged": True, "last_seq": w["last_seq"], "stuck": []}
    fetch = next(r[0] for r in w["rows"] if r[1].startswith("fetch_orders"))
    attempts = c.get(f"/api/sessions/{APPROVAL_SESSION}/run", params={"path": fetch}).json()["attempts"]
    assert [(a["attempt"], a["outcome"], a["error_code"]) for a in attempts] == [
        (1, "retried", "INVENTORY_UNAVAILABLE"),
        (2, "completed", None),
    ]
    assert c.get("/api/sessions/nobody/waterfall").status_code == 404


def test_a_session_pruned_and_run_again_under_its_id_to_the_same_seq_is_drawn_anew(tmp_path):
    from console_workflows import failing
    from flowscope import Runner

    db = tmp_path / "again.db"
    with SqliteEventStore(db) as store:
        with pytest.raises(ValueError):
            Runner(failing, store).run_sync(None, session_id="nightly")
    c, cfg = client(db)
    before = c.get("/api/sessions/nightly/waterfall").json()
    assert before["session"]["error_code"] is not None
    time.sleep(0.01)  # another last append time
    store = cfg.store
    store.delete_sessions(["nightly"])
    with pytest.raises(ValueError):  # the same id, the same events, later: another log
        Runner(failing, store).run_sync(None, session_id="nightly")
    assert store.last_seq("nightly") == before["last_seq"]
    seen = {"since": before["last_seq"], "at": before["session"]["updated_at"]}
    again = c.get("/api/sessions/nightly/waterfall", params=seen).json()
    assert "unchanged" not in again and again["session"]["updated_at"] > before["session"]["updated_at"]
    assert c.get("/api/sessions/nightly/waterfall").json() == again  # not the page drawn before
    now = {"since": again["last_seq"], "at": again["session"]["updated_at"]}
    assert c.get("/api/sessions/nightly/waterfall", params=now).json()["unchanged"] is True
    # an unknown session is a 404 whatever seq the page says it drew
    assert c.get("/api/sessions/nobody/waterfall", params={"since": 0}).status_code == 404


def test_a_bridges_session_names_its_engine_and_how_it_continues_with_stucks_words(tmp_path):
    from console_workflows import make_bridge_sessions

    path = tmp_path / "bridged.db"
    with SqliteEventStore(path) as store:
        asking, orphaned = make_bridge_sessions(store)
    c, _ = client(path)
    w = c.get(f"/api/sessions/{asking}/waterfall").json()
    assert w["session"]["engine"] == "langgraph" and w["waiting"][0]["interrupt_id"] == "approve"
    assert w["session"]["continued_in"].startswith("LangGraph continues it: graph.invoke(Command(resume=")
    w = c.get(f"/api/sessions/{orphaned}/waterfall").json()
    assert w["session"]["engine"] == "adk"
    [row] = w["stuck"]
    assert row["state"] == "orphaned" and row["action"] == w["session"]["continued_in"]


def test_nothing_the_cli_redacts_is_shown(db):
    c, _ = client(db)
    bodies = [
        c.get(f"/api/sessions/{FAILED_SESSION}").text,
        c.get(f"/api/sessions/{FAILED_SESSION}/events").text,
        c.get(f"/api/sessions/{FAILED_SESSION}/run", params={"path": "failing_export@1/explode@1"}).text,
        c.get(f"/api/sessions/{APPROVAL_SESSION}/events").text,
    ]
    for text in bodies:
        assert "abc123secret" not in text and "/home/ops" not in text
    events = c.get(f"/api/sessions/{APPROVAL_SESSION}/events", params={"types": "run_started"}).json()
    assert events and all(e["fields"]["input"].startswith("<redacted: ") for e in events)
    failures = c.get(f"/api/sessions/{FAILED_SESSION}/events", params={"failures": "1"}).json()
    assert {e["type"] for e in failures} <= {
        "node_error",
        "node_error_propagated",
        "node_retrying",
        "run_finished",
    }
    assert any(e["type"] == "node_error" for e in failures)


# --------------------------------------------------------------------------- the guard


def test_a_foreign_host_header_is_refused_on_every_path(db):
    c, _ = client(db)
    for path in ("/", "/api/sessions", "/static/app.js", f"/api/sessions/{APPROVAL_SESSION}"):
        r = c.get(path, headers={"host": "attacker.example:8765"})
        assert r.status_code == 421, path
        assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert c.get("/api/sessions", headers={"host": "127.0.0.1:9999"}).status_code == 421  # another port
    assert c.get("/api/sessions", headers={"host": "localhost:8765"}).status_code == 200


def test_the_api_needs_the_per_start_token_and_the_url_moves_it_into_a_cookie(db):
    c, cfg = client(db)
    del c.headers["x-flowscope-token"]
    assert c.get("/api/sessions").status_code == 403
    assert c.get("/api/sessions", headers={"x-flowscope-token": "guess"}).status_code == 403
    assert c.get("/").status_code == 200  # the page shell itself holds no data
    r = c.get(f"/?token={cfg.token}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"  # out of the address bar
    cookie = r.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert c.get("/api/sessions").status_code == 200  # the cookie now carries it
    kept = c.get(f"/sessions/x?token={cfg.token}&status=failed", follow_redirects=False)
    assert kept.headers["location"] == "/sessions/x?status=failed"  # the rest of the URL stays
    assert cfg.url().startswith("http://127.0.0.1:8765/?token=")


def test_a_write_without_the_token_or_from_a_foreign_origin_is_refused_and_records_nothing(fresh):
    c, cfg = client(fresh)
    before = statuses(fresh)
    answer = {"inputs": {"approval": True}}
    url = f"/api/sessions/{APPROVAL_SESSION}/answer"
    assert c.post(url, json=answer, headers={"x-flowscope-token": ""}).status_code == 403
    assert c.post(url, json=answer, headers={"origin": "http://attacker.example"}).status_code == 403
    assert (
        c.post(url, json=answer, headers={"origin": BASE, "sec-fetch-site": "cross-site"}).status_code == 403
    )
    assert (
        c.post(
            f"/api/sessions/{FAILED_SESSION}/retry", json={}, headers={"origin": "http://127.0.0.1:1"}
        ).status_code
        == 403
    )
    assert statuses(fresh) == before
    with SqliteEventStore(fresh, readonly=True) as s:
        assert s.inbox(APPROVAL_SESSION) == []
    ok = c.post(url, json=answer, headers={"origin": BASE})
    assert (
        ok.status_code == 200
        and ok.json()["command"] == f"flowscope resume {APPROVAL_SESSION} --input approval=true"
    )
    assert statuses(fresh)[APPROVAL_SESSION] == "answered"


def test_a_read_only_console_refuses_every_write(fresh):
    c, _ = client(fresh, read_only=True)
    before = statuses(fresh)
    for path, body in (
        (f"/api/sessions/{APPROVAL_SESSION}/answer", {"inputs": {"approval": True}}),
        (f"/api/sessions/{FAILED_SESSION}/retry", {}),
        (f"/api/sessions/{PAUSED_SESSION}/cancel", {}),
        ("/api/bulk", {"action": "cancel", "state": "paused"}),
    ):
        r = c.post(path, json=body, headers={"origin": BASE})
        assert r.status_code == 403 and "read-only" in r.json()["error"], path
    assert statuses(fresh) == before
    assert c.get("/api/info").json()["read_only"] is True
    assert c.get("/api/sessions").status_code == 200


def test_every_response_carries_the_content_security_policy(db):
    c, _ = client(db)
    for path in (
        "/",
        "/stuck",
        f"/sessions/{APPROVAL_SESSION}",
        "/static/app.js",
        "/favicon.ico",
        "/api/info",
    ):
        r = c.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-security-policy"].split(";")[0] == "default-src 'self'"
        assert (
            r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
        )
    shell = c.get("/").text
    assert (
        '<script type="module" src="/static/app.js">' in shell
        and "<script>" not in shell
        and "style=" not in shell
    )


# --------------------------------------------------------------------------- the actions


def test_answers_are_validated_before_anything_is_recorded(fresh):
    c, _ = client(fresh)
    url = f"/api/sessions/{APPROVAL_SESSION}/answer"
    bad = c.post(url, json={"inputs": {"nope": True}})
    assert bad.status_code == 409 and "no open input request 'nope'" in bad.json()["error"]
    assert c.post(url, json={"inputs": {"approval": True}, "dry_run": True}).json()["valid"] is True
    for body in (
        b'{"dry_run": true}',
        b'{"inputs": {"approval": "\\ud800"}, "dry_run": true}',
    ):  # as the answer
        refused = c.post(url, content=body, headers={"content-type": "application/json"})
        assert refused.status_code in (400, 409) and "valid" not in refused.json(), refused.text
    assert c.post(url, json="not an object").status_code == 400
    huge = c.post(url, json={"inputs": {"approval": "x" * (2 << 20)}})  # read no further than its first MiB
    assert huge.status_code == 413 and "flowscope resume --input" in huge.json()["error"], huge.text
    nan = c.post(url, content=b'{"inputs": {"approval": NaN}}', headers={"content-type": "application/json"})
    assert nan.status_code == 400 and "JSON" in nan.json()["error"], nan.text  # no value JSON cannot hold
    assert statuses(fresh)[APPROVAL_SESSION] == "paused"
    assert c.post(url, json={"inputs": {"approval": True}}).status_code == 200
    again = c.post(url, json={"inputs": {"approval": True}})
    assert again.status_code == 409 and "already answered" in again.json()["error"]


def test_an_answers_dry_run_is_a_json_boolean_or_absent_anything_else_is_a_400(fresh):
    """``"dry_run": "false"`` is truthy: taken as a check, it would record nothing and say
    the answer is valid. Only ``true``, ``false`` or no ``dry_run`` is read; the rest is refused."""
    c, _ = client(fresh)
    url = f"/api/sessions/{APPROVAL_SESSION}/answer"
    for bad in ("false", "true", 0, 1, None, [], {}):
        refused = c.post(url, json={"inputs": {"approval": True}, "dry_run": bad})
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["error"] == "dry_run must be a JSON boolean (true or false), or absent"
    assert statuses(fresh)[APPROVAL_SESSION] == "paused"
    assert c.post(url, json={"inputs": {"approval": True}, "dry_run": True}).json()["valid"] is True
    assert statuses(fresh)[APPROVAL_SESSION] == "paused"
    assert c.post(url, json={"inputs": {"approval": True}, "dry_run": False}).json()["inputs"] == ["approval"]
    assert statuses(fresh)[APPROVAL_SESSION] == "answered"


def test_the_command_an_action_shows_for_a_session_id_that_starts_with_a_dash_pastes_as_an_id(tmp_path):
    from console_workflows import asks, failing
    from flowscope import START, Runner, Workflow

    db = tmp_path / "dash.db"
    with SqliteEventStore(db) as store:
        Runner(Workflow("asking", edges=[(START, asks)]), store).run_sync(None, session_id="-rf")
        with pytest.raises(ValueError):
            Runner(failing, store).run_sync(None, session_id="-x")
    c, cfg = client(db)
    prefix = cfg.prefix
    answered = c.post("/api/sessions/-rf/answer", json={"inputs": {"ship": True}, "dry_run": True}).json()
    assert answered["command"] == f"{prefix} resume --input ship=true -- -rf"
    retried = c.post("/api/sessions/-x/retry", json={"reason": "fixed"}).json()
    assert retried["command"] == f"{prefix} retry --reason fixed -- -x"
    cancelled = c.post("/api/sessions/-x/cancel", json={}).json()
    assert cancelled["command"] == f"{prefix} cancel -- -x"


def test_retry_cancel_and_bulk_go_through_the_operator_actions(fresh):
    c, _ = client(fresh)
    r = c.post(f"/api/sessions/{FAILED_SESSION}/retry", json={"reason": "fixed the export"})
    assert (
        r.status_code == 200
        and r.json()["command"] == f"flowscope retry {FAILED_SESSION} --reason 'fixed the export'"
    )
    assert c.post(f"/api/sessions/{PAUSED_SESSION}/retry", json={}).status_code == 409  # not failed
    assert c.post(f"/api/sessions/{PAUSED_SESSION}/cancel", json={}).json()["kind"] == "cancel"
    assert statuses(fresh)[FAILED_SESSION] == "queued" and statuses(fresh)[PAUSED_SESSION] == "cancelled"
    assert (
        c.post("/api/bulk", json={"action": "cancel"}).status_code == 400
    )  # no filter: it would touch everything
    count = c.post("/api/bulk", json={"action": "cancel", "state": "paused"}).json()
    assert count["count"] == 1 and count["session_ids"] == [APPROVAL_SESSION]
    assert count["command"] == "flowscope cancel --state paused --yes"
    assert statuses(fresh)[APPROVAL_SESSION] == "paused"  # the count first: nothing changed
    stale = c.post("/api/bulk", json={"action": "cancel", "state": "paused", "confirm": ["other"]})
    assert stale.status_code == 409 and statuses(fresh)[APPROVAL_SESSION] == "paused"
    by_count = c.post("/api/bulk", json={"action": "cancel", "state": "paused", "confirm": 1})
    assert by_count.status_code == 400 and "session_ids" in by_count.json()["error"]
    done = c.post(
        "/api/bulk", json={"action": "cancel", "state": "paused", "confirm": [APPROVAL_SESSION]}
    ).json()
    assert done["results"] == [{"session_id": APPROVAL_SESSION, "ok": True, "pending": False}]
    assert statuses(fresh)[APPROVAL_SESSION] == "cancelled"


def test_a_bulk_confirmation_acts_only_on_the_sessions_the_operator_saw(fresh):
    """The count alone is not a confirmation: between the list and the click, the session
    shown may have been dealt with and another have come to match the same filters."""
    with SqliteEventStore(fresh) as store:
        submit(store, "nightly_export", None, session_id="seen")
    c, _ = client(fresh)
    shown = c.post(
        "/api/bulk", json={"action": "cancel", "state": "queued", "workflow": "nightly_export"}
    ).json()
    assert shown["session_ids"] == ["seen"]
    assert c.post("/api/sessions/seen/cancel", json={}).status_code == 200  # another operator
    with SqliteEventStore(fresh) as store:
        submit(store, "nightly_export", None, session_id="never-shown")
    swapped = c.post(
        "/api/bulk",
        json={
            "action": "cancel",
            "state": "queued",
            "workflow": "nightly_export",
            "confirm": shown["session_ids"],
        },
    )
    assert swapped.status_code == 409 and "look again" in swapped.json()["error"], swapped.text
    by_count = c.post(
        "/api/bulk", json={"action": "cancel", "state": "queued", "workflow": "nightly_export", "confirm": 1}
    )
    assert by_count.status_code == 400, by_count.text  # one session, but not the one shown
    assert statuses(fresh)["never-shown"] == "queued"


def test_a_session_id_with_a_slash_is_one_segment_on_every_route(fresh):
    """The page sends an id's "/" as %2F, which the server decodes before routing: the id is
    routed whole, never as another route ("a/events" is a session, not session a's events)."""
    with SqliteEventStore(fresh) as store:
        for sid in ("a", "a/events", "team/batch-1"):
            submit(store, "nightly_export", None, session_id=sid)
    c, _ = client(fresh)
    drawn = c.get("/api/sessions/a%2Fevents/waterfall")
    assert drawn.status_code == 200 and drawn.json()["session"]["session_id"] == "a/events", drawn.text
    assert c.get("/api/sessions/a%2Fevents").status_code == 200
    assert c.get("/api/sessions/nobody%2Fevents").status_code == 404  # not nobody's events: no such session
    assert c.get("/api/sessions/team%2Fbatch-1/waterfall").json()["session"]["session_id"] == "team/batch-1"
    assert c.get("/api/sessions/team%2Fbatch-1/events").status_code == 200
    cancelled = c.post("/api/sessions/team%2Fbatch-1/cancel", json={"reason": "not tonight"})
    assert cancelled.status_code == 200 and cancelled.json()["session_id"] == "team/batch-1"
    assert statuses(fresh)["team/batch-1"] == "cancelled" and statuses(fresh)["a"] == "queued"
    assert c.get("/api/sessions/50%25off").status_code == 404  # a "%" in an id is the id's own


def test_a_bad_field_or_query_value_is_a_400_and_an_unknown_route_a_json_404(fresh):
    c, _ = client(fresh)
    bad = {
        ("POST", f"/api/sessions/{FAILED_SESSION}/retry", '{"reason": 42}'): "reason must be a JSON string",
        ("POST", f"/api/sessions/{FAILED_SESSION}/retry", '{"from_path": ["x"]}'): "from_path must be",
        ("POST", f"/api/sessions/{PAUSED_SESSION}/cancel", '{"reason": {"a": 1}}'): "reason must be",
        (
            "POST",
            "/api/bulk",
            '{"action": "retry", "state": "failed", "reason": ["x"], "confirm": []}',
        ): "reason",
        ("POST", "/api/bulk", '{"action": "retry", "workflow": 7}'): "workflow must be",
        ("GET", "/api/stuck?state=bogus", None): "state must be one of",
        ("GET", "/api/sessions?until=nan", None): "is not a time",
        ("GET", "/api/sessions?since=inf", None): "is not a time",
        ("GET", f"/api/sessions/{FAILED_SESSION}/waterfall?since=abc", None): "since is a seq",
    }
    for (method, url, content), fragment in bad.items():
        r = c.request(method, url, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and fragment in r.json()["error"], (url, content, r.status_code, r.text)
        assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert statuses(fresh)[FAILED_SESSION] == "failed" and statuses(fresh)[PAUSED_SESSION] == "paused"
    missing = c.get("/api/no-such-thing")
    assert missing.status_code == 404 and "no such API route" in missing.json()["error"]
    assert missing.headers["content-security-policy"].startswith("default-src 'self'")
    assert c.get("/api/sessions/x/waterfall", params={}).status_code == 404  # an unknown session
    assert c.post("/api/stuck").status_code == 405  # a route's wrong method is still that


def test_a_defect_is_a_json_500_with_the_guards_headers_and_one_log_line(db, monkeypatch, caplog):
    from flowscope.console import api

    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("boom at /srv/secret/app.py")

    monkeypatch.setattr(api, "session_waterfall", broken)
    c, _ = client(db)
    r = c.get(f"/api/sessions/{FAILED_SESSION}/waterfall")
    assert r.status_code == 500 and r.json() == {
        "error": "the console failed (RuntimeError); its log has the line"
    }
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    (line,) = [m for m in caplog.messages if "failed" in m]
    assert "RuntimeError: boom at <path>" in line and "Traceback" not in caplog.text


def test_each_attempt_names_the_worker_whose_invocation_ran_it(tmp_path):
    import asyncio

    from console_workflows import big
    from flowscope import Runner

    db = tmp_path / "owners.db"
    with SqliteEventStore(db) as store:
        asyncio.run(Runner(big, store, worker_id="w-one").run(2, session_id="two-owners"))
        asyncio.run(Runner(big, store, worker_id="w-two").resume("two-owners", inputs={"half": True}))
        started = [e for e in store.read("two-owners") if e.type == "run_started"]
    # the engine records each invocation's lease owner; the fold keeps the latest one
    assert [e.owner["worker_id"] for e in started] == ["w-one", "w-two"]
    assert all(e.owner["host"] and e.owner["pid"] == os.getpid() for e in started)
    c, _ = client(db)
    rows = c.get("/api/sessions/two-owners").json()
    assert rows == cli_json(db, "show", "two-owners")  # the same key in show's JSON and the API
    fan = next(r for r in rows if r["path"] == "big@1/fan@1")
    assert [s["owner"]["worker_id"] for s in fan["segments"]] == ["w-one", "w-two"]
    run = c.get("/api/sessions/two-owners/run", params={"path": "big@1/fan@1"}).json()
    assert [(a["owner"]["worker_id"], a["outcome"]) for a in run["attempts"]] == [
        ("w-one", "paused"),
        ("w-two", "completed"),
    ]


# --------------------------------------------------------------------------- live, layout, command


@pytest.mark.slow  # timing-bound (threads, processes or sleeps): the full suite runs it
def test_the_change_feed_probes_the_store_at_most_once_per_interval(fresh):
    with SqliteEventStore(fresh) as store:
        feed = ChangeFeed(store, interval=0.2)
        v = feed.version()
        for _ in range(50):  # fifty pages asking at once
            assert feed.version() == v
        assert feed.probes == 1
        with SqliteEventStore(fresh) as other:  # another process's write
            other.send(PAUSED_SESSION, "answer", {"inputs": {}})
        time.sleep(0.25)
        assert feed.version() == v + 1 and feed.probes == 2


@pytest.mark.slow  # timing-bound: waits for a lease to run out
def test_the_change_feed_moves_when_a_lease_runs_out_without_a_write(fresh):
    """A killed worker writes nothing more: the page left open learns of its orphaned
    sessions from the liveness rule, which the feed asks, not from a write."""
    from flowscope.store.testing import other_host_owner
    from flowscope.store.testing.helpers import hold_running

    with SqliteEventStore(fresh) as store:
        hold_running(store, other_host_owner("w-far"), 2, time.time() - 3600.0 + 0.3)  # leases end in 0.3 s
        feed = ChangeFeed(store, interval=0.05, liveness_interval=0.05)
        v = feed.version()
        time.sleep(0.1)
        assert feed.version() == v  # nothing changed yet
        time.sleep(0.35)
        files = feed._probe_files()
        assert feed.version() == v + 1  # the leases ran out
        assert feed._probe_files() == files  # and nothing was written
        time.sleep(0.1)
        assert feed.version() == v + 1  # once


def test_the_list_never_reads_every_session_and_counts_the_tabs_once_per_change(db):
    from flowscope.console import api

    class Counting(SqliteEventStore):
        calls = {"open_runs": 0}
        unbounded: list = []  # listings neither cut to a page nor to given ids

        def sessions(self):
            raise AssertionError("the console read every session")

        def open_runs(self):
            self.calls["open_runs"] += 1
            return super().open_runs()

        def find_sessions(self, query=None, *, limit=None, offset=0):
            if limit is None and (query is None or query.session_ids is None):
                self.unbounded.append(query)
            return super().find_sessions(query, limit=limit, offset=offset)

    with Counting(db, readonly=True) as store:
        feed = ChangeFeed(store, interval=60.0)
        for f in (
            api.SessionFilter(limit=2),
            api.SessionFilter(status="failed"),
            api.SessionFilter(q="ops"),
            api.SessionFilter(attention="waiting_input"),
            api.SessionFilter(error_code="UNKNOWN_ERROR"),
            api.SessionFilter(limit=2),
        ):
            api.list_sessions(feed, f, now=1_000_000.5)  # five pages, one store version, one second
        assert store.calls["open_runs"] == 1  # the tabs, once
        api.list_sessions(feed, api.SessionFilter(), now=1_000_007.5)  # later: the rule again, no read
        assert store.calls["open_runs"] == 1
        assert store.unbounded == []
        feed.changed()  # the store moved: the next page counts the tabs again, once
        api.list_sessions(feed, api.SessionFilter(), now=1_000_000.5)
        assert store.calls["open_runs"] == 2


def test_the_error_code_filter_selects_exactly_the_sessions_whose_row_shows_that_code(tmp_path):
    from flowscope.cli import views
    from flowscope.console import api
    from flowscope.store.testing.helpers import varied_sessions

    with SqliteEventStore(tmp_path / "codes.db") as store:
        varied_sessions(store, seed=3, sessions=12, events=80)
        rows = views.session_rows(store, store.sessions())
        feed = ChangeFeed(store, interval=60.0)
        codes = {r["error_code"] for r in rows} - {None}
        assert len(codes) >= 2  # random failures of more than one code
        for code in sorted(codes):
            want = [r["session_id"] for r in rows if r["error_code"] == code]
            got, total, _tabs = api.list_sessions(feed, api.SessionFilter(error_code=code, limit=500))
            assert [r["session_id"] for r in got] == want and total == len(want), code
            for tab in api.ATTENTION:  # narrowed by a tab (maybe an empty one): never widened
                got, total, tabs = api.list_sessions(feed, api.SessionFilter(error_code=code, attention=tab))
                assert total <= min(len(want), tabs[tab])


def test_the_waterfall_axis_compresses_idle_gaps_and_writes_their_length():
    windows = [(0.0, 2.0), (3602.0, 3604.0)]  # an hour's pause between two invocations
    axis = Axis(0.0, 3604.0, windows, 1000.0, 40.0)
    [gap] = axis.gaps()
    assert (gap.start, gap.end, gap.width) == (2.0, 3602.0, 40.0) and gap.duration_s == 3600.0
    assert axis.x(2.0) == pytest.approx(480.0) and axis.x(3602.0) == pytest.approx(520.0)
    assert axis.x(3604.0) == pytest.approx(1000.0)  # the busy time fills the rest, to scale
    rows = [
        {
            "started_at": 0.0,
            "ended_at": 3604.0,
            "segments": [{"started_at": 0.0, "ended_at": 2.0}, {"started_at": 3602.0, "ended_at": 3604.0}],
        },
        {"started_at": 1.0, "ended_at": None},
        {"started_at": None, "ended_at": None},
    ]
    out = waterfall_layout(rows, windows=windows, end_ts=3604.0)
    assert out["segments"] == [[[0.0, 480.0], [520.0, 1000.0]], [[240.0, 1000.0]], []]
    assert out["gaps"] == [{"x": 480.0, "width": 40.0, "start": 2.0, "end": 3602.0, "duration_s": 3600.0}]
    terminal = Axis(0.0, 3604.0, windows, 32)  # flowscope show: the gap is one column
    assert terminal.gap_columns() == [15]


def test_flowscope_ui_without_its_extra_says_how_to_install_it(db, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    r = CliRunner().invoke(cli, ["--db", str(db), "ui"])
    assert (
        r.exit_code == 2
        and r.output.strip()
        == "flowscope: error: the console needs its extra: pip install 'flowscope[ui]' (Starlette and uvicorn)"
    )


@pytest.mark.slow
def test_on_postgresql_the_api_serves_the_cli_rows_and_acts(pg_cluster):
    from flowscope.store.postgres import PostgresEventStore

    url = pg_cluster.new_database("console")
    with PostgresEventStore(url) as store:
        make_operator_sessions(store, pause_s=0.0)
        cfg = ConsoleConfig(store=store, db_shown=url, port=8765)
        c = TestClient(create_app(cfg), base_url=BASE, headers={"x-flowscope-token": cfg.token})
        runs = CliRunner().invoke(cli, ["--db", url, "runs", "--format", "json"], catch_exceptions=False)
        assert c.get("/api/sessions").json() == json.loads(runs.output)
        r = c.get("/api/sessions", params={"attention": "failed"})
        assert [x["session_id"] for x in r.json()] == [FAILED_SESSION] and json.loads(
            r.headers["x-attention"]
        )["waiting_input"] == 2
        assert c.get(f"/api/sessions/{APPROVAL_SESSION}/waterfall").json()["invocations"] == 2
        assert c.post(f"/api/sessions/{FAILED_SESSION}/retry", json={}).status_code == 200
        assert c.post(f"/api/sessions/{PAUSED_SESSION}/cancel", json={}).status_code == 200
        assert {s.session_id: s.status for s in store.sessions()}[FAILED_SESSION] == "queued"
        assert {s.session_id: s.status for s in store.sessions()}[PAUSED_SESSION] == "cancelled"


# --------------------------------------------------------------------------- stuck, and the store's file


def _orphaned_session(store: SqliteEventStore, sid: str) -> None:
    """A session whose owner (a process on this host) was SIGKILLed inside a nested run: the
    workflow and its node both running, the lease still current."""
    from flowscope.events import NodeStarted, RunStarted
    from flowscope.store.testing import dead_owner, ev, node_ev

    now = time.time()
    lease = store.acquire(sid, dead_owner("w-killed"), 3600.0, now=now)
    events = [
        ev(RunStarted, sid=sid, workflow="shop", ts=now - 1),
        node_ev(NodeStarted, "shop@1", ts=now - 1, sid=sid, kind="workflow"),
        node_ev(NodeStarted, "shop@1/charge@1", ts=now - 1, sid=sid, parent_path="shop@1"),
    ]
    store.append(sid, events, 0, epoch=lease.epoch)


@pytest.mark.slow  # over 0.15 s: several CLI views of the same store
def test_the_attention_tabs_list_a_session_under_the_state_stuck_gives_its_innermost_open_run(fresh):
    """A session's enclosing runs share its innermost run's open state; ``stuck`` lists the
    innermost alone, and so do the tabs: a session whose one job is overdue is overdue, not
    also waiting for a job (its enclosing workflow is waiting_job, past no deadline)."""
    from console_workflows import OVERDUE_SESSION, make_overdue_session

    with SqliteEventStore(fresh) as store:
        make_overdue_session(store)
        _orphaned_session(store, "ops-orphan")
    c, _ = client(fresh)
    stuck = cli_json(fresh, "stuck", "--older-than", "0s")
    counts = json.loads(c.get("/api/sessions").headers["x-attention"])
    for state in ("waiting_input", "waiting_job", "overdue", "orphaned"):
        listed = {r["session_id"] for r in c.get("/api/sessions", params={"attention": state}).json()}
        assert listed == {r["session_id"] for r in stuck if r["state"] == state}, state
        assert counts[state] == len(listed), state
    assert counts["overdue"] == 1 and counts["waiting_job"] == 0 and counts["orphaned"] == 1
    assert [r["state"] for r in stuck if r["session_id"] == OVERDUE_SESSION] == ["overdue"]


@pytest.mark.slow  # over 0.15 s: several CLI views of the same store
def test_the_session_page_is_given_what_stuck_says_its_status_hides(fresh):
    """The waterfall's data carries ``stuck``'s rows for the session (orphaned, overdue, each
    with the command ``stuck`` suggests), asked again even when its log has not grown: an
    owner dies and a deadline passes without an event."""
    from console_workflows import OVERDUE_SESSION, make_overdue_session

    with SqliteEventStore(fresh) as store:
        job = make_overdue_session(store)
        _orphaned_session(store, "ops-orphan")
    prefix = command_prefix(str(fresh))  # as flowscope ui --db sets it: every command names the database
    c, _ = client(fresh, prefix=prefix)
    moving = ("age_s", "heartbeat_age_s")
    for sid, state in ((OVERDUE_SESSION, "overdue"), ("ops-orphan", "orphaned")):
        w = c.get(f"/api/sessions/{sid}/waterfall").json()
        cli_rows = cli_json(fresh, "stuck", "--older-than", "0s", "--state", state)
        want = [{k: v for k, v in r.items() if k not in moving} for r in cli_rows if r["session_id"] == sid]
        assert [{k: v for k, v in r.items() if k not in moving} for r in w["stuck"]] == want and want, sid
        again = c.get(f"/api/sessions/{sid}/waterfall", params={"since": w["last_seq"]}).json()
        assert again["unchanged"] is True and [r["action"] for r in again["stuck"]] == [want[0]["action"]]
    overdue = c.get(f"/api/sessions/{OVERDUE_SESSION}/waterfall").json()
    assert overdue["status"] == "paused" and overdue["waiting"][0]["job_id"] == job
    assert overdue["stuck"][0]["waiting_on"] == [job]
    assert overdue["stuck"][0]["action"].startswith(f"{prefix} resume {OVERDUE_SESSION} --job '{job}=")
    orphan = c.get("/api/sessions/ops-orphan/waterfall").json()
    assert orphan["status"] == "running" and orphan["session"]["owner"]["alive"] is False
    assert [(r["path"], r["action"]) for r in orphan["stuck"]] == [
        # the innermost run, as stuck lists it
        ("shop@1/charge@1", f"{prefix} resume ops-orphan --workflow MODULE:ATTR")
    ]
    assert c.get(f"/api/sessions/{APPROVAL_SESSION}/waterfall").json()["stuck"] == []  # waiting, not stuck


@pytest.mark.slow  # over 0.15 s: several CLI views of the same store
def test_a_session_answered_or_reported_waits_for_a_worker_not_a_person_or_a_job(fresh):
    """Once its input is answered, or its job's result reported, a session is a worker's to
    resume, and ``resume --input`` or ``--job`` would be refused (an answer is given once):
    ``stuck``, ``/api/stuck`` and the tabs call its waiting run queued (for a worker, with
    the worker hint), never waiting for a person, for a job, or overdue."""
    from console_workflows import OVERDUE_SESSION, make_overdue_session

    with SqliteEventStore(fresh) as store:
        job = make_overdue_session(store)
    prefix = command_prefix(str(fresh))
    c, _ = client(fresh, prefix=prefix, queued_after_s=0.0)
    answers = {
        PAUSED_SESSION: {"inputs": {"half": True}},
        OVERDUE_SESSION: {"jobs": {job: {"success": True}}},
    }
    for sid, answer in answers.items():
        assert c.post(f"/api/sessions/{sid}/answer", json=answer).status_code == 200, sid
    assert statuses(fresh)[PAUSED_SESSION] == statuses(fresh)[OVERDUE_SESSION] == "answered"
    for rows in (cli_json(fresh, "stuck", "--older-than", "0s"), c.get("/api/stuck").json()):
        got = {
            r["session_id"]: (r["state"], r["waiting_on"], r["action"])
            for r in rows
            if r["session_id"] in answers
        }
        hint = f"no live worker serves {{!r}}: {prefix} worker "
        assert {sid: (state, on) for sid, (state, on, _) in got.items()} == {
            PAUSED_SESSION: ("queued", ["a worker"]),
            OVERDUE_SESSION: ("queued", ["a worker"]),
        }, got
        assert got[PAUSED_SESSION][2].startswith(hint.format("big")), got
        assert got[OVERDUE_SESSION][2].startswith(hint.format("order_fulfilment")), got
    assert {
        r["session_id"] for r in cli_json(fresh, "stuck", "--older-than", "0s", "--state", "queued")
    } >= set(answers)
    counts = json.loads(c.get("/api/sessions").headers["x-attention"])
    tabs = {
        t: {r["session_id"] for r in c.get("/api/sessions", params={"attention": t}).json()} for t in counts
    }
    assert {t for t, ids in tabs.items() if ids & set(answers)} == {"queued_too_long"}, tabs
    assert counts == {t: len(ids) for t, ids in tabs.items()}
    assert c.get(f"/api/sessions/{OVERDUE_SESSION}/waterfall").json()["stuck"] == []  # no longer overdue


def test_the_session_page_counts_invocations_as_runs_does(fresh):
    with SqliteEventStore(fresh) as store:
        submit(store, "nightly_export", None, session_id="never-started")
    c, _ = client(fresh)
    runs = {r["session_id"]: r["invocations"] for r in cli_json(fresh, "runs", "--limit", "0")}
    for sid in ("never-started", APPROVAL_SESSION):
        assert c.get(f"/api/sessions/{sid}/waterfall").json()["invocations"] == runs[sid], sid
    assert runs["never-started"] == 0 and runs[APPROVAL_SESSION] == 2


def test_a_database_file_deleted_or_replaced_under_the_console_is_a_503_never_its_old_rows(fresh):
    """The store's connection still reads the file it opened: once that file is deleted, or
    another stands at its path, every read and write answers 503 with what to do."""
    c, _ = client(fresh, live_interval_s=0.0)  # the feed probes the file at every request
    assert c.get("/api/sessions").status_code == 200
    routes = [
        ("GET", "/api/sessions"),
        ("GET", f"/api/sessions/{APPROVAL_SESSION}"),
        ("GET", f"/api/sessions/{APPROVAL_SESSION}/waterfall"),
        ("GET", "/api/stuck"),
        ("GET", "/api/audit"),
        ("POST", f"/api/sessions/{PAUSED_SESSION}/cancel"),
    ]
    for suffix in ("", "-wal", "-shm"):
        Path(str(fresh) + suffix).unlink(missing_ok=True)
    for method, url in routes:
        r = c.request(method, url, json={} if method == "POST" else None)
        assert r.status_code == 503, (url, r.text)
        assert "was deleted" in r.json()["error"] and "restart `flowscope ui`" in r.json()["error"], url
    with SqliteEventStore(fresh) as other:  # another database at the same path
        submit(other, "nightly_export", None, session_id="from-the-new-file")
    for method, url in routes:
        r = c.request(method, url, json={} if method == "POST" else None)
        assert r.status_code == 503 and "replaced by another file" in r.json()["error"], (url, r.text)
    assert c.get("/api/info").status_code == 200  # the page still boots, to say so
    assert statuses(fresh) == {"from-the-new-file": "queued"}  # and nothing was written to it


def test_a_body_nested_past_what_json_reads_and_an_offset_past_a_stores_integer_are_400s(fresh):
    """Python's JSON reader recurses once per level (a RecursionError, not a ValueError), and
    SQLite's OFFSET is a 64-bit integer (an OverflowError past it): neither is a defect."""
    c, _ = client(fresh)
    deep = b'{"inputs": {"approval": ' + b"[" * 100_000 + b"]" * 100_000 + b'}, "dry_run": true}'
    for url in (
        f"/api/sessions/{APPROVAL_SESSION}/answer",
        f"/api/sessions/{FAILED_SESSION}/retry",
        "/api/bulk",
    ):
        r = c.post(url, content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"], (url, r.text)
    huge = c.get("/api/sessions", params={"offset": str(10**20)})
    assert huge.status_code == 400 and "offset 0 to" in huge.json()["error"], huge.text
    from flowscope.console.api import MAX_OFFSET

    assert c.get("/api/sessions", params={"offset": str(MAX_OFFSET)}).json() == []  # the last allowed
    assert statuses(fresh)[APPROVAL_SESSION] == "paused" and statuses(fresh)[FAILED_SESSION] == "failed"
