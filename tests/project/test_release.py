"""What a release carries: one version, the licence the metadata names, its changelog entry.

Pure: reads the checkout and the installed distribution's metadata. The built
artefacts themselves (sdist, wheel, a fresh install) are checked by
``scripts/package-check``.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import delayed_retry
from delayed_retry.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_version_has_one_source() -> None:
    assert importlib.metadata.version("delayed-retry") == PROJECT["version"], (
        "the installed metadata is stale: run scripts/bootstrap"
    )
    assert delayed_retry.__version__ == PROJECT["version"]


def test_the_command_line_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"delayed-retry {PROJECT['version']}\n", "")


def test_the_version_needs_no_command_and_no_broker(capsys: pytest.CaptureFixture[str]) -> None:
    # --version wins over the required command, as --help does, and connects to nothing.
    assert main(["--url", "amqp://guest:guest@127.0.0.1:1/", "--version"]) == 0
    assert capsys.readouterr().out.startswith("delayed-retry ")


def test_the_license_file_is_the_one_the_metadata_names() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text, "the LICENSE file must hold the full text"


def test_the_package_is_marked_typed() -> None:
    assert (ROOT / "src" / "delayed_retry" / "py.typed").is_file()
    assert "Typing :: Typed" in PROJECT["classifiers"]


def test_the_changelog_has_an_entry_for_this_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    version = re.escape(PROJECT["version"])
    entry = re.search(rf"^## \[{version}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)
    assert entry is not None, f"CHANGELOG.md has no '## [{PROJECT['version']}] - YYYY-MM-DD' entry"
    assert re.search(rf"^\[{version}\]: \S+", text, re.M), "no link for it"


def test_every_extra_the_docs_name_exists() -> None:
    extras = set(PROJECT["optional-dependencies"])
    readme = (ROOT / "README.md").read_text()
    for extra in ("webhook", "web", "spark", "service", "faststream", "testcontainers", "docs"):
        assert extra in extras
        assert f"| `{extra}` |" in readme, f"the README's Install table lacks the {extra!r} extra"
