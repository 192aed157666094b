"""The web view as an ASGI application, to mount in Starlette, FastAPI or any ASGI server.

Use :func:`asgi_app` when the surrounding service is ASGI; in an aiohttp service mount
:func:`~delayed_retry.web.create_app` directly instead. It runs the same aiohttp application
on a private Unix socket and passes each request through unchanged, so every security rule
applies; call :meth:`WebASGI.close` at shutdown. An example: docs/web.md, "In an existing
application".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
from aio_pika.abc import AbstractConnection
from aiohttp import web

from delayed_retry.web.app import create_app
from delayed_retry.web.security import Handler
from delayed_retry.web.settings import WebSettings

__all__ = ["WebASGI", "asgi_app"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_SCHEME_HEADER = "X-Delayed-Retry-Forwarded-Scheme"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"}


@web.middleware
async def _forwarded_scheme(request: web.Request, handler: Handler) -> web.StreamResponse:
    # Only the adapter reaches the private socket, and it always sets this header from the
    # ASGI scope (removing any copy the client sent), so the scheme can be trusted.
    scheme = request.headers.get(_SCHEME_HEADER)
    if scheme in ("http", "https"):
        request = request.clone(scheme=scheme)
    return await handler(request)


class WebASGI:
    """An ASGI application serving the web view; see :func:`asgi_app`."""

    def __init__(self, settings: WebSettings, *, connection: AbstractConnection | None) -> None:
        self.settings = settings
        self.connection = connection
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._folder: Path | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:  # websockets: not served
            await send({"type": "websocket.close", "code": 1003})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # Started on the first request, which tells the path it is mounted at.
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self, root_path: str) -> aiohttp.ClientSession:
        async with self._lock:
            if self._session is not None:
                return self._session
            inner = create_app(self.settings, connection=self.connection)
            if root_path:
                app = web.Application(middlewares=[_forwarded_scheme])
                app.add_subapp(root_path, inner)
            else:
                inner.middlewares.insert(0, _forwarded_scheme)
                app = inner
            self._folder = Path(tempfile.mkdtemp(prefix="delayed-retry-web-"))
            socket_path = str(self._folder / "web.sock")
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=2)
            await runner.setup()
            await web.UnixSite(runner, socket_path).start()
            self._runner = runner
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=socket_path),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
            return self._session

    async def close(self) -> None:
        """Stop the application (closing the broker connection it opened)."""
        async with self._lock:
            if self._session is not None:
                await self._session.close()
                self._session = None
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        root_path = str(scope.get("root_path", "")).rstrip("/")
        session = await self._start(root_path)
        path = str(scope.get("raw_path", b"").decode("latin-1") or scope["path"])
        if root_path and not path.startswith(root_path):
            path = root_path + path  # servers that strip the mount point from path
        query = scope.get("query_string", b"").decode("latin-1")
        url = "http://delayed-retry-web" + path + (f"?{query}" if query else "")
        headers: list[tuple[str, str]] = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope.get("headers", [])
            if k.decode("latin-1").lower() not in (_SCHEME_HEADER.lower(), *_HOP_BY_HOP)
        ]
        headers.append((_SCHEME_HEADER, str(scope.get("scheme", "http"))))
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > 1024 * 1024:
                await _plain(send, 413, b"request body too large\n")
                return
            if not message.get("more_body", False):
                break
        async with session.request(
            scope["method"],
            url,
            headers=headers,
            data=bytes(body),
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        ) as response:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [
                        (k, v)
                        for k, v in response.raw_headers
                        if k.decode("latin-1").lower() not in _HOP_BY_HOP
                    ],
                }
            )
            gone = asyncio.create_task(_disconnected(receive))
            try:
                async for chunk in _chunks(response, gone):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                gone.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await gone
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _chunks(
    response: aiohttp.ClientResponse, gone: asyncio.Task[None]
) -> AsyncIterator[bytes]:
    """The response body as it arrives, until it ends or the client goes away."""
    while True:
        read = asyncio.ensure_future(response.content.readany())
        done, _ = await asyncio.wait({read, gone}, return_when=asyncio.FIRST_COMPLETED)
        if read not in done:
            read.cancel()
            return
        chunk = read.result()
        if not chunk:
            return
        yield chunk


async def _plain(send: Send, status: int, text: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8")],
        }
    )
    await send({"type": "http.response.body", "body": text})


def asgi_app(settings: WebSettings, *, connection: AbstractConnection | None = None) -> WebASGI:
    """The web view as an ASGI application (mountable under any path)."""
    return WebASGI(settings, connection=connection)
