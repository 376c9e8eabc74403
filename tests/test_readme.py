"""The README's first workflow runs as printed and passes a type checker: what a newcomer
pastes first is what the package does, and what its type hints promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from commands import cli_env

ROOT = Path(__file__).resolve().parent.parent


def first_workflow() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## A first workflow", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's first workflow has no python block"
    return match.group(1)


@pytest.mark.slow
def test_the_readmes_first_workflow_runs_as_printed_and_type_checks(tmp_path: Path):
    script = tmp_path / "first_workflow.py"
    script.write_text(first_workflow())
    env = cli_env()  # no OTEL_* variable: its spans go nowhere
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "paused ['approval']", run.stdout
    # the lines a user types against the API (the nodes' bodies are untyped, as in the README)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
