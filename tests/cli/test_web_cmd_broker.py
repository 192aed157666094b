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


def test_web_refuses_an_audit_log_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "audit.jsonl"
    assert main(["web", "--queue", "orders", "--audit-log", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"cannot append the audit log to {str(target)!r}" in err[0]
    assert "--audit-log PATH" in err[0]


@pytest.mark.broker
async def test_web_keeps_its_audit_log_in_the_users_state_folder_not_the_current_one(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    port = free_port()
    work = tmp_path / "checkout"
    work.mkdir()
    state = tmp_path / "state"
    try:
        process = await asyncio.create_subprocess_exec(
            *(str(CLI), "--url", rabbitmq_url, "web", "--port", str(port)),
            *("--queue", "orders-web-audit"),
            cwd=work,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "DELAYED_RETRY_WEB_TOKEN": "", "XDG_STATE_HOME": str(state)},
        )
        assert process.stdout is not None
        try:
            out = b""
            while b"audit log:" not in out:
                line = await asyncio.wait_for(process.stdout.readline(), 60)
                assert line, out
                out += line
            expected = state / "delayed-retry" / "audit.jsonl"
            assert f"audit log: {expected}" in out.decode()
            assert expected.exists()
            process.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    finally:
        release_port(port)
    assert list(work.iterdir()) == []  # nothing in the folder it was started from


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
    # The command line is right; the broker lacks what it needs: 1, as the help says, not 2.
    assert code == 1
    err = capsys.readouterr().err
    assert "management API" in err and "--queue" in err


@pytest.mark.broker
async def test_a_read_only_web_view_needs_no_writable_home(
    rabbitmq_url: str, tmp_path: Path
) -> None:
    """A container user without a home runs ``web --read-only``: it has nothing to audit."""
    port = free_port()
    home = tmp_path / "no-such-home"  # never made: nothing can be written under it
    env = {**os.environ, "DELAYED_RETRY_WEB_TOKEN": "", "HOME": str(home)}
    env.pop("XDG_STATE_HOME", None)
    try:
        process = await asyncio.create_subprocess_exec(
            *(str(CLI), "--url", rabbitmq_url, "web", "--port", str(port)),
            *("--queue", "orders-web-ro", "--read-only"),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert process.stdout is not None
        try:
            out = b""
            while b"audit log:" not in out:
                line = await asyncio.wait_for(process.stdout.readline(), 60)
                assert line, out
                out += line
            assert "audit log: none (read-only)" in out.decode()
            process.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    finally:
        release_port(port)
    assert not home.exists()
