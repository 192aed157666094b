"""The README's "Use" program (examples/use.py) runs as pasted: consumes, then stops cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from tests.support.queues import delete_all

pytestmark = pytest.mark.broker

USE = Path(__file__).resolve().parents[2] / "examples" / "use.py"


def test_the_readme_use_snippet_is_the_example_program() -> None:
    readme = (USE.parents[1] / "README.md").read_text()
    body = USE.read_text().split('"""', 2)[2].strip()
    assert body in readme, "README's Use section must show examples/use.py as it is"


def test_the_use_program_consumes_and_stops_on_sigint(rabbitmq_url: str) -> None:
    env = {**os.environ, "RABBITMQ_URL": rabbitmq_url}
    proc = subprocess.Popen(
        [sys.executable, str(USE)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        publish = _publish_when_consumed(rabbitmq_url, "orders", [b"order-1"])
        asyncio.run(asyncio.wait_for(publish, 120))
        assert proc.stdout is not None
        lines = []
        for raw in proc.stdout:
            lines.append(raw.decode())
            if "processing b'order-1'" in lines[-1]:
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, "".join(lines)
        assert "consuming 'orders'" in "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        asyncio.run(
            delete_all(rabbitmq_url, queues=["orders", "orders.parking", "orders.dead-letter"])
        )


FASTSTREAM_APP = USE.parent / "faststream_app.py"


async def _publish_when_consumed(url: str, queue: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` to ``queue`` once the example program consumes it."""
    connection = await aio_pika.connect(url)
    async with connection:
        while True:
            channel = await connection.channel()
            try:
                declared = await channel.declare_queue(queue, passive=True)
                if declared.declaration_result.consumer_count:
                    for body in bodies:
                        await channel.default_exchange.publish(
                            aio_pika.Message(body), routing_key=queue
                        )
                    return
            except aio_pika.exceptions.ChannelNotFoundEntity:
                pass
            finally:
                if not channel.is_closed:
                    await channel.close()
            await asyncio.sleep(0.1)


def test_the_faststream_app_retries_and_parks(rabbitmq_url: str) -> None:
    env = {**os.environ, "RABBITMQ_URL": rabbitmq_url}
    proc = subprocess.Popen(
        [sys.executable, str(FASTSTREAM_APP)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        publish = _publish_when_consumed(rabbitmq_url, "fs-orders", [b"invalid-1", b"flaky-1"])
        asyncio.run(asyncio.wait_for(publish, 120))
        assert proc.stdout is not None
        lines = []
        for raw in proc.stdout:
            lines.append(raw.decode())
            if "flaky-1: done" in lines[-1]:
                break
        out = "".join(lines)
        assert "flaky-1: attempt 2 (last error: __main__.TransientError" in out, out
        assert "invalid-1: attempt 2" not in out, out
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        asyncio.run(delete_all(rabbitmq_url, queues=["fs-orders", "fs-orders.parking"]))
