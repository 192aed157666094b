"""Finding the parking queues when none are named: RabbitMQ's management API.

AMQP cannot list queues, so without ``--queue`` the web view asks the
management plugin (``rabbitmq-plugins enable rabbitmq_management``) for the
queues of the vhost and keeps those named ``<queue>.parking``.
"""

from __future__ import annotations

import base64
import logging
from urllib.parse import quote, unquote, urlsplit

import aiohttp

from delayed_retry.errors import ConfigurationError
from delayed_retry.topology import DelayTopology

__all__ = ["discover_queues", "management_url_for"]

log = logging.getLogger(__name__)


def management_url_for(amqp_url: str) -> str:
    """The management API's usual address for a broker URL: same host, port 15672."""
    parts = urlsplit(amqp_url)
    scheme = "https" if parts.scheme == "amqps" else "http"
    return f"{scheme}://{parts.hostname or '127.0.0.1'}:15672"


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
    """Work queues that have a parking queue on the broker's vhost."""
    parts = urlsplit(amqp_url)
    base = (management_url or management_url_for(amqp_url)).rstrip("/")
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    user_password = f"{unquote(parts.username or 'guest')}:{unquote(parts.password or 'guest')}"
    auth = {"Authorization": "Basic " + base64.b64encode(user_password.encode()).decode()}
    url = f"{base}/api/queues/{quote(vhost, safe='')}?columns=name"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(url, headers=auth) as response,
        ):
            if response.status != 200:
                raise ConfigurationError(
                    f"the management API at {base} answered {response.status} when listing "
                    f"queues of vhost {vhost!r}; pass the work queues with --queue instead"
                )
            data = await response.json()
    except aiohttp.ClientError as exc:
        raise ConfigurationError(
            f"cannot list queues through the management API at {base} ({exc}); enable "
            "rabbitmq_management, pass --management-url, or name the queues with --queue"
        ) from exc
    names = [q["name"] for q in data if isinstance(q, dict) and isinstance(q.get("name"), str)]
    return work_queues_of(names, topology)
