"""What the service commands say when they start, and the stranding mistakes they warn about."""

from __future__ import annotations

import asyncio
import signal

import aio_pika
import pytest

from delayed_retry.admin.live_chain import LiveQueue
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli.startup import Startup, startup_line, stranded_forward_queues
from tests.support.chain import Scenario
from tests.support.services import lines_until_running, start_command


def test_the_start_up_line_names_the_chain_and_what_is_consumed() -> None:
    topology = DelayTopology(prefix="orders", levels=20)
    line = startup_line(
        Startup(
            command="front-door",
            topology=topology,
            consumes=("X.delay", "orders.forward.X"),
            delivers_to=("X",),
        )
    )
    assert line == (
        "delayed-retry front-door: chain prefix 'orders' (20 levels of 1 ms, quorum); "
        "consuming 'X.delay', 'orders.forward.X'; delivering to exchange 'X'"
    )


def test_forward_queues_of_another_prefix_with_messages_are_reported() -> None:
    topology = DelayTopology(prefix="delayed-retry")
    queues = [
        LiveQueue(name="orders.forward.X", messages=86),
        LiveQueue(name="delayed-retry.forward.X", messages=3),  # ours: served
        LiveQueue(name="empty.forward.X", messages=0),  # nothing stranded
        LiveQueue(name="orders.forward.Y", messages=5),  # another exchange
        LiveQueue(name="orders.forward.X.parking", messages=2),  # not a forward queue
    ]
    warnings = stranded_forward_queues(topology=topology, exchanges=["X"], queues=queues)
    assert len(warnings) == 1
    assert "'orders.forward.X' holds 86 message(s)" in warnings[0]
    assert "--prefix orders" in warnings[0] and "DELAYED_RETRY_PREFIX=orders" in warnings[0]


@pytest.mark.broker
@pytest.mark.timeout(120)
async def test_a_forwarder_warns_of_a_missing_exchange_and_an_unserved_inbox(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    s = quorum
    exchange = s.name("missing")
    inbox = f"{exchange}.delay"
    forward = s.topology.forward_queue(exchange)
    s.track_queue(inbox, forward, f"{forward}.parking")
    # Messages wait for a front door that is not running.
    await s.ch.declare_queue(inbox, durable=True, arguments={"x-queue-type": "quorum"})
    await s.ch.default_exchange.publish(aio_pika.Message(b"waiting"), routing_key=inbox)
    await s.wait_for_depth(inbox, 1)
    args = ["--url", rabbitmq_url, "forwarder", "--exchange", exchange]
    args += ["--prefix", s.topology.prefix, "--levels", str(s.topology.levels)]
    proc = start_command(args)
    try:
        lines = await asyncio.to_thread(lines_until_running, proc)
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = "\n".join(lines)
    assert f"delayed-retry forwarder: chain prefix {s.topology.prefix!r}" in text
    assert f"consuming {forward!r}; delivering to exchange {exchange!r}" in text
    assert f"warning: exchange {exchange!r} does not exist" in text
    assert f"warning: queue {inbox!r} holds 1 message(s) and nothing consumes it" in text
    assert proc.returncode == 0
