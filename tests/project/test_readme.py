"""The README teaches what runs: every command it shows parses, and its example is reachable.

A first reader copies the README's commands as they stand; a renamed option or subcommand
must fail here, not on their terminal.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from delayed_retry.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def _commands(lines: list[str]) -> list[list[str]]:
    """The arguments of each ``delayed-retry ...`` line, comments cut."""
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:1] == ["delayed-retry"] and len(words) > 1:
            commands.append(words[1:])
    return commands


COMMANDS = _commands([line for block in _shell_blocks(README) for line in block.splitlines()])
# Inline mentions in the prose may be fragments ("`delayed-retry alerts --webhook`").
MENTIONED = _commands(re.findall(r"`(delayed-retry [^`]+)`", README))


def test_the_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 8, COMMANDS


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_every_command_in_the_readme_parses(argv: list[str]) -> None:
    # argparse exits with 2 on an unknown option or subcommand; parsing runs nothing.
    build_parser().parse_args(argv)


def test_every_command_the_readme_mentions_exists() -> None:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    subcommands = set(actions[0].choices)
    assert MENTIONED
    for argv in MENTIONED:
        assert argv[0] in subcommands, f"the README mentions 'delayed-retry {argv[0]}'"


def test_the_readme_says_how_to_publish_to_its_example_and_to_the_faststream_one() -> None:
    subscribed = {c[c.index("--queue") + 1] for c in COMMANDS if c[0] == "publish"}
    assert {"orders", "fs-orders"} <= subscribed
    assert "python examples/use.py" in README and "python examples/faststream_app.py" in README
    assert (ROOT / "examples" / "use.py").exists()
    assert (ROOT / "examples" / "faststream_app.py").exists()


def test_the_readme_stays_short_and_leaves_reference_to_the_docs() -> None:
    assert len(README.splitlines()) <= 300
    assert "scripts/docs" in README
    # Release history lives in CHANGELOG.md, not in the README.
    assert "they said" not in README and "now say" not in README


def test_every_readme_section_the_code_names_exists() -> None:
    headings = set(re.findall(r"^#+ (.+)$", README, re.M))
    named: list[tuple[str, str]] = []
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "examples").glob("*.py")]:
        text = path.read_text()
        for section in re.findall(r"""README's ['"]([^'"]+)['"] (?:section|program)""", text):
            named.append((str(path.relative_to(ROOT)), section))
    assert named, "the demo and examples/use.py name README sections"
    missing = [(path, section) for path, section in named if section not in headings]
    assert not missing, f"no such README heading: {missing}; README headings: {sorted(headings)}"
