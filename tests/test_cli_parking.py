"""``delayed-retry parking list|show|replay|purge`` against a real broker."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import aio_pika
import pytest

from delayed_retry.cli import main
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.headers import X_PARKED_AT, X_PARKED_REASON

pytestmark = pytest.mark.broker


async def _setup(url: str, queue: str) -> None:
    """A work queue and a parking queue holding 2 CardDeclined, 1 TimeoutError, 1 binary body."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        await channel.declare_queue(f"{queue}.parking", durable=True)
        rows = [
            ("m-0", "billing.CardDeclined", b'{"order": 1}'),
            ("m-1", "billing.CardDeclined", b'{"order": 2}'),
            ("m-2", "TimeoutError", b'{"order": 3}'),
            ("m-3", "TimeoutError", b"\xff\x00\x01binary"),
        ]
        for ident, kind, body in rows:
            headers: dict[str, aio_pika.abc.FieldValue] = {
                X_PARKED_REASON: "max-retries",
                X_PARKED_AT: to_epoch_ms(utcnow() - timedelta(hours=2)),
                "x-exception-type": kind,
                "x-exception-message": f"{ident} failed",
                "x-retry": 3,
            }
            await channel.default_exchange.publish(
                aio_pika.Message(body, message_id=ident, headers=headers),
                routing_key=f"{queue}.parking",
            )


def _ids(url: str, queue: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["--url", url, "parking", "list", "--queue", queue, "--json"]) == 0
    return sorted(r["id"] for r in json.loads(capsys.readouterr().out)["records"])


def test_list_groups_and_filters_and_show_prints_binary_bodies_safely(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_setup(rabbitmq_url, unique))
    url = ["--url", rabbitmq_url]
    assert main([*url, "parking", "list", "--queue", unique]) == 0
    out = capsys.readouterr().out
    assert f"failure groups of {unique!r} (4 messages)" in out
    assert "billing.CardDeclined" in out and "2 h" in out and "nothing was removed" in out

    assert (
        main(
            [
                *url,
                "parking",
                "list",
                "--queue",
                unique,
                "--json",
                "--exception",
                "CardDeclined",
                "--older-than",
                "1h",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert [g["count"] for g in data["groups"]] == [2]
    assert [r["id"] for r in data["records"]] == ["m-0", "m-1"]
    assert data["records"][0]["body"] == '{"order": 1}'

    assert main([*url, "parking", "list", "--queue", unique, "--newer-than", "1h"]) == 0
    assert f"no parked messages for {unique!r} match" in capsys.readouterr().out

    assert main([*url, "parking", "show", "m-3", "--queue", unique]) == 0
    out = capsys.readouterr().out
    assert "(binary, base64) /wAB" in out and "TimeoutError" in out
    assert main([*url, "parking", "show", "nope", "--queue", unique]) == 1
    assert "no parked message with id 'nope'" in capsys.readouterr().err
    assert _ids(rabbitmq_url, unique, capsys) == ["m-0", "m-1", "m-2", "m-3"]


def test_replay_dry_run_then_by_filter_and_purge_asks_first(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_setup(rabbitmq_url, unique))
    url = ["--url", rabbitmq_url]
    topo = ["--prefix", unique, "--levels", "4"]
    assert main([*url, "declare", *topo]) == 0  # the replay binds the queue itself
    capsys.readouterr()

    replay = [*url, "parking", "replay", "--queue", unique, *topo, "--exception", "TimeoutError"]
    assert main([*replay, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would replay m-2" in out and "would replay m-3" in out
    assert "dry run: would have replayed 2 of 4" in out
    assert _ids(rabbitmq_url, unique, capsys) == ["m-0", "m-1", "m-2", "m-3"]

    assert main([*replay, "--rate", "100/s", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["done"] == 2 and report["to_queue"] == unique and not report["dry_run"]
    assert _ids(rabbitmq_url, unique, capsys) == ["m-0", "m-1"]

    purge = [*url, "parking", "purge", "--queue", unique]
    assert main(purge) == 2
    assert "needs a selection" in capsys.readouterr().err
    assert main([*purge, "--id", "m-0"]) == 2  # no terminal to ask on, no --yes
    assert "add --yes" in capsys.readouterr().err
    assert _ids(rabbitmq_url, unique, capsys) == ["m-0", "m-1"]
    assert main([*purge, "--id", "m-0", "--yes"]) == 0
    assert "purged 1 message(s)" in capsys.readouterr().out
    assert _ids(rabbitmq_url, unique, capsys) == ["m-1"]
