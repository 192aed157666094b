"""deploy/: the Kubernetes manifests and the compose file agree with the command line."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayed_retry.cli.main import build_parser
from delayed_retry.cli.service_state import LIVENESS_PATH, READINESS_PATH

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVICES = {"front-door", "forwarder", "router", "alerts", "web"}


def _documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _deployments() -> list[dict[str, Any]]:
    return [d for d in _documents() if d["kind"] == "Deployment"]


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_service_has_a_deployment() -> None:
    commands = {d["spec"]["template"]["spec"]["containers"][0]["args"][0] for d in _deployments()}
    assert commands == SERVICES


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["metadata"]["name"])
def test_a_deployment_runs_a_real_command_with_probes_on_its_ports(
    deployment: dict[str, Any],
) -> None:
    template = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= (
        template["metadata"]["labels"].items()
    )
    (container,) = template["spec"]["containers"]
    args = container["args"]
    parsed = build_parser().parse_args(args)  # exits 2 on an unknown command or option
    assert parsed.command in SERVICES
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == parsed.health_port
    assert ports["metrics"] == parsed.metrics_port
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == parsed.metrics_port
    assert annotations["prometheus.io/path"] == "/metrics"
    for probe, path in (("livenessProbe", LIVENESS_PATH), ("readinessProbe", READINESS_PATH)):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert get["port"] in ("health", parsed.health_port)
    grace = template["spec"]["terminationGracePeriodSeconds"]
    assert grace > parsed.stop_timeout + 5  # the stop bound fits in the grace period
    env = {e["name"] for e in container["env"]}
    assert "RABBITMQ_URL" in env


def test_the_compose_services_run_real_commands_with_probes() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"rabbitmq", "webhook"} | SERVICES - {"router"} == set(services)
    for name in SERVICES - {"router"}:
        args = shlex.split(services[name]["command"])
        parsed = build_parser().parse_args(args)
        assert parsed.command == name
        assert (parsed.health_port, parsed.metrics_port) == (8081, 9464)
        assert services[name]["environment"]["RABBITMQ_URL"].startswith("amqp://")
