"""The exit-code rule: 2 when the command line is wrong, 1 when the world is not as it needs.

A queue the user named that does not exist is the world (exit 1), worded
one way by every command, with the fix that is true for that kind of queue;
so is an optional dependency that is not installed. The wrong command line
itself is in ``test_usage.py``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from delayed_retry.cli.main import main
from delayed_retry.cli.output import EXIT_FAILURE
from delayed_retry.errors import parking_queue_not_found, queue_not_found
from tests.cli.test_usage import COMMANDS, NOWHERE
from tests.support.queues import declare_queue


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("delayed-retry: error: "), lines
    return lines[0]


def test_a_missing_queue_is_worded_with_the_fix_for_its_kind() -> None:
    work = queue_not_found("orders", so="nothing can be scheduled for it")
    assert work.startswith("queue 'orders' does not exist in this vhost, so nothing can be")
    assert "'delayed-retry declare --create --bind orders'" in work
    parking = parking_queue_not_found("orders.parking")
    assert parking.startswith("parking queue 'orders.parking' does not exist in this vhost; ")
    # declare binds the work queue, which creates its parking queue; --create is not needed.
    assert "'delayed-retry declare --bind orders'" in parking and "--create" not in parking
    assert "declare --bind QUEUE" in parking_queue_not_found("my-parking-lot")


# Each command that names a queue, given a queue that does not exist; the chain exists.
MISSING_QUEUE_CASES: dict[tuple[str, ...], tuple[list[str], str]] = {
    ("status",): (["--queue", "{q}"], "work"),
    ("publish",): (["--queue", "{q}", "--delay", "1s"], "work"),
    ("declare",): (["--bind", "{q}"], "work"),
    ("router",): (["--queue", "{q}"], "work"),
    ("parking", "list"): (["--queue", "{q}"], "parking"),
    ("parking", "show"): (["some-id", "--queue", "{q}"], "parking"),
    ("parking", "replay"): (["--queue", "{q}", "--dry-run"], "work"),
    ("parking", "purge"): (["--queue", "{q}", "--all", "--yes"], "parking"),
    ("parking", "refresh"): (["--queue", "{q}"], "parking"),
    ("parking", "edit"): (
        ["some-id", "--queue", "{q}", "--unset-header", "x-a", "--yes"],
        "parking",
    ),
    ("archive",): (["--queue", "{q}.parking", "--to", "{tmp}"], "parking"),
}

NOT_AN_ERROR = {
    ("topology", "verify"): "reports a missing queue as one of its differences, exit 1",
    ("topology", "discard"): "messages may still wait for a queue deleted since: taking them "
    "out is what it is for",
    ("topology", "expedite"): "messages may still wait for a queue deleted since: the broker "
    "refuses their copy, and the command names the message it keeps waiting",
    ("teardown",): "a missing queue has nothing to unbind",
    ("web",): "serves the view, which shows the queue as missing",
    ("spark", "schedule"): "needs an input file: test_spark_cmd_broker.py covers it",
}


def test_every_command_that_names_a_queue_is_checked_for_a_missing_one() -> None:
    naming = {
        path
        for path, parser in COMMANDS.items()
        for action in parser._actions
        if {"--queue", "--bind"} & set(action.option_strings)
    }
    assert naming == set(MISSING_QUEUE_CASES) | set(NOT_AN_ERROR)


@pytest.mark.parametrize("path", sorted(MISSING_QUEUE_CASES), ids=" ".join)
def test_a_queue_that_does_not_exist_is_exit_1_worded_one_way(
    path: tuple[str, ...],
    rabbitmq_url: str,
    unique: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A chain that exists, with a queue bound to it: only the named queue is missing.
    there = f"{unique}-there"
    asyncio.run(declare_queue(rabbitmq_url, there))
    topology = ["--prefix", unique, "--levels", "4"]
    assert main(["--url", rabbitmq_url, "declare", *topology, "--bind", there]) == 0
    capsys.readouterr()
    missing = f"{unique}-nope"
    options, kind = MISSING_QUEUE_CASES[path]
    given = [o.format(q=missing, tmp=tmp_path / "archive") for o in options]
    assert main(["--url", rabbitmq_url, *path, *given, *topology]) == EXIT_FAILURE
    line = _one_error_line(capsys)
    if kind == "work":
        assert f"error: queue {missing!r} does not exist in this vhost" in line
        assert f"'delayed-retry declare --create --bind {missing}'" in line
    else:
        assert f"error: parking queue '{missing}.parking' does not exist in this vhost" in line
        assert f"'delayed-retry declare --bind {missing}'" in line


SPARK_EXTRA_CASES: dict[tuple[str, ...], list[str]] = {
    ("spark", "generate"): ["--rows", "1", "--to", "{tmp}"],
    ("spark", "analyze"): ["{tmp}"],
    ("spark", "redrive"): ["{tmp}", "--dry-run"],
    ("spark", "schedule"): [
        "{tmp}",
        *("--queue", "q", "--due-at", "d", "--body", "b"),
        *("--schedule-id", "s", "--ledger", "{tmp}"),
    ],
    ("archive",): ["--queue", "orders.parking", "--to", "{tmp}"],
}


def test_every_spark_command_is_checked_for_the_extra() -> None:
    spark = {path for path in COMMANDS if path[0] == "spark"}
    assert spark | {("archive",)} == set(SPARK_EXTRA_CASES)


def _uninstall(monkeypatch: pytest.MonkeyPatch, *packages: str) -> None:
    """Make ``import package`` fail in this test as if it were not installed."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.delitem(sys.modules, name)
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)


@pytest.mark.parametrize("path", sorted(SPARK_EXTRA_CASES), ids=" ".join)
def test_without_the_spark_extra_each_spark_command_names_it(
    path: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _uninstall(monkeypatch, "pyarrow", "pyspark")
    given = [o.format(tmp=tmp_path) for o in SPARK_EXTRA_CASES[path]]
    assert main([*NOWHERE, *path, *given]) == EXIT_FAILURE
    line = _one_error_line(capsys)
    assert f"'delayed-retry {' '.join(path)}' needs the 'spark' extra" in line
    assert "pip install 'delayed-retry[spark]'" in line and "No module named" not in line


def test_without_the_web_extra_the_web_command_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _uninstall(monkeypatch, "aiohttp", "jinja2")
    assert main([*NOWHERE, "web"]) == EXIT_FAILURE
    line = _one_error_line(capsys)
    assert "the web view needs the 'web' extra" in line
    assert "pip install 'delayed-retry[web]'" in line


def test_verify_words_a_missing_queue_with_the_fix_for_its_kind(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = ["--prefix", unique, "--levels", "4"]
    assert main(["--url", rabbitmq_url, "declare", *topology]) == 0
    capsys.readouterr()
    missing = f"{unique}-nope"
    verify = ["topology", "verify", "--queue", missing, "--no-management", *topology]
    assert main(["--url", rabbitmq_url, *verify]) == EXIT_FAILURE
    lines = capsys.readouterr().out.splitlines()
    work = next(line for line in lines if line.startswith(f"✗ queue {missing!r}: missing"))
    assert work.endswith(f"--bind {missing} --create") and "its consumer declares it" in work
    parking = next(line for line in lines if f"queue '{missing}.parking': missing" in line)
    assert parking.endswith(f"--bind {missing}")
