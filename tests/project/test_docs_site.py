"""The documentation site stays whole: every page in its nav, every public name and command in it.

Pure: reads ``mkdocs.yml``, ``docs/`` and the package. ``scripts/docs build``
(CI's docs step) builds the site itself, strictly; these checks catch what a
strict build lets through: a page left out of the nav, a public name or a
command with no entry.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import delayed_retry
from delayed_retry.cli.main import build_parser
from delayed_retry.cli.service_metrics import HELD_UNTIL_DUE, MESSAGES, READY
from delayed_retry.consumer.options import HandlerOptions, RouterOptions, option_specs
from delayed_retry.observability import gauges, metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG: dict[str, Any] = yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs_hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(entry: Any) -> list[str]:
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [page for item in entry for page in _nav_pages(item)]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in _nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {entry!r}")


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    cli_reference = _hook("cli_reference")
    nav = _nav_pages(CONFIG["nav"])
    files = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(files - set(nav)) == [], "pages missing from the nav of mkdocs.yml"
    assert sorted(set(nav) - files - {cli_reference.PAGE}) == [], "nav entries with no page"
    assert not (DOCS / cli_reference.PAGE).exists(), "the command reference is generated"


def test_every_public_name_has_an_api_entry() -> None:
    page = (DOCS / "reference" / "api" / "index.md").read_text()
    missing = [n for n in delayed_retry.__all__ if f"::: delayed_retry.{n}\n" not in page]
    assert missing == [], f"docs/reference/api/index.md has no '::: delayed_retry.X' for {missing}"


@pytest.mark.parametrize(
    ("page", "module"),
    [
        ("faststream.md", "delayed_retry.faststream"),
        ("alerts.md", "delayed_retry.alerts"),
        ("spark.md", "delayed_retry.spark"),
        ("web.md", "delayed_retry.web"),
        ("testing.md", "delayed_retry.testing"),
    ],
)
def test_each_subpackage_page_renders_its_public_names(page: str, module: str) -> None:
    assert f"::: {module}\n" in (DOCS / "reference" / "api" / page).read_text()


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


def test_the_command_reference_shows_every_command_and_option() -> None:
    page = _hook("cli_reference").render()
    for path, parser in _commands(build_parser()):
        title = " ".join(("delayed-retry", *path))
        assert f"## `{title}`\n" in page, f"no section for {title}"
        section = page.split(f"## `{title}`\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for option in action.option_strings:
                assert option in section, f"{title}: {option} is not in its section"


def test_the_command_reference_shows_built_in_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYED_RETRY_PREFIX", "someones-prefix")
    monkeypatch.setenv("RABBITMQ_URL", "amqp://someone:secret@elsewhere/")
    page = _hook("cli_reference").render()
    assert "someones-prefix" not in page and "secret" not in page


def test_every_metric_is_in_the_metrics_reference() -> None:
    page = (DOCS / "reference" / "metrics.md").read_text()
    names = [getattr(metrics, n) for n in metrics.__all__ if n.isupper()]
    names += [gauges.DELAYED_MESSAGES, gauges.PARKED_MESSAGES, MESSAGES, HELD_UNTIL_DUE, READY]
    missing = [n for n in names if f"`{n}`" not in page]
    assert missing == [], f"docs/reference/metrics.md does not list {missing}"


def test_docstring_option_lists_become_lists() -> None:
    option_lists = _hook("docstring_roles").option_lists
    text = (
        "Wrap it.\n\nOptions (keyword-only):\n  queue: the queue; retries\n"
        "    return there.\n  max_retries: how many.\nAfter."
    )
    assert option_lists(text) == (
        "Wrap it.\n\nOptions (keyword-only):\n\n- `queue`: the queue; retries return there.\n"
        "- `max_retries`: how many.\n\nAfter."
    )
    plain = "A line: not a list.\n  indented: but no colon line above"
    assert option_lists(plain) == plain


def test_the_option_tables_are_written_from_the_option_definitions() -> None:
    tables = _hook("option_tables")
    for page, options in (("retries.md", HandlerOptions), ("any-language.md", RouterOptions)):
        text = (DOCS / page).read_text()
        marker = f"<!-- options: {options.__name__} -->"
        assert marker in text, f"docs/{page} has no {marker}"
        table = tables.expand(text)
        for name, spec in option_specs(options).items():
            assert f"| `{name}` |" in table, f"docs/{page}: no row for {name}"
            assert f"`{spec.default_text}`" in table
    rendered = tables.render("HandlerOptions")
    assert "`str \\| None`" in rendered  # queue's type, escaped for the table
    assert "&lt;queue&gt;.parking" in rendered  # help text is escaped, not read as HTML
    with pytest.raises(ValueError, match="NoSuchOptions"):
        tables.expand("<!-- options: NoSuchOptions -->")
