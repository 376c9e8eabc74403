"""The speed targets' entry point (bench/targets.py): one command prints the targets table
and its exit code says whether every target was met. Timing nothing here: ``--smoke``
runs tiny sizes, and what it measures means nothing; this checks that the bench runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commands import cli_env
from conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python bench/SCRIPT ARGS`` with this tree's ``src`` first on the path."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=timeout,
    )


def target_rows(out: str) -> list[str]:
    """The rows of the targets table ``targets.py`` printed, its header left out."""
    table = out.split("### Targets", 1)[1].splitlines()
    return [line for line in table if line.startswith("| ") and "---" not in line][1:]


@pytest.mark.slow
def test_targets_entry_point_prints_the_table_and_exits_1_exactly_when_a_row_misses() -> None:
    proc = bench("targets.py", "--quick", "--smoke", "--only", "invoke", timeout=120)
    out = proc.stdout
    assert "### Targets" in out, proc.stderr[-2000:]
    rows = target_rows(out)
    # the invocation's one target, measured (peers installed) or reported as not measured
    assert len(rows) == 1, rows
    missed = rows[0].rstrip().endswith("| MISS |")
    assert rows[0].rstrip().endswith("| pass |") or missed, rows
    measured = rows[0].split("|")[3].strip()
    if measured != "not measured":  # a ratio: its median, and the middle half of the repetitions' ratios
        found = re.fullmatch(r"(\d+\.\d)x \((\d+\.\d)x–(\d+\.\d)x\)", measured)
        assert found is not None, rows
        median, low, high = (float(g) for g in found.groups())
        assert low <= median <= high, rows
    assert proc.returncode == (1 if missed else 0), (proc.returncode, rows)


@pytest.mark.slow
def test_targets_entry_point_measures_the_targets_in_seconds_beside_the_ratios() -> None:
    """The resume, the scrape and the console: a row each (two for the console), the time
    in its unit, pass or MISS against the limit, the exit code from the rows."""
    if not Path(os.environ.get("FLOWSCOPE_CHROMIUM", "/usr/lib/chromium/chromium")).exists():
        unavailable(
            "no Chromium for the console's section: apt-get install -y chromium (./scripts/test does)"
        )
    proc = bench("targets.py", "--quick", "--smoke", "--only", "resume,scrape,console", timeout=300)
    out = proc.stdout
    assert "### Targets" in out, proc.stderr[-2000:]
    rows = target_rows(out)
    assert [r.split("|")[1].strip().split(" ")[0] for r in rows] == [
        "resume",
        "StoreCollector",
        "console:",
        "console:",
    ]
    wanted = [r.split("|")[2].strip() for r in rows]
    assert wanted == ["≤ 0.3 s", "≤ 50 ms", "≤ 2 s", "≤ 2 s"], rows
    verdicts = []
    for row, limit in zip(rows, wanted):
        measured = row.split("|")[3].strip()
        unit = limit.split()[-1]
        found = re.match(rf"(\d+\.\d+) {unit}\b", measured)
        assert found is not None, row
        verdict = row.rstrip().rsplit("|", 2)[-2].strip()
        assert verdict == ("pass" if float(found.group(1)) <= float(limit.split()[1]) else "MISS"), row
        verdicts.append(verdict)
    assert proc.returncode == (1 if "MISS" in verdicts else 0), (proc.returncode, rows)


@pytest.mark.slow
def test_targets_entry_point_refuses_an_unknown_section() -> None:
    proc = bench("targets.py", "--only", "chain,nope", timeout=60)
    assert proc.returncode == 2
    assert "unknown section(s) nope" in proc.stderr


@pytest.mark.slow
def test_telemetry_layers_prints_one_row_per_layer_for_every_workload() -> None:
    """bench/telemetry_layers.py --smoke: each layer's row, for the chain, the sessions and the invocations,
    with figures in every timed column (the layers it overrides still exist)."""
    proc = bench("telemetry_layers.py", "--smoke", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tables = proc.stdout.split("### ")[1:]
    assert len(tables) == 3, proc.stdout
    for table in tables:
        rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
        assert [r.split("|")[1].strip() for r in rows][0] == "engine alone"
        assert rows[-1].split("|")[1].strip() == "+ metrics: the full stack"
        assert len(rows) == 6
        for row in rows:
            cells = [c.strip() for c in row.split("|")[1:-1]]
            assert float(cells[1]) > 0 and float(cells[3]) > 0, row


@pytest.mark.slow  # a console-script run of the bench
def test_wal_pages_reads_one_frame_per_one_row_commit_and_more_per_node():
    """bench/wal_pages.py counts commits and pages from the WAL frames it reads back: the
    one-row floor is exactly one page per commit, a node's commit several."""
    proc = bench("wal_pages.py", "--chain", "20", "--runs", "2", "--sessions", "20", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    heads = re.findall(r"^(.+): (\d+) frames in (\d+) commits, (\d+) (\w[\w ]*)$", proc.stdout, re.M)
    assert [h[0] for h in heads] == [
        "SQLite alone, 20-chain x 2",
        "SQLite alone, 20 concurrent 10-chains",
        "floor: one-row commit",
    ]
    (_, chain_frames, chain_commits, nodes, _), (_, many_frames, _, runs, _), floor = heads
    assert floor[2:4] == ("1000", "1000")  # a commit per row, each read back from its frame
    assert int(floor[1]) - int(floor[2]) < 50  # one page per commit, and now and then a new interior page
    assert int(nodes) == 40 and int(runs) == 200
    assert int(chain_frames) > 4 * int(chain_commits)  # the events, the runs, their indexes, the session
    assert int(many_frames) < int(chain_frames) / 40 * 200  # group commits share their pages


def test_the_targets_peer_on_sqlite_commits_as_durably_as_the_store_it_is_compared_with(
    tmp_path, monkeypatch
) -> None:
    """A ``sqlite3`` connection (LangGraph's savers' too) keeps SQLite's ``synchronous=FULL``,
    an fsync at every commit, where flowscope's store runs ``NORMAL`` by default: the targets
    give their peer's connection the store's setting, and the peer's own default is kept
    apart. A value that is not a setting is refused, never pasted into the pragma."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import peers_langgraph
    import targets
    from flowscope.store.sqlite import SqliteEventStore

    def setting(conn) -> int:
        return conn.execute("PRAGMA synchronous").fetchone()[0]

    store = SqliteEventStore(tmp_path / "flowscope.db")  # the default durability
    peer = peers_langgraph.sqlite_connection(str(tmp_path / "peer.db"), targets.SAME_AS_STORE)
    default = peers_langgraph.sqlite_connection(str(tmp_path / "default.db"))
    try:
        assert setting(peer) == setting(store._conn) == 1  # NORMAL
        assert setting(default) == 2  # FULL
        with pytest.raises(ValueError, match="synchronous must be one of"):
            peers_langgraph.sqlite_connection(str(tmp_path / "bad.db"), "NORMAL; DROP TABLE x")
    finally:
        for conn in (peer, default):
            conn.close()
        store.close()
