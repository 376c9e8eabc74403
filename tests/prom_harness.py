"""A real Prometheus server for tests, and helpers to run Grafana panel queries on it.

Starts the ``prometheus`` binary (Debian package ``prometheus``: ``/usr/bin/prometheus``)
on 127.0.0.1 with a free port, a temporary data directory and a generated config that
scrapes the given targets every second, with exemplar storage on. Talks to it through
the HTTP API with urllib only::

    with PrometheusServer(["127.0.0.1:9464"], rule_files=[ALERTS]) as prom:
        prom.wait_for_samples(2)                  # rate() needs two samples
        prom.query('flowscope_store_orphaned_runs > 0')
        prom.wait_for('flowscope_store_orphaned_runs > 0', timeout=20)
        prom.targets()

``stop()`` (or leaving the ``with`` block) terminates the process, waits for it and
removes the data directory: no process is left behind.

``dashboard_queries(path)`` lists the queries of a Grafana dashboard JSON and
``render_grafana_expr(expr)`` replaces Grafana's variables (``$workflow``,
``$__rate_interval``, ...) so that the query can be sent to Prometheus as is.

The module imports nothing from flowscope and needs nothing beyond the standard library.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PrometheusNotFound",
    "PrometheusQueryError",
    "PrometheusServer",
    "DashboardQuery",
    "GRAFANA_BUILTIN_VARIABLES",
    "dashboard_queries",
    "find_prometheus",
    "free_port",
    "render_grafana_expr",
]

INSTALL_HINT = (
    "the Prometheus server binary is needed for this test: install Debian's `prometheus` "
    "package (apt-get install -y prometheus, which also provides promtool) or set "
    "FLOWSCOPE_PROMETHEUS to the path of a prometheus binary"
)


class PrometheusNotFound(RuntimeError):
    """No prometheus binary: the message says how to install one."""


class PrometheusQueryError(RuntimeError):
    """The HTTP API answered with an error (bad expression, execution error...)."""

    def __init__(self, expr: str, error_type: str, error: str):
        super().__init__(f"{error_type}: {error} (query: {expr})")
        self.expr = expr
        self.error_type = error_type
        self.error = error


def find_prometheus() -> str:
    """Path of the prometheus binary: $FLOWSCOPE_PROMETHEUS, then PATH, then /usr/bin."""
    candidates = [os.environ.get("FLOWSCOPE_PROMETHEUS"), shutil.which("prometheus"), "/usr/bin/prometheus"]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise PrometheusNotFound(INSTALL_HINT)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrometheusServer:
    """A Prometheus server process scraping ``targets`` (``"host:port"`` strings).

    ``targets`` may also be a mapping ``{job_name: [targets...]}``. ``rule_files`` are
    copied next to the generated config and evaluated every ``evaluation_interval``.
    """

    def __init__(
        self,
        targets: Sequence[str] | Mapping[str, Sequence[str]] = (),
        *,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        rule_files: Iterable[str | os.PathLike[str]] = (),
        metrics_path: str = "/metrics",
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
    ):
        if isinstance(targets, Mapping):
            self._jobs = {job: list(ts) for job, ts in targets.items()}
        else:
            self._jobs = {"flowscope": list(targets)}
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.rule_files = [Path(p) for p in rule_files]
        self.metrics_path = metrics_path
        self.binary = binary
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None
        self._log = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("Prometheus is not started")
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """The generated configuration (JSON is YAML, so no YAML library is needed)."""
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [f"rules/{i}-{p.name}" for i, p in enumerate(self.rule_files)],
            "scrape_configs": [
                {
                    "job_name": job,
                    "metrics_path": self.metrics_path,
                    "scrape_interval": self.scrape_interval,
                    "scrape_timeout": self.scrape_interval,
                    "static_configs": [{"targets": targets}],
                }
                for job, targets in self._jobs.items()
            ],
        }

    def start(self) -> PrometheusServer:
        if self.process is not None:
            raise RuntimeError("Prometheus is already started")
        binary = self.binary or find_prometheus()
        self.workdir = Path(tempfile.mkdtemp(prefix="flowscope-prom-"))
        rules_dir = self.workdir / "rules"
        rules_dir.mkdir()
        for i, path in enumerate(self.rule_files):
            shutil.copyfile(path, rules_dir / f"{i}-{path.name}")
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(json.dumps(self.config(), indent=2))
        last_error = ""
        try:
            for _attempt in range(3):  # a free port can be taken between probe and bind
                self.port = free_port()
                log_path = self.workdir / "prometheus.log"
                self._log = open(log_path, "wb")
                args = [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--enable-feature=exemplar-storage",
                    "--log.level=warn",
                    *self.extra_args,
                ]
                self.process = subprocess.Popen(
                    args,
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.workdir,
                )
                if self._wait_ready():
                    return self
                last_error = self._terminate()
                if "address already in use" not in last_error:
                    break
            raise RuntimeError(f"Prometheus did not become ready:\n{last_error[-4000:]}")
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        return False

    def _terminate(self) -> str:
        """Stop the process (TERM, then KILL) and return its log."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.log()

    def log(self) -> str:
        """What the Prometheus process wrote so far."""
        if self.workdir is None:
            return ""
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Terminate the server, wait for it, delete its data. Safe to call twice."""
        self._terminate()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP API
    def api(
        self,
        path: str,
        params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        *,
        expr: str = "",
    ) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raise PrometheusQueryError."""
        query = urllib.parse.urlencode(params or {}, doseq=True)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:
            try:
                body = json.loads(err.read() or b"{}")
            except ValueError:
                body = {}
            raise PrometheusQueryError(
                expr or url, body.get("errorType", f"HTTP {err.code}"), body.get("error", err.reason)
            ) from None
        if body.get("status") != "success":
            raise PrometheusQueryError(
                expr or url, body.get("errorType", "unknown"), body.get("error", "no error message")
            )
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query. Returns the result list (``[{"metric": {...}, "value": [t, "v"]}]``).

        A scalar or string result is returned as a one-element list with an empty metric.
        """
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", params, expr=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        return self.api("query_exemplars", {"query": expr, "start": start, "end": end}, expr=expr)

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with ``health``, ``lastError``, ``scrapeUrl``..."""
        return self.api("targets", {"state": "active"})["activeTargets"]

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule (alerting and recording) with health, state and lastError."""
        groups = self.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]

    def series_names(self, match: str = '{__name__=~".+"}') -> set[str]:
        """Names of the series that Prometheus holds now (for "exists in the scrape")."""
        return {row["metric"]["__name__"] for row in self.query(f"count by (__name__) ({match})")}

    # ------------------------------------------------------------------ waiting
    def wait_for(
        self,
        expr: str,
        timeout: float = 10.0,
        *,
        interval: float = 0.2,
        predicate: Callable[[list[dict[str, Any]]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns a non-empty result (and ``predicate(result)``).

        Raises TimeoutError with the last result and the targets' health.
        """
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while True:
            result = self.query(expr)
            if result and (predicate is None or predicate(result)):
                return result
            if time.monotonic() >= deadline:
                health = [(t.get("scrapeUrl"), t.get("health"), t.get("lastError")) for t in self.targets()]
                raise TimeoutError(
                    f"{expr!r} not satisfied after {timeout}s; last result {result!r}; targets {health!r}"
                )
            time.sleep(interval)

    def wait_for_targets_up(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until every configured target has been scraped successfully."""
        wanted = sum(len(ts) for ts in self._jobs.values())
        return self.wait_for("up == 1", timeout, predicate=lambda result: len(result) >= wanted)

    def wait_for_samples(self, n: int = 2, timeout: float = 15.0) -> None:
        """Wait until every target has been scraped at least ``n`` times (rate() needs 2)."""
        wanted = sum(len(ts) for ts in self._jobs.values())
        self.wait_for(
            f"count_over_time(up[10m]) >= {n}", timeout, predicate=lambda result: len(result) >= wanted
        )


# ---------------------------------------------------------------------- Grafana queries
# Grafana's own variables, with values that make sense for a query sent directly.
GRAFANA_BUILTIN_VARIABLES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def render_grafana_expr(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Replace ``$var``, ``${var}``, ``${var:fmt}`` and ``[[var]]`` in a panel query.

    ``variables`` override the defaults: dashboard variables render as ``.*`` (the
    "All" value of a regex-matched multi-value variable), Grafana's built-ins as in
    GRAFANA_BUILTIN_VARIABLES.
    """
    values = dict(GRAFANA_BUILTIN_VARIABLES)
    values.update(variables or {})

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return values.get(name, ".*")

    return _VARIABLE.sub(substitute, expr)


@dataclass(frozen=True)
class DashboardQuery:
    panel: str
    ref_id: str
    datasource_type: str
    datasource_uid: str
    expr: str
    exemplar: bool = False

    def rendered(self, variables: Mapping[str, str] | None = None) -> str:
        return render_grafana_expr(self.expr, variables)


def _panels(panels: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # collapsed rows hold their panels


def dashboard_queries(
    path: str | os.PathLike[str], datasource_type: str | None = "prometheus"
) -> list[DashboardQuery]:
    """Every target query of every panel of a dashboard JSON file.

    With ``datasource_type`` (default ``"prometheus"``) only the targets of that
    datasource type; ``None`` for all (Tempo targets carry a TraceQL ``query``).
    """
    dashboard = json.loads(Path(path).read_text())
    queries = []
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            ds = target.get("datasource") or panel.get("datasource") or {}
            if datasource_type is not None and ds.get("type") != datasource_type:
                continue
            expr = target.get("expr", target.get("query", ""))
            queries.append(
                DashboardQuery(
                    panel.get("title", ""),
                    target.get("refId", ""),
                    ds.get("type", ""),
                    ds.get("uid", ""),
                    expr,
                    bool(target.get("exemplar")),
                )
            )
    return queries
