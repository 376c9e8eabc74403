"""Where ``flowscope ui`` listens: on the loopback address unless ``--host`` says otherwise
(docs/ui.md, security model), so other machines never reach a console by default. The
server is not run: the socket handed to it is looked at, in process."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

try:
    import uvicorn
except ImportError:  # CI installs the extra: there a missing one is a failure, never a skip
    if os.environ.get("CI"):
        raise
    pytest.skip("the console's extra is not installed: pip install -e '.[ui]'", allow_module_level=True)

from flowscope.cli import cli  # noqa: E402
from flowscope.store import SqliteEventStore  # noqa: E402


def test_the_console_listens_on_the_loopback_address_by_default(tmp_path, monkeypatch):
    db = tmp_path / "ui.db"
    SqliteEventStore(db).close()
    bound: list[str] = []

    def run(self, sockets=None):  # instead of serving: where the socket listens
        bound.extend(s.getsockname()[0] for s in sockets)

    monkeypatch.setattr(uvicorn.Server, "run", run)
    r = CliRunner().invoke(cli, ["--db", str(db), "ui", "--port", "0"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert bound == ["127.0.0.1"]
