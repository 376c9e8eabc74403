"""``flowscope ui`` listens before it prints its URL: whoever opens the URL at once is served.

The process is stopped (SIGSTOP) as soon as its first line is read, so nothing of uvicorn's
start-up can run after it: a connection must still be accepted by the kernel (the socket is
listening, the connection waits in the backlog) and answered once the process goes on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from commands import start_cli
from flowscope.store.sqlite import SqliteEventStore

pytestmark = pytest.mark.slow


def test_the_url_printed_first_is_already_listening(tmp_path: Path) -> None:
    db = tmp_path / "ui.db"
    SqliteEventStore(db).close()  # the console serves a store that exists
    proc = start_cli("--db", str(db), "ui", "--port", "0", stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        os.kill(proc.pid, signal.SIGSTOP)
        host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
        # refused if the socket were only bound: a stopped process cannot start listening
        with socket.create_connection((host, int(port)), timeout=5):
            pass
        os.kill(proc.pid, signal.SIGCONT)
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stopping_with_a_page_open_ends_its_change_stream_without_a_traceback(tmp_path: Path, sig) -> None:
    import threading
    import time

    db = tmp_path / "ui.db"
    SqliteEventStore(db).close()
    proc = start_cli("--db", str(db), "ui", "--port", "0", stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    url = proc.stdout.readline().strip()
    base, token = url.split("/?token=")
    opened = threading.Event()
    ended: list[bytes] = []

    def page() -> None:  # what an open page holds: the live stream of changes
        request = urllib.request.Request(base + "/api/live", headers={"X-Flowscope-Token": token})
        with urllib.request.urlopen(request, timeout=30) as stream:
            ended.append(stream.readline())
            opened.set()
            ended.append(stream.read())  # to its end: the server ends it

    t = threading.Thread(target=page, daemon=True)
    t.start()
    assert opened.wait(30)
    started = time.monotonic()
    proc.send_signal(sig)
    err = proc.communicate(timeout=30)[1]
    took = time.monotonic() - started
    t.join(timeout=5)
    assert "Traceback" not in err and "ERROR" not in err, err
    assert len(err.strip().splitlines()) <= 2, err  # the start line, and "interrupted" for Ctrl-C
    assert ended and ended[0].startswith(b"retry:") and not t.is_alive()
    assert took < 3, took  # within a turn of the stream, not the graceful wait's cut-off
