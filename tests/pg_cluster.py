"""A throwaway PostgreSQL cluster for the tests and the benchmark: Debian's binaries,
``initdb`` and ``pg_ctl`` in a temporary folder, listening on 127.0.0.1 and a free port.

Roles: ``postgres`` (the superuser, over the folder's unix socket), ``flowscope`` (trust,
may create databases: what the tests connect as) and ``flowscope_pw`` (password
``s3cret-pw``, scram-sha-256 over TCP: the wrong-credentials test). Run as root, the
binaries run as the ``postgres`` user (the server refuses to run as root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PgCluster", "BIN_DIR", "MISSING_HINT", "TEST_ROLE", "PASSWORD_ROLE", "PASSWORD"]

BIN_DIR = Path(os.environ.get("FLOWSCOPE_PG_BIN", "/usr/lib/postgresql/15/bin"))
MISSING_HINT = (
    f"PostgreSQL server binaries not found in {BIN_DIR} (initdb, pg_ctl): "
    "install them with `sudo apt-get install -y postgresql` (or set FLOWSCOPE_PG_BIN)"
)
TEST_ROLE = "flowscope"
PASSWORD_ROLE = "flowscope_pw"
PASSWORD = "s3cret-pw"

#: Test settings: durability off (a test cluster is thrown away) unless ``durable=True``.
_FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgCluster:
    """One running cluster; :meth:`start` makes it, :meth:`stop` removes it."""

    root: Path
    port: int
    durable: bool = False
    settings: dict[str, str] = field(default_factory=dict)
    _dbs: int = 0

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    # ------------------------------------------------------------------ processes

    @staticmethod
    def _as_postgres(cmd: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *cmd]
        return cmd

    def _run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = self._as_postgres([str(BIN_DIR / args[0]), *args[1:]])
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)

    @classmethod
    def start(cls, *, durable: bool = False, max_connections: int = 300, **settings: str) -> PgCluster:
        for binary in ("initdb", "pg_ctl", "postgres"):
            if not (BIN_DIR / binary).exists():
                raise RuntimeError(MISSING_HINT)
        root = Path(tempfile.mkdtemp(prefix="flowscope-pg-"))
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        os.chmod(root, 0o755)
        c = cls(root=root, port=free_port(), durable=durable, settings=dict(settings))
        c._init(max_connections)
        c._pg_ctl_start()
        c._create_roles()
        return c

    def _init(self, max_connections: int) -> None:
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"
        )
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": str(max_connections),
            "shared_buffers": "'128MB'",
            "log_min_messages": "'fatal'",
            **({} if self.durable else _FAST),
            **self.settings,
        }
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\n# flowscope test cluster\n")
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        # The password role must authenticate; everyone else is trusted.
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
            "host all all 127.0.0.1/32 trust\n"
        )
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.socket_dir, "postgres", "postgres")
            for p in (self.data / "postgresql.conf", self.data / "pg_hba.conf"):
                shutil.chown(p, "postgres", "postgres")

    def _pg_ctl_start(self) -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "30", "start"
        )

    def _create_roles(self) -> None:
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {TEST_ROLE} LOGIN CREATEDB")
            conn.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}'")
            conn.execute(f"CREATE DATABASE {TEST_ROLE} OWNER {TEST_ROLE}")

    def stop(self) -> None:
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the data stays."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-m",
            "fast",
            "-w",
            "-t",
            "30",
            "restart",
            "-l",
            str(self.root / "server.log"),
        )

    def stop_server(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def start_server(self) -> None:
        self._pg_ctl_start()

    def freeze(self) -> list[int]:
        """SIGSTOP the postmaster and its children, as a frozen host: the open connections
        stay open and nothing answers on them, nor a new one's startup. :meth:`thaw` them."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[1]) == postmaster:
                pids.append(int(stat.parent.name))
        stopped: list[int] = []
        try:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    if pid == postmaster:
                        raise
                    continue  # a backend that exited meanwhile (its connection closed)
                stopped.append(pid)
        except BaseException:
            self.thaw(stopped)  # never leave a cluster half stopped for the teardown to wait on
            raise
        return stopped

    @staticmethod
    def thaw(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    # ------------------------------------------------------------------ connecting

    def url(self, dbname: str = TEST_ROLE, user: str = TEST_ROLE, password: str | None = None) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, dbname: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user="postgres", dbname=dbname, autocommit=True
        )

    def new_database(self, prefix: str = "t") -> str:
        """A fresh, empty database owned by the test role; its URL."""
        self._dbs += 1
        name = f"{prefix}_{os.getpid()}_{self._dbs}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name} OWNER {TEST_ROLE}")
        return self.url(name)

    def new_schema(self, prefix: str = "s") -> str:
        """A fresh schema in the test role's database; its name."""
        self._dbs += 1
        name = f"{prefix}_{os.getpid()}_{self._dbs}"
        with self.admin(TEST_ROLE) as conn:
            conn.execute(f"CREATE SCHEMA {name} AUTHORIZATION {TEST_ROLE}")
        return name

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.admin():
                    return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL on port {self.port} did not come back within {timeout}s")

    def log_tail(self, n: int = 20) -> Iterator[str]:
        try:
            lines = (self.root / "server.log").read_text().splitlines()
        except OSError:
            return iter(())
        return iter(lines[-n:])
