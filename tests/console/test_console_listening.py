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
