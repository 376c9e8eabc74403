"""The one redactor, end to end: a real ``flowscope worker`` serves nodes that raise every
planted secret (and one whose ``__str__`` raises), a job's error is reported with them
through the CLI, and none of them appears in the worker's stderr, the events, the spans a
real OTLP receiver got, the Prometheus metrics (the worker's and ``serve-metrics``'), or
the output of any command that reads the store."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_otlp_export import free_port, otelsink

from commands import ROOT, cli_env, run_cli, start_cli
from flowscope.cli import cli
from flowscope.fold import rebuild
from flowscope.store import SqliteEventStore
from leaky_workflows import PLANTED
from leaky_workflows import SECRETS as ALL_SECRETS
from waiting import poll, wait_for

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return cli_env(paths=(ROOT,))  # the checkout on the path: tests.leaky_workflows


def _cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--db", str(db), *args, cwd=ROOT, env=_env())


def _scrape(port: int) -> str:
    def get() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:  # not listening yet
            return None

    return wait_for(get, timeout=20, what=f"a scrape of 127.0.0.1:{port}", interval=0.1)


def test_no_planted_secret_reaches_stderr_events_spans_metrics_or_any_command(tmp_path: Path, monkeypatch):
    assert ALL_SECRETS.count(" | ") == len(PLANTED) - 1
    db = tmp_path / "leaks.db"
    SqliteEventStore(db).close()
    outputs: dict[str, str] = {}
    metrics_port = free_port()
    with otelsink("http", monkeypatch) as (endpoint, collected):
        err = tmp_path / "worker.err"
        worker = start_cli(
            "--db",
            str(db),
            "worker",
            "tests.leaky_workflows:ALL",
            "--poll",
            "50ms",
            "--lease",
            "3s",
            "--metrics-port",
            str(metrics_port),
            "--otlp-endpoint",
            endpoint,
            cwd=ROOT,
            env=_env(),
            stderr=open(err, "wb"),
        )
        try:
            for sid, wf in (("leak", "leaking"), ("hostile", "broken_str"), ("job", "leaky_job")):
                r = _cli(db, "start", wf, "--session", sid)
                assert r.returncode == 0, r.stderr
            with SqliteEventStore(db, readonly=True) as store:
                wait_for(
                    lambda: (
                        [rebuild(store.read(s)).status for s in ("leak", "hostile", "job")]
                        == ["failed", "failed", "paused"]
                    ),
                    timeout=30,
                    what="the sessions to fail or pause",
                )
                (pending,) = rebuild(store.read("job")).pending
            r = _cli(
                db,
                "resume",
                "job",
                "--job",
                f"{pending.job_id}=" + json.dumps({"success": False, "error": ALL_SECRETS}),
            )
            assert r.returncode == 0, r.stderr
            outputs["resume --job"] = r.stdout + r.stderr
            outputs["worker metrics"] = _scrape(metrics_port)
        finally:
            worker.send_signal(signal.SIGTERM)
            out, _ = worker.communicate(timeout=30)
        outputs["worker stdout"] = out
        outputs["worker stderr"] = err.read_text()
        spans = poll(collected.spans, timeout=10, interval=0.1)
        assert spans, "the worker sent no span"
        outputs["spans"] = "\n".join(str(span) for _res, _scope, span in spans)
        assert any(span.status.code == 2 for _res, _scope, span in spans)  # the failures are spans with ERROR

    with SqliteEventStore(db, readonly=True) as store:
        outputs["events"] = "\n".join(repr(e) for sid in ("leak", "hostile", "job") for e in store.read(sid))
    commands = [
        ["runs"],
        ["runs", "--format", "json"],
        ["audit"],
        ["audit", "--format", "json"],
        ["stuck", "--older-than", "0s"],
        ["stuck", "--older-than", "0s", "--format", "json"],
    ]
    for sid in ("leak", "hostile", "job"):
        commands += [
            ["show", sid],
            ["show", sid, "--format", "json"],
            ["events", sid],
            ["events", sid, "--format", "json"],
            ["export", sid],
        ]
    for args in commands:  # the reads in this process (click's runner: the same command, no start-up)
        read = CliRunner().invoke(cli, ["--db", str(db), *args], catch_exceptions=False)
        assert read.exit_code == 0 and read.stdout.strip(), (args, read.exit_code, read.stderr)
        outputs[" ".join(args)] = read.stdout + read.stderr
    # as processes too: what a command logs goes to its stderr there (in this process, to pytest's)
    for args in (["stuck", "--older-than", "0s"], ["show", "leak"], ["resume", "leak"], ["cancel", "job"]):
        r = _cli(db, *args)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        outputs["process: " + " ".join(args)] = r.stdout + r.stderr
    port = free_port()
    serve = start_cli(
        "--db", str(db), "serve-metrics", "--port", str(port), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL
    )
    try:
        outputs["serve-metrics"] = _scrape(port)
    finally:
        serve.send_signal(signal.SIGTERM)
        outputs["serve-metrics stderr"] = serve.communicate(timeout=30)[1]

    assert "ValueError" in outputs["worker stderr"] and "failed" in outputs["worker stderr"]
    assert "Traceback" not in outputs["worker stderr"], outputs["worker stderr"][-3000:]
    assert "flowscope_node_runs_total" in outputs["worker metrics"]
    assert "access_token=***" in outputs["events"]
    for where, text in outputs.items():
        for _text, secret in PLANTED:
            assert secret not in text, (where, secret, text[-2000:])
