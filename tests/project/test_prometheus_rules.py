"""deploy/prometheus and its page: promtool's checks, one source of the rules, the links.

``promtool`` comes with Debian's ``prometheus`` package (``scripts/bootstrap`` installs it).
The end-to-end run against a real Prometheus is ``test_prometheus_broker.py``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.prometheus import (
    OPERATOR_RULE,
    ROOT,
    RULE_TESTS,
    RULES,
    tool,
)

PAGE = ROOT / "docs" / "alerting-and-dashboards.md"
RUNBOOK = (
    "https://github.com/delayed-retry/delayed-retry/blob/main/docs/alerting-and-dashboards.md#"
)


def _rules(kind: str) -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        yield from (rule for rule in group["rules"] if kind in rule)


ALERTS = [rule["alert"] for rule in _rules("alert")]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_accepts_the_rules() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass() -> None:
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def _alert_tests() -> list[dict[str, Any]]:
    return [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


@pytest.mark.parametrize("alert", ALERTS)
def test_every_alert_has_a_case_that_fires_and_one_that_must_not(alert: str) -> None:
    cases = [case for case in _alert_tests() if case["alertname"] == alert]
    assert any(case["exp_alerts"] for case in cases), f"{alert}: no unit test in which it fires"
    assert any(not case["exp_alerts"] for case in cases), (
        f"{alert}: no unit test in which it must stay quiet (exp_alerts: [])"
    )


@pytest.mark.parametrize("alert", ALERTS)
def test_every_alert_says_what_to_do_and_links_its_section(alert: str) -> None:
    (rule,) = [r for r in _rules("alert") if r["alert"] == alert]
    annotations = rule["annotations"]
    assert annotations["summary"].strip() and annotations["description"].strip()
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert annotations["runbook_url"] == RUNBOOK + alert.lower()
    assert f"\n### {alert}\n" in PAGE.read_text(), f"{PAGE.name} has no section ### {alert}"


def test_the_operator_rule_carries_the_same_groups() -> None:
    (resource,) = [d for d in yaml.safe_load_all(OPERATOR_RULE.read_text()) if d]
    assert (resource["apiVersion"], resource["kind"]) == (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
    )
    assert resource["spec"] == yaml.safe_load(RULES.read_text()), (
        f"{OPERATOR_RULE.relative_to(ROOT)} differs from {RULES.relative_to(ROOT)}: copy the "
        "rules file's groups under spec:, indented by two spaces"
    )


def test_the_recording_rules_follow_the_level_metric_operation_naming() -> None:
    for rule in _rules("record"):
        assert re.fullmatch(r"delayed_retry:[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]
