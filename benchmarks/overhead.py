"""The decorator's own CPU cost per successful message, without a broker.

A broker run on a shared machine varies by tens of percent from one round to
the next; this one measures only what the success path adds. It builds real
``aio_pika.IncomingMessage`` objects around a stand-in channel whose
``basic_ack`` does nothing, and times (best of several repeats) a plain
handler that acks against the same handler under ``@with_delayed_retry``
(OpenTelemetry API without an SDK, as most deployments start). The ratio is
plain time / decorated time per message; the absolute microseconds are the
library's overhead on top of aio-pika's own.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiormq.abc
from aio_pika import IncomingMessage
from aio_pika.abc import AbstractIncomingMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from delayed_retry import DelayTopology, with_delayed_retry
from delayed_retry.amqp.declarer import declarer_for


class _Connection:
    """Stands in for the aiormq connection: hashable and weak-referenceable."""


class _Channel:
    is_closed = False

    def __init__(self) -> None:
        self.connection = _Connection()

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        return None


def _message(channel: _Channel, tag: int) -> IncomingMessage:
    props = spec.Basic.Properties(
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        delivery_mode=2,
        message_id=str(tag),
    )
    delivered = aiormq.abc.DeliveredMessage(
        delivery=spec.Basic.Deliver("ctag", tag, False, "", "work"),
        header=ContentHeader(body_size=200, properties=props),
        body=b"x" * 200,
        channel=channel,  # type: ignore[arg-type]
    )
    return IncomingMessage(delivered)


async def _time(handler: Any, n: int) -> float:
    return await _time_on(handler, _Channel(), n)


async def _measure(n: int, repeats: int) -> dict[str, float]:
    topology = DelayTopology(prefix="bench-overhead", levels=16)

    async def plain(message: AbstractIncomingMessage) -> None:
        await message.ack()

    async def body(message: AbstractIncomingMessage) -> None:
        return None

    decorated = with_delayed_retry(queue="work", topology=topology)(body)
    best = {"plain": float("inf"), "decorated": float("inf")}
    for _ in range(repeats):
        best["plain"] = min(best["plain"], await _time(plain, n))
        best["decorated"] = min(best["decorated"], await _decorated_time(decorated, topology, n))
    return best


async def _decorated_time(decorated: Any, topology: DelayTopology, n: int) -> float:
    channel = _Channel()
    # The stand-in connection has no broker: mark its declarations as made.
    done = declarer_for(channel.connection)  # type: ignore[arg-type]
    done._done.add(("topology", topology))
    done._done.add(("destination", topology, "work", None, True))
    return await _time_on(decorated, channel, n)


async def _time_on(handler: Any, channel: _Channel, n: int) -> float:
    messages = [_message(channel, i + 1) for i in range(n)]
    start = time.perf_counter()
    for message in messages:
        await handler(message)
    return (time.perf_counter() - start) / n * 1e6


def run(*, messages: int = 20_000, repeats: int = 5) -> list[dict[str, Any]]:
    best = asyncio.run(_measure(messages, repeats))
    return [
        {
            "workload": "success overhead (no broker)",
            "subject": "delayed-retry",
            "baseline": "plain aio-pika handler",
            "unit": "µs/msg",
            "value": round(best["decorated"], 2),
            "baseline_value": round(best["plain"], 2),
            "ratio": round(best["plain"] / best["decorated"], 3),
            "added_us": round(best["decorated"] - best["plain"], 2),
            "messages": messages,
            "repeats": repeats,
        }
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
