"""One fault, one true signal, in the shape SREs deploy.

``flowscope worker`` processes started by the CLI with ``--metrics-port``, ``flowscope
serve-metrics`` over the same SQLite file, and a real Prometheus (tests/prom_harness.py)
scraping all three every second with the shipped alert rules loaded. Every fault happens
inside a nested workflow (tests/signal_workflows.py), in turn, on the same processes:

1. a card declined inside ``card_wf/payment`` (among finished runs, so the error rate has
   a base): FlowscopeNodeErrorRateHigh, for ``charge_card`` only;
2. a node that hangs while its worker lives: FlowscopeNodeStuckRunning, for ``stall``;
3. a worker SIGKILLed inside ``kill_wf/kill_inner``: FlowscopeRunOrphaned, for
   ``hang_forever``; the process is gone too, so its endpoint is down
   (FlowscopeWorkerEndpointDown for its instance, with no workflow label): a second fact of
   the same kill, not a second count of the run, and not the store endpoint's alert;
4. an empty job result answered with ``flowscope resume --job`` by a process that is no
   worker: FlowscopeJobEmptyResults, for ``geocode`` (counted from the store);
5. queued work no worker serves (``flowscope start queued_wf``):
   FlowscopeQueuedWorkNotPickedUp, for ``queued_wf``;
6. the store's metrics endpoint (serve-metrics) stopped: FlowscopeMetricsEndpointDown, for
   its instance.

After each fault, every alert *expression* is evaluated through the HTTP query API (not
waiting for the ``for:`` durations; the age thresholds written ``N * 60`` are scaled down
by AGE_SCALE, the only change to the shipped expressions): the series that appeared since
the fault are exactly the one(s) meant for it, labelled with the deepest path's node and
its session's workflow. Before the first fault, no expression returns anything.
A missing prometheus binary fails, never skips. About 30 s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_dashboards import ALERTS, alert_rules

from commands import cli_env, cli_ok, start_cli
from prom_harness import PrometheusServer, find_prometheus, free_port

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
#: The shipped age thresholds (``15 * 60``, ``5 * 60`` seconds) divided by this: 3 s, 1 s.
AGE_SCALE = 300
WORKERS_JOB = "flowscope-workers"
STORE_JOB = "flowscope-serve-metrics"
TARGET_LABELS = ("job", "instance")
FINISHED = ("completed", "failed", "cancelled", "paused")


def scaled(expr: str) -> str:
    return re.sub(r"(\d+)\s*\*\s*60\b", lambda m: f"{int(m.group(1)) * 60 / AGE_SCALE:g}", expr)


def child_env() -> dict[str, str]:
    return cli_env(paths=(TESTS,), PYTHONUNBUFFERED="1")  # signal_workflows


def tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


class Fleet:
    """The test's processes, by name, with their logs; ``stop_all()`` leaves none behind."""

    def __init__(self, tmp: Path, db: Path) -> None:
        self.tmp, self.db = tmp, db
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[str]:
        log = open(self.tmp / f"{name}.log", "wb")
        with log:
            proc = start_cli(
                *args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.tmp,
                env=child_env(),
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def cli(self, *args: str) -> str:
        return cli_ok(*args, "--db", str(self.db), cwd=self.tmp, env=child_env()).strip()

    def log(self, name: str) -> str:
        return tail(self.tmp / f"{name}.log")

    def alive(self, name: str) -> None:
        proc = self.procs[name]
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{self.log(name)}"

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def wait(predicate: Callable[[], Any], timeout: float, what: str, fleet: Fleet) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n}\n{fleet.log(n)}" for n in fleet.procs)
            raise AssertionError(f"{what}: not after {timeout}s\n{logs}")
        time.sleep(0.1)


def test_each_fault_fires_exactly_its_alert_once_at_the_deepest_path(tmp_path):
    find_prometheus()  # fails (never skips) with the install hint
    from flowscope.fold import rebuild
    from flowscope.store import SqliteEventStore

    db = tmp_path / "fleet.db"
    SqliteEventStore(db).close()  # the schema exists before the processes open the file
    rules = {r["alert"]: scaled(r["expr"]) for r in alert_rules(yaml.safe_load(ALERTS.read_text()))}
    ports = {"serve": free_port(), "killed": free_port(), "served": free_port()}
    instance = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    fleet = Fleet(tmp_path, db)
    prom = PrometheusServer(
        {STORE_JOB: [instance["serve"]], WORKERS_JOB: [instance["killed"], instance["served"]]},
        rule_files=[ALERTS],
    )
    store = None
    t0 = time.monotonic()
    try:
        prom.start()
        fleet.start(
            "serve", "serve-metrics", "--db", str(db), "--port", str(ports["serve"]), "--stale-after", "2s"
        )
        for name, spec in (("killed", "signal_workflows:KILLED"), ("served", "signal_workflows:SERVED")):
            fleet.start(
                name,
                "worker",
                spec,
                "--db",
                str(db),
                "--metrics-port",
                str(ports[name]),
                "--poll",
                "100ms",
                "--drain",
                "500ms",
            )
        prom.wait_for_targets_up(timeout=40)
        store = SqliteEventStore(db, readonly=True)

        def firing() -> dict[str, set[tuple[tuple[str, str], ...]]]:
            """Every alert expression's series now, target labels dropped but for the
            endpoint alert (whose subject is the target)."""
            out: dict[str, set[tuple[tuple[str, str], ...]]] = {}
            for alert, expr in rules.items():
                keep = ("instance",) if alert.endswith("EndpointDown") else ()
                out[alert] = {
                    tuple(
                        sorted(
                            (k, v)
                            for k, v in s["metric"].items()
                            if k != "__name__" and (k not in TARGET_LABELS or k in keep)
                        )
                    )
                    for s in prom.query(expr)
                }
            return out

        def new_since(before: dict[str, set[Any]]) -> dict[str, set[Any]]:
            now = firing()
            return {a: now[a] - before.get(a, set()) for a in now if now[a] - before.get(a, set())}

        def expect(
            before: dict[str, set[Any]], expected: dict[str, set[Any]], what: str, timeout: float = 25
        ) -> None:
            """Poll until the series new since ``before`` are ``expected``, then hold them for
            two more evaluations (a signal that lags behind the first is caught)."""
            seen: list[dict[str, set[Any]]] = []

            def settled() -> bool:
                seen.append(new_since(before))
                return seen[-1] == expected

            try:
                wait(settled, timeout, what, fleet)
            except AssertionError as exc:
                raise AssertionError(
                    f"{what}: expected {expected}, last {seen[-1] if seen else None}\n{exc}"
                ) from None
            time.sleep(1.2)  # one more scrape and evaluation
            assert new_since(before) == expected, what

        def status(sid: str) -> str | None:
            info = store.session_info(sid)
            return info.status if info is not None else None

        def run_of(sid: str, node: str) -> Any:
            return next((r for r in store.node_runs(sid) if r.node == node), None)

        def labels(**kv: str) -> tuple[tuple[str, str], ...]:
            return tuple(sorted(kv.items()))

        healthy = firing()
        assert healthy == {a: set() for a in rules}, f"alerts before any fault: {healthy}"

        # ---------------------------------------------------------------- 1. a declined card
        before = firing()
        # a first batch creates the series (increase() needs a sample before the failures)
        first = [fleet.cli("start", "card_wf", "--input", json.dumps({"declined": d})) for d in (False, True)]
        wait(lambda: all(status(s) in FINISHED for s in first), 20, "the first card batch", fleet)
        prom.wait_for(
            'flowscope_node_runs_total{workflow="card_wf", node="charge_card", outcome="failure"}', 10
        )
        second = [
            fleet.cli("start", "card_wf", "--input", json.dumps({"declined": d}))
            for d in (False, False, False, False, False, True)
        ]
        wait(lambda: all(status(s) in FINISHED for s in second), 20, "the second card batch", fleet)
        assert [status(s) for s in first + second].count("failed") == 2
        expect(
            before,
            {"FlowscopeNodeErrorRateHigh": {labels(workflow="card_wf", node="charge_card")}},
            "a declined card inside payment",
        )

        # ---------------------------------------------------------------- 2. a hung node
        before = firing()
        hung = fleet.cli("start", "hang_wf")
        stalled = wait(
            lambda: (r := run_of(hung, "stall")) is not None and r.status == "running" and r,
            20,
            "the stall run",
            fleet,
        )
        wait(
            lambda: time.time() - stalled.started_at > 15 * 60 / AGE_SCALE + 0.5, 10, "the stall's age", fleet
        )
        expect(
            before,
            {"FlowscopeNodeStuckRunning": {labels(workflow="hang_wf", node="stall", state="running")}},
            "a node hung inside hang_inner",
        )

        # ---------------------------------------------------------------- 3. a SIGKILLed worker
        before = firing()
        doomed = fleet.cli("start", "kill_wf")
        wait(
            lambda: (r := run_of(doomed, "hang_forever")) is not None and r.status == "running",
            20,
            "the doomed run",
            fleet,
        )
        fleet.alive("killed")
        os.kill(fleet.procs["killed"].pid, signal.SIGKILL)
        assert fleet.procs["killed"].wait(10) == -signal.SIGKILL
        expect(
            before,
            {
                "FlowscopeRunOrphaned": {labels(workflow="kill_wf", node="hang_forever")},
                "FlowscopeWorkerEndpointDown": {labels(instance=instance["killed"])},
            },
            "a worker killed inside kill_inner",
        )
        stuck = json.loads(fleet.cli("stuck", "--older-than", "0s", "--format", "json"))
        assert sorted((r["workflow"], r["node"], r["state"]) for r in stuck) == [
            ("hang_wf", "stall", "running"),
            ("kill_wf", "hang_forever", "orphaned"),
        ], stuck

        # ---------------------------------------------------------------- 4. an empty job result
        before = firing()
        enrich = fleet.cli("start", "job_wf")
        job_id = wait(
            lambda: next(
                (e.job_id for e in rebuild(store.read(enrich)).pending if e.type == "job_dispatched"), None
            ),
            20,
            "the dispatched job",
            fleet,
        )
        fleet.cli(
            "resume", enrich, "--job", f"{job_id}={json.dumps({'success': True, 'count': 0, 'data': []})}"
        )
        expect(
            before,
            {"FlowscopeJobEmptyResults": {labels(workflow="job_wf", node="geocode")}},
            "an empty job result answered with flowscope resume --job",
        )
        assert not prom.query(f'flowscope_job_results_total{{job="{WORKERS_JOB}"}}'), "counted twice"

        # ---------------------------------------------------------------- 5. queued work nobody serves
        before = firing()
        fleet.cli("start", "queued_wf")
        expect(
            before, {"FlowscopeQueuedWorkNotPickedUp": {labels(workflow="queued_wf")}}, "queued_wf, unserved"
        )

        # ---------------------------------------------------------------- 6. the store's endpoint stops
        before = firing()
        fleet.alive("serve")
        fleet.procs["serve"].send_signal(signal.SIGTERM)
        assert fleet.procs["serve"].wait(10) == 0, fleet.log("serve")
        expect(
            before,
            {"FlowscopeMetricsEndpointDown": {labels(instance=instance["serve"])}},
            "serve-metrics stopped",
        )

        fleet.alive("served")
        fleet.procs["served"].send_signal(signal.SIGTERM)
        assert fleet.procs["served"].wait(15) == 0, fleet.log("served")
        assert time.monotonic() - t0 < 90, f"the test took {time.monotonic() - t0:.0f}s"
    finally:
        if store is not None:
            store.close()
        fleet.stop_all()
        prom.stop()
