"""The commands that serve metrics, as processes: where they listen, and what they need.

- ``--metrics-host`` on every command that serves metrics (``demo --metrics-port``,
  ``worker --metrics-port``, ``serve-metrics``): the endpoint answers on that address and
  not on loopback's 127.0.0.1 (a Prometheus in a container reaches a host address only);
- the demo's worker process opens a SQLite file on an install without psycopg (the
  README's ``pip install -e '.[test]'``: no ``postgres`` extra).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from commands import cli_env, start_cli
from prom_harness import free_port
from waiting import wait_for

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
#: Another loopback address (all of 127/8 is loopback on Linux): bound explicitly, so an
#: endpoint that ignored --metrics-host would not answer on it.
OTHER_HOST = "127.0.0.2"
NO_PSYCOPG = "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None; "


def _env() -> dict[str, str]:
    return cli_env(paths=(TESTS,))  # signal_workflows


def _answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as resp:
            return resp.status == 200 and b"flowscope_" in resp.read()
    except OSError:
        return False


def _alive(proc: subprocess.Popen[str], log: Path) -> bool:
    """False while ``proc`` runs; the test fails with its log if it ended."""
    assert proc.poll() is None, log.read_text()
    return False


def _closed(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) != 0


def test_every_command_that_serves_metrics_binds_metrics_host(tmp_path):
    db = str(tmp_path / "m.db")
    ports = {"demo": free_port(), "worker": free_port(), "serve": free_port()}
    commands = {
        "demo": ["demo", "--db", db, "--metrics-host", OTHER_HOST, "--metrics-port", str(ports["demo"])],
        "worker": [
            "worker",
            "signal_workflows:SERVED",
            "--db",
            db,
            "--metrics-host",
            OTHER_HOST,
            "--metrics-port",
            str(ports["worker"]),
            "--drain",
            "0s",
        ],
        "serve": ["serve-metrics", "--db", db, "--metrics-host", OTHER_HOST, "--port", str(ports["serve"])],
    }
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name in ("demo", "worker", "serve"):  # serve-metrics needs the database the demo makes
            log = open(tmp_path / f"{name}.log", "wb")
            with log:
                procs[name] = start_cli(
                    *commands[name],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=tmp_path,
                    env=_env(),
                    start_new_session=True,
                )
            wait_for(
                lambda: _answers(OTHER_HOST, ports[name]) or _alive(procs[name], tmp_path / f"{name}.log"),
                timeout=40,
                what=f"{name} on {OTHER_HOST}:{ports[name]}",
                interval=0.1,
            )
            assert _closed("127.0.0.1", ports[name]), f"{name} listens on 127.0.0.1 too"
        for name, proc in procs.items():
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, (tmp_path / f"{name}.log").read_text()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_the_demo_worker_opens_a_sqlite_file_without_psycopg(tmp_path):
    """``python -m flowscope.examples.worker`` (the process ``flowscope demo`` kills) with
    psycopg unimportable, as on the README's install: it runs its workflow on the file."""
    db = str(tmp_path / "w.db")
    code = NO_PSYCOPG + (
        "from flowscope.examples.worker import main; "
        f"sys.exit(main(['--db', {db!r}, '--session', 's1', '--hang', '0', '--heartbeat', '0.2']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "s1: completed"
