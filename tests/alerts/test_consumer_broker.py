"""Parking alerts: a real broker, a real HTTP server on loopback receiving the webhooks."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aiohttp import web
from tenacity import wait_fixed

from delayed_retry import (
    ConfigurationError,
    DelayTopology,
    consume,
    declare_topology,
    with_delayed_retry,
)
from delayed_retry.alerts import (
    Alert,
    AlertSinkError,
    CallbackSink,
    LoggingSink,
    ParkingAlerts,
    SinkRetry,
    WebhookSink,
    deliver,
)
from delayed_retry.cli.alerts_cmd import run_alerts
from delayed_retry.cli.main import build_parser
from delayed_retry.observability.instrumentation import NoInstrumentation
from tests.support.queues import depth
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

FAST_RETRY = SinkRetry(attempts=3, wait=wait_fixed(0.01))


class GatewayDown(Exception):
    """What the handler raises; the messages park at once (max_retries=0)."""


@dataclass
class Webhook:
    """A loopback HTTP server answering with ``statuses`` in turn, then ``default``."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    default: int = 200
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)
    received: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        status = self.statuses.pop(0) if self.statuses else self.default
        self.answered.append(status)
        self.received.set()
        return web.Response(status=status, text="ok" if status < 300 else "broken")


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    hook = Webhook()
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    hook.url = f"http://{host}:{port}/hook"
    try:
        yield hook
    finally:
        await runner.cleanup()


async def park(
    connection: AbstractRobustConnection,
    topology: DelayTopology,
    queue_name: str,
    ids: list[str],
    *,
    already: int = 0,
) -> None:
    """Park ``ids`` through the middleware and wait until their copies are in the alert queue."""
    channel = await connection.channel()
    queue = await channel.declare_queue(queue_name, durable=True)

    @with_delayed_retry(max_retries=0, topology=topology, instrumentation=NoInstrumentation())
    async def handle(message: AbstractIncomingMessage) -> None:
        raise GatewayDown(f"gateway down for {message.message_id}")

    tag = await consume(queue, handle)
    for message_id in ids:
        await channel.default_exchange.publish(
            aio_pika.Message(b"{}", message_id=message_id), routing_key=queue_name
        )

    async def arrived() -> bool:
        return await depth(connection, topology.alerts_queue) == already + len(ids)

    await wait_until(arrived, what=f"{len(ids)} copies in {topology.alerts_queue}")
    await queue.cancel(tag)
    await channel.close()


async def test_webhook_gets_one_grouped_alert_and_the_copies_are_acked(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, webhook: Webhook
) -> None:
    await declare_topology(await connection.channel(), topology)
    await park(connection, topology, f"{unique}.q", ["a1", "a2", "a3"])
    await park(connection, topology, f"{unique}.other", ["b1"], already=3)
    alerts = ParkingAlerts(
        connection,
        sinks=[WebhookSink(webhook.url)],
        topology=topology,
        window=2.0,
        max_ids=2,
        sink_retry=FAST_RETRY,
    )
    async with alerts:
        await asyncio.wait_for(alerts.wait_delivered(1), 15)
    assert len(webhook.bodies) == 1
    body = webhook.bodies[0]
    assert body["total"] == 4
    # Handled concurrently, so parked in any order: two of the four are named.
    assert len(body["message_ids"]) == 2
    assert set(body["message_ids"]) <= {"a1", "a2", "a3", "b1"}
    assert body["more"] == 2
    assert body["groups"][0]["example"] in {f"gateway down for a{i}" for i in (1, 2, 3)}
    body["groups"][0]["example"] = None
    # a1, a2 and a3 differ only in a number: one group, one template.
    assert [g.pop("template") for g in body["groups"]] == [
        "gateway down for a<num>",
        "gateway down for b<num>",
    ]
    assert all(len(g.pop("key")) == 12 for g in body["groups"])
    assert body["groups"] == [
        {
            "queue": f"{unique}.q",
            "exception_type": f"{__name__}.GatewayDown",
            "count": 3,
            "example": None,
        },
        {
            "queue": f"{unique}.other",
            "exception_type": f"{__name__}.GatewayDown",
            "count": 1,
            "example": "gateway down for b1",
        },
    ]
    assert f"delayed-retry parking list --queue {unique}.q" in body["text"]
    # Acked after the webhook succeeded; the parked messages themselves are untouched.
    assert await depth(connection, topology.alerts_queue) == 0
    assert await depth(connection, f"{unique}.q.parking") == 3


async def test_a_sink_failing_twice_then_succeeding_is_retried_and_then_acked(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, webhook: Webhook
) -> None:
    await declare_topology(await connection.channel(), topology)
    await park(connection, topology, f"{unique}.q", ["m1"])
    webhook.statuses = [500, 503]
    async with ParkingAlerts(
        connection,
        sinks=[WebhookSink(webhook.url, slack=True)],
        topology=topology,
        window=0,
        sink_retry=FAST_RETRY,
    ) as alerts:
        await asyncio.wait_for(alerts.wait_delivered(1), 15)
    assert webhook.answered == [500, 503, 200]
    # Slack-compatible payload: text and blocks.
    assert webhook.bodies[-1]["text"] == f"1 message parked on {unique}.q"
    assert "m1" in webhook.bodies[-1]["blocks"][0]["text"]["text"]
    assert await depth(connection, topology.alerts_queue) == 0


async def test_a_sink_that_always_fails_leaves_the_copies_in_the_alert_queue(
    connection: AbstractRobustConnection,
    unique: str,
    topology: DelayTopology,
    webhook: Webhook,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await declare_topology(await connection.channel(), topology)
    await park(connection, topology, f"{unique}.q", ["f1", "f2"])
    webhook.default = 500
    delivered: list[Alert] = []
    alerts = ParkingAlerts(
        connection,
        # The callback sink succeeds; the webhook never does: nothing may be acked.
        sinks=[CallbackSink(delivered.append), WebhookSink(webhook.url)],
        topology=topology,
        window=0,
        sink_retry=SinkRetry(attempts=2, wait=wait_fixed(0.01)),
        retry_after=3600,
    )
    with caplog.at_level(logging.ERROR, logger="delayed_retry.alerts"):
        await alerts.start()
        try:

            async def failing() -> bool:
                return alerts.failing

            await wait_until(failing, what="the alert delivery to give up")
            # Held unacked by the consumer: not ready, but not gone either.
            assert await depth(connection, topology.alerts_queue) == 0
        finally:
            await alerts.stop()
    assert webhook.answered == [500, 500]
    assert len(delivered) == 1
    assert alerts.alerts_delivered == 0
    assert "stay unacked" in caplog.text
    assert topology.alerts_queue in caplog.text
    # The consumer's channel is closed: both copies are back in the alert queue.
    assert await depth(connection, topology.alerts_queue) == 2


async def test_callback_and_logging_sinks(
    connection: AbstractRobustConnection,
    unique: str,
    topology: DelayTopology,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await declare_topology(await connection.channel(), topology)
    await park(connection, topology, f"{unique}.q", ["c1", "c2"])
    got: asyncio.Queue[Alert] = asyncio.Queue()

    async def on_alert(alert: Alert) -> None:
        await got.put(alert)

    with caplog.at_level(logging.WARNING, logger="delayed_retry.alerts"):
        async with ParkingAlerts(
            connection,
            sinks=[CallbackSink(on_alert), LoggingSink()],
            topology=topology,
            window=0.5,
            sink_retry=FAST_RETRY,
        ) as alerts:
            alert = await asyncio.wait_for(got.get(), 15)
            await asyncio.wait_for(alerts.wait_delivered(1), 15)
    assert alert.total == 2
    assert sorted(alert.message_ids) == ["c1", "c2"]
    assert f"2 messages parked on {unique}.q" in caplog.text
    assert await depth(connection, topology.alerts_queue) == 0


async def test_unroutable_chain_messages_are_alerted_too(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology
) -> None:
    channel = await connection.channel()
    await declare_topology(channel, topology)
    # A chain message for a queue that is not bound to the delivery exchange.
    route = topology.route(1, f"{unique}.gone")
    exchange = await channel.get_exchange(route.exchange)
    await exchange.publish(aio_pika.Message(b"x", message_id="u1"), routing_key=route.routing_key)
    got: asyncio.Queue[Alert] = asyncio.Queue()
    async with ParkingAlerts(
        connection, sinks=[CallbackSink(got.put_nowait)], topology=topology, window=0
    ):
        alert = await asyncio.wait_for(got.get(), 15)
    assert [(g.queue, g.exception_type) for g in alert.groups] == [(f"{unique}.gone", "unroutable")]
    assert alert.message_ids == ("u1",)


async def test_missing_alert_queue_is_a_clear_error(
    connection: AbstractRobustConnection, unique: str
) -> None:
    alerts = ParkingAlerts(
        connection,
        sinks=[LoggingSink()],
        topology=DelayTopology(prefix=f"{unique}-never-declared"),
        declare=False,
    )
    with pytest.raises(ConfigurationError, match="does not exist; declare the topology first"):
        await alerts.start()


def test_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="at least one sink"):
        ParkingAlerts(object(), sinks=[])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="no async send"):
        ParkingAlerts(object(), sinks=[object()])  # type: ignore[arg-type,list-item]
    with pytest.raises(ConfigurationError, match="http"):
        WebhookSink("ftp://example.invalid/")
    with pytest.raises(ConfigurationError, match="at least 1"):
        SinkRetry(attempts=0)


def test_webhook_sink_without_aiohttp_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    with pytest.raises(ConfigurationError, match=r"delayed-retry\[webhook\]"):
        WebhookSink("http://127.0.0.1:9/hook")


async def test_deliver_gives_up_with_an_error_naming_the_sink() -> None:
    calls = 0

    def broken(alert: Alert) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("disk full")

    alert = Alert(total=1, groups=(), message_ids=("x",))
    with pytest.raises(AlertSinkError, match=r"CallbackSink\('.*broken'\) failed 3 time"):
        await deliver(CallbackSink(broken), alert, retry=FAST_RETRY)
    assert calls == 3


async def test_alerts_command_posts_to_the_webhook(
    connection: AbstractRobustConnection,
    rabbitmq_url: str,
    unique: str,
    topology: DelayTopology,
    webhook: Webhook,
) -> None:
    await declare_topology(await connection.channel(), topology)
    await park(connection, topology, f"{unique}.q", ["k1"])
    args = build_parser().parse_args(
        [
            "--url",
            rabbitmq_url,
            "alerts",
            "--webhook",
            webhook.url,
            "--window",
            "0",
            "--log",
            "--once",
            "--prefix",
            topology.prefix,
            "--levels",
            str(topology.levels),
            "--queue-type",
            "classic",
        ]
    )
    assert await asyncio.wait_for(run_alerts(args), 30) == 0
    assert json.loads(json.dumps(webhook.bodies))[0]["message_ids"] == ["k1"]
    assert await depth(connection, topology.alerts_queue) == 0


def test_alerts_command_rejects_slack_without_webhook() -> None:
    args = build_parser().parse_args(["alerts", "--slack"])
    with pytest.raises(ConfigurationError, match="--slack needs --webhook"):
        asyncio.run(run_alerts(args))
