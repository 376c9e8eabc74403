"""The console in a real browser: Debian's Chromium driven by Playwright's async API (never
``playwright install``), against ``flowscope ui`` started as a process on the demo's
database, with a real ``flowscope worker`` serving the demo workflow.

After the demo, the list shows every demo session and filters on the server; a session
page draws one row per node path and the pause between invocations; the approval is
answered through its form and the worker completes the session (the page follows it
live); a worker SIGKILLed mid-attempt is taken over by another after its lease, and the
page shows both attempts with their two workers and the recovery; a failed session is
retried and a paused one cancelled through their buttons; an orphaned and an overdue
session say so, with ``stuck``'s command; a database deleted under an open page is said
above it; a foreign ``Host`` and a tokenless write are refused; a session of 10,000 node
runs keeps only the rows in view in the page, scrolls and folds (how fast is
bench/console_bench.py's); no page logs a console error. The same list, waterfall and answer on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from commands import ROOT, cli_env, cli_ok, start_cli
from conftest import unavailable
from console_workflows import (
    APPROVAL_SESSION,
    FAILED_SESSION,
    PAUSED_SESSION,
    make_big_session,
    make_operator_sessions,
)
from flowscope.cli.app import command_prefix

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

CHROMIUM = os.environ.get("FLOWSCOPE_CHROMIUM", "/usr/lib/chromium/chromium")
#: Where the session page's screenshot goes when set (docs/ui.md shows it).
SCREENSHOT = os.environ.get("FLOWSCOPE_CONSOLE_SCREENSHOT")
BIG = "big-10k"


def _env() -> dict[str, str]:
    return cli_env(paths=(Path(ROOT) / "tests",))  # console_workflows


class Console:
    """A ``flowscope ui`` process: its URL (with the token) and its base."""

    def __init__(self, db: str, logs: Path, *extra: str) -> None:
        self.db = db  # what every command the console shows names (command_prefix)
        self.log = logs / "ui.stderr"
        with open(self.log, "w") as err:  # a file, not a pipe nobody reads: a full pipe blocks the process
            self.proc = start_cli("ui", "--db", db, "--port", "0", *extra, env=_env(), stderr=err)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            raise AssertionError(f"flowscope ui printed {self.url!r} first; stderr: {self.stop()}")
        self.base = self.url.split("/?", 1)[0]

    def stop(self) -> str:
        stop(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.log.read_text()


def start_worker(db: str, logs: Path) -> subprocess.Popen[str]:
    with open(logs / "worker.stderr", "w") as err:
        return start_cli(
            *("--db", db, "worker", "flowscope.examples.demo:order_fulfilment", "--poll", "100ms"),
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> Path:
    """The demo's database, with the operator's sessions and a session of 10,000 runs."""
    from flowscope.store import SqliteEventStore

    db = tmp_path_factory.mktemp("console-browser") / "demo.db"
    cli_ok("demo", "--db", str(db), env=_env(), timeout=180)
    with SqliteEventStore(db) as store:
        make_operator_sessions(store, pause_s=1.1)
        make_big_session(store, BIG)
    return db


@pytest.fixture(scope="module")
def console(demo_db) -> Iterator[Console]:
    c = Console(str(demo_db), demo_db.parent)
    worker = start_worker(str(demo_db), demo_db.parent)
    try:
        yield c
    finally:
        stop(worker)
        err = c.stop()
        assert "Traceback" not in err, err


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> Any:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        unavailable("playwright is not installed: pip install -e '.[test]'")
    if not Path(CHROMIUM).exists():
        unavailable(
            f"no Chromium at {CHROMIUM}: apt-get install -y --no-install-recommends chromium (./scripts/test does)"
        )
    async with async_playwright() as p:
        b = await p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--disable-dev-shm-usage", "--host-resolver-rules=MAP rebound.example 127.0.0.1"],
        )
        try:
            yield b
        finally:
            await b.close()


class Page:
    """A page that records every console error and uncaught exception."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on(
            "console", lambda m: self.errors.append(f"{page.url}: {m.text}") if m.type == "error" else None
        )
        page.on("pageerror", lambda e: self.errors.append(f"{page.url}: {e}"))

    async def open(self, url: str) -> None:
        await self.page.goto(url)
        await self.page.wait_for_selector("body[data-ready='1']", timeout=15_000)


async def new_page(browser: Any, console: Console) -> Page:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    p = Page(await context.new_page())
    await p.open(console.url)  # the token: into a cookie, out of the address bar
    assert p.page.url == console.base + "/"
    return p


async def status_of(page: Page, want: str, timeout: float = 30.0) -> None:
    try:
        await page.page.wait_for_selector(f"#status .s-{want}", timeout=timeout * 1000)
    except Exception:
        seen = await page.page.evaluate(
            "() => [document.querySelector('#status')?.textContent, document.querySelector('#confirm-error')?.textContent,"
            " document.querySelector('#notice')?.textContent, document.querySelector('#live-state')?.textContent]"
        )
        raise AssertionError(
            f"the page never showed {want}: status, dialog error, notice, live = {seen}; {page.errors}"
        ) from None


async def test_the_demo_sessions_list_filters_and_the_waterfall_draws_every_path_and_the_pause(
    browser, console, demo_db
):
    from flowscope.store import SqliteEventStore

    with SqliteEventStore(demo_db, readonly=True) as store:
        demo_ids = {s.session_id for s in store.sessions() if s.session_id.startswith("demo-")}
        approval_paths = [r.path for r in store.node_runs(APPROVAL_SESSION)]
    assert {i.rsplit("-", 1)[1] for i in demo_ids} >= {"orders", "declined", "lost", "export"}
    p = await new_page(browser, console)
    listed = set(await p.page.locator("#list td.id a").all_inner_texts())
    assert demo_ids <= listed
    assert await p.page.locator("#count").inner_text() == f"1-{len(listed)} of {len(listed)}"
    failed = await p.page.locator("[data-tab=failed] .n").inner_text()
    assert int(failed) == 2  # the demo's declined batch and the failed export

    await p.page.select_option("select[name=status]", "failed")
    await p.page.click("form.filters button[type=submit]")
    await p.page.wait_for_selector("body[data-ready='1']")
    assert "status=failed" in p.page.url  # the filter is in the URL
    shown = set(await p.page.locator("#list td.id a").all_inner_texts())
    assert shown == {FAILED_SESSION} | {s for s in demo_ids if s.endswith("-declined")}

    await p.open(f"{console.base}/sessions/{APPROVAL_SESSION}")
    rows = p.page.locator(".wf-row")
    assert await rows.count() == len(approval_paths)
    assert sorted(await rows.evaluate_all("els => els.map(e => e.dataset.path)")) == sorted(approval_paths)
    gap = p.page.locator(".wf-head .gap")
    assert (
        await gap.count() == 1 and float(await gap.get_attribute("data-gap")) >= 1.0
    )  # the pause, compressed
    assert (await p.page.locator(".wf-head .gap-label").inner_text()).endswith("s")
    fetch = p.page.locator(".wf-row[data-path$='fetch_orders@1']")
    await fetch.click()
    await p.page.wait_for_selector("#detail table.rows")
    attempts = await p.page.locator("#detail table.rows").first.inner_text()
    assert "retried" in attempts and "INVENTORY_UNAVAILABLE" in attempts
    await (
        p.page.locator("#detail table.rows").first.locator("tbody tr").first.click()
    )  # the retried attempt alone
    assert (await p.page.locator("#attempt-filter").inner_text()).startswith("attempt 1: 2 of ")
    assert await p.page.locator("#run-events tbody td:nth-child(2)").all_inner_texts() == [
        "node_started",
        "node_retrying",
    ]
    if SCREENSHOT:
        await p.page.screenshot(path=SCREENSHOT)

    await p.open(f"{console.base}/stuck")  # the rows of `flowscope stuck`, each with its fix
    fixes = await p.page.locator("#stuck code.cmd").all_inner_texts()
    assert f"{command_prefix(str(demo_db))} resume {APPROVAL_SESSION} --input 'approval=JSON'" in fixes
    await p.open(f"{console.base}/audit")
    assert await p.page.locator("#audit tbody tr").count() > 5
    assert p.errors == []
    await p.page.context.close()  # and its event stream


async def test_a_session_page_shows_what_stuck_says_its_status_hides(browser, console, demo_db):
    """The demo's export session (its worker SIGKILLed mid-run) is still "running", and its
    lost batch "paused" on a job past its deadline: the page says orphaned and overdue, each
    with the command ``flowscope stuck`` prints for it."""
    from flowscope.cli import views
    from flowscope.store import SqliteEventStore

    for _ in range(150):  # the lost job's deadline is the demo's --stale-after (5 s) after it
        with SqliteEventStore(demo_db, readonly=True) as store:
            rows = {
                r["session_id"].rsplit("-", 1)[1]: r
                for r in views.stuck_rows(store, 0.0, 60.0, prefix=command_prefix(str(demo_db)))
            }
        if rows.get("lost", {}).get("state") == "overdue":
            break
        await asyncio.sleep(0.1)
    orphan, overdue = rows["export"], rows["lost"]
    assert (orphan["state"], overdue["state"]) == ("orphaned", "overdue")
    p = await new_page(browser, console)
    await p.open(f"{console.base}/sessions/{orphan['session_id']}")
    assert await p.page.locator("#status").inner_text() == "running"
    line = await p.page.locator("#stuck [data-state=orphaned]").inner_text()
    assert "is gone" in line and orphan["action"] in line and orphan["path"] in line
    assert (await p.page.locator("#summary").inner_text()).count(": gone") == 1  # the owner's cell
    await p.open(f"{console.base}/sessions/{overdue['session_id']}")
    line = await p.page.locator("#stuck [data-state=overdue]").inner_text()
    assert "past its deadline" in line and overdue["action"] in line
    job = overdue["waiting_on"][0]
    note = p.page.locator(f"[data-waiting='{job}'] .overdue-note")
    assert await note.is_visible() and overdue["action"] in await note.inner_text()
    assert p.errors == []
    await p.page.context.close()


async def test_a_database_deleted_under_an_open_page_is_said_above_it(browser, demo_db, tmp_path):
    import sqlite3

    copy = tmp_path / "gone.db"
    src, dst = sqlite3.connect(demo_db), sqlite3.connect(copy)
    src.backup(dst)
    src.close()
    dst.close()
    c = Console(str(copy), tmp_path)
    try:
        p = await new_page(browser, c)
        banner = p.page.locator("#banner")
        assert await banner.is_hidden()
        for suffix in ("", "-wal", "-shm"):
            Path(str(copy) + suffix).unlink(missing_ok=True)
        for _ in range(100):  # the live stream's next change (the file's probe) redraws the list
            if await banner.is_visible():
                break
            await asyncio.sleep(0.1)
        text = await banner.inner_text()
        assert "was deleted" in text and "restart `flowscope ui`" in text
        assert p.errors and all("status of 503" in e for e in p.errors)  # Chromium logs each 503 fetch
        await p.page.context.close()
    finally:
        assert "Traceback" not in c.stop()


async def test_answering_the_approval_from_the_page_lets_a_worker_complete_the_session(browser, console):
    p = await new_page(browser, console)
    await p.open(f"{console.base}/sessions/{APPROVAL_SESSION}")
    form = p.page.locator("[data-waiting=approval]")
    await form.locator("textarea").fill("not json")
    await form.locator("button[data-submit]").click()
    assert "not JSON" in await form.locator(".error").inner_text()  # validated before anything is sent
    await form.locator("textarea").fill("true")
    await form.locator("button[data-submit]").click()
    await p.page.wait_for_selector("#confirm[open]")
    assert (
        await p.page.locator("#confirm-cmd").inner_text()
        == f"{command_prefix(console.db)} resume {APPROVAL_SESSION} --input approval=true"
    )
    await p.page.click("#confirm-yes")
    await status_of(p, "completed")  # answered, then the worker ran it: the page followed live
    assert p.errors == []
    await p.page.context.close()  # and its event stream


async def test_an_answer_typed_on_the_page_is_recorded_as_typed_not_rounded(browser, console, demo_db):
    from console_workflows import asks
    from flowscope import START, Runner, Workflow
    from flowscope.events import InputReceived
    from flowscope.store import SqliteEventStore

    with SqliteEventStore(demo_db) as store:  # a workflow no worker serves: it stays answered
        await Runner(Workflow("exact_probe", edges=[(START, asks)]), store).run(None, session_id="ops-exact")
    p = await new_page(browser, console)
    await p.open(f"{console.base}/sessions/ops-exact")
    form = p.page.locator("[data-waiting=ship]")
    await form.locator("textarea").fill('{"order_id": 12345678901234567890, "amount": 1.10}')
    await form.locator("button[data-submit]").click()
    await p.page.wait_for_selector("#confirm[open]")
    # a JavaScript number holds 12345678901234567000 at most: the page sends the text
    assert "12345678901234567890" in await p.page.locator("#confirm-text").inner_text()
    assert "12345678901234567890" in await p.page.locator("#confirm-cmd").inner_text()
    await p.page.click("#confirm-yes")
    await p.page.wait_for_selector("#notice:has-text('answered')")
    with SqliteEventStore(demo_db, readonly=True) as store:
        (given,) = [e.value for e in store.read("ops-exact") if isinstance(e, InputReceived)]
    assert given == {"order_id": 12345678901234567890, "amount": 1.1}
    assert p.errors == []
    await p.page.context.close()


async def test_times_are_shown_in_utc_as_the_filters_read_them_whatever_the_browsers_zone(
    browser, console, demo_db
):
    from datetime import UTC, datetime

    from flowscope.store import SqliteEventStore

    with SqliteEventStore(demo_db, readonly=True) as store:
        info = store.session_info(FAILED_SESSION)
    assert info is not None and info.updated_at is not None
    utc = datetime.fromtimestamp(info.updated_at, UTC)
    context = await browser.new_context(viewport={"width": 1400, "height": 900}, timezone_id="Asia/Tokyo")
    p = Page(await context.new_page())
    await p.open(console.url)
    headers = [t.strip() for t in await p.page.locator("#list th").all_inner_texts()]
    column = headers.index("Updated (UTC)") + 1
    row = p.page.locator("#list tbody tr").filter(
        has=p.page.get_by_role("link", name=FAILED_SESSION, exact=True)
    )
    assert await row.locator(f"td:nth-child({column})").inner_text() == utc.strftime("%Y-%m-%d %H:%M:%S")
    await p.page.fill("input[name=since]", utc.strftime("%Y-%m-%dT%H:%M"))  # the time shown, typed back
    await p.page.click("form.filters button[type=submit]")
    await p.page.wait_for_selector("body[data-ready='1']")
    assert FAILED_SESSION in await p.page.locator("#list td.id a").all_inner_texts()
    assert p.errors == []
    await context.close()


async def test_retry_and_cancel_through_the_buttons(browser, console):
    p = await new_page(browser, console)
    await p.open(f"{console.base}/sessions/{FAILED_SESSION}")
    await p.page.click("#action-retry")
    await p.page.fill("#confirm-reason", "fixed the export")
    assert (
        await p.page.locator("#confirm-cmd").inner_text()
        == f"{command_prefix(console.db)} retry {FAILED_SESSION} --reason 'fixed the export'"
    )
    await p.page.click("#confirm-yes")
    await status_of(p, "queued", timeout=10)

    await p.open(f"{console.base}/sessions/{PAUSED_SESSION}")
    await p.page.click("#action-cancel")
    await p.page.click("#confirm-yes")
    await status_of(p, "cancelled", timeout=10)
    assert p.errors == []
    await p.page.context.close()  # and its event stream


async def test_a_foreign_host_and_a_tokenless_write_are_refused(browser, console):
    context = await browser.new_context()  # no token cookie
    page = await context.new_page()
    port = console.base.rsplit(":", 1)[1]
    rebound = await page.goto(f"http://rebound.example:{port}/")  # DNS rebinding: another name for 127.0.0.1
    assert rebound is not None and rebound.status == 421
    await page.goto(console.base + "/")
    r = await page.request.post(
        f"{console.base}/api/sessions/{FAILED_SESSION}/cancel",
        data="{}",
        headers={"content-type": "application/json"},
    )
    assert r.status == 403 and "token" in (await r.json())["error"]
    await context.close()


async def test_a_change_recorded_by_another_process_reaches_an_open_event_stream(console, demo_db):
    import httpx

    from flowscope.ownership import this_process
    from flowscope.store import SqliteEventStore

    token = console.url.split("token=", 1)[1]
    async with httpx.AsyncClient(
        base_url=console.base, headers={"x-flowscope-token": token}, timeout=10
    ) as http:
        async with http.stream("GET", "/api/live") as stream:
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("retry: ") and await anext(lines) == "event: hello"
            await anext(lines), await anext(lines)  # its data, and the blank line that ends it
            with SqliteEventStore(demo_db) as other:  # another process's write (here: a worker seen)
                other.workers_seen(this_process(), ["probe"])
            t = time.monotonic()
            assert await anext(lines) == "event: change"
            took = time.monotonic() - t
    print(f"\na change reached the event stream in {took:.2f}s")
    assert took < 3.0


async def test_a_read_only_console_shows_no_write_and_serves_none(browser, demo_db, tmp_path):
    c = Console(str(demo_db), tmp_path, "--read-only")
    try:
        p = await new_page(browser, c)
        assert (await p.page.locator("#db").inner_text()).endswith("(read-only)")
        assert await p.page.locator("#bulk-go").count() == 0
        await p.open(f"{c.base}/sessions/demo-x")  # an unknown session: one line, no console error
        assert "no session 'demo-x'" in await p.page.locator("#summary .error").inner_text()
        declined = next(
            s
            for s in await p.page.evaluate("fetch('/api/sessions?status=failed').then(r => r.json())")
            if s["session_id"].startswith("demo-")
        )
        await p.open(f"{c.base}/sessions/{declined['session_id']}")
        assert await p.page.locator("#summary button").count() == 0  # no retry, no cancel
        r = await p.page.evaluate(
            f"fetch('/api/sessions/{declined['session_id']}/retry', {{method: 'POST', body: '{{}}', headers: {{'content-type': 'application/json'}}}}).then(r => r.status)"
        )
        assert r == 403
        provoked = [  # Chromium logs every 4xx fetch; these two were asked for
            f"{c.base}/sessions/demo-x: Failed to load resource: the server responded with a status of 404 (Not Found)",
            f"{c.base}/sessions/{declined['session_id']}: Failed to load resource: the server responded with a status of 403 (Forbidden)",
        ]
        assert p.errors == provoked
        await p.page.context.close()
    finally:
        c.stop()


async def test_a_bridges_session_page_says_how_its_engine_continues_it_and_offers_no_action(
    browser, tmp_path
):
    from console_workflows import make_bridge_sessions
    from flowscope.store import SqliteEventStore

    db = tmp_path / "bridged.db"
    with SqliteEventStore(db) as store:
        asking, orphaned = make_bridge_sessions(store)
    c = Console(str(db), tmp_path)
    try:
        p = await new_page(browser, c)
        await p.open(f"{c.base}/sessions/{asking}")
        note = await p.page.locator("#engine").inner_text()
        assert "Run by langgraph" in note and "graph.invoke(Command(resume=" in note
        assert await p.page.locator("#summary button").count() == 0  # no retry, no cancel
        waiting = p.page.locator("[data-waiting='approve']")
        assert await waiting.is_visible()  # what it waits on, shown
        assert await waiting.locator("textarea, button").count() == 0  # but no answer form
        await p.open(f"{c.base}/sessions/{orphaned}")
        line = await p.page.locator("#stuck [data-state=orphaned]").inner_text()
        assert "ADK continues it" in line and "flowscope" not in line
        assert await p.page.locator("#stuck code").count() == 0  # no command to paste
        assert await p.page.locator("#summary button").count() == 0
        await p.open(f"{c.base}/stuck")  # the stuck page says the same, as text
        fixes = await p.page.locator("#stuck tbody td:last-child").all_inner_texts()
        assert sorted(f.split(":", 1)[0] for f in fixes) == ["ADK continues it", "LangGraph continues it"]
        assert await p.page.locator("#stuck code.cmd").count() == 0
        assert p.errors == []
        await p.page.context.close()
    finally:
        assert "Traceback" not in c.stop()


async def test_a_session_of_ten_thousand_node_runs_keeps_only_the_rows_in_view_and_folds(browser, console):
    """A big session stays usable: only the rows in view are in the page, scrolling to the
    end brings the last row, and folding a nested run hides its 9,999 descendants. How fast
    is measured by bench/console_bench.py, not here; the figures are printed for the log."""
    p = await new_page(browser, console)  # the list first: a warm server, a cold session
    await p.open(f"{console.base}/sessions/{BIG}")
    drawn_ms = await p.page.evaluate("performance.getEntriesByName('flowscope-ready')[0].startTime")
    assert "10000 node run(s)" in await p.page.locator(".wf-note").inner_text()
    assert await p.page.locator(".wf-row").count() < 100  # only the rows in view are in the page
    assert await p.page.locator(".wf-row[data-path$='leaf@9998']").count() == 0
    t = time.perf_counter()
    await p.page.locator(".wf-scroll").evaluate("el => { el.scrollTop = el.scrollHeight; }")
    await p.page.wait_for_selector(".wf-row[data-path$='leaf@9998']", timeout=10_000)
    scrolled = time.perf_counter() - t
    assert await p.page.locator(".wf-row").count() < 100
    fan = p.page.locator(".wf-row[data-path='big@1/fan@1'] .wf-toggle")
    await p.page.locator(".wf-scroll").evaluate("el => { el.scrollTop = 0; }")
    await fan.click()
    await p.page.wait_for_function("document.querySelector('.wf-note').textContent.includes('2 shown')")
    print(
        f"\n10,000-run session: drawn {drawn_ms:.0f} ms after navigation, scrolled to the end in {scrolled * 1000:.0f} ms"
    )
    assert p.errors == []
    await p.page.context.close()  # and its event stream


def start_named_worker(db: str, logs: Path, name: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """A ``flowscope worker`` serving ``recovering`` as ``name`` on host ``host-<name>``, 2 s leases."""
    with open(logs / f"{name}.stderr", "w") as err:
        return start_cli(
            *("--db", db, "worker", "console_workflows:recovering", "--lease", "2s", "--poll", "100ms"),
            *("--worker-id", name),
            env={**env, "FLOWSCOPE_HOST": f"host-{name}"},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


async def test_a_worker_killed_mid_attempt_is_taken_over_and_the_page_shows_both_workers(browser, tmp_path):
    import httpx

    from console_workflows import HOLD_ENV, recovering
    from flowscope import Runner
    from flowscope.store import SqliteEventStore

    db, held = tmp_path / "recovery.db", tmp_path / "holding"
    env = {**_env(), HOLD_ENV: str(held)}
    with SqliteEventStore(db) as store:
        sid = Runner(recovering, store).submit(7, session_id="recovered")
    first = start_named_worker(str(db), tmp_path, "worker-a", env)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():  # the first attempt is inside its body
            assert first.poll() is None and time.monotonic() < deadline, (
                tmp_path / "worker-a.stderr"
            ).read_text()
            time.sleep(0.05)
        first.kill()  # SIGKILL: its lease stays in the store until it expires
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    # another host: it cannot see worker-a's process, so it waits for the lease to expire
    second = start_named_worker(str(db), tmp_path, "worker-b", env)
    c = Console(str(db), tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            with SqliteEventStore(db, readonly=True) as store:
                info = store.session_info(sid)
            if info is not None and info.status == "completed":
                break
            assert second.poll() is None and time.monotonic() < deadline, (
                tmp_path / "worker-b.stderr"
            ).read_text()
            time.sleep(0.1)
        token = c.url.split("token=", 1)[1]
        async with httpx.AsyncClient(
            base_url=c.base, headers={"x-flowscope-token": token}, timeout=10
        ) as http:
            run = (await http.get(f"/api/sessions/{sid}/run", params={"path": "recovering@1/hold@1"})).json()
        attempts = [
            (a["attempt"], a["owner"]["worker_id"], a["owner"]["host"], a["outcome"], a["recovered"])
            for a in run["attempts"]
        ]
        assert attempts == [
            (1, "worker-a", "host-worker-a", "lost", False),
            (2, "worker-b", "host-worker-b", "completed", True),
        ]
        assert run["row"]["recoveries"] == 1

        p = await new_page(browser, c)
        await p.open(f"{c.base}/sessions/{sid}")
        row = p.page.locator(".wf-row[data-path='recovering@1/hold@1']")
        assert await row.locator(".seg.recovered").count() == 1  # the recovery, marked on the bar
        await row.click()
        await p.page.wait_for_selector("#detail table.rows")
        table = p.page.locator("#detail table.rows").first
        workers = await table.locator("td.worker").all_inner_texts()
        outcomes = await table.locator("tbody td:nth-child(6)").all_inner_texts()
        assert workers == ["worker-a on host-worker-a", "worker-b on host-worker-b"]
        assert outcomes == ["lost", "completed (recovered)"]
        assert p.errors == []
        await p.page.context.close()
    finally:
        stop(second)
        err = c.stop()
    assert "Traceback" not in err, err


@pytest.fixture(scope="module")
def pg_url(pg_cluster) -> str:
    """A database owned by the password role, with the operator's sessions; its URL, with
    the password in it (which nothing may show)."""
    from flowscope.store.postgres import PostgresEventStore
    from pg_cluster import PASSWORD, PASSWORD_ROLE

    name = f"ui_{os.getpid()}"
    with pg_cluster.admin() as a:
        a.execute(f"CREATE DATABASE {name} OWNER {PASSWORD_ROLE}")
    url = pg_cluster.url(name, user=PASSWORD_ROLE, password=PASSWORD)
    with PostgresEventStore(url) as store:
        make_operator_sessions(store, pause_s=1.1)
    return url


async def test_the_console_on_postgresql_lists_draws_and_answers(browser, pg_url, tmp_path):
    from pg_cluster import PASSWORD

    url = pg_url
    c = Console(url, tmp_path)
    worker = start_worker(url, tmp_path)
    try:
        assert PASSWORD not in c.url
        p = await new_page(browser, c)
        assert PASSWORD not in await p.page.content() and "***" in await p.page.locator("#db").inner_text()
        listed = set(await p.page.locator("#list td.id a").all_inner_texts())
        assert listed == {APPROVAL_SESSION, FAILED_SESSION, PAUSED_SESSION}
        await p.open(f"{c.base}/sessions/{APPROVAL_SESSION}")
        assert await p.page.locator(".wf-head .gap").count() == 1
        form = p.page.locator("[data-waiting=approval]")
        await form.locator("button[data-submit]").click()
        await p.page.click("#confirm-yes")
        try:
            await status_of(p, "completed")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; worker: {(tmp_path / 'worker.stderr').read_text()[-2000:]}"
            ) from None
        assert p.errors == []
        await p.page.context.close()
    finally:
        stop(worker)
        err = c.stop()
    assert PASSWORD not in err and "Traceback" not in err, err


async def test_an_answer_being_typed_survives_the_events_another_branch_appends(browser, console, demo_db):
    import threading

    from console_workflows import split
    from flowscope import Runner
    from flowscope.store import SqliteEventStore

    def run() -> None:
        with SqliteEventStore(demo_db) as store:
            Runner(split, store).run_sync(12, session_id="ops-split")

    other = threading.Thread(target=run)
    other.start()
    try:
        p = await new_page(browser, console)
        await p.open(f"{console.base}/sessions/ops-split")
        text = p.page.locator("[data-waiting=ship] textarea")
        await text.wait_for(timeout=10_000)
        await text.fill('{"approved": true, "note": "half typed')
        rows = await p.page.locator(".wf-row").count()
        for _ in range(100):  # the other branch's runs drawn (the page's CSP refuses an evaluated string)
            if await p.page.locator(".wf-row").count() >= rows + 3:
                break
            await asyncio.sleep(0.1)
        assert await p.page.locator(".wf-row").count() >= rows + 3
        assert await text.input_value() == '{"approved": true, "note": "half typed'  # not redrawn to `true`
        assert await text.evaluate(
            "el => el === document.activeElement"
        )  # and still where the operator types
        assert p.errors == []
        await p.page.context.close()
    finally:
        other.join(timeout=30)


async def test_a_bulk_cancel_from_the_page_acts_on_the_sessions_it_listed(browser, console, demo_db):
    from flowscope.engine.submit import submit_run
    from flowscope.store import SqliteEventStore

    with SqliteEventStore(demo_db) as store:
        for sid in ("probe-1", "probe-2"):
            submit_run(store, "bulk_probe", None, session_id=sid)
    p = await new_page(browser, console)
    await p.page.select_option("#main select[name=action]", "cancel")
    await p.page.fill("input[name=bulk-workflow]", "bulk_probe")
    await p.page.select_option("select[name=bulk-state]", "queued")
    await p.page.click("#bulk-go")
    await p.page.wait_for_selector("#confirm[open]")
    assert "probe-1, probe-2" in await p.page.locator("#confirm-text").inner_text()
    await p.page.fill("#confirm-reason", "not tonight")
    await p.page.press("#confirm-reason", "Enter")  # Enter confirms, as the button does
    for _ in range(100):
        if "2 of 2 done" in await p.page.locator("#bulk-out").inner_text():
            break
        await asyncio.sleep(0.1)
    assert "cancel: 2 of 2 done" in await p.page.locator("#bulk-out").inner_text()
    with SqliteEventStore(demo_db, readonly=True) as store:
        assert {s.session_id: s.status for s in store.sessions() if s.workflow == "bulk_probe"} == {
            "probe-1": "cancelled",
            "probe-2": "cancelled",
        }
    assert p.errors == []
    await p.page.context.close()


async def test_a_waterfall_row_and_an_attempt_open_from_the_keyboard(browser, console, demo_db):
    from flowscope.store import SqliteEventStore

    with SqliteEventStore(demo_db, readonly=True) as store:  # the demo's declined batch stays failed
        declined = next(s.session_id for s in store.sessions() if s.session_id.endswith("-declined"))
    p = await new_page(browser, console)
    await p.open(f"{console.base}/sessions/{declined}")
    row = p.page.locator(".wf-row").last
    await row.focus()
    await p.page.keyboard.press("Enter")
    await p.page.wait_for_selector("#detail table.rows")
    assert await p.page.locator("#retry-from").is_enabled()  # a node chosen: "Retry from" can be used
    await p.page.locator("#detail table.rows").first.locator("tbody tr").first.focus()
    await p.page.keyboard.press("Enter")
    assert (await p.page.locator("#attempt-filter").inner_text()).startswith("attempt 1")
    assert p.errors == []
    await p.page.context.close()


async def test_an_invocation_is_labelled_by_its_last_hex_digits_with_the_whole_id_in_its_title(
    browser, console, demo_db
):
    """Invocation ids are UUIDv7 (time first): two invocations a minute apart share their
    first 8 hex digits. The Attempts table and the event log label each by its last 8, so
    the approval's enrichment (a job, then its result 1.1 s later) reads as two invocations."""
    from flowscope.store import SqliteEventStore

    node = "order_fulfilment@1/enrich_addresses@1"
    with SqliteEventStore(demo_db, readonly=True) as store:
        log = [e for e in store.read(APPROVAL_SESSION) if e.path == node]
    started = [e.invocation_id for e in log if e.type == "node_started"]
    assert len(set(started)) == 2
    p = await new_page(browser, console)
    await p.open(f"{console.base}/sessions/{APPROVAL_SESSION}")
    await p.page.locator(f".wf-row[data-path='{node}']").click()
    await p.page.wait_for_selector("#detail table.rows")
    labels = p.page.locator("#detail table.rows").first.locator("tbody td.id span")
    shown = await labels.evaluate_all("els => els.map(e => [e.textContent, e.title])")
    assert shown == [[i[-8:], i] for i in started]
    await p.page.fill("#events input[name=ev-path]", node)
    await p.page.locator("#events button", has_text="Show").click()
    await p.page.wait_for_selector("#events table.rows")
    inv = p.page.locator("#events table.rows tbody tr td:nth-child(4) span")
    shown = await inv.evaluate_all("els => els.map(e => [e.textContent, e.title])")
    assert shown == [[e.invocation_id[-8:], e.invocation_id] for e in log]
    assert p.errors == []
    await p.page.context.close()


async def test_a_list_page_past_the_last_session_says_so_and_links_the_last_page_with_rows(browser, console):
    """An offset past the end (an old link, sessions pruned) reads no row: the pager says
    there is none on this page and how many there are, and links the last page that has
    some, never a range like "1001-1000" nor a "newer" page that is empty too."""
    p = await new_page(browser, console)
    await p.open(f"{console.base}/?limit=5&offset=1000")
    said = await p.page.locator("#count").inner_text()
    assert said.startswith("No session on this page (") and said.endswith(" in all)"), said
    total = int(said.split("(")[1].split()[0])
    assert 5 < total < 1000
    links = p.page.locator(".pager a")
    assert await links.all_inner_texts() == ["last page"]
    last = (total - 1) // 5 * 5
    assert await links.get_attribute("href") == f"/?limit=5&offset={last}"
    await p.open(console.base + f"/?limit=5&offset={last}")
    assert await p.page.locator("#count").inner_text() == f"{last + 1}-{total} of {total}"
    assert await p.page.locator(".pager a").all_inner_texts() == ["newer"]
    assert p.errors == []
    await p.page.context.close()
