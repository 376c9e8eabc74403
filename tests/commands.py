"""The commands the tests run as a user runs them: where they are, the environment they run
in, and the two ways a test starts one (to its end, or in the background)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["FLOWSCOPE", "SRC", "cli_env", "run_cli", "start_cli"]

#: The ``flowscope`` console script that ``pip install`` put beside the interpreter running
#: the tests: this checkout's, not whichever one comes first on ``PATH``.
FLOWSCOPE = str(Path(sys.executable).parent / "flowscope")
#: This checkout's sources, first on the ``PYTHONPATH`` of every command a test runs.
SRC = str(Path(__file__).resolve().parents[1] / "src")


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment for a command: no ``FLOWSCOPE_DB`` and no ``OTEL_*``
    variable (a test sets those it means in ``extra``), this checkout's sources first."""
    env = {k: v for k, v in os.environ.items() if k != "FLOWSCOPE_DB" and not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def run_cli(
    *args: str, cwd: Path, env: dict[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``flowscope ARGS`` to its end, its output captured as text."""
    return subprocess.run(
        [FLOWSCOPE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def start_cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``flowscope ARGS`` in the background (a worker, a server), its output piped as text."""
    return subprocess.Popen(
        [FLOWSCOPE, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
