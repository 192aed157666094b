"""Queue-depth gauges: messages waiting in each level of the chain, parked per queue.

The OpenTelemetry SDK calls observable-gauge callbacks from its export
thread and expects them to return at once. So :class:`ChainMonitor` reads the
depths in the background, by passive queue declares on a dedicated
connection every ``interval`` seconds, keeps the last reading, and the
callbacks only read that cache. A reading older than ``max_age`` is not
reported (a gap in the series says "unknown" better than a stale number).

Run one per system, not one per consumer: each poll costs one declare per
level and per parking queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiormq
import aiormq.abc
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration, to_seconds
from delayed_retry.lifecycle import Lifecycle
from delayed_retry.observability.metrics import meter_for
from delayed_retry.observability.spans import MESSAGING_DESTINATION_NAME
from delayed_retry.rabbitmq.urls import redact_url

__all__ = ["DELAYED_MESSAGES", "PARKED_MESSAGES", "ChainMonitor", "DepthReading"]

log = logging.getLogger(__name__)

DELAYED_MESSAGES = "delayed_retry.delayed.messages"
"""Gauge: messages waiting in one level queue (attributes: level, queue name)."""
PARKED_MESSAGES = "delayed_retry.parked.messages"
"""Gauge: messages in one parking queue (or the unroutable queue)."""
ATTR_LEVEL = "delayed_retry.level"


@dataclass(frozen=True, kw_only=True)
class DepthReading:
    """One poll: depths by level and by parking queue, and when (``time.monotonic``)."""

    at: float
    levels: dict[int, int] = field(default_factory=dict)
    parked: dict[str, int] = field(default_factory=dict)


class ChainMonitor(Lifecycle):
    """Publishes the depths of the delay chain and of parking queues as OpenTelemetry gauges.

    Use it in one process per system (an operations sidecar, the alerting
    process) with ``async with ChainMonitor(url=..., parking_queues=[...])``.
    ``parking_queues`` names the parking queues to watch (usually
    ``DelayTopology.default_parking_queue(q)`` for each consumed queue); the
    unroutable queue is always watched. ``interval`` bounds the broker load;
    the gauges never wait on the broker.
    """

    def __init__(
        self,
        *,
        url: str,
        topology: DelayTopology = DEFAULT_TOPOLOGY,
        parking_queues: Iterable[str] = (),
        interval: Duration = 15.0,
        max_age: Duration | None = None,
        meter_provider: MeterProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.topology = topology
        self.parking_queues: Sequence[str] = (*dict.fromkeys(parking_queues),)
        self.interval = to_seconds(interval, name="ChainMonitor interval")
        if self.interval <= 0:
            raise ValueError(f"ChainMonitor interval={interval!r} must be positive")
        self.max_age = (
            to_seconds(max_age, name="ChainMonitor max_age")
            if max_age is not None
            else 3 * self.interval
        )
        self._clock = clock
        self._reading: DepthReading | None = None
        self._connection: aiormq.abc.AbstractConnection | None = None
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        meter = meter_for(meter_provider)
        meter.create_observable_gauge(
            DELAYED_MESSAGES,
            callbacks=[self._observe_levels],
            unit="{message}",
            description="Messages waiting in each level queue of the delay chain.",
        )
        meter.create_observable_gauge(
            PARKED_MESSAGES,
            callbacks=[self._observe_parked],
            unit="{message}",
            description="Messages in each parking queue and in the unroutable queue.",
        )

    # -- the gauges: cache reads only ------------------------------------------
    def reading(self) -> DepthReading | None:
        """The last reading, or ``None`` when there is none or it is older than ``max_age``."""
        reading = self._reading
        if reading is None or self._clock() - reading.at > self.max_age:
            return None
        return reading

    def _observe_levels(self, options: CallbackOptions) -> Iterable[Observation]:
        reading = self.reading()
        if reading is None:
            return []
        return [
            Observation(
                count,
                {ATTR_LEVEL: level, MESSAGING_DESTINATION_NAME: self.topology.level_name(level)},
            )
            for level, count in sorted(reading.levels.items())
        ]

    def _observe_parked(self, options: CallbackOptions) -> Iterable[Observation]:
        reading = self.reading()
        if reading is None:
            return []
        return [
            Observation(count, {MESSAGING_DESTINATION_NAME: name})
            for name, count in sorted(reading.parked.items())
        ]

    # -- polling ---------------------------------------------------------------
    async def _depth(self, name: str) -> int | None:
        for _ in range(2):
            if self._connection is None or self._connection.is_closed:
                self._connection = await aiormq.connect(self.url)
                self._channel = None
            if self._channel is None or self._channel.is_closed:
                self._channel = await self._connection.channel(publisher_confirms=False)
            try:
                ok = await self._channel.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return None  # not declared (yet): nothing to report
            except aiormq.exceptions.ChannelClosed:
                self._channel = None
                continue
            return int(ok.message_count or 0)
        return None

    async def refresh(self) -> DepthReading:
        """Poll the broker now and cache the reading (the background task calls this)."""
        levels: dict[int, int] = {}
        for level in range(self.topology.levels):
            depth = await self._depth(self.topology.level_name(level))
            if depth is not None:
                levels[level] = depth
        parked: dict[str, int] = {}
        for name in (*self.parking_queues, self.topology.unroutable_queue):
            depth = await self._depth(name)
            if depth is not None:
                parked[name] = depth
        reading = DepthReading(at=self._clock(), levels=levels, parked=parked)
        self._reading = reading
        return reading

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)
            if self._stop.is_set():
                return
            try:
                await self.refresh()
            except (aiormq.exceptions.AMQPError, ConnectionError, OSError) as exc:
                log.warning(
                    "ChainMonitor could not read queue depths from %s (%r); retrying in %.0f s",
                    redact_url(self.url),
                    exc,
                    self.interval,
                )
                await self._close_connection()

    async def start(self) -> None:
        """Take a first reading (fails loudly if the broker is unreachable), then poll."""
        if self._task is not None:
            return
        self._stop.clear()
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name="delayed-retry-chain-monitor")

    async def stop(self) -> None:
        """Stop polling and close the connection; the gauges then report nothing."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        self._reading = None
        await self._close_connection()

    async def _close_connection(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await connection.close()
