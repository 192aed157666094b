"""Broker URLs: the one place a password is masked, and the vhost a URL names. Pure."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["redact_url", "vhost_of"]


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***``; use it wherever a URL is logged or shown.

    The user and the rest of the URL stay, so the reader still sees which
    broker and which account were meant. Text that is not a URL with a
    password comes back unchanged.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # an unparsable port or netloc: mask everything before the host
        head, at, host = url.rpartition("@")
        if not at:
            return url
        scheme, sep, creds = head.partition("://")
        return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"
    if password is None:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def vhost_of(url: str) -> str:
    """The virtual host an ``amqp://`` or ``amqps://`` URL names, decoded; ``/`` when it names none.

    Use it wherever a vhost is needed from the broker URL (the management API,
    messages), so ``amqp://host``, ``amqp://host/`` and ``amqp://host/%2F``
    all mean the default vhost ``/``, as they do for aio-pika.
    """
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"
