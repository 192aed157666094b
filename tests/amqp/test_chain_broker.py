"""The delay chain on a real broker: delays land in their window and never early."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import aio_pika
import pytest

from delayed_retry import (
    ConfigurationError,
    DelayOutOfRangeError,
    declare_topology,
    publish_delayed,
)
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers import X_DUE_AT
from tests.support.chain import Inbox, Scenario
from tests.support.waiting import WAIT

pytestmark = pytest.mark.broker

LATE = 5.0
"""Upper bound on lateness, generous for a loaded 2-core machine; early is never allowed."""


async def test_parallel_delays_arrive_in_their_window_never_early(scenario: Scenario) -> None:
    queue = await scenario.queue()
    inbox = Inbox()
    await queue.consume(inbox)
    # 0.3 s and 0.35 s share the 256 ms level; 0.5 s and 0.55 s several more; 1 s is 9 hops.
    delays = [0.05, 0.3, 0.35, 0.5, 0.55, 0.8, 1.0, 0.0]
    rng = random.Random(7)
    delays += [round(rng.uniform(0, 1.2), 3) for _ in range(24)]
    due = await asyncio.gather(
        *(
            publish_delayed(
                scenario.ch,
                aio_pika.Message(str(i).encode(), message_id=f"m{i}"),
                queue=queue.name,
                delay=d,
                topology=scenario.topology,
            )
            for i, d in enumerate(delays)
        )
    )
    arrivals = await inbox.take(len(delays))
    for arrival in arrivals:
        i = int(arrival.message.body)
        due_at = due[i].timestamp()
        assert arrival.at >= due_at, f"delay {delays[i]} arrived {due_at - arrival.at:.4f} s early"
        assert arrival.at - due_at < LATE, f"delay {delays[i]} arrived {arrival.at - due_at} late"
        assert arrival.headers[X_DUE_AT] == to_epoch_ms(due[i])
        assert "x-death" in arrival.headers or delays[i] == 0  # it really went through the chain
    assert sorted(int(a.message.body) for a in arrivals) == list(range(len(delays)))
    assert await scenario.depth(scenario.topology.unroutable_queue) == 0


async def test_zero_delay_passes_straight_through(quorum: Scenario) -> None:
    queue = await quorum.queue()
    inbox = Inbox()
    await queue.consume(inbox)
    due = await publish_delayed(
        quorum.ch, aio_pika.Message(b"now"), queue=queue.name, delay=0, topology=quorum.topology
    )
    arrival = await inbox.get()
    assert arrival.message.body == b"now"
    assert arrival.at >= due.timestamp()
    assert "x-death" not in arrival.headers  # no level held it


async def test_delay_as_timedelta_seconds_and_aware_datetime(quorum: Scenario) -> None:
    queue = await quorum.queue()
    await declare_topology(quorum.ch, quorum.topology, queues=[queue.name])
    inbox = Inbox()
    await queue.consume(inbox)
    elsewhere = timezone(timedelta(hours=-5))
    ways: list[Callable[[], float | timedelta | datetime]] = [
        lambda: timedelta(milliseconds=200),
        lambda: 0.2,
        lambda: 1,
        lambda: datetime.now(UTC).astimezone(elsewhere) + timedelta(milliseconds=300),
        lambda: datetime.now(UTC) - timedelta(days=1),  # in the past: at once
    ]
    due = []
    for i, way in enumerate(ways):
        delay = way()
        due.append(
            await publish_delayed(
                quorum.ch,
                aio_pika.Message(str(i).encode()),
                queue=queue.name,
                delay=delay,
                topology=quorum.topology,
            )
        )
        if isinstance(delay, datetime) and delay > datetime.now(UTC):
            assert due[i] == delay
    for arrival in await inbox.take(len(ways)):
        i = int(arrival.message.body)
        assert due[i].timestamp() <= arrival.at < due[i].timestamp() + LATE


async def test_message_properties_survive_and_expiration_does_not_cut_the_delay(
    quorum: Scenario,
) -> None:
    queue = await quorum.queue()
    inbox = Inbox()
    await queue.consume(inbox)
    message = aio_pika.Message(
        b"{}",
        content_type="application/json",
        message_id="id-1",
        correlation_id="c-1",
        headers={"tenant": "acme", "x-death": [{"queue": "elsewhere", "count": 1}]},
        expiration=0.001,  # carried into a level queue it would end the wait at once
    )
    due = await publish_delayed(
        quorum.ch, message, queue=queue.name, delay=0.4, topology=quorum.topology
    )
    arrival = await inbox.get()
    assert arrival.at >= due.timestamp()
    got = arrival.message
    assert (got.content_type, got.message_id, got.correlation_id) == (
        "application/json",
        "id-1",
        "c-1",
    )
    assert got.headers["tenant"] == "acme"
    assert all(d.get("queue") != "elsewhere" for d in got.headers["x-death"])  # type: ignore[union-attr]
    assert got.expiration is None


@pytest.mark.parametrize(
    ("delay", "error", "match"),
    [
        (datetime(2030, 1, 1), ConfigurationError, "no timezone"),  # noqa: DTZ001 (the bad input)
        (-1, DelayOutOfRangeError, "negative"),
        (timedelta(seconds=-1), DelayOutOfRangeError, "negative"),
        (math.nan, DelayOutOfRangeError, "finite"),
        (math.inf, DelayOutOfRangeError, "finite"),
        (70, DelayOutOfRangeError, r"longer than the maximum .*\(16 levels of"),
        (1e12, DelayOutOfRangeError, "beyond any due time"),
        (datetime.now(UTC) + timedelta(days=2), DelayOutOfRangeError, "longer than the maximum"),
        ("5", ConfigurationError, "not a duration"),
    ],
)
async def test_bad_delays_raise_at_publish_time_and_publish_nothing(
    quorum: Scenario, delay: object, error: type[Exception], match: str
) -> None:
    queue = await quorum.queue()
    await declare_topology(quorum.ch, quorum.topology, queues=[queue.name])
    with pytest.raises(error, match=match):
        await publish_delayed(
            quorum.ch,
            aio_pika.Message(b"x"),
            queue=queue.name,
            delay=delay,  # type: ignore[arg-type]
            topology=quorum.topology,
        )
    for spec in quorum.topology.queues():
        assert await quorum.depth(spec.name) == 0, spec.name
    assert await quorum.depth(queue.name) == 0


async def test_unknown_destination_queue_is_a_clear_error(quorum: Scenario) -> None:
    missing = quorum.name("missing")
    with pytest.raises(ConfigurationError, match=rf"{missing}.*does not exist"):
        await publish_delayed(
            quorum.ch, aio_pika.Message(b"x"), queue=missing, delay=1, topology=quorum.topology
        )
    # The caller's channel is still usable.
    queue = await quorum.queue()
    inbox = Inbox()
    await queue.consume(inbox)
    await publish_delayed(
        quorum.ch, aio_pika.Message(b"y"), queue=queue.name, delay=0, topology=quorum.topology
    )
    assert (await inbox.get(WAIT)).message.body == b"y"
