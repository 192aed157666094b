"""Every command reports a wrong command line the same way: one line on stderr, exit 2.

The commands are read from the parser, so a new command is covered without
touching this file. Pure: the command line is refused before any connection
(``--url`` points at a closed port in case one were tried).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from delayed_retry.cli.main import build_parser, main
from delayed_retry.cli.output import EXIT_USAGE, duration_type

NOWHERE = ["--url", "amqp://guest:guest@127.0.0.1:1/"]
BAD = "5x"


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command (``status``, ``parking replay``, ...) with its parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def _refuses(action: argparse.Action, text: str) -> bool:
    if action.choices is not None:
        return text not in action.choices
    if not callable(action.type):
        return False
    try:
        action.type(text)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return True
    return False


def _bad_value(parser: argparse.ArgumentParser) -> list[str]:
    """An option of ``parser`` given a value it refuses, or an unknown option if it has none."""
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and _refuses(action, BAD):
            return [action.option_strings[-1], BAD]
    return ["--no-such-option"]


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("delayed-retry: error: "), lines[0]
    return lines[0]


def test_the_parser_has_the_commands_the_readme_lists() -> None:
    assert {"status", "parking replay", "spark analyze", "demo", "web"} <= {
        " ".join(path) for path in COMMANDS
    }


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_a_bad_value_is_one_line_and_exit_2(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _bad_value(COMMANDS[path])
    assert main([*NOWHERE, *path, *bad]) == EXIT_USAGE
    line = _one_error_line(capsys)
    assert bad[0] in line


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_an_unknown_option_is_one_line_naming_help_and_exit_2(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*NOWHERE, *path, "--no-such-option"]) == EXIT_USAGE
    line = _one_error_line(capsys)
    # A missing required option may be named first: either way, one line and the help.
    assert f"'delayed-retry {' '.join(path)} --help' lists the options" in line


DURATION_OPTIONS = sorted(
    (path, action.option_strings[-1])
    for path, parser in COMMANDS.items()
    for action in parser._actions
    if action.type is duration_type
)


def test_there_are_duration_options_to_check() -> None:
    assert (("parking", "replay"), "--delay") in DURATION_OPTIONS


@pytest.mark.parametrize(("path", "option"), DURATION_OPTIONS, ids=str)
@pytest.mark.parametrize("joined", [False, True], ids=["separate", "joined"])
def test_a_negative_duration_is_a_value_refused_as_negative(
    path: tuple[str, ...], option: str, joined: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    given = [f"{option}=-5s"] if joined else [option, "-5s"]
    assert main([*NOWHERE, *path, *given]) == EXIT_USAGE
    line = _one_error_line(capsys)
    assert f"argument {option}: " in line and "'-5s' must not be negative" in line


def test_the_misspelt_command_and_the_missing_option_are_one_line_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*NOWHERE, "nonsense"]) == EXIT_USAGE
    assert "invalid choice: 'nonsense'" in _one_error_line(capsys)
    assert main([*NOWHERE, "parking", "list"]) == EXIT_USAGE
    assert "the following arguments are required: --queue" in _one_error_line(capsys)
