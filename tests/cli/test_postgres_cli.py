"""Every command on a ``postgresql://`` URL (``--db`` and ``FLOWSCOPE_DB``), with a
password in the URL that never appears in any output; ``serve-metrics`` on the URL scraped
by a real Prometheus showing the store series, orphaned runs and queued sessions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from commands import ROOT, cli_env, run_cli, start_cli
from pg_cluster import PASSWORD, PASSWORD_ROLE, PgCluster
from prom_harness import PrometheusServer, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pw_url(pg_cluster: PgCluster) -> str:
    """A database owned by the password role, and its URL with the password in it."""
    name = f"cli_{os.getpid()}"
    with pg_cluster.admin() as a:
        a.execute(f"CREATE DATABASE {name} OWNER {PASSWORD_ROLE}")
    return pg_cluster.url(name, user=PASSWORD_ROLE, password=PASSWORD)


def env(**extra: str) -> dict[str, str]:
    """No ``PGPASSWORD``: the password a command uses is the URL's; the checkout on the path
    for ``tests.chaos_workflows``."""
    return cli_env(drop=("PGPASSWORD",), paths=(ROOT,), **extra)


def run(*args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    r = run_cli(*args, cwd=ROOT, env=env(**extra), timeout=timeout)
    assert PASSWORD not in r.stdout and PASSWORD not in r.stderr, (args, r.stdout[-500:], r.stderr[-500:])
    return r


def test_every_command_takes_a_url_and_never_prints_its_password(pw_url: str, tmp_path: Path):
    demo = run("--db", pw_url, "demo", timeout=240)
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "postgresql://flowscope_pw:***@" in demo.stdout  # the hints name it, masked
    runs = run("runs", "--format", "json", FLOWSCOPE_DB=pw_url)
    assert runs.returncode == 0, runs.stderr
    sessions = {r["session"] if "session" in r else r["session_id"]: r for r in json.loads(runs.stdout)}
    orders = next(s for s in sessions if s.endswith("-orders"))
    assert run("--db", pw_url, "show", orders).returncode == 0
    assert run("audit", "--db", pw_url, "--format", "csv").returncode == 0
    stuck = run("--db", pw_url, "stuck", "--older-than", "0s", "--format", "json")
    assert stuck.returncode == 0 and json.loads(stuck.stdout), stuck.stdout  # the demo's orphan and pauses
    out = tmp_path / "spans.json"
    assert run("--db", pw_url, "export", orders, "-o", str(out)).returncode == 0
    assert "resourceSpans" in out.read_text()
    unknown = run("--db", pw_url, "show", "no-such-session")
    assert (
        unknown.returncode == 2
        and "flowscope_pw:***@" in unknown.stderr
        and "\n" not in unknown.stderr.strip()
    )
    # a worker by URL: start by name, served, resumed without the code
    sid = run("--db", pw_url, "start", "chaos_ask", "--input", "1", "--session", "cli-ask").stdout.strip()
    assert sid == "cli-ask"
    worker = start_cli(
        "--db",
        pw_url,
        "worker",
        "tests.chaos_workflows:ALL",
        "--poll",
        "2s",
        cwd=ROOT,
        env=env(CHAOS_LOG=str(tmp_path / "fx.jsonl")),
    )
    try:
        deadline = time.monotonic() + 30
        while (
            '"paused"' not in (s := run("--db", pw_url, "runs", "--format", "json").stdout)
            or "cli-ask" not in s
        ):
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.3)
        answer = run("--db", pw_url, "resume", "cli-ask", "--input", "go=true")
        # "paused" is in the log a moment before the worker lets the lease go: an answer in
        # between is sent to the owner's inbox (it takes it in), after it is recorded; both are durable
        durable = "recorded" in answer.stdout or "sent input go" in answer.stdout
        assert answer.returncode == 0 and durable, answer.stdout + answer.stderr
        deadline = time.monotonic() + 30
        while True:  # woken by the NOTIFY of the answer (poll is 2 s)
            show = run("--db", pw_url, "runs", "--format", "json")
            row = next(r for r in json.loads(show.stdout) if "cli-ask" in json.dumps(r))
            if row["status"] == "completed":
                break
            assert time.monotonic() < deadline, row
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        wout, werr = worker.communicate(timeout=30)
    assert worker.returncode == 0, werr[-1000:]
    assert PASSWORD not in wout + werr
    # prune by URL: the completed sessions go, the paused and orphaned ones stay
    dry = run(
        "--db",
        pw_url,
        "prune",
        "--older-than",
        "0s",
        "--status",
        "completed",
        "--dry-run",
        "--format",
        "json",
    )
    assert dry.returncode == 0, dry.stderr
    doomed = {r["session_id"] for r in json.loads(dry.stdout)}
    assert "cli-ask" in doomed and orders in doomed, doomed
    pruned = run("--db", pw_url, "prune", "--older-than", "0s", "--status", "completed")
    assert pruned.returncode == 0 and f"deleted {len(doomed)} session(s)" in pruned.stdout, (
        pruned.stdout + pruned.stderr
    )
    assert "freed" in pruned.stdout, pruned.stdout
    assert run("--db", pw_url, "show", "cli-ask").returncode == 2
    left = {
        r["session"] if "session" in r else r["session_id"]: r["status"]
        for r in json.loads(run("--db", pw_url, "runs", "--format", "json").stdout)
    }
    assert left and not doomed & set(left) and "completed" not in left.values(), left
    stuck_after = run("--db", pw_url, "stuck", "--older-than", "0s", "--format", "json")
    key = lambda r: (r["session_id"], r["path"])  # noqa: E731
    assert sorted(map(key, json.loads(stuck_after.stdout))) == sorted(
        map(key, json.loads(stuck.stdout))
    )  # kept


def test_a_password_with_url_delimiters_connects_unencoded_and_never_prints(
    pg_cluster: PgCluster, pw_url: str
):
    """libpq takes a "#" or "?" in a URL's password as it is: such a URL works, and the
    hints, the console's first line and every listing mask the password whole, and the
    ``sslpassword`` of its query."""
    odd = "se#cret?pw"
    with pg_cluster.admin() as a:
        a.execute(f"ALTER ROLE {PASSWORD_ROLE} PASSWORD '{odd}'")
    try:
        url = pw_url.replace(PASSWORD, odd) + "?sslmode=disable&sslpassword=an-ssl-secret"
        started = run("--db", url, "start", "nightly_export", "--session", "odd-1")
        assert started.returncode == 0, started.stderr
        listed = run("--db", url, "runs", "--format", "json")
        assert listed.returncode == 0 and "odd-1" in listed.stdout, listed.stderr
        ui = start_cli("--db", url, "ui", "--port", "0", cwd=ROOT, env=env())
        try:
            assert ui.stderr is not None
            first = ui.stderr.readline()
        finally:
            ui.terminate()
            rest = ui.communicate(timeout=30)
        assert f"{PASSWORD_ROLE}:***@" in first, first
        for text in (started.stdout, started.stderr, listed.stdout, listed.stderr, first, *rest):
            assert "cret" not in text, text
    finally:
        with pg_cluster.admin() as a:
            a.execute(f"ALTER ROLE {PASSWORD_ROLE} PASSWORD '{PASSWORD}'")


def test_wrong_password_and_unreachable_are_one_line_errors(pg_cluster: PgCluster):
    bad = pg_cluster.url(user=PASSWORD_ROLE, password="wrong-" + PASSWORD)
    r = run("--db", bad, "runs")
    assert r.returncode == 2 and "refused the connection" in r.stderr and "wrong-" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run("--db", "postgresql://u:hunter2@127.0.0.1:1/x", "runs")
    assert r.returncode == 2 and "127.0.0.1:1/x" in r.stderr and "hunter2" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_serve_metrics_on_a_url_scraped_by_prometheus(pg_cluster: PgCluster, tmp_path: Path):
    url = pg_cluster.new_database("prom")
    import chaos_workflows as cw
    from flowscope import Runner
    from flowscope.events import NodeStarted, RunStarted
    from flowscope.ownership import Owner
    from flowscope.store import PostgresEventStore
    from flowscope.store.testing import ev

    with PostgresEventStore(url) as s:
        for i in range(3):
            Runner(cw.chain, s).submit(i, session_id=f"q{i}")  # queued: no worker serves them
        dead = Owner(worker_id="gone", host="host-elsewhere", pid=1, started_at=1.0)
        lease = s.acquire("o1", dead, 0.5, now=time.time() - 10)  # a lease that ended 9.5 s ago
        s.append(
            "o1",
            [
                ev(RunStarted, "o1", workflow="chaos_chain"),
                ev(NodeStarted, "o1", path="chaos_chain/c1", node="c1"),
            ],
            0,
            epoch=lease.epoch,
        )
    port = free_port()
    serve = start_cli("--db", url, "serve-metrics", "--port", str(port), cwd=ROOT, env=env())
    try:
        with PrometheusServer([f"127.0.0.1:{port}"]) as prom:
            prom.wait_for("flowscope_store_up == 1", timeout=30)
            prom.wait_for('flowscope_store_orphaned_runs{workflow="chaos_chain",node="c1"} == 1', timeout=20)
            prom.wait_for('flowscope_store_queued_sessions{workflow="chaos_chain"} == 3', timeout=20)
            assert prom.query('flowscope_store_open_runs{workflow="chaos_chain",state="running"}')
            assert prom.query('flowscope_store_oldest_queued_timestamp_seconds{workflow="chaos_chain"} > 0')
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=20)
    assert serve.returncode == 0


def test_a_store_in_its_own_schema_is_reached_by_the_urls_search_path(pg_cluster: PgCluster):
    import psycopg

    from flowscope import START, Runner, Workflow, node
    from flowscope.store.postgres import PostgresEventStore

    url = pg_cluster.new_database()
    with psycopg.connect(url, autocommit=True) as c:  # another application's table beside it
        c.execute("CREATE TABLE customers (id int)")
    with PostgresEventStore(url, schema="flowscope") as store:  # as the refusal below advises
        Runner(Workflow("w", edges=[(START, node(lambda x: x, name="a"))]), store).run_sync(
            1, session_id="s1"
        )
    refused = run("--db", url, "runs")
    assert refused.returncode == 2 and "PostgresEventStore(schema=...)" in refused.stderr, refused.stderr
    assert "search_path" in refused.stderr  # and says how the CLI gets there
    in_schema = f"{url}?options=-csearch_path%3Dflowscope"
    runs = run("--db", in_schema, "runs", "--format", "json")
    assert runs.returncode == 0, runs.stderr
    assert [(r["session_id"], r["status"]) for r in json.loads(runs.stdout)] == [("s1", "completed")]
    two = run("--db", f"{url}?options=-csearch_path%3Dflowscope,public", "runs")
    assert two.returncode == 2 and len(two.stderr.strip().splitlines()) == 1, two.stderr
    assert "give the one schema that holds the flowscope tables" in two.stderr
