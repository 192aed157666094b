"""The README's demo: a consumer that fails, backs off through the chain, succeeds or parks.

Run it with ``scripts/demo`` from a checkout (a throwaway RabbitMQ node, started and removed
for it, unless ``$RABBITMQ_URL`` names a broker) or ``delayed-retry --url URL demo`` on a
broker of your own. It uses names of its own (``delayed-retry-demo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections.abc import Iterator
from datetime import timedelta

import aio_pika
from tenacity import retry_if_exception_type, wait_exponential

from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.consume import consume
from delayed_retry.consumer.decorator import with_delayed_retry
from delayed_retry.consumer.retry_state import current_retry_state
from delayed_retry.delivery.schedule import publish_delayed
from delayed_retry.parking.shortcuts import peek_parked
from delayed_retry.rabbitmq.urls import redact_url, vhost_of
from delayed_retry.recovery.hold import DEFAULT_HOLD


class PaymentGatewayDown(Exception):
    """A transient failure: worth retrying later."""


START = time.monotonic()


DEMO_TOPOLOGY = DelayTopology(prefix="delayed-retry-demo", levels=20)
"""A chain of its own (20 levels of 1 ms hold up to 17 minutes), apart from real traffic."""
DEMO_QUEUE = "delayed-retry-demo.orders"


def say(text: str) -> None:
    print(f"[{time.monotonic() - START:6.2f}s] {text}", flush=True)


STORY = (
    "five orders go to {queue!r}, whose consumer is wrapped in @with_delayed_retry "
    "(at most 4 retries, waiting 0.25 s, 0.5 s, 1 s, 2 s between attempts):",
    "  order-1  succeeds at once",
    "  order-2  times out twice, then succeeds: two retries through the delay chain",
    "  order-3  always times out: 4 retries, each waiting longer, then parked (max-retries)",
    "  order-4  has no customer id (ValueError, not retried): parked at once (not-retryable)",
    "  order-5  is scheduled 1.5 s ahead with publish_delayed: handled when due, not before",
    "each attempt shows how late it came after its due time",
)
"""What the demo is about to show, printed before it publishes anything."""


def next_steps(*, own_broker: bool) -> list[str]:
    """What to try after the demo, as lines (commands the user can paste)."""
    lines = [
        "next:",
        "  your own consumer: the README's 'Your first consumer' section, or "
        "docs/getting-started.md (publish to it with 'delayed-retry publish --queue orders "
        "--delay 0s', watch it with 'delayed-retry status --queue orders')",
        "  every option and path of the decorator: docs/retries.md; parked messages: "
        "docs/parking.md",
    ]
    if not own_broker:
        lines.append(
            "  keep what the demo parks to look at: run it on a broker of yours, "
            "'delayed-retry --url amqp://USER:PASSWORD@HOST:5672/ demo'"
        )
    return lines


class _StoryLog(logging.Handler):
    """The library's own warnings, told in the story's format (time, then the line)."""

    def emit(self, record: logging.LogRecord) -> None:
        say(f"  delayed-retry {record.levelname.lower()}: {record.getMessage()}")


@contextlib.contextmanager
def _library_lines_in_the_story() -> Iterator[None]:
    """Show delayed-retry's warnings as story lines instead of in the log's own format."""
    library = logging.getLogger("delayed_retry")
    handler = _StoryLog(level=logging.WARNING)
    propagate = library.propagate
    library.addHandler(handler)
    library.propagate = False
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.propagate = propagate


async def run(url: str) -> int:
    topology = DEMO_TOPOLOGY
    queue_name = DEMO_QUEUE
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue(queue_name, durable=True)
        await queue.purge()
        await declare_topology(channel, topology, queues=[queue_name])
        parking = await channel.declare_queue(f"{queue_name}.parking", passive=True)
        await parking.purge()
        finished: asyncio.Queue[str] = asyncio.Queue()

        @with_delayed_retry(
            max_retries=4,
            wait=wait_exponential(multiplier=0.25, max=2),  # 0.25 s, 0.5 s, 1 s, 2 s
            retry=retry_if_exception_type(PaymentGatewayDown),
            topology=topology,
        )
        async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            state = current_retry_state()
            assert state is not None
            order = message.body.decode()
            late = ""
            if state.due_at is not None:
                late = f", {(time.time() - state.due_at.timestamp()) * 1000:.0f} ms after due"
            say(f"{order}: attempt {state.attempt}{late}")
            if order == "order-2" and state.attempt < 3:
                raise PaymentGatewayDown("payment gateway timed out")
            if order == "order-3":
                if state.attempt >= 5:
                    await finished.put(order)
                raise PaymentGatewayDown("payment gateway keeps timing out")
            if order == "order-4":
                await finished.put(order)
                raise ValueError("order has no customer id")  # not retryable: parks at once
            say(f"{order}: done")
            await finished.put(order)

        consumer_tag = await consume(queue, handle)
        say(f"consuming {queue_name!r}; the delay chain is {topology.prefix!r}")
        for n in (1, 2, 3, 4):
            await channel.default_exchange.publish(
                aio_pika.Message(f"order-{n}".encode(), message_id=f"order-{n}"),
                routing_key=queue_name,
            )
        due = await publish_delayed(
            channel,
            aio_pika.Message(b"order-5 (scheduled)", message_id="order-5"),
            queue=queue_name,
            delay=timedelta(seconds=1.5),
            topology=topology,
            hold=DEFAULT_HOLD,  # the handler below holds it until due
        )
        say(f"scheduled order-5 for {due.isoformat(timespec='milliseconds')}")
        seen: set[str] = set()
        while len(seen) < 5:
            seen.add(await asyncio.wait_for(finished.get(), timeout=60))
        # Let the hand-over of the last failure (parking) finish.
        parked = []
        for _ in range(100):
            parked = await peek_parked(channel, queue=queue_name, topology=topology)
            if len(parked) == 2:
                break
            await asyncio.sleep(0.05)
        await queue.cancel(consumer_tag)
        say(f"{len(parked)} message(s) parked in {queue_name}.parking:")
        for p in parked:
            say(f"  {p.message_id}: {p.reason} after {p.attempts} attempt(s): {p.exception_type}")
        return 0 if len(parked) == 2 else 1


def left_behind(topology: DelayTopology, queue: str, *, vhost: str = "/") -> str:
    """What the demo leaves on a broker of the user's, and the commands that look and remove it.

    The ``rabbitmqctl`` line names ``vhost``: without ``-p`` it would act on ``/``.
    """
    queues = len(topology.queues()) + 2  # the chain's, the work queue and its parking queue
    options = f"--prefix {topology.prefix} --levels {topology.levels}"
    return "\n".join(
        [
            f"left on the broker to look at: queue {queue!r}, its parking queue "
            f"{queue + '.parking'!r} with the parked messages, and the chain "
            f"{topology.prefix!r} ({queues} queues and {len(topology.exchanges())} exchanges "
            "in all)",
            f"  look:   delayed-retry parking list --queue {queue} {options}",
            f"  remove: delayed-retry parking purge --queue {queue} --all --yes {options}",
            f"          delayed-retry teardown {options} --queue {queue} --purge-alerts --yes",
            f"          {shlex.join(['rabbitmqctl', 'delete_queue', '-p', vhost, queue])}",
        ]
    )


def main(url: str, *, throwaway: bool = False, introduced: bool = False) -> int:
    """Run the demo on the broker at ``url``.

    On a broker of the user's it ends by saying what it left there and how to
    remove it; pass ``throwaway=True`` for a broker that goes away with all of
    it (``scripts/demo`` starts one). ``introduced``: :func:`introduce` was
    called already, before a throwaway node was started.
    """
    global START
    START = time.monotonic()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not introduced:
        introduce(url)
    with _library_lines_in_the_story():
        code = asyncio.run(run(url))
    for line in next_steps(own_broker=not throwaway):
        say(line)
    if not throwaway:
        say(left_behind(DEMO_TOPOLOGY, DEMO_QUEUE, vhost=vhost_of(url)))
    return code


def introduce(url: str | None) -> None:
    """Say at once what the demo runs on and what each order will show.

    ``None``: a throwaway node is about to start (``scripts/demo``), which
    takes a few seconds; call this first so those seconds are not silent.
    """
    say(
        f"the demo runs on the broker at {redact_url(url)}, with names of its own"
        if url is not None
        else "starting a throwaway RabbitMQ node for the demo (a few seconds; RABBITMQ_URL "
        "runs it on yours instead)"
    )
    for line in STORY:
        say(line.format(queue=DEMO_QUEUE))
