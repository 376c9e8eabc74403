"""Live pages on PostgreSQL: the console ``LISTEN``\\s for the store's notice of a status
change, so a change made by another process reaches every open event stream at once,
long before the feed's polling interval, and the store is probed once per notice
whatever the number of open pages."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from commands import cli_env

pytestmark = pytest.mark.slow

PAGES = 5
#: The feed's polling interval here: a change that arrives sooner came by a notice.
INTERVAL_S = 30.0
#: Another process: a run whose status moves twice (running, then completed 0.6 s later):
#: its first append takes the store's locking path, the last its one-statement path.
OTHER = """
import asyncio, sys
from flowscope import START, Runner, Workflow, node
from flowscope.store.postgres import PostgresEventStore

@node
async def nap(ctx, x):
    await asyncio.sleep(0.6)
    return x

with PostgresEventStore(sys.argv[1]) as store:
    asyncio.run(Runner(Workflow("napping", edges=[(START, nap)]), store).run(1, session_id="napped"))
"""


async def next_event(lines: AsyncIterator[str], timeout: float) -> str:
    """The name of the stream's next event (its data and keep-alive comments skipped)."""

    async def read() -> str:
        async for line in lines:
            if line.startswith("event: "):
                return line[len("event: ") :]
        raise AssertionError("the event stream ended")

    return await asyncio.wait_for(read(), timeout)


async def test_on_postgresql_another_process_change_wakes_every_open_stream_with_one_probe(pg_cluster):
    import httpx
    import uvicorn

    from flowscope.console.app import ConsoleConfig, create_app
    from flowscope.store.postgres import PostgresEventStore

    url = pg_cluster.new_database("live")
    PostgresEventStore(url).close()  # the schema, so the console can open it read-only
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    store = PostgresEventStore(url, readonly=True)
    cfg = ConsoleConfig(store=store, db_shown=url, port=port, read_only=True, live_interval_s=INTERVAL_S)
    app = create_app(cfg)
    feed = app.state.feed
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(
            base_url=base, headers={"x-flowscope-token": cfg.token}, timeout=60
        ) as http:
            async with OpenStreams(http, PAGES) as pages:
                for lines in pages:
                    assert await next_event(lines, 10) == "hello"
                deadline = time.monotonic() + 10
                while feed.probes < 2:  # the first page's probe, then the listener's first look
                    assert time.monotonic() < deadline, "the feed never started listening"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)  # (that look found nothing new: no page was sent a change)
                before = feed.probes
                other = subprocess.Popen(
                    [sys.executable, "-c", OTHER, url], env=cli_env(), stderr=subprocess.PIPE, text=True
                )
                t0 = time.monotonic()
                try:
                    for step in ("running", "completed"):
                        for lines in pages:
                            assert await next_event(lines, 10) == "change", step
                        took = time.monotonic() - t0
                        print(f"\n{step}: every one of {PAGES} open streams heard of it after {took:.2f}s")
                        assert took < 5.0 < INTERVAL_S
                finally:
                    _, err = other.communicate(timeout=60)
                assert other.returncode == 0, err
                # one probe per notice, however many pages wait on the feed
                assert feed.probes - before == 2
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        store.close()


class OpenStreams:
    """``n`` open ``GET /api/live`` streams on ``http``: each one's line iterator."""

    def __init__(self, http: Any, n: int) -> None:
        self.http, self.n = http, n
        self._cms: list[Any] = []

    async def __aenter__(self) -> list[AsyncIterator[str]]:
        out = []
        for _ in range(self.n):
            cm = self.http.stream("GET", "/api/live")
            response = await cm.__aenter__()
            assert response.status_code == 200
            self._cms.append(cm)
            out.append(response.aiter_lines())
        return out

    async def __aexit__(self, *exc: Any) -> None:
        for cm in reversed(self._cms):
            await cm.__aexit__(None, None, None)
