"""The container path of ``broker_url``: opt-in, a named image, a clean fall-back.

The tests marked ``container`` need a Docker engine with the RabbitMQ image;
``scripts/container-smoke`` (run by CI after ``scripts/test``) builds one and
runs them. The others check the choice and the fall-back without an engine.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import pytest

from harness import BrokerHarnessError, broker_url, wait_for_broker
from harness.broker import CONTAINER_ENV, DEFAULT_IMAGE, IMAGE_ENV, container_mode

NO_ENGINE = "unix:///nonexistent/delayed-retry/docker.sock"


@pytest.fixture
def no_broker_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``broker_url`` choose for itself (CI may set RABBITMQ_URL)."""
    monkeypatch.delenv("RABBITMQ_URL", raising=False)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "harness.broker" and r.levelno >= logging.WARNING
    ]


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (None, "off"),
        ("", "off"),
        ("0", "off"),
        ("1", "prefer"),
        ("yes", "prefer"),
        ("require", "require"),
        (" Require ", "require"),
    ],
)
def test_the_variable_chooses_the_container_mode(value: str | None, mode: str) -> None:
    assert container_mode(value) == mode


def test_an_unknown_container_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(BrokerHarnessError, match=rf"{CONTAINER_ENV}='docker'.*use 1 .*require"):
        container_mode("docker")


@pytest.mark.usefixtures("no_broker_url")
def test_a_required_container_without_an_engine_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    monkeypatch.setenv(CONTAINER_ENV, "require")
    with (
        pytest.raises(BrokerHarnessError, match=rf"{CONTAINER_ENV}=require, but no Docker engine"),
        broker_url(),
    ):
        pass


@pytest.mark.broker
@pytest.mark.usefixtures("no_broker_url")
def test_a_preferred_container_without_an_engine_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    monkeypatch.setenv(CONTAINER_ENV, "1")
    caplog.set_level(logging.INFO, logger="harness.broker")
    with broker_url(timeout=30) as url:
        wait_for_broker(url, timeout=5)
    [warning] = warnings_of(caplog)
    assert "using a private node instead" in warning
    assert f"no Docker engine answers at {NO_ENGINE}" in warning


# --- with a Docker engine (scripts/container-smoke) ------------------------------------


@pytest.fixture
def engine() -> Iterator[Any]:
    """A Docker SDK client on the engine DOCKER_HOST names."""
    docker: Any = importlib.import_module("docker")
    client = docker.from_env(timeout=60)
    try:
        client.ping()
    except Exception as exc:
        pytest.fail(f"no Docker engine for a container test ({exc}); run scripts/container-smoke")
    yield client
    client.close()


def _image() -> str:
    return os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


@pytest.mark.container
@pytest.mark.usefixtures("no_broker_url")
async def test_broker_url_runs_on_a_container_of_the_named_image(engine: Any) -> None:
    image = _image()
    with broker_url(container="require", image=image) as url:
        port = urlsplit(url).port
        running = engine.containers.list(filters={"ancestor": image})
        published = {
            int(binding["HostPort"]) for c in running for binding in (c.ports.get("5672/tcp") or [])
        }
        assert port in published, f"{url} is not a {image} container ({published})"
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"x"), queue.name)
            message = await queue.get(no_ack=True, timeout=10)
            assert message.body == b"x"
        ids = {c.id for c in running}
    still = {c.id for c in engine.containers.list(filters={"ancestor": image})}
    assert not ids & still, "the container was left running"


@pytest.mark.container
@pytest.mark.usefixtures("no_broker_url")
def test_an_image_the_engine_cannot_provide_falls_back_with_one_warning(
    engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    missing = "delayed-retry-test/absent:never"
    caplog.set_level(logging.INFO, logger="harness.broker")
    with broker_url(container="prefer", image=missing, timeout=30) as url:
        wait_for_broker(url, timeout=5)
    [warning] = warnings_of(caplog)
    assert f"cannot provide image {missing!r}" in warning
    assert IMAGE_ENV in warning
