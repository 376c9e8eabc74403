"""The dashboards, alert rules and collector configs ship inside the package, and
``flowscope deploy-files DIR`` writes them out for a pip user, refusing to overwrite."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowscope.cli import cli
from flowscope.cli.deploy_cmd import FOLDERS, shipped_files

ROOT = Path(__file__).resolve().parents[2]


def repo_files() -> dict[str, bytes]:
    """The files of the repository's dashboards/ and collectors/ (the folders users know)."""
    out = {}
    for folder in FOLDERS:
        base = ROOT / folder
        for p in sorted(base.rglob("*")):
            if p.is_file():
                out[f"{folder}/{p.relative_to(base).as_posix()}"] = p.read_bytes()
    return out


def test_every_dashboard_and_collector_file_is_package_data():
    files = repo_files()
    assert "dashboards/prometheus/flowscope-alerts.yml" in files and "collectors/docker-compose.yml" in files
    assert {rel: f.read_bytes() for rel, f in shipped_files().items()} == files


def test_deploy_files_writes_them_all_byte_for_byte(tmp_path):
    out = tmp_path / "ops"
    result = CliRunner().invoke(cli, ["deploy-files", str(out)])
    assert result.exit_code == 0, result.output
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert written == repo_files()
    # the compose file's relative mounts resolve inside what was written
    assert (out / "collectors" / ".." / "dashboards" / "prometheus" / "flowscope-alerts.yml").is_file()


def test_deploy_files_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "ops"
    alerts = out / "dashboards" / "prometheus" / "flowscope-alerts.yml"
    alerts.parent.mkdir(parents=True)
    alerts.write_text("my own rules\n")
    result = CliRunner().invoke(cli, ["deploy-files", str(out)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--force" in lines[0] and "Traceback" not in result.output
    assert alerts.read_text() == "my own rules\n"  # nothing lost
    assert not (out / "collectors").exists()  # nothing half-written either
    result = CliRunner().invoke(cli, ["deploy-files", "--force", str(out)])
    assert result.exit_code == 0
    assert alerts.read_bytes() == repo_files()["dashboards/prometheus/flowscope-alerts.yml"]


def test_deploy_files_into_a_file_is_one_line_and_exit_two(tmp_path):
    blocker = tmp_path / "ops"
    blocker.write_text("a file, not a folder")
    result = CliRunner().invoke(cli, ["deploy-files", str(blocker / "sub")])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.slow
def test_the_wheel_carries_the_dashboards_and_collectors(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("flowscope-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in repo_files():
        assert f"flowscope/deploy/{rel}" in names, rel
