"""The throttle of one consumer: stop taking messages, probe one at a time, resume.

:class:`ThrottleControl` acts out the transitions of a
:class:`~delayed_retry.recovery.throttle.ThrottleState` for one
:class:`~delayed_retry.consumer.handler.RetryingHandler` (the decorator's and the FastStream
middleware's alike): on a trip it cancels the handler's consumers on the broker and puts back
what they had prefetched (:func:`~delayed_retry.consumer.put_back.put_back`); every
``probe_every`` it takes one message with ``basic.get`` through the consumer's own callback;
the first success registers the consumers again. Why ``basic.cancel`` and not a lower
prefetch, and what an operator sees (the WARNING lines, the gauge, the alert event, the
marker queue ``status`` counts): docs/backing-off-and-crashes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from dataclasses import dataclass
from typing import Any

import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage
from opentelemetry.metrics import MeterProvider
from pamqp.commands import Basic

from delayed_retry.amqp.consumers import consume_marker, resume_on_broker
from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.put_back import put_back
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.headers.names import (
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TYPE,
    X_QUEUE,
    X_THROTTLE_EVENT,
    X_THROTTLE_TRIGGER,
    X_THROTTLED_AT,
)
from delayed_retry.headers.text import exception_name, exception_text
from delayed_retry.observability.metrics import THROTTLE_TRIPS, THROTTLED, meter_for
from delayed_retry.recovery.throttle import (
    MARKER_EXPIRES_MS,
    Throttle,
    ThrottleState,
    Transition,
    marker_queue_name,
)

__all__ = ["ThrottleControl"]

log = logging.getLogger(__name__)


_probing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "delayed_retry_throttle_probe", default=False
)


@dataclass(eq=False)
class _Stopped:
    """A consumer cancelled by the throttle, to probe through and to start again."""

    channel: aiormq.abc.AbstractChannel
    tag: str
    callback: Any


class _Instruments:
    """The throttle's metric instruments (through the global OpenTelemetry meter provider)."""

    def __init__(self, provider: MeterProvider | None) -> None:
        meter = meter_for(provider)
        self.throttled = meter.create_up_down_counter(
            THROTTLED,
            unit="{consumer}",
            description="Consumers whose throttle has tripped and that take one message at a time.",
        )
        self.trips = meter.create_counter(
            THROTTLE_TRIPS,
            unit="{trip}",
            description="Times a consumer's throttle tripped after a run of failures.",
        )


class ThrottleControl:
    """The throttle of one handler on one queue: its gate, its transitions, its probes.

    Made by the handler when a :class:`~delayed_retry.recovery.throttle.Throttle` is
    configured. The handler calls :meth:`admit` before running a message and
    :meth:`observe` after; :meth:`stop` ends probing (on shutdown).
    """

    def __init__(
        self,
        throttle: Throttle,
        *,
        queue: str,
        topology: DelayTopology,
        publish_timeout: float,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.throttle = throttle
        self.queue = queue
        self.topology = topology
        self.publish_timeout = publish_timeout
        self.state = ThrottleState(throttle)
        self._stopped: dict[tuple[int, str], _Stopped] = {}
        self._probe_task: asyncio.Task[None] | None = None
        self._marker: aiormq.abc.AbstractChannel | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._instruments = _Instruments(meter_provider)
        self._attributes = {"messaging.destination.name": queue}

    @property
    def throttled(self) -> bool:
        """Whether the throttle has tripped and the consumer probes one message at a time."""
        return self.state.throttled

    async def admit(self, message: AbstractIncomingMessage) -> bool:
        """Whether ``message`` may run now; when not, it has been put back (and its consumer
        stopped). A probe's message is always admitted."""
        if not self.state.throttled or _probing.get():
            return True
        await self._stop_consumer(message)
        await put_back(
            message, self.queue, topology=self.topology, publish_timeout=self.publish_timeout
        )
        return False

    def observe(self, message: AbstractIncomingMessage, failure: BaseException | None) -> None:
        """Record how ``message``'s handling ended; act on a trip or a resume."""
        if failure is None:
            transition: Transition | None = self.state.record(failed=False)
        else:
            transition = self.state.record(failed=True, counted=self._counted(failure))
        if transition == "tripped":
            self._tripped(message, failure)
        elif transition == "resumed":
            self._resumed(message)

    def _counted(self, failure: BaseException) -> bool:
        """The ``counts`` predicate's answer; a predicate that raises counts nothing (logged),
        so that it never changes what happens to the message."""
        try:
            return self.throttle.counted(failure)
        except Exception:
            log.exception(
                "the throttle's counts predicate of queue %r raised on %r; not counted",
                self.queue,
                failure,
            )
            return False

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _tripped(self, message: AbstractIncomingMessage, failure: BaseException | None) -> None:
        log.warning(
            "throttle tripped on queue %r after %s (last: %s); the consumer stops taking "
            "messages and tries one every %.3g s",
            self.queue,
            self.throttle.describe(),
            exception_name(failure),
            self.throttle.probe_seconds,
        )
        self._instruments.throttled.add(1, self._attributes)
        self._instruments.trips.add(1, self._attributes)
        channel = _channel_of(message)
        self._spawn(self._on_trip(message, channel, failure), "delayed-retry-throttle-trip")
        if self._probe_task is None or self._probe_task.done():
            self._probe_task = asyncio.create_task(
                self._probe_loop(), name=f"delayed-retry-throttle-probe-{self.queue}"
            )

    async def _on_trip(
        self,
        message: AbstractIncomingMessage,
        channel: aiormq.abc.AbstractChannel | None,
        failure: BaseException | None,
    ) -> None:
        await self._stop_consumer(message)
        await self._alert(channel, "tripped", failure)

    def _resumed(self, message: AbstractIncomingMessage) -> None:
        log.warning(
            "throttle on queue %r resumed after a successful handling; consuming at full speed",
            self.queue,
        )
        self._instruments.throttled.add(-1, self._attributes)
        self._spawn(self._restart_consumers(), "delayed-retry-throttle-resume")
        self._spawn(self._unmark(), "delayed-retry-throttle-unmark")
        self._spawn(
            self._alert(_channel_of(message), "resumed", None), "delayed-retry-throttle-alert"
        )

    async def _stop_consumer(self, message: AbstractIncomingMessage) -> None:
        """Cancel the consumer that delivered ``message`` (once), keeping its callback."""
        tag = message.consumer_tag
        if tag is None:  # a basic.get: no consumer to stop
            return
        try:
            channel = message.channel
        except Exception:  # closed: that consumer is gone already
            return
        key = (id(channel), tag)
        if key in self._stopped:
            return
        consumers: dict[str, Any] = getattr(channel, "consumers", {})  # aiormq's, by tag
        callback = consumers.get(tag)
        if callback is None:
            return
        self._stopped[key] = _Stopped(channel, tag, callback)
        try:
            await channel.basic_cancel(tag)
        except Exception as err:  # the channel is closing: the broker stops it anyway
            log.warning("could not cancel consumer %r of queue %r: %r", tag, self.queue, err)
        await self._mark(channel)

    async def _mark(self, channel: aiormq.abc.AbstractChannel) -> None:
        """Consume the marker queue while throttled, so that the broker counts this process."""
        if self._marker is not None and not self._marker.is_closed:
            return
        name = marker_queue_name(self.topology.prefix, self.queue)
        try:
            marker = await channel.connection.channel()
            await marker.queue_declare(
                name,
                durable=True,
                arguments={"x-queue-type": "classic", "x-expires": MARKER_EXPIRES_MS},
            )
            await consume_marker(marker, name)
        except Exception as err:
            log.warning(
                "could not mark queue %r as throttled in %r (delayed-retry status will not "
                "count this process): %r",
                self.queue,
                name,
                err,
            )
            return
        self._marker = marker

    async def _unmark(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None and not marker.is_closed:
            with contextlib.suppress(Exception):
                await marker.close()

    async def _restart_consumers(self) -> None:
        """Register every consumer the throttle cancelled again, on its channel, with its tag."""
        stopped, self._stopped = list(self._stopped.values()), {}
        for consumer in stopped:
            if consumer.channel.is_closed or consumer.tag in getattr(
                consumer.channel, "consumers", {}
            ):
                continue  # gone with its channel, or a reconnect restored it already
            try:
                await resume_on_broker(
                    consumer.channel, self.queue, consumer.callback, tag=consumer.tag
                )
            except Exception as err:
                log.error(
                    "could not restart consumer %r of queue %r after the throttle resumed: %r",
                    consumer.tag,
                    self.queue,
                    err,
                )

    async def _probe_loop(self) -> None:
        """While throttled: every ``probe_every``, run one message through a stopped consumer."""
        interval = self.throttle.probe_seconds
        while self.state.throttled:
            await asyncio.sleep(interval)
            if not self.state.throttled:
                return
            consumer = next(
                (c for c in reversed(self._stopped.values()) if not c.channel.is_closed), None
            )
            if consumer is None:
                continue  # none known yet (or reconnecting): a delivery will stop one
            try:
                got = await consumer.channel.basic_get(self.queue, no_ack=False)
            except Exception as err:
                log.warning(
                    "throttle probe on queue %r could not take a message: %r", self.queue, err
                )
                continue
            if isinstance(got.delivery, Basic.GetEmpty):
                continue
            token = _probing.set(True)
            try:
                await consumer.callback(got)
            except Exception:
                log.exception("throttle probe on queue %r failed", self.queue)
            finally:
                _probing.reset(token)

    async def _alert(
        self,
        channel: aiormq.abc.AbstractChannel | None,
        event: Transition,
        failure: BaseException | None,
    ) -> None:
        """Send the trip or resume to the alert queue, where the alert consumer passes it on."""
        if channel is None or channel.is_closed:
            log.warning(
                "the throttle %s event of queue %r was not sent to the alert queue: its "
                "channel is closed",
                event,
                self.queue,
            )
            return
        headers: dict[str, Any] = {
            X_THROTTLE_EVENT: event,
            X_QUEUE: self.queue,
            X_THROTTLE_TRIGGER: self.throttle.describe(),
            X_THROTTLED_AT: to_epoch_ms(utcnow()),
        }
        if failure is not None:
            headers[X_EXCEPTION_TYPE] = exception_name(failure)
            headers[X_EXCEPTION_MESSAGE] = exception_text(failure)[:1000]
        try:
            await publish_confirmed(
                channel,
                exchange="",
                routing_key=self.topology.alerts_queue,
                body=b"",
                properties=aiormq.spec.Basic.Properties(headers=headers, delivery_mode=2),
                timeout=self.publish_timeout,
            )
        except Exception as err:
            log.warning(
                "could not send the throttle %s event of queue %r to the alert queue: %r",
                event,
                self.queue,
                err,
            )

    async def stop(self) -> None:
        """Stop probing (a shutdown); consumers the throttle cancelled stay cancelled."""
        task, self._probe_task = self._probe_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._unmark()


def _channel_of(message: AbstractIncomingMessage) -> aiormq.abc.AbstractChannel | None:
    try:
        return message.channel
    except Exception:  # aio-pika raises once the channel is closed
        return None
