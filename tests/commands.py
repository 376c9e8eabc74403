"""The commands the tests run as a user runs them: where they are, the environment they run
in, and the two ways a test starts one (to its end, or in the background)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

__all__ = ["FLOWSCOPE", "ROOT", "SRC", "cli_env", "cli_ok", "run_cli", "start_cli"]

#: The ``flowscope`` console script that ``pip install`` put beside the interpreter running
#: the tests: this checkout's, not whichever one comes first on ``PATH``.
FLOWSCOPE = str(Path(sys.executable).parent / "flowscope")
#: The checkout: on a command's ``PYTHONPATH`` (``paths=``) when it imports the tests'
#: workflows (``tests.chaos_workflows:ALL``).
ROOT = str(Path(__file__).resolve().parents[1])
#: This checkout's sources, first on the ``PYTHONPATH`` of every command a test runs.
SRC = str(Path(ROOT) / "src")
#: Where a stream goes: ``subprocess.PIPE``/``DEVNULL``/``STDOUT``, an open file, or None (inherited).
Stream = int | IO[Any] | None


def cli_env(*, drop: Iterable[str] = (), paths: Iterable[str | Path] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a command: without ``FLOWSCOPE_DB``, any ``OTEL_*``
    variable and the names in ``drop`` (a test sets those it means in ``extra``); this
    checkout's sources first on ``PYTHONPATH``, then ``paths``, then what was there."""
    gone = {"FLOWSCOPE_DB", *drop}
    env = {k: v for k, v in os.environ.items() if k not in gone and not k.startswith("OTEL_")}
    # no empty entry: Python reads one as the current directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, *map(str, paths), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def run_cli(
    *args: str,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    stdin: Stream = subprocess.DEVNULL,
) -> subprocess.CompletedProcess[str]:
    """``flowscope ARGS`` to its end, its output captured as text; ``env`` defaults to
    :func:`cli_env`, and nothing is read from the terminal unless ``stdin`` says so."""
    return subprocess.run(
        [FLOWSCOPE, *args],
        cwd=cwd,
        env=cli_env() if env is None else env,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_ok(*args: str, **kwargs: Any) -> str:
    """:func:`run_cli` of a command that must succeed: its standard output; the test fails
    with the command's exit code and standard error if it does not exit 0."""
    done = run_cli(*args, **kwargs)
    assert done.returncode == 0, f"flowscope {' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def start_cli(
    *args: str,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    stdin: Stream = None,
    stdout: Stream = subprocess.PIPE,
    stderr: Stream = subprocess.PIPE,
    start_new_session: bool = False,
) -> subprocess.Popen[str]:
    """``flowscope ARGS`` in the background (a worker, a server), its output piped as text
    unless ``stdout``/``stderr`` say otherwise; ``env`` defaults to :func:`cli_env`;
    ``start_new_session``: out of the test's process group (a signal sent to the group
    does not reach it)."""
    return subprocess.Popen(
        [FLOWSCOPE, *args],
        cwd=cwd,
        env=cli_env() if env is None else env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=start_new_session,
    )
