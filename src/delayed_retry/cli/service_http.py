"""A tiny HTTP/1.1 server on asyncio for a service's health and metrics endpoints.

Only ``GET`` (and ``HEAD``) of fixed paths, one request per connection: what
a Kubernetes probe and a Prometheus scrape send. No web framework, so the
endpoints need no extra beyond the one the metrics themselves need.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from delayed_retry.cli import output

__all__ = ["Reply", "Route", "serve_routes"]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_READ_TIMEOUT = 5.0


@dataclass(frozen=True, kw_only=True)
class Reply:
    """An answer: status, content type and body."""

    status: int
    body: bytes
    content_type: str = "application/json"


Route = Callable[[], Reply | Awaitable[Reply]]
"""What answers ``GET`` of one path."""


async def _answer(routes: Mapping[str, Route], request_line: bytes) -> tuple[Reply, bool]:
    parts = request_line.decode("latin-1").split()
    if len(parts) != 3:
        return Reply(status=405, body=b'{"error": "not an HTTP request"}\n'), False
    method, target, _ = parts
    path = target.split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return Reply(status=405, body=b'{"error": "only GET"}\n'), False
    route = routes.get(path)
    if route is None:
        paths = ", ".join(sorted(routes))
        return Reply(status=404, body=f'{{"error": "no such path; try {paths}"}}\n'.encode()), False
    reply = route()
    if not isinstance(reply, Reply):
        reply = await reply
    return reply, method == "HEAD"


async def _handle(
    routes: Mapping[str, Route], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        request_line = await asyncio.wait_for(reader.readline(), _READ_TIMEOUT)
        while (line := await asyncio.wait_for(reader.readline(), _READ_TIMEOUT)) not in (
            b"\r\n",
            b"\n",
            b"",
        ):
            del line  # headers are not needed
        reply, head_only = await _answer(routes, request_line)
        head = (
            f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, '')}\r\n"
            f"Content-Type: {reply.content_type}\r\n"
            f"Content-Length: {len(reply.body)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + (b"" if head_only else reply.body))
        await writer.drain()
    except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass  # a client that went away or sent nothing in time
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve_routes(
    *, host: str, port: int, routes: Mapping[str, Route], option: str
) -> asyncio.Server:
    """Listen on ``host:port`` and answer ``routes``; ``option`` names the flag in errors."""
    try:
        return await asyncio.start_server(
            lambda r, w: _handle(routes, r, w), host=host, port=port, reuse_address=True
        )
    except OSError as exc:
        raise output.CommandError(
            f"{option} {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); another "
            f"process uses the port: choose another {option}"
        ) from exc
