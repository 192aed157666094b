"""Read a vhost's exchanges, queues, bindings and policies from the management HTTP API.

AMQP cannot list bindings or policies, so ``topology verify`` reads them here
when the management plugin is reachable (by default on port 15672 of the
broker's host, with the AMQP URL's credentials). Plain ``urllib`` in a worker
thread: no extra dependency, and nothing here writes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from delayed_retry.admin.chain_diff import Binding, LiveChain, LiveExchange, LiveQueue, Policy

__all__ = [
    "DEFAULT_MANAGEMENT_PORT",
    "ManagementClient",
    "ManagementUnavailable",
    "management_url_for",
    "read_live_chain",
    "vhost_of",
]

DEFAULT_MANAGEMENT_PORT = 15672


class ManagementUnavailable(Exception):
    """The management API could not be read; the message says why and what to do."""


def vhost_of(amqp_url: str) -> str:
    """The vhost an AMQP URL names (``/`` when its path is empty)."""
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def management_url_for(amqp_url: str) -> str:
    """The management API's base URL guessed from an AMQP URL: same host and user, port 15672."""
    parts = urlsplit(amqp_url)
    scheme = "https" if parts.scheme == "amqps" else "http"
    auth = ""
    if parts.username is not None:
        auth = parts.username + (f":{parts.password}" if parts.password is not None else "") + "@"
    return f"{scheme}://{auth}{parts.hostname or '127.0.0.1'}:{DEFAULT_MANAGEMENT_PORT}/"


class ManagementClient:
    """A read-only client of the management HTTP API at ``base_url`` (credentials in the URL)."""

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ManagementUnavailable(
                f"management URL {base_url!r} is not an http(s) URL; pass one like "
                "http://guest:guest@127.0.0.1:15672/"
            )
        port = f":{parts.port}" if parts.port else ""
        self.base = f"{parts.scheme}://{parts.hostname}{port}{parts.path.rstrip('/')}"
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        self._auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout

    def _get_sync(self, path: str) -> Any:
        request = urllib.request.Request(
            self.base + path, headers={"Authorization": self._auth, "Accept": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise ManagementUnavailable(
                    f"the management API at {self.base} refused the credentials ({exc.code}); "
                    "the user needs the 'monitoring' tag, or pass --management-url with another"
                ) from exc
            raise ManagementUnavailable(
                f"the management API at {self.base} answered {exc.code} for {path}"
            ) from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ManagementUnavailable(
                f"the management API at {self.base} is not reachable ({exc}); enable the "
                "rabbitmq_management plugin or pass --management-url"
            ) from exc

    async def get(self, path: str) -> Any:
        """GET ``path`` (like ``/api/queues/%2F``) and return the decoded JSON."""
        return await asyncio.to_thread(self._get_sync, path)


async def read_live_chain(client: ManagementClient, vhost: str) -> LiveChain:
    """Exchanges, queues, bindings and policies of ``vhost``.

    Read whole: a chain binds queues of any name, and NServiceBus naming puts
    the levels outside the prefix.
    """
    v = quote(vhost, safe="")
    exchanges_raw = await client.get(f"/api/exchanges/{v}")
    queues_raw = await client.get(f"/api/queues/{v}")
    bindings_raw = await client.get(f"/api/bindings/{v}")
    policies_raw = await client.get(f"/api/policies/{v}")
    try:
        operator_raw = await client.get(f"/api/operator-policies/{v}")
    except ManagementUnavailable:
        operator_raw = []  # older brokers, or a user without the policymaker tag
    exchanges = {
        e["name"]: LiveExchange(
            name=e["name"],
            type=e.get("type", ""),
            durable=bool(e.get("durable", True)),
            arguments=e.get("arguments") or {},
        )
        for e in exchanges_raw
        if e.get("name")  # the default exchange has no name
    }
    queues = {
        q["name"]: LiveQueue(
            name=q["name"],
            durable=bool(q.get("durable", True)),
            arguments=q.get("arguments") or {},
            messages=q.get("messages"),
        )
        for q in queues_raw
    }
    bindings = frozenset(
        Binding(
            b["source"],
            b["destination_type"],
            b["destination"],
            b["routing_key"],
            properties_key=b.get("properties_key") or "",
        )
        for b in bindings_raw
        if b.get("source")  # the default exchange's implicit bindings
    )
    policies = tuple(
        Policy(
            name=p["name"],
            pattern=p.get("pattern", ""),
            apply_to=p.get("apply-to", "all"),
            priority=int(p.get("priority") or 0),
            definition=p.get("definition") or {},
            operator=operator,
        )
        for raw, operator in ((policies_raw, False), (operator_raw, True))
        for p in raw
    )
    return LiveChain(exchanges=exchanges, queues=queues, bindings=bindings, policies=policies)
