"""Reach the broker from the command line: check ``--url``, connect, explain failures in one line.

Commands call :func:`connect` instead of ``aio_pika.connect``; ``main`` turns
any connection failure into one line with :func:`explain_connection_error`,
and an operation the broker refused with :func:`explain_broker_refusal` (a
refusal comes from a broker that was reached, so it never reads "cannot reach").
"""

from __future__ import annotations

from urllib.parse import urlsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractConnection

from delayed_retry.cli import output
from delayed_retry.rabbitmq.urls import redact_url as redact
from delayed_retry.rabbitmq.urls import vhost_of

__all__ = ["check_url", "connect", "explain_broker_refusal", "explain_connection_error"]

_SCHEMES = ("amqp", "amqps")


def check_url(url: str) -> None:
    """Refuse a URL that is not ``amqp://`` or ``amqps://`` with a host, before dialling."""
    example = "amqp://user:password@host:5672/vhost"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise output.UsageError(
            f"--url {redact(url)!r} is not a broker URL ({exc}); write it like {example}"
        ) from None
    if parts.scheme not in _SCHEMES:
        what = f"a {parts.scheme}:// URL" if parts.scheme else "not a URL"
        raise output.UsageError(
            f"--url {redact(url)!r} is {what}; the broker speaks AMQP: write it like {example} "
            "(the management UI's http:// address and port 15672 do not work here)"
        )
    if not parts.hostname:
        raise output.UsageError(f"--url {redact(url)!r} names no host; write it like {example}")
    if port == 0:
        raise output.UsageError(f"--url {redact(url)!r} has port 0; the AMQP port is usually 5672")


_CONNECTION_REFUSALS = (
    aiormq.exceptions.ConnectionSyntaxError,
    aiormq.exceptions.ConnectionFrameError,
    aiormq.exceptions.ConnectionCommandInvalid,
    aiormq.exceptions.ConnectionChannelError,
    aiormq.exceptions.ConnectionUnexpectedFrame,
    aiormq.exceptions.ConnectionResourceError,
    aiormq.exceptions.ConnectionNotAllowed,
    aiormq.exceptions.ConnectionNotImplemented,
    aiormq.exceptions.ConnectionInternalError,
)
"""What aiormq raises when the broker answers an operation with ``connection.close``:
the hard errors, e.g. NOT_IMPLEMENTED for ``queue.delete`` with if-empty on a quorum queue."""


def _reply_text(exc: BaseException) -> str:
    """The broker's reply text (``NOT_FOUND - no queue 'x' in vhost '/'``) of a refusal."""
    text = exc.args[-1] if exc.args else None
    return str(text) if text else repr(exc)


def explain_broker_refusal(exc: BaseException, url: str) -> str | None:
    """One line for an operation the broker at ``url`` refused, or ``None`` for anything else.

    A refusal closes the channel (``ChannelClosed`` and its kinds: not found,
    precondition failed, access refused, locked) or, for a few hard errors,
    the whole connection; either way the broker was reached and its reply
    text names the object and the reason.
    """
    shown = redact(url)
    if isinstance(exc, aiormq.exceptions.ChannelClosed):
        return (
            f"the broker at {shown!r} refused an operation of this command: {_reply_text(exc)}. "
            "The broker is reachable; change what its reply names"
        )
    if isinstance(exc, _CONNECTION_REFUSALS):
        return (
            f"the broker at {shown!r} refused an operation of this command and closed the "
            f"connection: {_reply_text(exc)}. The broker is reachable; change what its reply names"
        )
    return None


def explain_connection_error(exc: BaseException, url: str) -> str | None:
    """One line for a failure to connect to ``url``, or ``None`` if ``exc`` is something else.

    A broker refusal is worded by :func:`explain_broker_refusal`, never as unreachable.
    """
    refusal = explain_broker_refusal(exc, url)
    if refusal is not None:
        return refusal
    shown = redact(url)
    if isinstance(exc, aiormq.exceptions.ProbableAuthenticationError):
        return (
            f"the broker at {shown!r} refused the user name or password; check the credentials "
            "in --url or $RABBITMQ_URL"
        )
    if isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc):
        return (
            f"the broker at {shown!r} refused to open virtual host {vhost_of(url)!r} (it does not "
            "exist or the user may not use it); check the path of --url, e.g. '/' is %2F"
        )
    if isinstance(exc, aiormq.exceptions.InvalidFrameError) and "unmarshal" in str(exc):
        detail = exc.args[-1] if exc.args else exc
        return (
            f"a message this command read from the broker at {shown!r} cannot be decoded by the "
            f"AMQP client ({detail}); it is still in its queue. Read it in the management UI and "
            "see 'Messages the client cannot decode' in docs/reliability.md to move it aside"
        )
    if isinstance(exc, aiormq.exceptions.AMQPConnectionError | ConnectionError | OSError):
        detail = exc.args[-1] if exc.args else exc
        return (
            f"cannot reach the broker at {shown!r}: {detail}; check the host and port of --url "
            "or $RABBITMQ_URL and that RabbitMQ is running"
        )
    if isinstance(exc, TimeoutError):
        return f"no answer from the broker at {shown!r} in time; check the host and port of --url"
    return None


async def connect(url: str, *, timeout: float = 10.0) -> AbstractConnection:
    """An aio-pika connection to ``url``; failures become one-line :class:`CommandError`."""
    check_url(url)
    try:
        return await aio_pika.connect(url, timeout=timeout)
    except (aiormq.exceptions.AMQPError, OSError, TimeoutError) as exc:
        line = explain_connection_error(exc, url)
        if line is None:
            raise
        raise output.CommandError(line) from exc
