"""A consumer with an outbox killed with SIGKILL between its confirmed publishes and its ack.

The delivery comes back and is handled again: its two downstream messages are
published once more, with the same ``message_id``s, and no more.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractChannel

from delayed_retry import DelayTopology
from tests.support.queues import delete_all, depth, drain, wait_for_depth
from tests.support.waiting import wait_until

from ._support import QUORUM
from .test_crash import Child

CHILD = Path(__file__).with_name("outbox_consumer.py")


async def test_sigkill_between_the_outbox_and_the_ack_repeats_each_publish_once(
    channel: AbstractChannel, rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    work, down = f"{unique}.work", f"{unique}.down"
    topology = DelayTopology(prefix=unique, levels=12)
    event = tmp_path / "event.txt"
    args = [rabbitmq_url, work, down, unique, str(event), "stop-before-ack"]
    child = Child(args, tmp_path / "child.log", script=CHILD)
    try:
        for name in (work, down):
            await channel.declare_queue(name, durable=True, arguments=QUORUM)
        await channel.default_exchange.publish(aio_pika.Message(b"job", message_id="in-1"), work)
        child.start()
        await wait_until(lambda: event.exists(), what="the held publishes confirmed")
        assert event.read_text() == "released"
        await wait_for_depth(channel, down, 2)  # confirmed before the ack
        child.kill()
        event.unlink()
        args[-1] = "run"
        child.start()
        await wait_until(lambda: event.exists(), what="the delivery acked after the restart")
        child.kill()
        assert await depth(channel, work) == 0, (tmp_path / "child.log").read_text()[-3000:]
        ids = Counter(m.message_id for m in await drain(channel, down))
        # At most one repeat of each, with the same id: consumers can deduplicate.
        assert ids == {"in-1:outbox:1": 2, "in-1:outbox:2": 2}
    finally:
        child.kill()
        await delete_all(channel, queues=[work, down], topology=topology)
