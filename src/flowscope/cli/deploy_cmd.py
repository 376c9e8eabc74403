"""``flowscope deploy-files DIR``: write the Grafana dashboard, the Prometheus alert rules
and the collector configs that ship inside the package, for a user who installed it with pip.

They are the files of the repository's ``dashboards/`` and ``collectors/`` (package data
under ``flowscope/deploy``), written as the same two folders, so the compose file's relative
paths (``../dashboards/...``) hold. Nothing is overwritten unless ``--force``.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import click

from .app import not_empty
from .failures import CliError

__all__ = ["deploy_files", "COMMANDS", "FOLDERS", "shipped_files"]

#: The folders shipped under ``flowscope/deploy``, written out under the same names.
FOLDERS = ("dashboards", "collectors")


def shipped_files() -> dict[str, Traversable]:
    """Every shipped file by its path relative to the output folder (``dashboards/...``)."""
    root = resources.files("flowscope") / "deploy"
    out: dict[str, Traversable] = {}

    def walk(node: Traversable, rel: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            path = f"{rel}/{child.name}"
            if child.is_dir():
                walk(child, path)
            elif child.is_file() and not child.name.endswith((".pyc", ".py")):
                out[path] = child

    for folder in FOLDERS:
        node = root / folder
        if not node.is_dir():
            raise CliError(
                f"this flowscope install has no {folder}/ (a broken install?); reinstall flowscope"
            )
        walk(node, folder)
    return out


@click.command("deploy-files")
@click.argument("directory", type=click.Path(file_okay=False), callback=not_empty)
@click.option("--force", is_flag=True, help="Overwrite files that exist already.")
def deploy_files(directory: str, force: bool) -> None:
    """Write the dashboards, alert rules and collector configs into DIRECTORY.

    DIRECTORY/dashboards holds the Grafana dashboard and provisioning and the Prometheus
    alert rules (with their promtool tests); DIRECTORY/collectors the OpenTelemetry
    Collector, Prometheus and Tempo configs and a compose file that starts them with
    Jaeger and Grafana (docs/operations.md). Exit code 0 once written, 2 if a file exists
    (without --force) or cannot be written.
    """
    files = shipped_files()
    folder = Path(directory)
    targets = {rel: folder / rel for rel in files}
    if not force:
        there = [rel for rel, path in targets.items() if path.exists()]
        if there:
            raise CliError(
                f"{len(there)} of the files exist already in {directory} (first: {there[0]}); "
                "pass --force to overwrite them, or choose an empty folder"
            )
    try:
        for rel, source in files.items():
            target = targets[rel]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    except OSError as exc:
        raise CliError(f"cannot write into {directory}: {exc.strerror or exc}") from None
    click.echo(f"wrote {len(files)} files into {directory}: " + ", ".join(f"{f}/" for f in FOLDERS))
    click.echo(f"  start them: docker compose -f {folder / 'collectors' / 'docker-compose.yml'} up -d")


COMMANDS = [deploy_files]
