"""The JSON of the commands speaks one language: the same quantity has the same name.

Durations are seconds, named ``…_seconds`` everywhere (``status`` and
``topology show`` used to say ``holds_seconds`` and ``holds_s``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from delayed_retry.cli.main import main

pytestmark = pytest.mark.broker


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from _keys(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _keys(inner)


def test_status_and_topology_show_name_the_levels_alike(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = ["--prefix", unique, "--levels", "6"]
    url = ["--url", rabbitmq_url]
    assert main([*url, "declare", *topo]) == 0
    capsys.readouterr()
    assert main([*url, "status", *topo, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert main([*url, "topology", "show", *topo, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)

    level_in_status, level_in_show = status["chain"][3], shown["levels"][3]
    shared = {"level", "queue", "holds_seconds", "due_within_seconds", "messages"}
    assert shared <= set(level_in_status) and shared <= set(level_in_show)
    assert {k: level_in_status[k] for k in shared} == {k: level_in_show[k] for k in shared}
    assert level_in_show["entering_delays_seconds"] == [0.008, 0.015]
    for key in [*_keys(status), *_keys(shown)]:
        assert not key.endswith(("_s", "_ms")), f"{key!r}: name durations …_seconds"
