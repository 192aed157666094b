"""deploy/grafana's dashboard: Grafana's published schema, its variables, its layout, its page.

Grafana publishes the dashboard model as TypeScript types (the npm package
``@grafana/schema``); ``scripts/bootstrap`` installs them with TypeScript into
``.venv/grafana-schema``, and the model is type-checked against them with excess
properties refused. No Grafana runs here. That every query returns data from a real
Prometheus is ``test_prometheus_broker.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.prometheus import ROOT, RULES, dashboard, dashboard_queries

PAGE = ROOT / "docs" / "alerting-and-dashboards.md"
SCHEMA = ROOT / ".venv" / "grafana-schema" / "node_modules"
DASHBOARD_TYPES = SCHEMA / "@grafana" / "schema" / "dist" / "types" / "raw" / "dashboard" / "x"


@pytest.fixture(scope="module")
def type_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """tsc's errors for the dashboard and for a copy with a field Grafana does not know, by name.

    One tsc run for both (it takes seconds): ``dashboard`` and ``refused``.
    """
    tsc = SCHEMA / ".bin" / "tsc"
    types = DASHBOARD_TYPES / "types.gen.d.ts"
    if not (tsc.exists() and types.exists()):
        raise AssertionError(f"{tsc} or {types} missing: run scripts/bootstrap (it needs npm)")
    refused = dashboard()
    refused["panels"][1]["gridPos"]["width"] = 12
    folder = tmp_path_factory.mktemp("grafana")
    sources = {"dashboard": dashboard(), "refused": refused}
    for name, model in sources.items():
        (folder / f"{name}.ts").write_text(
            f"import type {{ Dashboard }} from {json.dumps(str(DASHBOARD_TYPES / 'types.gen'))};\n"
            f"export const dashboard: Dashboard = {json.dumps(model, indent=1)};\n"
        )
    options = ["--noEmit", "--strict", "--target", "es2020", "--moduleResolution", "node"]
    done = subprocess.run(
        [str(tsc), *options, *(str(folder / f"{name}.ts") for name in sources)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = (done.stdout + done.stderr).splitlines()
    return {name: "\n".join(line for line in lines if f"{name}.ts" in line) for name in sources}


def test_the_dashboard_is_a_dashboard_of_grafanas_schema(type_errors: dict[str, str]) -> None:
    assert type_errors["refused"], "tsc reported nothing, not even the refused copy"
    assert type_errors["dashboard"] == ""


def test_the_schema_check_refuses_a_field_grafana_does_not_know(
    type_errors: dict[str, str],
) -> None:
    assert "'\"width\"' does not exist in type 'GridPos'" in type_errors["refused"]


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
    recorded = {
        rule["record"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    assert used and used <= recorded
