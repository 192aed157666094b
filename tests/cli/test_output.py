"""The command line's shared output helpers: pure, no broker."""

from __future__ import annotations

import argparse
import io
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from delayed_retry.cli.connection import check_url
from delayed_retry.cli.main import main
from delayed_retry.cli.output import (
    UsageError,
    confirm,
    header_type,
    progress_bar,
    rate_type,
    render_table,
    to_jsonable,
)


def test_tables_fit_the_width_and_keep_one_line_per_row() -> None:
    rows = [("m-1", "x" * 200, 3), ("m-2", "two\nlines", 12)]
    text = render_table(("id", "exception", "attempts"), rows, width=40, right=(2,))
    lines = text.splitlines()
    assert len(lines) == 3
    assert all(len(line) <= 40 for line in lines)
    assert "…" in lines[1] and "two lines" in lines[2]
    assert lines[2].endswith("12") and lines[1].endswith(" 3")


@dataclass(frozen=True)
class Sample:
    at: datetime
    took: timedelta
    body: bytes


def test_json_values_are_plain() -> None:
    moment = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    assert to_jsonable(Sample(moment, timedelta(seconds=1.5), b"\xff")) == {
        "at": "2026-01-02T03:04:00+00:00",
        "took": 1.5,
        "body": {"base64": "/w=="},
    }
    assert to_jsonable({"b": b"text", "s": frozenset({1})}) == {"b": "text", "s": [1]}


@pytest.mark.parametrize(("text", "per_second"), [("50/s", 50), ("30/m", 0.5), ("7", 7)])
def test_rates(text: str, per_second: float) -> None:
    assert rate_type(text) == pytest.approx(per_second)


@pytest.mark.parametrize("text", ["fast", "0/s", "-1/s", "5/fortnight", "inf"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="100/s"):
        rate_type(text)


def test_headers_split_at_the_first_equals() -> None:
    assert header_type("k=a=b") == ("k", "a=b")
    with pytest.raises(argparse.ArgumentTypeError, match="name=value"):
        header_type("=x")


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("garbage", "is not a URL"),
        ("http://localhost/", "is a http:// URL"),
        ("amqp://", "names no host"),
        ("amqp://host:99999/", "not a broker URL"),
    ],
)
def test_urls_are_checked_before_dialling(url: str, text: str) -> None:
    with pytest.raises(UsageError, match=text):
        check_url(url)
    check_url("amqps://user:pw@host:5671/vh")


@pytest.mark.parametrize(
    ("options", "text"),
    [
        (["--levels", "0"], "levels 0 of the delay chain is outside 1..48"),
        (["--levels", "40"], "40 levels of 1 ms give the delay chain's level 39 a TTL"),
        (["--prefix", "amq.x"], "prefix 'amq.x' of the delay chain is not usable"),
    ],
)
def test_library_errors_are_printed_as_they_are(
    options: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The topology is built from the options before any connection: no broker needed.
    argv = ["--url", "amqp://guest:guest@127.0.0.1:1/", "topology", "show", *options]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"delayed-retry: error: {text}")
    assert "DelayTopology" not in line  # the same words serve code and command line


def test_a_unit_below_one_millisecond_is_refused_by_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topology", "show", "--unit-ms", "-5"]) == 2
    assert "'-5' is not a whole number of milliseconds of at least 1" in capsys.readouterr().err


def test_progress_is_silent_off_a_terminal_and_draws_on_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with progress_bar("replay", total=3, enabled=False) as update:
        update(1, 3)
    assert capsys.readouterr().err == ""
    with progress_bar("replay", total=None, enabled=True) as update:
        update(2, 3)


def test_progress_says_what_each_count_counts() -> None:
    # A replay looks at more messages than it replays: "2/4" alone read as "2 of 4 replayed".
    screen = io.StringIO()
    with progress_bar(
        "replay", total=None, counts="looked at", acted="replayed", stream=screen
    ) as update:
        update(2, 4, acted=1)
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert "2/4 looked at" in drawn and "1 replayed" in drawn, drawn


def test_confirm_needs_yes_without_a_terminal() -> None:
    assert confirm("delete 3?", assume_yes=True)
    with pytest.raises(UsageError, match="add --yes"):
        confirm("delete 3?", assume_yes=False)  # pytest's stdin is not a terminal
