"""The ASGI form: mounted under a path in Starlette, served by uvicorn on loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from delayed_retry.web import WebSettings
from delayed_retry.web.asgi import asgi_app
from harness import free_port, release_port
from tests.support.chain import Scenario
from tests.support.waiting import wait_until
from tests.support.web import ids_in, park

pytestmark = pytest.mark.broker


async def test_mounted_in_starlette_under_a_path(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["timeout", "missing"])
    view = asgi_app(
        WebSettings(url=rabbitmq_url, queues=(queue,), topology=lot.topology, live_interval=0.2)
    )
    app = Starlette(routes=[Mount("/retries", app=view)])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())
    base = f"http://127.0.0.1:{port}"
    try:

        async def started() -> bool:
            return server.started

        await wait_until(started, timeout=30)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/retries/") as response:
                assert response.status == 200
                page = await response.text()
                assert response.headers["X-Content-Type-Options"] == "nosniff"
            # Links and assets carry the mount path.
            assert f'href="/retries/parked?queue={queue}"' in page
            assert "/retries/static/htmx.min.js" in page
            async with session.get(f"{base}/retries/api/parked", params={"queue": queue}) as r:
                ids = sorted(i["message_id"] for i in (await r.json())["items"])
            assert ids == ["missing-101", "timeout-100"]
            body = {"queue": queue, "message_ids": ["missing-101"]}
            async with session.post(f"{base}/retries/api/parked/purge", json=body) as r:
                assert r.status == 403
            async with session.post(
                f"{base}/retries/api/parked/purge",
                json=body,
                headers={"Origin": "http://evil.example"},
            ) as r:
                assert r.status == 403
            async with session.post(
                f"{base}/retries/api/parked/purge", json=body, headers={"Origin": base}
            ) as r:
                assert r.status == 202, await r.text()
                status_url = (await r.json())["status_url"]
            assert status_url.startswith("/retries/api/jobs/")

            async def finished() -> bool:
                async with session.get(base + status_url) as r:
                    return bool((await r.json())["state"] == "finished")

            await wait_until(finished, timeout=30)
            async with session.get(f"{base}/retries/events") as r:
                event = b""
                while not event.endswith(b"\n\n"):
                    event += await asyncio.wait_for(r.content.readline(), 10)
            data = json.loads(event.decode().splitlines()[1].removeprefix("data: "))
            assert queue + ".parking" in data["counts"]
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
        await view.close()
        release_port(port)
    assert await ids_in(lot, queue + ".parking") == ["timeout-100"]
