"""Broker URLs in messages: the one place a password is masked. Pure."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url"]


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
