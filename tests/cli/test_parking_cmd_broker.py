"""``delayed-retry parking list|show|replay|purge`` against a real broker."""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import timedelta

import aio_pika
import pytest

from delayed_retry import DelayTopology
from delayed_retry.cli import main
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.headers import X_PARKED_AT, X_PARKED_REASON
from delayed_retry.rabbitmq.versions import broker_major_version
from tests.support.queues import delete_all

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
    # Each record shows the start of its body; a binary one says what it is.
    assert re.search(r"m-0 .* \{\"order\": 1\}$", out, re.MULTILINE), out
    assert re.search(r"m-3 .* \(binary, 9 bytes\)$", out, re.MULTILINE), out

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


async def _park(url: str, queue: str, rows: list[tuple[str, bytes, int]]) -> None:
    """Park ``(message_id, body, hours ago)`` rows in ``queue``'s parking queue."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        await channel.declare_queue(f"{queue}.parking", durable=True)
        for ident, body, hours in rows:
            headers: dict[str, aio_pika.abc.FieldValue] = {
                X_PARKED_REASON: "max-retries",
                X_PARKED_AT: to_epoch_ms(utcnow() - timedelta(hours=hours)),
                "x-exception-type": "billing.CardDeclined",
            }
            await channel.default_exchange.publish(
                aio_pika.Message(body, message_id=ident, headers=headers),
                routing_key=f"{queue}.parking",
            )


def test_ids_may_be_prefixes_and_an_id_of_several_messages_is_never_just_the_first(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two parked messages share the id order-2 (a message parked twice, say).
    rows = [("order-1", b"a", 3), ("order-10", b"b", 3), ("order-2", b"c", 2), ("order-2", b"d", 1)]
    asyncio.run(_park(rabbitmq_url, unique, rows))
    url = ["--url", rabbitmq_url]
    show = [*url, "parking", "show", "--queue", unique]

    assert main([*show, "order-10"]) == 0  # a whole id
    assert "id: order-10" in capsys.readouterr().out
    assert main([*show, "order-1"]) == 0  # a whole id wins over order-10, which it starts
    assert "body (1 bytes):\na\n" in capsys.readouterr().out

    assert main([*show, "order-2"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"2 parked messages of {unique!r} have the id 'order-2'" in err[0]
    assert err[0].count("order-2 (parked ") == 2 and "add --all" in err[0]
    assert main([*show, "order-2", "--all", "--json"]) == 0
    assert [r["body"] for r in json.loads(capsys.readouterr().out)] == ["c", "d"]

    assert main([*show, "order-"]) == 1
    line = capsys.readouterr().err
    assert "'order-' selects 4 parked messages" in line and "3 ids start with it" in line
    assert main([*show, "nope"]) == 1
    assert "no parked message with id 'nope'" in capsys.readouterr().err

    # replay says how many an id selects before acting, and asks when it is more than one.
    topo = ["--prefix", unique, "--levels", "4"]
    assert main([*url, "declare", *topo]) == 0
    capsys.readouterr()
    replay = [*url, "parking", "replay", "--queue", unique, *topo]
    assert main([*replay, "--id", "order-2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--id 'order-2' selects 2 parked message(s): order-2 (×2)" in out
    assert "dry run: would have replayed 2 of 4" in out
    assert main([*replay, "--id", "order-2"]) == 2  # no terminal to ask on, no --yes
    captured = capsys.readouterr()
    assert "selects 2 parked message(s)" in captured.out and "add --yes" in captured.err
    assert _ids(rabbitmq_url, unique, capsys) == ["order-1", "order-10", "order-2", "order-2"]
    assert main([*replay, "--id", "order-10"]) == 0  # one message: nothing to ask
    assert "replayed 1 message(s)" in capsys.readouterr().out
    assert main([*replay, "--id", "order-2", "--yes"]) == 0
    assert "replayed 2 message(s)" in capsys.readouterr().out
    assert _ids(rabbitmq_url, unique, capsys) == ["order-1"]

    # purge takes a prefix too, and asks with the count it selected.
    purge = [*url, "parking", "purge", "--queue", unique]
    assert main([*purge, "--id", "order", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "--id 'order' selects 1 parked message(s): order-1" in out
    assert "purged 1 message(s)" in out
    assert _ids(rabbitmq_url, unique, capsys) == []


async def _park_in_quorum(url: str, queue: str) -> int | None:
    """One parked message in ``queue``'s quorum parking queue; the broker's major version."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.default_exchange.publish(
            aio_pika.Message(b"x", message_id="seen", headers={X_PARKED_REASON: "max-retries"}),
            routing_key=f"{queue}.parking",
        )
        underlay = await channel.get_underlay_channel()
        return broker_major_version(underlay.connection.server_properties)


def test_show_sets_the_broker_read_counters_apart_from_the_headers(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", rabbitmq_url]
    topo = ["--prefix", unique, "--levels", "4"]
    assert main([*url, "declare", *topo, "--bind", unique, "--create"]) == 0  # quorum
    major = asyncio.run(_park_in_quorum(rabbitmq_url, unique))
    show = [*url, "parking", "show", "seen", "--queue", unique, *topo]
    capsys.readouterr()
    for _look in range(2):  # each look is a read the broker counts
        assert main([*show, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert "x-delivery-count" not in data["headers"] and "x-parked-reason" in data["headers"]
    if major is not None and major >= 4:  # quorum queues count returns from 4.0 on
        assert data["broker_read_counters"]["x-delivery-count"] >= 1
    assert main(show) == 0
    out = capsys.readouterr().out
    headers = out.split("headers:")[1].split("body (")[0]
    if major is not None and major >= 4:
        own, counted = headers.split("read counts: written by RabbitMQ on every read")
        assert "x-delivery-count" not in own
        assert "x-delivery-count = " in counted and "each look counts" in counted


class _Terminal(io.StringIO):
    """Standard input that is a terminal, answering ``answer``."""

    def isatty(self) -> bool:
        return True


def test_an_unfiltered_replay_of_the_whole_lot_asks_first_like_purge(
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asyncio.run(_setup(rabbitmq_url, unique))
    topo = ["--prefix", unique, "--levels", "4"]
    assert main(["--url", rabbitmq_url, "declare", *topo]) == 0
    capsys.readouterr()
    try:
        _replay_asks(rabbitmq_url, unique, topo, capsys, monkeypatch)
    finally:
        topology = DelayTopology(prefix=unique, levels=4)
        asyncio.run(delete_all(rabbitmq_url, topology=topology, queues=[unique]))


def _replay_asks(
    rabbitmq_url: str,
    unique: str,
    topo: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replay = ["--url", rabbitmq_url, "parking", "replay", "--queue", unique, *topo]

    assert main(replay) == 2  # no terminal to ask on, no --yes: nothing moves
    err = capsys.readouterr().err
    assert f"replay all 4 parked message(s) of {unique!r}" in err and "add --yes" in err
    assert _ids(rabbitmq_url, unique, capsys) == ["m-0", "m-1", "m-2", "m-3"]

    monkeypatch.setattr("sys.stdin", _Terminal("n\n"))
    assert main(replay) == 1  # asked on a terminal, answered no
    captured = capsys.readouterr()
    assert "[y/N]" in captured.out and "nothing replayed" in captured.err
    assert _ids(rabbitmq_url, unique, capsys) == ["m-0", "m-1", "m-2", "m-3"]

    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
    assert main(replay) == 0
    assert "replayed 4 message(s)" in capsys.readouterr().out
    assert _ids(rabbitmq_url, unique, capsys) == []

    assert main([*replay, "--yes"]) == 0  # nothing left: nothing to ask
    assert "no parked messages" in capsys.readouterr().out
