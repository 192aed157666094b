"""deploy/prometheus, deploy/grafana and their page: promtool's checks, one source, the links.

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
    dashboard,
    dashboard_queries,
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


# --- the dashboard --------------------------------------------------------------------------


def _panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_the_dashboard_takes_its_datasource_and_queues_as_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    queue = variables["queue"]
    assert queue["type"] == "query" and queue["multi"] and queue["includeAll"]
    assert queue["datasource"]["uid"] == "${datasource}"
    for panel in _panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


def test_the_dashboard_model_holds_together() -> None:
    model = dashboard()
    assert model["uid"] and model["title"] and isinstance(model["schemaVersion"], int)
    panels = list(_panels())
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        if panel["type"] != "row":
            assert panel["targets"] and panel["description"], panel["title"]
            ref_ids = [t["refId"] for t in panel["targets"]]
            assert len(set(ref_ids)) == len(ref_ids), panel["title"]


def test_the_page_explains_every_panel() -> None:
    text = PAGE.read_text()
    for panel in _panels():
        assert f"**{panel['title']}**" in text or f"### {panel['title']}" in text, panel["title"]


def test_the_recorded_series_the_dashboard_reads_are_recorded() -> None:
    used = {
        name
        for _, expr in dashboard_queries(dashboard())
        for name in re.findall(r"delayed_retry:[a-z0-9_:]+", expr)
    }
    assert used and used <= {rule["record"] for rule in _rules("record")}
