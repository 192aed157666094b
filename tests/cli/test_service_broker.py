"""The service commands as an operator runs them: probes, metrics, broker outages, SIGTERM.

Real processes on a private node of this module's own (the test stops and
restarts it), real HTTP on loopback.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import aio_pika
import pytest

from delayed_retry import DEFAULT_HOLD, DelayTopology, declare_topology, publish_delayed
from delayed_retry.cli.service import CLOSE_ALLOWANCE
from harness import RabbitMQNode, free_port
from tests.support.nodes import private_node
from tests.support.services import get, metric, start_command, stop, wait_status

pytestmark = pytest.mark.private_node

TOPOLOGY = DelayTopology(
    prefix=f"svc-{secrets.token_hex(3)}", levels=12, unit=timedelta(milliseconds=1)
)
CHAIN = ["--prefix", TOPOLOGY.prefix, "--levels", "12"]
STOP_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQNode]:
    """A private node this module may stop and restart."""
    yield from private_node()


@pytest.fixture
async def channel(node: RabbitMQNode) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(node.url)
    async with connection:
        ch = await connection.channel()
        await ch.declare_queue("svc-work", durable=True, arguments={"x-queue-type": "quorum"})
        await declare_topology(ch, TOPOLOGY, queues=["svc-work"])
        yield ch


def _args(command: str, exchange: str) -> list[str]:
    return {
        "front-door": ["--exchange", exchange],
        "forwarder": ["--exchange", exchange],
        "router": ["--queue", "svc-work"],
        "alerts": [],
        "web": ["--queue", "svc-work", "--port", str(free_port()), "--read-only"],
    }[command]


@pytest.mark.parametrize("command", ["front-door", "forwarder", "router", "alerts", "web"])
async def test_each_service_answers_its_probes_and_metrics(
    command: str, node: RabbitMQNode, channel: aio_pika.abc.AbstractChannel
) -> None:
    health = free_port()
    # The web view shares one port between probes and metrics: both work.
    metrics = health if command == "web" else free_port()
    exchange = f"svc-x-{secrets.token_hex(3)}"
    await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    proc = start_command(
        [
            *("--url", node.url, command, *_args(command, exchange), *CHAIN),
            *("--health-port", str(health), "--metrics-port", str(metrics)),
        ],
        env={"DELAYED_RETRY_WEB_TOKEN": ""},
    )
    try:
        ready = await asyncio.to_thread(wait_status, health, "/readyz", 200, proc=proc)
        assert ready["status"] == "ready" and ready["service"] == command
        assert ready["checks"]["started"] is True and ready["checks"]["stopping"] is False
        assert await asyncio.to_thread(get, health, "/livez") == (
            200,
            json.dumps({"status": "alive", "service": command}) + "\n",
        )
        status, body = await asyncio.to_thread(get, health, "/nothing")
        assert status == 404 and "/livez" in body
        status, page = await asyncio.to_thread(get, metrics, "/metrics")
        assert status == 200
        assert metric(page, "delayed_retry_service_ready", service=command) == 1.0
        assert "target_info" in page
    finally:
        code, took, output = await asyncio.to_thread(stop, proc)
    assert code == 0, output
    assert took < STOP_TIMEOUT + CLOSE_ALLOWANCE
    assert "stopped in" in output


async def _bodies(channel: aio_pika.abc.AbstractChannel, queue: str, want: set[str]) -> set[str]:
    """Read ``queue`` until every body of ``want`` arrived (duplicates allowed), or 60 s."""
    got: set[str] = set()
    q = await channel.get_queue(queue)
    deadline = asyncio.get_running_loop().time() + 60
    while not want <= got and asyncio.get_running_loop().time() < deadline:
        message = await q.get(fail=False)
        if message is None:
            await asyncio.sleep(0.05)
            continue
        got.add(message.body.decode())
        await message.ack()
    return got


@pytest.mark.timeout(240)
async def test_sigterm_loses_nothing_and_readiness_follows_the_broker(
    node: RabbitMQNode, channel: aio_pika.abc.AbstractChannel
) -> None:
    exchange = f"svc-x-{secrets.token_hex(3)}"
    x = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    target = await channel.declare_queue(f"{exchange}.target", durable=True)
    await target.bind(x, "#")
    health, metrics = free_port(), free_port()
    command = ["--url", node.url, "forwarder", "--exchange", exchange, *CHAIN]
    command += ["--health-port", str(health), "--metrics-port", str(metrics)]
    command += ["--stop-timeout", f"{STOP_TIMEOUT:g}s", "--log-format", "json"]

    first = start_command(command)
    await asyncio.to_thread(wait_status, health, "/readyz", 200, proc=first)
    # Messages leave the chain early and wait in the forwarder until due (held): a
    # SIGTERM in the middle finds some held, some being forwarded, most in the chain.
    sent = {f"m{i}" for i in range(300)}
    for body in sorted(sent):
        await publish_delayed(
            channel,
            aio_pika.Message(body.encode()),
            exchange=exchange,
            routing_key=f"k.{body}",
            delay=random.uniform(0.05, 2.0),
            topology=TOPOLOGY,
            hold=DEFAULT_HOLD,
        )
    deadline = asyncio.get_running_loop().time() + 30
    forwarded = 0.0
    while forwarded < 30:
        assert asyncio.get_running_loop().time() < deadline, "nothing forwarded in 30 s"
        page = (await asyncio.to_thread(get, metrics, "/metrics"))[1]
        forwarded = metric(page, "delayed_retry_service_messages_total", outcome="forwarded") or 0
        await asyncio.sleep(0.02)
    code, took, output = await asyncio.to_thread(stop, first)
    assert code == 0, output
    assert took < STOP_TIMEOUT + CLOSE_ALLOWANCE, output
    print(f"forwarder with {forwarded:g} forwarded exited {took:.2f} s after SIGTERM")
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert any("stopped in" in line["message"] for line in lines)
    assert get(health, "/readyz")[0] is None  # the port closed with the process

    second = start_command(command)
    try:
        await asyncio.to_thread(wait_status, health, "/readyz", 200, proc=second)
        got = await _bodies(channel, target.name, sent)
        assert sent - got == set(), f"lost {len(sent - got)} message(s) across the SIGTERM"

        # The broker goes away: not ready (still alive); it returns: ready again.
        await asyncio.to_thread(node.stop)
        down = await asyncio.to_thread(wait_status, health, "/readyz", 503, proc=second)
        assert down["checks"]["connected"] is False
        assert (await asyncio.to_thread(get, health, "/livez"))[0] == 200
        page = (await asyncio.to_thread(get, metrics, "/metrics"))[1]
        assert metric(page, "delayed_retry_service_ready", service="forwarder") == 0.0
        await asyncio.to_thread(node.start)
        up = await asyncio.to_thread(wait_status, health, "/readyz", 200, proc=second)
        assert up["checks"] == {
            "started": True,
            "stopping": False,
            "connected": True,
            "consuming": True,
            "broker_sees_consumers": True,
            "exchanges_exist": True,
            "broker_answers": True,
        }
        assert up["reconnects"] >= 1
        assert up["consumers"][TOPOLOGY.forward_queue(exchange)]["restored"] >= 1
    finally:
        code, took, output = await asyncio.to_thread(stop, second)
    assert code == 0, output
