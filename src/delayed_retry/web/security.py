"""Who may connect, who may change things, and the headers every answer carries.

The checks are pure functions (tested as functions); :func:`security_middleware`
applies them to every aiohttp request. The threat model is in ``docs/web.md``.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from delayed_retry.errors import ConfigurationError
from delayed_retry.web.settings import Credentials

__all__ = [
    "SECURITY_HEADERS",
    "USER",
    "authenticate",
    "check_bind",
    "host_allowed",
    "is_loopback",
    "same_origin",
    "security_middleware",
]

log = logging.getLogger(__name__)

SECURITY_HEADERS: Mapping[str, str] = {
    # No inline script or style, nothing from elsewhere, no framing, no plugins.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

_LOOPBACK_NAMES = ("localhost",)
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only reaches this machine."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, credentials: Credentials | None) -> None:
    """Refuse to listen beyond loopback without authentication."""
    if credentials is None and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to serve the web view on {host!r} without authentication: anyone who "
            "reaches that address could replay or purge parked messages. Pass --auth "
            "USER:PASSWORD or set DELAYED_RETRY_WEB_TOKEN, or bind to 127.0.0.1"
        )


def _split_host(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def host_allowed(host_header: str | None, *, trusted: tuple[str, ...], authenticated: bool) -> bool:
    """Whether a request's ``Host`` is acceptable.

    Without authentication only loopback names are: a DNS-rebinding page
    (``evil.example`` resolving to 127.0.0.1) sends its own name as ``Host``.
    ``trusted`` adds names (a reverse proxy's).
    """
    if not host_header:
        return False
    name = _split_host(host_header).lower()
    if name in (t.lower() for t in trusted):
        return True
    return authenticated or is_loopback(name)


def same_origin(headers: Mapping[str, str], *, scheme: str, host: str | None) -> bool:
    """Whether a state-changing request comes from this site's own pages.

    ``Sec-Fetch-Site: same-origin`` when the browser sends it; otherwise an
    ``Origin`` equal to ``scheme://host``; anything else (no header at all,
    ``null``, another site) is refused. Scripts send ``Origin`` themselves.
    """
    site = headers.get("Sec-Fetch-Site")
    if site is not None:
        return site == "same-origin"
    origin = headers.get("Origin")
    if not origin or origin == "null" or not host:
        return False
    return origin.lower() == f"{scheme}://{host}".lower()


def authenticate(authorization: str | None, credentials: Credentials | None) -> str | None:
    """The user a request authenticates as (``"token"`` for the bearer token), else ``None``.

    With no credentials configured everyone is ``"local"`` (loopback only).
    """
    if credentials is None:
        return "local"
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    scheme = scheme.lower()
    value = value.strip()
    if scheme == "bearer":
        return "token" if credentials.check_token(value) else None
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if sep and credentials.check_basic(user, password):
            return user
    return None


USER = web.RequestKey("delayed_retry_web_user", str)
"""The request's user: a Basic user name, ``token``, or ``local`` when no credentials are set."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def security_middleware(
    credentials: Credentials | None, *, read_only: bool, trusted_hosts: tuple[str, ...] = ()
) -> Middleware:
    """aiohttp middleware: Host check, authentication, same-origin POSTs, read-only, headers."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await _guarded(request, handler)
        except web.HTTPException as exc:
            for name, value in SECURITY_HEADERS.items():
                exc.headers.setdefault(name, value)
            raise
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        user = authenticate(request.headers.get("Authorization"), credentials)
        # "local" (no credentials configured) is not authentication: check the Host.
        authenticated = credentials is not None and user is not None
        if not host_allowed(
            request.headers.get("Host"), trusted=trusted_hosts, authenticated=authenticated
        ):
            raise web.HTTPMisdirectedRequest(text="unexpected Host header\n")
        if user is None:
            raise web.HTTPUnauthorized(
                text="authentication required\n",
                headers={"WWW-Authenticate": 'Basic realm="delayed-retry", charset="UTF-8"'},
            )
        if request.method not in _SAFE_METHODS:
            if request.method != "POST":
                raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
            if not same_origin(request.headers, scheme=request.scheme, host=request.host):
                log.warning(
                    "refused a cross-origin %s %s (Origin=%r, Sec-Fetch-Site=%r)",
                    request.method,
                    request.path,
                    request.headers.get("Origin"),
                    request.headers.get("Sec-Fetch-Site"),
                )
                raise web.HTTPForbidden(text="cross-origin request refused\n")
            if read_only:
                raise web.HTTPForbidden(text="this web view is read-only (--read-only)\n")
        request[USER] = user
        return await handler(request)

    return middleware
