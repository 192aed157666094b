"""The one client of RabbitMQ's management HTTP API.

Use :class:`ManagementClient` for whatever AMQP cannot list (queues, bindings, policies, an
exchange's definition). Its address (:func:`management_url_for`: 15672, or https 15671 for
``amqps://``), credentials, TLS (the broker URL's ``cafile`` too), timeouts
(:data:`DEFAULT_TIMEOUT`, :data:`BEST_EFFORT_TIMEOUT`), vhost quoting and errors
(:class:`ManagementError`, naming the URL with the password masked) are decided here once.
Plain ``urllib`` in a worker thread; nothing here writes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import urllib.error
import urllib.request
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from delayed_retry.admin.live_chain import Binding, LiveChain, LiveExchange, LiveQueue, Policy
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.rabbitmq.urls import redact_url, vhost_of

__all__ = [
    "BEST_EFFORT_TIMEOUT",
    "DEFAULT_HTTPS_PORT",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_TIMEOUT",
    "ManagementClient",
    "ManagementError",
    "management_url_for",
]

DEFAULT_HTTP_PORT = 15672
"""RabbitMQ's default port of the management API without TLS."""
DEFAULT_HTTPS_PORT = 15671
"""RabbitMQ's conventional port of the management API over TLS (``management.ssl.port``)."""
DEFAULT_TIMEOUT = 10.0
"""Seconds to wait for one answer when the caller needs it."""
BEST_EFFORT_TIMEOUT = 2.0
"""Seconds to wait for one answer the caller can do without (it carries on without it),
so an API behind a firewall that drops packets delays the command by little."""

_ADDRESS_FIX = (
    "give the API's address with --management-url or $RABBITMQ_MANAGEMENT_URL "
    "(management_url= in code)"
)


class ManagementError(DelayedRetryError):
    """The management API could not be read; the message names the URL and the fix.

    ``url`` is the API's address with the password masked; ``status`` the HTTP
    status it answered, or ``None`` when it did not answer (refused, timed
    out, not JSON). Catch it where the API is optional and carry on without it.
    """

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


def management_url_for(amqp_url: str) -> str:
    """The management API's address RabbitMQ uses by default for the broker at ``amqp_url``.

    Same host and credentials; ``http`` on 15672 for ``amqp://``, ``https`` on
    15671 for ``amqps://``. The AMQP port says nothing about the API's, so it
    is not used.
    """
    parts = urlsplit(amqp_url)
    https = parts.scheme == "amqps"
    host = parts.hostname or "127.0.0.1"
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]  # as written: still percent-encoded
    auth = f"{userinfo}@" if userinfo else ""
    scheme, port = ("https", DEFAULT_HTTPS_PORT) if https else ("http", DEFAULT_HTTP_PORT)
    return f"{scheme}://{auth}{host}:{port}/"


def _with_credentials_of(url: str, amqp_url: str) -> str:
    """``url`` with the broker URL's user and password when it has none of its own."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return url
    userinfo = urlsplit(amqp_url).netloc.rpartition("@")[0]
    if not userinfo:
        return url
    return parts._replace(netloc=f"{userinfo}@{parts.netloc}").geturl()


def _cafile_of(amqp_url: str) -> str | None:
    values = parse_qs(urlsplit(amqp_url).query).get("cafile")
    return values[0] if values else None


class ManagementClient:
    """A read-only client of one vhost through the management HTTP API.

    Build it with :meth:`for_broker` from the broker URL (and the management
    URL when one is given): that applies the address, credential and TLS
    rules of this module. Construct it directly when you have the API's own
    address, such as a test's private node. Every read is ``async`` and runs
    in a worker thread; each failure is a :class:`ManagementError`.
    """

    def __init__(
        self,
        url: str,
        *,
        vhost: str = "/",
        timeout: float = DEFAULT_TIMEOUT,
        cafile: str | None = None,
    ) -> None:
        shown = redact_url(url)
        try:
            parts = urlsplit(url)
            _ = parts.port  # a port that is not a number raises ValueError
        except ValueError as exc:
            raise ConfigurationError(
                f"management URL {shown!r} is not a URL ({exc}); write it like "
                f"http://user:password@host:{DEFAULT_HTTP_PORT}/"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"management URL {shown!r} is not an http:// or https:// URL with a host; "
                f"write it like http://user:password@host:{DEFAULT_HTTP_PORT}/ (the AMQP "
                "URL goes in --url)"
            )
        if not timeout > 0:
            raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds")
        self.url = shown
        """The API's address, password masked: for messages and logs."""
        self.vhost = vhost
        self.timeout = timeout
        self.user = unquote(parts.username or "guest")
        password = unquote(parts.password or "guest")
        self._auth = "Basic " + base64.b64encode(f"{self.user}:{password}".encode()).decode()
        host_port = parts.netloc.rpartition("@")[2]
        self._base = f"{parts.scheme}://{host_port}{parts.path.rstrip('/')}"
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl.create_default_context()
            if cafile:
                try:
                    self._ssl.load_verify_locations(cafile=cafile)
                except (OSError, ssl.SSLError) as exc:
                    raise ConfigurationError(
                        f"cafile {cafile!r} cannot be read as CA certificates for the management "
                        f"API at {shown} ({exc}); fix the cafile= path of the broker URL"
                    ) from None
        self._guessed = False

    @classmethod
    def for_broker(
        cls,
        amqp_url: str,
        *,
        management_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> ManagementClient:
        """The client of the broker at ``amqp_url``, for its vhost.

        ``management_url`` overrides the address (:func:`management_url_for`
        otherwise); without credentials of its own it gets the broker URL's.
        Pass :data:`BEST_EFFORT_TIMEOUT` when the caller carries on without
        an answer.
        """
        url = management_url or management_url_for(amqp_url)
        client = cls(
            _with_credentials_of(url, amqp_url),
            vhost=vhost_of(amqp_url),
            timeout=timeout,
            cafile=_cafile_of(amqp_url),
        )
        client._guessed = not management_url
        return client

    # -- reads -------------------------------------------------------------------
    async def queue_names(self) -> list[str]:
        """The names of the vhost's queues."""
        raw = await self._read(("queues", self.vhost), what="queues", query="columns=name")
        return [q["name"] for q in raw if isinstance(q, dict) and isinstance(q.get("name"), str)]

    async def queues(self) -> list[LiveQueue]:
        """The vhost's queues with their arguments and depth."""
        raw = await self._read(("queues", self.vhost), what="queues")
        return [
            LiveQueue(
                name=q["name"],
                durable=bool(q.get("durable", True)),
                arguments=q.get("arguments") or {},
                messages=q.get("messages"),
                leader=_leader_of(q),
                members=tuple(str(m) for m in q.get("members") or ()),
            )
            for q in raw
        ]

    async def exchanges(self) -> list[LiveExchange]:
        """The vhost's named exchanges (the nameless default exchange left out)."""
        raw = await self._read(("exchanges", self.vhost), what="exchanges")
        return [
            LiveExchange(
                name=e["name"],
                type=e.get("type", ""),
                durable=bool(e.get("durable", True)),
                arguments=e.get("arguments") or {},
            )
            for e in raw
            if e.get("name")
        ]

    async def exchange(self, name: str) -> dict[str, Any]:
        """What the API reports of exchange ``name``: type, durable, arguments, and more.

        Raises :class:`ManagementError` with ``status`` 404 when it does not exist.
        """
        info: dict[str, Any] = await self._read(
            ("exchanges", self.vhost, name), what=f"exchange {name!r}"
        )
        return info

    async def queue(self, name: str) -> dict[str, Any]:
        """What the API reports of queue ``name``: type, arguments, ``effective_policy_definition``.

        Raises :class:`ManagementError` with ``status`` 404 when it does not exist.
        """
        info: dict[str, Any] = await self._read(
            ("queues", self.vhost, name), what=f"queue {name!r}"
        )
        return info

    async def bindings(self) -> list[Binding]:
        """Every binding of the vhost, but the default exchange's implicit ones."""
        return _bindings(await self._read(("bindings", self.vhost), what="bindings"))

    async def queue_bindings(self, queue: str) -> list[Binding]:
        """The bindings into ``queue`` (404 when it does not exist)."""
        raw = await self._read(("queues", self.vhost, queue, "bindings"), what=f"queue {queue!r}")
        return _bindings(raw)

    async def exchange_bindings(
        self, name: str, *, direction: Literal["source", "destination"]
    ) -> list[Binding]:
        """Bindings from exchange ``name`` (``source``) or into it (``destination``)."""
        raw = await self._read(
            ("exchanges", self.vhost, name, "bindings", direction), what=f"exchange {name!r}"
        )
        return _bindings(raw)

    async def policies(self, *, operator: bool = False) -> list[Policy]:
        """The vhost's policies, or its operator policies with ``operator=True``."""
        kind = "operator-policies" if operator else "policies"
        raw = await self._read((kind, self.vhost), what=kind.replace("-", " "))
        return [
            Policy(
                name=p["name"],
                pattern=p.get("pattern", ""),
                apply_to=p.get("apply-to", "all"),
                priority=int(p.get("priority") or 0),
                definition=p.get("definition") or {},
                operator=operator,
            )
            for p in raw
        ]

    async def live_chain(self) -> LiveChain:
        """Exchanges, queues, bindings and policies of the vhost, for ``topology verify``.

        Read whole: a chain binds queues of any name, and NServiceBus naming
        puts the levels outside the prefix. Operator policies count when they
        can be read (older brokers and users without the policymaker tag
        cannot).
        """
        exchanges = await self.exchanges()
        queues = await self.queues()
        bindings = await self.bindings()
        policies = await self.policies()
        with contextlib.suppress(ManagementError):
            policies += await self.policies(operator=True)
        return LiveChain(
            exchanges={e.name: e for e in exchanges},
            queues={q.name: q for q in queues},
            bindings=frozenset(bindings),
            policies=tuple(policies),
            vhost=self.vhost,
        )

    # -- the one request -----------------------------------------------------------
    async def _read(self, segments: tuple[str, ...], *, what: str, query: str = "") -> Any:
        path = "/api/" + "/".join(quote(s, safe="") for s in segments)
        if query:
            path += f"?{query}"
        return await asyncio.to_thread(self._get, path, what)

    def _get(self, path: str, what: str) -> Any:
        request = urllib.request.Request(
            self._base + path, headers={"Authorization": self._auth, "Accept": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._ssl) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:
            raise self._refusal(exc.code, str(exc.reason), path, what) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            if isinstance(reason, TimeoutError):
                problem = f"did not answer within {self.timeout:g} s"
            else:
                problem = f"cannot be reached ({reason})"
            raise ManagementError(
                f"the management API at {self.url} {problem}; enable the management plugin "
                f"(rabbitmq-plugins enable rabbitmq_management) or {_ADDRESS_FIX}"
                + self._guess_note(),
                url=self.url,
            ) from None
        try:
            return json.loads(body)
        except ValueError:
            raise ManagementError(
                f"{self.url} answered {path} with something that is not JSON: it is not the "
                f"management API; {_ADDRESS_FIX}" + self._guess_note(),
                url=self.url,
            ) from None

    def _refusal(self, status: int, reason: str, path: str, what: str) -> ManagementError:
        answered = f"the management API at {self.url} answered {status} {reason} for {path}"
        if status == 401:
            fix = (
                f"it refused user {self.user!r}: check the user and password in the management "
                "URL or, when it has none, in the broker URL"
            )
        elif status == 403:
            fix = (
                f"user {self.user!r} may not read it: give it the 'monitoring' tag "
                f"(rabbitmqctl set_user_tags {self.user} monitoring) and access to vhost "
                f"{self.vhost!r}, or use another user in the management URL"
            )
        elif status == 404:
            fix = (
                f"no {what} found in vhost {self.vhost!r} (it or the vhost does not exist); "
                "check the name and the vhost at the end of the broker URL ('/' is %2F)"
            )
        else:
            fix = "see the broker's log, and try again once the node is healthy"
        return ManagementError(f"{answered}: {fix}", url=self.url, status=status)

    def _guess_note(self) -> str:
        if not self._guessed:
            return ""
        return (
            " (the address was derived from the broker URL: http on "
            f"{DEFAULT_HTTP_PORT} for amqp://, https on {DEFAULT_HTTPS_PORT} for amqps://)"
        )


def _leader_of(raw: dict[str, Any]) -> str | None:
    """A quorum queue's ``leader``, else a classic queue's ``node``, else ``None``."""
    node = raw.get("leader") or raw.get("node")
    return str(node) if node else None


def _bindings(raw: list[dict[str, Any]]) -> list[Binding]:
    return [
        Binding(
            source=b["source"],
            destination_type=b["destination_type"],
            destination=b["destination"],
            routing_key=b["routing_key"],
            arguments=dict(b.get("arguments") or {}),
            properties_key=b.get("properties_key") or "",
        )
        for b in raw
        if b.get("source")  # the default exchange's implicit bindings
    ]
