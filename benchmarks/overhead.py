"""The decorator's own CPU cost per message, without a broker: on success, and on a retry.

A broker run on a shared machine varies by tens of percent from one round to
the next; this one measures only what the library's Python adds. It builds
real ``aio_pika.IncomingMessage`` objects around a stand-in channel and times
(best of several repeats, both sides in the same run) the library against the
same work written by hand, with the OpenTelemetry API and no SDK, as most
deployments start. The ratio is baseline time / library time per message; the
absolute microseconds are the library's overhead on top of aio-pika's own.

- success (:func:`run`): a plain handler that acks against the same handler
  under ``@with_delayed_retry``; the stand-in's ``basic_ack`` does nothing.
- retry (:func:`run_retry`): the handler raises ``RetryAfter(0.001)`` (a
  decorator with ``hold=None``, so the copy enters the chain) against a
  hand-written retry: catch it, build the copy (body, the message's
  properties, the library's headers) and ``basic_publish`` it to the same
  exchange and routing key, then ack. The stand-in is in confirm mode and
  answers each publish with a ``Basic.Ack`` at once; the headers and the route
  are those of one library retry, captured first, so both send the same copy.
  The difference is the library's own path from the handler's exception to
  the publish and the ack: the decision, the failure record, the route, the
  declaration checks, the confirm bookkeeping.

    .venv/bin/python benchmarks/overhead.py [--path success|retry|both]
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
from pamqp.header import ContentHeader

from delayed_retry import DelayTopology, RetryAfter, with_delayed_retry
from delayed_retry.amqp.declarer import declarer_for

QUEUE = "work"
RETRY_DELAY = 0.001
"""The retry's delay: one unit (1 ms) of the chain, so the copy enters at level 0."""


class _Connection:
    """Stands in for the aiormq connection: hashable and weak-referenceable."""


class _Channel:
    is_closed = False

    def __init__(self) -> None:
        self.connection = _Connection()

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        return None


class _ConfirmingChannel(_Channel):
    """A channel in confirm mode whose broker confirms every publish at once."""

    publisher_confirms = True

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
        return spec.Basic.Ack()


class _RecordingChannel(_ConfirmingChannel):
    """The same, keeping what was published: the copy the baseline then sends by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[tuple[str, str, spec.Basic.Properties]] = []

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
        assert properties is not None
        self.published.append((exchange, routing_key, properties))
        return spec.Basic.Ack()


def _message(channel: _Channel, tag: int) -> IncomingMessage:
    props = spec.Basic.Properties(
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        delivery_mode=2,
        message_id=str(tag),
    )
    delivered = aiormq.abc.DeliveredMessage(
        delivery=spec.Basic.Deliver("ctag", tag, False, "", QUEUE),
        header=ContentHeader(body_size=200, properties=props),
        body=b"x" * 200,
        channel=channel,  # type: ignore[arg-type]
    )
    return IncomingMessage(delivered)


def _declared(channel: _Channel, topology: DelayTopology) -> None:
    """The stand-in connection has no broker: mark its declarations as made."""
    done = declarer_for(channel.connection)  # type: ignore[arg-type]
    done._done.add(("topology", topology))
    done._done.add(("destination", topology, QUEUE, None, True))


async def _time(handler: Any, n: int) -> float:
    return await _time_on(handler, _Channel(), n)


async def _measure(n: int, repeats: int) -> dict[str, float]:
    topology = DelayTopology(prefix="bench-overhead", levels=16)

    async def plain(message: AbstractIncomingMessage) -> None:
        await message.ack()

    async def body(message: AbstractIncomingMessage) -> None:
        return None

    decorated = with_delayed_retry(queue=QUEUE, topology=topology)(body)
    best = {"plain": float("inf"), "decorated": float("inf")}
    for _ in range(repeats):
        best["plain"] = min(best["plain"], await _time(plain, n))
        best["decorated"] = min(best["decorated"], await _decorated_time(decorated, topology, n))
    return best


async def _decorated_time(decorated: Any, topology: DelayTopology, n: int) -> float:
    channel = _Channel()
    _declared(channel, topology)
    return await _time_on(decorated, channel, n)


async def _time_on(handler: Any, channel: _Channel, n: int) -> float:
    messages = [_message(channel, i + 1) for i in range(n)]
    # CPU time: on a shared machine the wall clock also counts the time others ran.
    start = time.process_time()
    for message in messages:
        await handler(message)
    return (time.process_time() - start) / n * 1e6


def run(*, messages: int = 20_000, repeats: int = 5) -> list[dict[str, Any]]:
    """The success path: best-of-``repeats`` µs per message, decorated and plain."""
    best = asyncio.run(_measure(messages, repeats))
    return [
        _row(
            workload="success overhead (no broker)",
            subject=("delayed-retry", best["decorated"]),
            baseline=("plain aio-pika handler", best["plain"]),
            messages=messages,
            repeats=repeats,
        )
    ]


def _row(
    *,
    workload: str,
    subject: tuple[str, float],
    baseline: tuple[str, float],
    messages: int,
    repeats: int,
    **extra: Any,
) -> dict[str, Any]:
    """One result row: a subject's and its baseline's µs per message, their ratio and gap."""
    (subject_name, value), (baseline_name, baseline_value) = subject, baseline
    return {
        "workload": workload,
        "subject": subject_name,
        "baseline": baseline_name,
        "unit": "µs/msg",
        "value": round(value, 2),
        "baseline_value": round(baseline_value, 2),
        "ratio": round(baseline_value / value, 3),
        "added_us": round(value - baseline_value, 2),
        "messages": messages,
        "repeats": repeats,
        **extra,
    }


async def _failing(message: AbstractIncomingMessage) -> None:
    raise RetryAfter(RETRY_DELAY)


def _retrying(topology: DelayTopology) -> Any:
    # hold=None: a 1 ms retry enters the chain instead of going straight back to the queue.
    return with_delayed_retry(queue=QUEUE, topology=topology, hold=None)(_failing)


async def _captured_copy(topology: DelayTopology) -> tuple[str, str, spec.Basic.Properties]:
    """The exchange, routing key and properties of one library retry."""
    channel = _RecordingChannel()
    _declared(channel, topology)
    await _retrying(topology)(_message(channel, 1))
    assert len(channel.published) == 1, "the library should have published one retry copy"
    return channel.published[0]


def _by_hand(copy: tuple[str, str, spec.Basic.Properties]) -> Any:
    """A hand-written retry that sends the library's copy: same route, same headers."""
    exchange, routing_key, template = copy

    async def handler(message: AbstractIncomingMessage) -> None:
        try:
            await _failing(message)
        except RetryAfter:
            props = message.properties
            properties = spec.Basic.Properties(
                content_type=props.content_type,
                content_encoding=props.content_encoding,
                headers=dict(template.headers or {}),
                delivery_mode=template.delivery_mode,
                priority=props.priority,
                correlation_id=props.correlation_id,
                reply_to=props.reply_to,
                message_id=props.message_id,
                timestamp=props.timestamp,
                message_type=props.message_type,
                app_id=props.app_id,
            )
            result = await message.channel.basic_publish(
                message.body,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=True,
                timeout=30.0,
            )
            if not isinstance(result, spec.Basic.Ack):
                raise RuntimeError(f"publish not confirmed: {result!r}") from None
            await message.ack()

    return handler


async def _measure_retry(n: int, repeats: int) -> dict[str, Any]:
    topology = DelayTopology(prefix="bench-overhead", levels=16)
    copy = await _captured_copy(topology)
    library, by_hand = _retrying(topology), _by_hand(copy)
    best: dict[str, Any] = {"library": float("inf"), "by hand": float("inf"), "copy": copy}
    for _ in range(repeats):
        channel = _ConfirmingChannel()
        best["by hand"] = min(best["by hand"], await _time_on(by_hand, channel, n))
        channel = _ConfirmingChannel()
        _declared(channel, topology)
        best["library"] = min(best["library"], await _time_on(library, channel, n))
    return best


def run_retry(*, messages: int = 5_000, repeats: int = 5) -> list[dict[str, Any]]:
    """The retry path: best-of-``repeats`` µs per retried message, library and by hand."""
    best = asyncio.run(_measure_retry(messages, repeats))
    exchange, routing_key, properties = best["copy"]
    return [
        _row(
            workload="retry overhead (no broker)",
            subject=("delayed-retry, RetryAfter(0.001), hold=None", best["library"]),
            baseline=("hand-written publish of the same copy + ack", best["by hand"]),
            messages=messages,
            repeats=repeats,
            route=f"{exchange} {routing_key}",
            copy_headers=sorted(properties.headers or {}),
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("success", "retry", "both"), default="both")
    parser.add_argument("--messages", type=int, help="per repeat (success 20,000, retry 5,000)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = {} if args.messages is None else {"messages": args.messages}
    if args.path in ("success", "both"):
        for row in run(repeats=args.repeats, **sizes):
            print(row)
    if args.path in ("retry", "both"):
        for row in run_retry(repeats=args.repeats, **sizes):
            print(row)


if __name__ == "__main__":
    main()
