"""A real Prometheus for the tests of deploy/prometheus and deploy/grafana: start, query, stop.

Debian's ``prometheus`` package (``scripts/bootstrap`` installs it) provides
``prometheus`` and ``promtool``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from harness import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "delayed-retry-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "delayed-retry-rules.test.yaml"
OPERATOR_RULE = ROOT / "deploy" / "kubernetes" / "prometheus-rule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "delayed-retry-dashboard.json"

RATE_INTERVAL = "1m"
"""What ``$__rate_interval`` stands for when a test runs a dashboard query itself."""


def tool(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; fails saying how to install it."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(
            f"{name} not found: install Debian's prometheus package (scripts/bootstrap does)"
        )
    return path


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard model of deploy/grafana."""
    model: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return model


def dashboard_queries(model: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel, rows' panels included."""
    for panel in model["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]


def runnable(expr: str, *, queue: str = ".*") -> str:
    """``expr`` with Grafana's variables replaced, as Grafana would send it."""
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$queue", queue)


class Prometheus:
    """A Prometheus server on a free loopback port, with its own data folder; stop it with close().

    ``scrape`` maps job names to ``host:port`` targets; rules and scrapes are
    evaluated every ``interval`` seconds.
    """

    def __init__(
        self, *, scrape: Mapping[str, str], rule_files: list[Path], interval: float = 1.0
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="drtest-prometheus-"))
        self.port = free_port()
        every = f"{round(interval * 1000)}ms"
        config = {
            "global": {"scrape_interval": every, "evaluation_interval": every},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in scrape.items()
            ],
        }
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (self.folder / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={self.folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a GET on the HTTP API (``/api/v1/...``); fails on an error status."""
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.loads(reply.read())
        if body["status"] != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once the server answers ``/-/ready``; fails with its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"Prometheus not ready in {timeout} s:\n{self.log_tail()}")

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts Prometheus holds now, pending or firing (``/api/v1/alerts``)."""
        alerts: list[dict[str, Any]] = self.api("/api/v1/alerts")["alerts"]
        return alerts

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now."""
        result: list[dict[str, Any]] = self.api("/api/v1/query", query=expr)["result"]
        return result

    def log_tail(self, lines: int = 30) -> str:
        self.log.flush()
        return "\n".join((self.folder / "prometheus.log").read_text().splitlines()[-lines:])

    def close(self) -> None:
        """Stop the server (by its process id) and remove its folder."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
