"""``ParkingAlerts``: consume the alert queue, group arrivals, deliver alerts to sinks.

The parking exchange fans out a copy of every parked message to
:attr:`DelayTopology.alerts_queue <delayed_retry.chain.topology.DelayTopology.alerts_queue>`
(the unroutable exchange does too), so alerting never consumes the parked
messages themselves. Copies are acked only after every sink has delivered
the alert that names them: at-least-once, so a crash may repeat an alert but
never lose one. While a sink keeps failing, the copies stay unacked in the
alert queue and delivery is tried again every ``retry_after`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from delayed_retry.alerts.grouping import Alert, AlertWindow, ParkedArrival, arrival_from
from delayed_retry.alerts.mute_store import MuteFollower
from delayed_retry.alerts.sinks import (
    DEFAULT_SINK_RETRY,
    AlertSink,
    AlertSinkError,
    SinkRetry,
    deliver,
)
from delayed_retry.amqp.consumers import Consumer, start_consumer
from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration, to_seconds, utcnow
from delayed_retry.errors import ConfigurationError, NotFoundError
from delayed_retry.lifecycle import Lifecycle

__all__ = ["ParkingAlerts"]

log = logging.getLogger(__name__)


class ParkingAlerts(Lifecycle):
    """Tells people when messages are parked, one alert per window of arrivals.

    Run one per system (several are safe: each alert copy goes to one of
    them). ``window`` is the storm control: the first arrival opens it, and
    everything parked until it closes becomes one alert with counts per queue
    and exception type. ``max_batch`` bounds how many copies one alert covers
    (and the channel's prefetch). ``declare=True`` declares the topology
    first; with ``False`` the alert queue must already exist.

    ``mutes=True`` honours the failure groups muted with ``delayed-retry mute`` (read from
    the broker's mutes stream): their arrivals are counted in :attr:`muted` and logged,
    not alerted.

    Use as ``async with ParkingAlerts(connection, sinks=[...]):`` or with
    :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        connection: AbstractConnection,
        *,
        sinks: Sequence[AlertSink],
        topology: DelayTopology = DEFAULT_TOPOLOGY,
        window: Duration = 30.0,
        max_ids: int = 5,
        max_batch: int = 500,
        sink_retry: SinkRetry = DEFAULT_SINK_RETRY,
        retry_after: Duration = 60.0,
        declare: bool = True,
        mutes: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not sinks:
            raise ConfigurationError("ParkingAlerts needs at least one sink (e.g. LoggingSink())")
        for sink in sinks:
            if not isinstance(sink, AlertSink):
                raise ConfigurationError(f"{sink!r} is not an alert sink: it has no async send()")
        self.connection = connection
        self.sinks = tuple(sinks)
        self.topology = topology
        self.sink_retry = sink_retry
        self.retry_after = to_seconds(retry_after, name="ParkingAlerts retry_after")
        self.declare = declare
        self._clock = clock
        self._window: AlertWindow[AbstractIncomingMessage] = AlertWindow(
            window=to_seconds(window, name="ParkingAlerts window"),
            max_ids=max_ids,
            max_batch=max_batch,
        )
        self._channel: AbstractChannel | None = None
        self._queue: AbstractQueue | None = None
        self._consumer: Consumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._sent = asyncio.Condition()
        self.alerts_delivered = 0
        """Alerts every sink has delivered since :meth:`start`."""
        self.failing = False
        """True while an alert could not be delivered and its messages wait unacked."""
        self._mutes = MuteFollower(connection, topology=topology) if mutes else None

    async def start(self) -> None:
        """Open a channel, check or declare the alert queue and start consuming."""
        if self._task is not None:
            return
        name = self.topology.alerts_queue
        if self._mutes is not None:
            await self._mutes.start()  # every mute set so far is known before any arrival
        try:
            channel, queue = await self._alert_queue(name)
        except BaseException:
            if self._mutes is not None:
                await self._mutes.stop()
            raise
        self._channel, self._queue = channel, queue
        self._stopping.clear()
        self._task = asyncio.create_task(self._flush_loop(), name="delayed-retry-parking-alerts")
        self._consumer = await start_consumer(queue, self._on_message, no_ack=False)
        log.info("parking alerts: consuming %r with %d sink(s)", name, len(self.sinks))

    async def _alert_queue(self, name: str) -> tuple[AbstractChannel, AbstractQueue]:
        """A channel of its own and the alert queue on it (declared first when ``declare``)."""
        channel = await self.connection.channel()
        try:
            await channel.set_qos(prefetch_count=self._window.max_batch)
            if self.declare:
                await declare_topology(channel, self.topology)
            return channel, await channel.declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            with contextlib.suppress(Exception):
                await channel.close()
            raise NotFoundError(
                f"alert queue {name!r} does not exist; declare the topology first: pass "
                "declare=True, call declare_topology(channel, topology), or run "
                f"'delayed-retry declare' with the options of chain {self.topology.prefix!r}"
            ) from exc
        except BaseException:
            with contextlib.suppress(Exception):
                await channel.close()
            raise

    @property
    def consuming(self) -> bool:
        """Whether the broker has its consumer of the alert queue now (false while it recovers)."""
        return self._consumer is not None and self._consumer.in_place

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """Its consumer of the alert queue, once started."""
        return (self._consumer,) if self._consumer is not None else ()

    @property
    def muted(self) -> dict[str, int]:
        """Arrivals of muted failure groups since :meth:`start`, per group key: not alerted."""
        return {} if self._mutes is None else dict(self._mutes.table.muted_arrivals)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        arrival = arrival_from(
            message.headers,
            message_id=message.message_id,
            routing_key=message.routing_key or "",
            levels=self.topology.levels,
        )
        if self._muted(arrival):
            await message.ack()
            return
        self._window.add(arrival, message, now=self._clock())
        self._wake.set()

    def _muted(self, arrival: ParkedArrival) -> bool:
        if self._mutes is None or arrival.event is not None:
            return False
        key = arrival.fingerprint.key
        mute = self._mutes.table.muting(key, utcnow())
        if mute is not None:
            log.info(
                "message %s parked from %r in muted group %s (until %s%s): counted, not alerted",
                arrival.message_id,
                arrival.queue,
                key,
                mute.until.isoformat(timespec="seconds"),
                f", {mute.reason}" if mute.reason else "",
            )
        return mute is not None

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less if stopping or a new message arrives."""
        waits = [
            asyncio.ensure_future(self._stopping.wait()),
            asyncio.ensure_future(self._wake.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=max(seconds, 0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self._wake.clear()

    async def _flush_loop(self) -> None:
        while not self._stopping.is_set():
            deadline = self._window.deadline()
            if deadline is None:
                await self._sleep(3600)
                continue
            now = self._clock()
            if not self._window.ready(now=now):
                await self._sleep(deadline - now)
                continue
            taken = self._window.take()
            if taken is not None:
                await self._deliver(*taken)
        # Stopping: what has arrived is still alerted on (one round of sink tries).
        taken = self._window.take()
        if taken is not None:
            await self._deliver(*taken, once=True)

    async def _deliver(
        self, alert: Alert, messages: list[AbstractIncomingMessage], *, once: bool = False
    ) -> None:
        done: set[int] = set()
        while True:
            for index, sink in enumerate(self.sinks):
                if index in done:
                    continue
                try:
                    await deliver(sink, alert, retry=self.sink_retry)
                except AlertSinkError as exc:
                    self.failing = True
                    log.error(
                        "could not deliver the alert for %d parked message(s) (%s): %s. "
                        "Their copies stay unacked in %r%s",
                        alert.total,
                        alert.title(),
                        exc,
                        self.topology.alerts_queue,
                        "" if once else f"; trying again in {self.retry_after:.0f} s",
                    )
                    break
                done.add(index)
            if len(done) == len(self.sinks):
                break
            if once or self._stopping.is_set():
                return  # left unacked: the broker redelivers them to the next consumer
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.retry_after)
            if self._stopping.is_set():
                return
        self.failing = False
        for message in messages:
            try:
                await message.ack()
            except Exception as exc:  # channel gone: redelivered, so alerted again
                log.warning("could not ack alert copy %s: %r", message.message_id, exc)
        async with self._sent:
            self.alerts_delivered += 1
            self._sent.notify_all()

    async def wait_delivered(self, count: int = 1) -> None:
        """Wait until ``count`` alerts have been delivered since :meth:`start`."""
        async with self._sent:
            await self._sent.wait_for(lambda: self.alerts_delivered >= count)

    async def stop(self) -> None:
        """Stop consuming, alert on what has arrived (one round of tries), close the channel."""
        if self._task is None:
            return
        if self._consumer is not None:
            await self._consumer.cancel()
        self._stopping.set()
        try:
            await self._task
        finally:
            if self._mutes is not None:
                await self._mutes.stop()
            self._task = None
            if self._channel is not None and not self._channel.is_closed:
                await self._channel.close()
            self._channel = self._queue = self._consumer = None
