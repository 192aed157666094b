"""``delayed_retry.testing``, what users test their handlers with: its names and its example.

The example (``examples/test_with_fake_channel.py``) is a user's test file: it runs
under pytest in a process of its own, as a user would run it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import delayed_retry.testing
from delayed_retry.testing import FakeChannel, fake_message

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "test_with_fake_channel.py"


def test_the_fake_is_exported_and_nothing_that_starts_a_broker() -> None:
    assert set(delayed_retry.testing.__all__) == {
        "Answer",
        "FakeChannel",
        "FakeConnection",
        "Published",
        "fake_message",
    }
    for name in delayed_retry.testing.__all__:
        assert getattr(delayed_retry.testing, name) is not None


def test_a_fake_message_is_settled_on_its_channel() -> None:
    channel = FakeChannel()
    message = fake_message(channel, body=b"x", routing_key="orders")
    assert (message.body, message.routing_key) == (b"x", "orders")
    assert channel.settlement_of(message) == []


def test_the_example_test_file_passes_under_pytest() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(EXAMPLE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout, run.stdout


def test_the_example_fails_when_the_handler_misbehaves(tmp_path: Path) -> None:
    # The same tests on a handler that swallows the gateway's failure: the retry test must
    # see that nothing went into the chain.
    broken = EXAMPLE.read_text().replace('raise GatewayDown("payment gateway timed out")', "return")
    assert broken != EXAMPLE.read_text()
    copy = tmp_path / "test_broken_example.py"
    copy.write_text(broken)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(copy)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 2 passed" in run.stdout, run.stdout


def test_a_harness_name_of_0_1_0_says_where_it_went() -> None:
    with pytest.raises(ImportError, match=r"delayed_retry\.testing\.RabbitMQNode is no longer"):
        from delayed_retry.testing import RabbitMQNode  # type: ignore[attr-defined]  # noqa: F401
    with pytest.raises(ImportError, match="FakeChannel"):
        _ = delayed_retry.testing.broker_url  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'FakeChanel'"):
        _ = delayed_retry.testing.FakeChanel  # type: ignore[attr-defined]
