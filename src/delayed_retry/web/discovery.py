"""Finding the parking queues when none are named: RabbitMQ's management API.

AMQP cannot list queues, so without ``--queue`` the web view asks the
management plugin (``rabbitmq-plugins enable rabbitmq_management``), through
:class:`~delayed_retry.admin.management.ManagementClient`, for the queues of
the vhost and keeps those named ``<queue>.parking``.
"""

from __future__ import annotations

import logging

from delayed_retry.admin.management import ManagementClient, ManagementError
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.errors import ServiceUnavailableError

__all__ = ["discover_queues", "work_queues_of"]

log = logging.getLogger(__name__)


def work_queues_of(names: list[str], topology: DelayTopology) -> list[str]:
    """The work queues whose parking queues are among ``names``. Pure."""
    out = []
    for name in names:
        if name.endswith(".parking") and not name.startswith(f"{topology.prefix}."):
            out.append(name.removesuffix(".parking"))
    return sorted(out)


async def discover_queues(
    amqp_url: str, *, topology: DelayTopology, management_url: str | None = None
) -> list[str]:
    """Work queues that have a parking queue on the broker's vhost.

    Raises :class:`~delayed_retry.errors.ServiceUnavailableError` (a
    ``ConfigurationError``) when the management API cannot be read: the web view
    then needs its work queues named.
    """
    client = ManagementClient.for_broker(amqp_url, management_url=management_url)
    try:
        names = await client.queue_names()
    except ManagementError as exc:
        raise ServiceUnavailableError(
            f"cannot list the queues to find the parking lots: {exc}; or name the work queues "
            "with --queue (WebSettings(queues=...) in code)"
        ) from exc
    return work_queues_of(names, topology)
