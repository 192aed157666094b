"""``delayed-retry web``: refuses unsafe options, serves on loopback, stops on SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from delayed_retry.cli.main import main
from harness import free_port, release_port

CLI = Path(sys.executable).parent / "delayed-retry"


def test_web_refuses_a_public_address_without_auth(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["web", "--host", "0.0.0.0", "--queue", "orders"]) == 2
    err = capsys.readouterr().err
    assert "without authentication" in err and "--auth" in err


def test_web_refuses_malformed_auth(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["web", "--auth", "nocolon", "--queue", "orders"]) == 2
    assert "USER:PASSWORD" in capsys.readouterr().err


@pytest.mark.broker
async def test_web_serves_until_interrupted(rabbitmq_url: str, tmp_path: Path) -> None:
    port = free_port()
    try:
        process = await asyncio.create_subprocess_exec(
            str(CLI),
            "--url",
            rabbitmq_url,
            "web",
            "--port",
            str(port),
            "--queue",
            "orders-web-cli",
            "--read-only",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "DELAYED_RETRY_WEB_TOKEN": ""},
        )
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            assert f"http://127.0.0.1:{port}/" in line.decode()
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/api/queues") as response,
            ):
                assert response.status == 200
                data = await response.json()
            assert data["queues"] == [
                {
                    "queue": "orders-web-cli",
                    "parking_queue": "orders-web-cli.parking",
                    "parked": None,
                }
            ]
            process.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    finally:
        release_port(port)


@pytest.mark.broker
def test_web_without_queues_and_no_management_api_says_what_to_do(
    rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    try:
        code = main(
            [
                "--url",
                rabbitmq_url,
                "web",
                "--port",
                str(port),
                "--management-url",
                "http://127.0.0.1:1",
            ]
        )
    finally:
        release_port(port)
    assert code == 2
    err = capsys.readouterr().err
    assert "management API" in err and "--queue" in err
