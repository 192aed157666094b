"""The retry path's own client CPU cost per retried message, without a broker.

Like :mod:`overhead` for the success path: real ``aio_pika.IncomingMessage``
objects around a stand-in channel in confirm mode whose ``basic_publish``
encodes the frames exactly as aiormq would put them on the socket (pamqp's
``frame.marshal`` of the method, the content header with its headers table,
and the body) and answers with an ack at once. Each message fails once under
``@with_delayed_retry`` (the decision, the failure record, the route, the
confirmed copy, the ack), and the copy, as the broker would deliver it from
the chain, is handled again and succeeds (the early-arrival check, the ack).

The baseline is the hand-rolled retry the broker benchmarks compare with:
build a copy with the received headers plus one marker, publish it on the same
stand-in channel, ack; then ack the copy. The difference is what the library's
retry path adds on the client, with no broker or network noise.

    .venv/bin/python benchmarks/retry_overhead.py [--messages N] [--repeats R] [--delay S]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiormq.abc
from aio_pika import IncomingMessage
from aio_pika.abc import AbstractIncomingMessage
from pamqp import commands as spec
from pamqp import frame as amqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from delayed_retry import DelayTopology, RetryAfter, with_delayed_retry
from delayed_retry.amqp.declarer import declarer_for

QUEUE = "work"
BODY = b"x" * 200


class _Connection:
    """Stands in for the aiormq connection: hashable and weak-referenceable."""

    connection_tune = None


class _Channel:
    """A channel in confirm mode that encodes each publish and confirms it at once."""

    is_closed = False
    publisher_confirms = True

    def __init__(self) -> None:
        self.connection = _Connection()
        self.published: list[tuple[str, str, spec.Basic.Properties]] = []
        self.wire_bytes = 0

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        return None

    async def basic_publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.Basic.Properties | None = None,
        mandatory: bool = False,
        timeout: float | None = None,
        **_: Any,
    ) -> spec.Basic.Ack:
        props = properties or spec.Basic.Properties()
        frames = (
            spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
            ContentHeader(0, len(body), props),
            ContentBody(body),
        )
        self.wire_bytes += sum(len(amqp_frame.marshal(f, 1)) for f in frames)
        self.published.append((exchange, routing_key, props))
        return spec.Basic.Ack()


def _incoming(
    channel: _Channel, tag: int, props: spec.Basic.Properties, exchange: str, key: str
) -> IncomingMessage:
    delivered = aiormq.abc.DeliveredMessage(
        delivery=spec.Basic.Deliver("ctag", tag, False, exchange, key),
        header=ContentHeader(body_size=len(BODY), properties=props),
        body=BODY,
        channel=channel,  # type: ignore[arg-type]
    )
    return IncomingMessage(delivered)


def _first(channel: _Channel, i: int) -> IncomingMessage:
    props = spec.Basic.Properties(delivery_mode=2, message_id=str(i))
    return _incoming(channel, i + 1, props, "", QUEUE)


def _redelivered(channel: _Channel, tag: int, published: Any) -> IncomingMessage:
    exchange, key, props = published
    # What the broker hands back: the properties decoded from the wire, as a consumer gets them.
    wire = amqp_frame.marshal(ContentHeader(0, len(BODY), props), 1)
    _, _, header = amqp_frame.unmarshal(wire)
    return _incoming(channel, tag, header.properties, exchange, key)


async def _library(topology: DelayTopology, n: int, delay: float) -> tuple[float, int]:
    seen: set[str | None] = set()

    async def body(message: AbstractIncomingMessage) -> None:
        if message.message_id not in seen:
            seen.add(message.message_id)
            raise RetryAfter(delay)

    # Default instrumentation: no SDK is configured here, so it stays quiet.
    handler = with_delayed_retry(queue=QUEUE, topology=topology)(body)
    channel = _Channel()
    # The stand-in connection has no broker: mark its declarations as made.
    done = declarer_for(channel.connection)  # type: ignore[arg-type]
    done._done.add(("topology", topology))
    done._done.add(("destination", topology, QUEUE, None, True))
    firsts = [_first(channel, i) for i in range(n)]
    start = time.process_time()
    for message in firsts:
        await handler(message)
    spent = time.process_time() - start
    again = [_redelivered(channel, n + i + 1, p) for i, p in enumerate(channel.published)]
    assert len(again) == n, "every message should have been handed over once"
    start = time.process_time()
    for message in again:
        await handler(message)
    spent += time.process_time() - start
    return spent / n * 1e6, channel.wire_bytes // n


async def _hand_rolled(n: int) -> tuple[float, int]:
    channel = _Channel()

    async def handle(message: AbstractIncomingMessage) -> None:
        if message.headers.get("x-bench-retried"):
            await message.ack()
            return
        props = spec.Basic.Properties(
            headers={**message.headers, "x-bench-retried": 1},
            message_id=message.message_id,
            delivery_mode=2,
        )
        await channel.basic_publish(
            message.body, exchange="", routing_key=QUEUE, properties=props, mandatory=True
        )
        await message.ack()

    firsts = [_first(channel, i) for i in range(n)]
    start = time.process_time()
    for message in firsts:
        await handle(message)
    spent = time.process_time() - start
    again = [_redelivered(channel, n + i + 1, p) for i, p in enumerate(channel.published)]
    start = time.process_time()
    for message in again:
        await handle(message)
    spent += time.process_time() - start
    return spent / n * 1e6, channel.wire_bytes // n


def run(*, messages: int = 5000, repeats: int = 7, delay: float = 0.0) -> dict[str, float]:
    """Best-of-``repeats`` CPU µs per retried message, library and hand-rolled."""
    topology = DelayTopology(prefix="bench-retry", levels=16)
    best = {"library": float("inf"), "hand-rolled": float("inf")}
    wire = {"library": 0, "hand-rolled": 0}
    for _ in range(repeats):
        us, wire["library"] = asyncio.run(_library(topology, messages, delay))
        best["library"] = min(best["library"], us)
        us, wire["hand-rolled"] = asyncio.run(_hand_rolled(messages))
        best["hand-rolled"] = min(best["hand-rolled"], us)
    return {
        "library_us": round(best["library"], 2),
        "hand_rolled_us": round(best["hand-rolled"], 2),
        "added_us": round(best["library"] - best["hand-rolled"], 2),
        "library_publish_bytes": wire["library"],
        "hand_rolled_publish_bytes": wire["hand-rolled"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    print(run(messages=args.messages, repeats=args.repeats, delay=args.delay))


if __name__ == "__main__":
    main()
