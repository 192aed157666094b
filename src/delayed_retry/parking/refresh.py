"""Move long-parked messages to the tail of their parking queue, so its log can shrink.

Use :func:`refresh_parked` on RabbitMQ before 4.3 (:func:`refresh_needed`) when a parking
queue's disk use keeps growing: each selected message is copied to the tail of the same
queue, confirmed, then acked, its parking record kept and ``x-parked-refreshed-at`` added.
Why a quorum queue's log grows, and what a refresh frees: docs/parking.md, "A parking queue
that grows on disk".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration, to_epoch_ms, to_seconds, utcnow
from delayed_retry.headers.names import X_PARKED_REFRESHED_AT
from delayed_retry.headers.values import sanitize_headers
from delayed_retry.parking.moving.actions import Channel, Delivery, copy_then_ack
from delayed_retry.parking.moving.engine import MoveRequest, move
from delayed_retry.parking.moving.report import MoveProgress, MoveReport
from delayed_retry.parking.records import ParkedFilter

__all__ = [
    "COMPACTING_VERSION",
    "RefreshAction",
    "refresh_headers",
    "refresh_needed",
    "refresh_parked",
]

COMPACTING_VERSION = (4, 3)
"""The first RabbitMQ version whose quorum queues truncate their log past a long-held message."""


def refresh_needed(version: tuple[int, int] | None) -> bool:
    """Whether a broker of ``version`` (major, minor) keeps a quorum log behind an old message.

    ``None`` (the broker did not say) counts as needed: refreshing is harmless.
    """
    return version is None or version < COMPACTING_VERSION


def refresh_headers(headers: Mapping[str, Any] | None, *, now: datetime) -> dict[str, Any]:
    """Headers of a refreshed copy: the parked message's, with the time of this refresh.

    The parking record is kept as it is; only the broker-written headers go
    (see :func:`~delayed_retry.headers.values.sanitize_headers`).
    """
    out = sanitize_headers(headers)
    out[X_PARKED_REFRESHED_AT] = to_epoch_ms(now)
    return out


@dataclass(frozen=True, kw_only=True)
class RefreshAction:
    """Refresh: publish a copy to the tail of ``parking`` (default exchange, confirmed),
    then ack the original."""

    parking: str
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT

    name: ClassVar[Literal["refresh"]] = "refresh"
    confirms: ClassVar[bool] = True

    @property
    def to_queue(self) -> str:
        return self.parking

    async def settle(self, own: Channel, got: Delivery, *, canary_token: str | None) -> None:
        headers = refresh_headers(got.header.properties.headers, now=utcnow())
        timeout = self.publish_timeout
        await copy_then_ack(
            own, got, exchange="", routing_key=self.parking, headers=headers, timeout=timeout
        )


async def refresh_parked(
    channel: Any,
    *,
    queue: str,
    parking_queue: str | None = None,
    older_than: Duration | None = None,
    limit: int | None = None,
    rate: float | None = None,
    dry_run: bool = False,
    progress: Callable[[MoveProgress], None] | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> MoveReport:
    """Move the parked messages of ``queue`` that sat longer than ``older_than`` to the tail.

    Use it on RabbitMQ before 4.3 when the parking queue's disk use grows
    with the traffic through it (see the module's docstring), e.g. weekly with
    ``older_than`` a week: only messages that have been in the queue that
    long are moved (since parking, or since their last refresh; ``None``
    moves every parked message). Each original is acked only after the
    broker confirmed its copy; a failure stops the refresh and leaves the
    message where it was (at worst it is there twice). Messages parked
    meanwhile and the copies themselves are not looked at. ``rate`` caps
    messages per second; ``dry_run`` moves nothing and reports what would move.
    """
    where = ParkedFilter()
    if older_than is not None:
        seconds = to_seconds(older_than, name="older_than")
        where = ParkedFilter(in_queue_longer_than=timedelta(seconds=seconds))
    request = MoveRequest(
        queue=queue,
        parking_queue=parking_queue,
        topology=topology,
        where=where,
        limit=limit,
        rate=rate,
        dry_run=dry_run,
        progress=progress,
    )
    action = RefreshAction(parking=request.parking, publish_timeout=publish_timeout)
    return await move(channel, action, request)
