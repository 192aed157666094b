"""What ``parking list`` says around its tables: counts in words, and ids cut to fit."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from delayed_retry.cli import main
from delayed_retry.cli.output import counted
from delayed_retry.headers import X_PARKED_REASON

pytestmark = pytest.mark.broker

LONG_ID = "order-2026-12-06T15:39:10.123456Z-" + "f" * 64


def test_counts_say_one_message_not_one_messages() -> None:
    assert [counted(n, "message") for n in (0, 1, 2)] == ["0 messages", "1 message", "2 messages"]


async def _park(url: str, queue: str, message_id: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(f"{queue}.parking", durable=True)
        await channel.default_exchange.publish(
            aio_pika.Message(
                b"{}", message_id=message_id, headers={X_PARKED_REASON: "max-retries"}
            ),
            routing_key=f"{queue}.parking",
        )


async def _delete(url: str, queue: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        await (await connection.channel()).queue_delete(f"{queue}.parking")


def test_a_cut_id_comes_with_how_to_show_it_by_its_start(
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    asyncio.run(_park(rabbitmq_url, unique, LONG_ID))
    try:
        assert main(["--url", rabbitmq_url, "parking", "list", "--queue", unique]) == 0
        out = capsys.readouterr().out
        assert f"failure groups of {unique!r} (1 message):" in out
        assert LONG_ID not in out and "…" in out
        assert "a unique start of an id is enough" in out
        # The hint works: the start shown before the cut selects the message.
        start = next(w for w in out.split() if w.startswith("order-2026")).rstrip("…")
        show = ["--url", rabbitmq_url, "parking", "show", "--queue", unique, start]
        assert main(show) == 0
        assert LONG_ID in capsys.readouterr().out
    finally:
        asyncio.run(_delete(rabbitmq_url, unique))
