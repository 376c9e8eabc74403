"""The package ships ``py.typed``: a type checker sees the public API's real signatures,
not ``Any`` (a lazily imported name, a decorator), so a misspelt argument is caught
before it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from commands import cli_env

USER_CODE = """
from flowscope import Node, node
from flowscope.observability import MetricsPlugin, StoreCollector, TracingPlugin, configure_tracing, serve_metrics

@node
def plain(x: int) -> int:
    return x

@node(name="named")
def named(x: int) -> int:
    return x

a: Node = plain
b: Node = named
configure_tracing("svc", otlp_endpiont="http://127.0.0.1:4318")
MetricsPlugin(registery=None)
TracingPlugin(record_stacktraces=True)
StoreCollector(stor=None)
serve_metrics(prot=0)
"""


@pytest.mark.slow
def test_the_public_api_is_typed_for_a_type_checker(tmp_path: Path):
    script = tmp_path / "user.py"
    script.write_text(USER_CODE)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(script)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = checked.stdout
    for line, argument in (
        (15, "otlp_endpiont"),
        (16, "registery"),
        (17, "record_stacktraces"),
        (18, "stor"),
    ):
        assert f'user.py:{line}: error: Unexpected keyword argument "{argument}"' in out, out
    assert 'user.py:19: error: Unexpected keyword argument "prot"' in out, out
    assert out.count(": error:") == 5, out  # and none where a decorated function is taken for a Node
