"""The Dockerfile builds, its image runs every command, and deploy/compose.yaml delivers.

Run by scripts/container-smoke, which starts a Docker engine and makes the base
images from Debian's packages (no registry is reachable here): it sets
``DELAYED_RETRY_BASE_IMAGE`` (Python from Debian, standing in for
``python:3.11-slim``) and ``DELAYED_RETRY_TEST_IMAGE`` (RabbitMQ).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from harness import free_port

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "delayed-retry:container-test"
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*_cache", "tests", "benchmarks")


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Dockerfile built on the Debian base, installing from wheels made here."""
    base = os.environ.get("DELAYED_RETRY_BASE_IMAGE")
    if not base or shutil.which("docker") is None:
        pytest.fail("needs a Docker engine and a base image: run scripts/container-smoke")
    context = tmp_path_factory.mktemp("image") / "context"
    shutil.copytree(ROOT, context, ignore=SKIP)
    began = time.monotonic()
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--wheel-dir",
        str(context / "wheels"),
        f"{context}[service,webhook,web]",
        "hatchling",
    )
    _run(
        "docker",
        "build",
        "-q",
        "-t",
        IMAGE,
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        "PIP_INSTALL_OPTIONS=--no-index --find-links /src/wheels",
        str(context),
    )
    print(f"image built in {time.monotonic() - began:.0f} s")
    return IMAGE


def test_the_image_runs_the_command_line(image: str) -> None:
    out = _run("docker", "run", "--rm", image, "forwarder", "--help")
    assert "--health-port" in out and "--metrics-port" in out
    user = _run("docker", "run", "--rm", "--entrypoint", "id", image, "-un")
    assert user.strip() == "delayed-retry"


@pytest.fixture
def compose(image: str) -> Iterator[tuple[list[str], dict[str, str]]]:
    env = {
        "DELAYED_RETRY_IMAGE": image,
        "RABBITMQ_IMAGE": os.environ.get("DELAYED_RETRY_TEST_IMAGE", "rabbitmq:3.10"),
        "RABBITMQ_PORT": str(free_port()),
        "WEB_PORT": str(free_port()),
    }
    command = ["docker-compose", "-p", "drtest", "-f", str(ROOT / "deploy" / "compose.yaml")]
    _run(*command, "up", "-d", "--no-build", env=env)
    try:
        yield command, env
    finally:
        logs = subprocess.run(
            [*command, "logs", "--no-color", "front-door", "forwarder", "alerts"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        print(logs.stdout[-6000:])
        subprocess.run([*command, "down", "-v", "-t", "30"], env={**os.environ, **env}, timeout=120)


async def _connect(url: str, deadline: float) -> aio_pika.abc.AbstractConnection:
    while True:
        try:
            return await aio_pika.connect(url)
        except Exception:
            assert time.monotonic() < deadline, f"the compose broker did not answer at {url}"
            await asyncio.sleep(0.5)


async def test_a_delayed_message_goes_through_the_compose_deployment(
    compose: tuple[list[str], dict[str, str]],
) -> None:
    command, env = compose
    began = time.monotonic()
    deadline = began + 240
    url = f"amqp://guest:guest@127.0.0.1:{env['RABBITMQ_PORT']}/"
    connection = await _connect(url, deadline)
    async with connection:
        channel = await connection.channel()
        # The front door declares orders and orders.delay once it runs.
        while True:
            try:
                probe = await connection.channel()
                await probe.get_exchange("orders.delay", ensure=True)
                await probe.close()
                break
            except Exception:
                assert time.monotonic() < deadline, "the front door never declared orders.delay"
                await asyncio.sleep(0.5)
        orders = await channel.get_exchange("orders")
        queue = await channel.declare_queue("drtest-orders", exclusive=True)
        await queue.bind(orders, "order.#")
        # Published as a producer would, the moment orders.delay exists; a message
        # the broker returns (nothing bound to orders.delay) raises instead of vanishing.
        publisher = await connection.channel(on_return_raises=True)
        inbox = await publisher.get_exchange("orders.delay")
        sent = time.monotonic()
        await inbox.publish(
            aio_pika.Message(b"later", headers={"x-delay": 1500}, message_id="later"),
            routing_key="order.created",
            mandatory=True,
        )
        message = None
        while message is None:
            assert time.monotonic() < sent + 60, "the delayed message did not arrive in 60 s"
            message = await queue.get(fail=False)
            if message is None:
                await asyncio.sleep(0.05)
        arrived = time.monotonic() - sent
        assert message.body == b"later" and message.headers["x-delay"] == -1500
        assert arrived >= 1.5
    print(f"compose up to delivery in {time.monotonic() - began:.0f} s; delay took {arrived:.2f} s")

    # Each service answers its probes inside the network.
    readyz = (
        "import urllib.request as u; r = u.urlopen('http://127.0.0.1:8081/readyz'); "
        "print(r.status, r.read().decode())"
    )
    for service in ("front-door", "forwarder", "alerts", "web"):
        ready = _wait_ready(command, env, service, readyz, deadline)
        assert ready.startswith("200 ") and '"ready"' in ready
    metrics = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9464/metrics').read().decode())"
    page = _run(*command, "exec", "-T", "forwarder", "python3", "-c", metrics, env=env)
    assert "delayed_retry_service_messages_total" in page

    # docker stop sends SIGTERM: the forwarder stops cleanly, exit code 0.
    _run(*command, "stop", "-t", "30", "forwarder", env=env)
    container = _run(*command, "ps", "-q", "forwarder", env=env).strip()
    code = _run("docker", "inspect", "-f", "{{.State.ExitCode}}", container).strip()
    assert code == "0"


def _wait_ready(
    command: list[str], env: dict[str, str], service: str, probe: str, deadline: float
) -> str:
    while True:
        done = subprocess.run(
            [*command, "exec", "-T", service, "python3", "-c", probe],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=60,
        )
        if done.returncode == 0 and done.stdout.startswith("200 "):
            return done.stdout
        assert time.monotonic() < deadline, f"{service} not ready: {done.stdout}{done.stderr}"
        time.sleep(1)
