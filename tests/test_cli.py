"""The command line against a real broker: declare, status, parking list/replay, errors."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from delayed_retry.cli import main
from delayed_retry.urls import redact_url

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://user:s3cret@host:5672/vh", "amqp://user:***@host:5672/vh"),
        ("amqps://user:p%40ss@host/", "amqps://user:***@host/"),
        ("amqp://user:a:b@c@host:5672/", "amqp://user:***@host:5672/"),
        ("amqp://user@host/", "amqp://user@host/"),
        ("amqp://host/", "amqp://host/"),
        ("amqp://user:s3cret@host:notaport/", "amqp://user:***@host:notaport/"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url_hides_the_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3cret" not in redact_url(url)


def test_declare_status_and_mismatch(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_declare_queue(rabbitmq_url, unique))
    topo = ["--prefix", unique, "--levels", "8"]
    assert main(["--url", rabbitmq_url, "declare", *topo, "--bind", unique]) == 0
    out = capsys.readouterr().out
    assert f"declared topology {unique!r}: 8 levels of 1 ms (quorum)" in out
    assert f"bound {unique!r}" in out

    assert main(["--url", rabbitmq_url, "status", *topo, "--queue", unique]) == 0
    out = capsys.readouterr().out
    assert f"{unique}.level.07" in out and f"{unique}.parking" in out and "missing" not in out

    # Same prefix, another unit: refused, naming the queue and the fix; nothing deleted.
    code = main(
        ["--url", rabbitmq_url, "declare", "--prefix", unique, "--levels", "8", "--unit-ms", "2"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"queue '{unique}.level.00' exists with other arguments" in err
    assert "use another DelayTopology prefix" in err


def test_status_reports_missing_queues(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", rabbitmq_url, "status", "--prefix", unique, "--levels", "2"]) == 1
    assert "run 'delayed-retry declare' with the same options" in capsys.readouterr().out


def test_parking_list_and_replay_on_an_empty_queue(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_declare_queue(rabbitmq_url, unique))
    topo = ["--prefix", unique, "--levels", "8"]
    assert main(["--url", rabbitmq_url, "declare", *topo, "--bind", unique]) == 0
    assert main(["--url", rabbitmq_url, "parking", "list", "--queue", unique, *topo]) == 0
    assert f"no parked messages for {unique!r}" in capsys.readouterr().out
    assert main(["--url", rabbitmq_url, "parking", "replay", "--queue", unique, *topo]) == 0
    assert f"replayed 0 message(s) to {unique!r}" in capsys.readouterr().out


def test_unreachable_broker_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "amqp://guest:pw@127.0.0.1:1/", "status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("delayed-retry: error: cannot reach the broker")
    assert "pw" not in err[-1]


async def _declare_queue(url: str, name: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True)
