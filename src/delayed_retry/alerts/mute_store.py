"""Muted failure groups on the broker: the mutes stream, written and followed.

The broker half of :mod:`delayed_retry.alerts.mutes`. Mutes live in a RabbitMQ stream
(:attr:`DelayTopology.mutes_stream <delayed_retry.chain.topology.DelayTopology.mutes_stream>`):
a stream keeps every record for every reader, so each alerts process reads them all from
the first, a restarted one included, and a cluster replicates them. :func:`record_mute`
appends one record with a publisher confirm; :class:`MuteFollower` keeps a
:class:`~delayed_retry.alerts.mutes.MuteTable` up to date; :func:`read_mutes` reads the
table once (the command line).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aiormq import spec

from delayed_retry.alerts.mutes import Mute, MuteTable, decode_mute, encode_mute
from delayed_retry.amqp.channels import close_quietly, scratch_channel, underlay_connection
from delayed_retry.amqp.consumers import start_consumer
from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.errors import ConfigurationError

__all__ = ["MUTES_STREAM_ARGUMENTS", "MuteFollower", "read_mutes", "record_mute"]

log = logging.getLogger(__name__)

MUTES_STREAM_ARGUMENTS: dict[str, str] = {"x-queue-type": "stream", "x-max-age": "400D"}
"""A stream that keeps records longer than the longest mute (365 days)."""

_SYNC_PREFIX = "delayed-retry-mutes-sync-"


async def _declare(channel: aiormq.abc.AbstractChannel, topology: DelayTopology) -> None:
    try:
        await channel.queue_declare(
            topology.mutes_stream, durable=True, arguments=dict(MUTES_STREAM_ARGUMENTS)
        )
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise ConfigurationError(
            f"queue {topology.mutes_stream!r} exists but is not the mutes stream "
            f"({MUTES_STREAM_ARGUMENTS}): {exc}; delete it, it holds only mute records"
        ) from exc


async def _append(
    connection: AbstractConnection, topology: DelayTopology, body: bytes, message_id: str
) -> None:
    async with scratch_channel(await underlay_connection(connection), confirms=True) as channel:
        await _declare(channel, topology)
        await publish_confirmed(
            channel,
            exchange="",
            routing_key=topology.mutes_stream,
            body=body,
            properties=spec.Basic.Properties(
                message_id=message_id, delivery_mode=2, content_type="application/json"
            ),
        )


async def record_mute(
    connection: AbstractConnection, mute: Mute, *, topology: DelayTopology
) -> None:
    """Append ``mute`` (or an unmute: :meth:`Mute.lifted`) to the stream, confirmed."""
    await _append(connection, topology, encode_mute(mute), f"mute-{uuid.uuid4().hex}")


class MuteFollower:
    """Follows the mutes stream into :attr:`table` for as long as it runs.

    :meth:`start` returns once every record written before it has been read, so a
    process that checks :attr:`table` after it honours every mute already set. The
    consumer of a robust connection is restored after a reconnect and reads the
    stream from the first record again (applying a record twice changes nothing).
    """

    def __init__(
        self, connection: AbstractConnection, *, topology: DelayTopology, timeout: float = 30.0
    ) -> None:
        self.connection = connection
        self.topology = topology
        self.timeout = timeout
        self.table = MuteTable()
        self._channel: AbstractChannel | None = None
        self._sync = f"{_SYNC_PREFIX}{uuid.uuid4().hex}"
        self._synced = asyncio.Event()

    async def start(self) -> None:
        """Read the stream up to now (within ``timeout`` seconds), then keep following it."""
        self._sync = f"{_SYNC_PREFIX}{uuid.uuid4().hex}"  # a restart reads to its own marker
        self._synced = asyncio.Event()
        try:
            await _append(self.connection, self.topology, b"{}", self._sync)
            self._channel = channel = await self.connection.channel()
            await channel.set_qos(prefetch_count=200)  # streams need a prefetch
            queue = await channel.declare_queue(
                self.topology.mutes_stream, durable=True, arguments=dict(MUTES_STREAM_ARGUMENTS)
            )
            await start_consumer(queue, self._on_record, arguments={"x-stream-offset": "first"})
            await asyncio.wait_for(self._synced.wait(), self.timeout)
        except TimeoutError as exc:
            await self.stop()
            raise TimeoutError(
                f"the mutes stream {self.topology.mutes_stream!r} was not read to its end "
                f"within {self.timeout:g} s; check the broker's health and try again"
            ) from exc
        except aiormq.exceptions.ChannelAccessRefused as exc:
            await self.stop()
            raise ConfigurationError(
                f"the broker refused this user the mutes stream {self.topology.mutes_stream!r} "
                f"({exc}); grant configure, write and read on it, or pass mutes=False to "
                "ParkingAlerts to alert without honouring mutes"
            ) from exc
        except BaseException:
            await self.stop()
            raise

    async def _on_record(self, message: AbstractIncomingMessage) -> None:
        if message.message_id == self._sync:
            self._synced.set()
        elif not (message.message_id or "").startswith(_SYNC_PREFIX):
            mute = decode_mute(message.body)
            if mute is None:
                log.warning("skipped a record of %r that is not a mute", self.topology.mutes_stream)
            else:
                self.table.apply(mute)
        await message.ack()

    async def stop(self) -> None:
        """Stop following (the table keeps what it has read)."""
        channel, self._channel = self._channel, None
        await close_quietly(channel)


async def read_mutes(
    connection: AbstractConnection, *, topology: DelayTopology, timeout: float = 30.0
) -> MuteTable:
    """Every mute recorded so far, read once."""
    follower = MuteFollower(connection, topology=topology, timeout=timeout)
    await follower.start()
    try:
        return follower.table
    finally:
        await follower.stop()
