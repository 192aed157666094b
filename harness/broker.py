"""One broker URL for a test session: a given URL, a container, or a private node.

Use :func:`broker_url` in test fixtures: it picks whatever broker this machine
can offer. Use :class:`~harness.RabbitMQNode` directly when a test
must kill, stop or restart the broker, or needs TLS; such tests must never
touch a shared broker.

A container is opt-in: set ``DELAYED_RETRY_TEST_CONTAINER=1`` to run the
session's broker in a testcontainers container (needs the ``testcontainers``
extra and a Docker engine), ``require`` to fail rather than fall back. Name
the image with ``DELAYED_RETRY_TEST_IMAGE`` (default ``rabbitmq:3.10``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from typing import Any, Literal

from delayed_retry.rabbitmq.urls import redact_url

from .chroot import VERSION_ENV
from .node import RabbitMQNode
from .probe import BrokerHarnessError, wait_for_broker

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "rabbitmq:3.10"
"""Container image for :func:`broker_url`; the same series as Debian bookworm's broker."""

CONTAINER_ENV = "DELAYED_RETRY_TEST_CONTAINER"
"""``1``: run the broker in a container when one can be had; ``require``: or fail."""

IMAGE_ENV = "DELAYED_RETRY_TEST_IMAGE"
"""The container image to run, when a container is asked for."""

ContainerMode = Literal["off", "prefer", "require"]


def container_mode(value: str | None) -> ContainerMode:
    """Read ``DELAYED_RETRY_TEST_CONTAINER``: off (unset, ``0``), prefer (``1``) or require."""
    word = (value or "").strip().lower()
    if word in ("", "0", "no", "false", "off"):
        return "off"
    if word in ("1", "yes", "true", "on", "prefer"):
        return "prefer"
    if word == "require":
        return "require"
    raise BrokerHarnessError(
        f"{CONTAINER_ENV}={value!r} is not understood; use 1 (a container, else a private "
        "node), require (a container or fail) or 0 (a private node)"
    )


class _NoContainer(Exception):
    """Why no container broker could be had (the reason is the message)."""


def _check_image(image: str) -> None:
    """Make sure the engine has ``image``, pulling it if needed; raise ``_NoContainer`` if not."""
    if importlib.util.find_spec("testcontainers") is None:
        raise _NoContainer(
            "testcontainers is not installed (pip install 'delayed-retry[testcontainers]')"
        )
    # Both are optional (the `testcontainers` extra); imported here, untyped.
    docker: Any = importlib.import_module("docker")
    engine = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise _NoContainer(f"no Docker engine answers at {engine} ({exc})") from exc
    try:
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            try:
                client.images.pull(image)
            except Exception as exc:
                raise _NoContainer(
                    f"the Docker engine at {engine} cannot provide image {image!r}: it is not "
                    f"on the machine and pulling it failed ({exc}); build it "
                    f"(scripts/container-smoke does) or name another with {IMAGE_ENV}"
                ) from exc
    except _NoContainer:
        raise
    except Exception as exc:
        raise _NoContainer(
            f"the Docker engine at {engine} failed to look up {image!r}: {exc}"
        ) from exc
    finally:
        client.close()


def _open_container(image: str, stack: contextlib.ExitStack) -> str:
    """Start ``image`` (stopped by ``stack``) and return its broker's URL once it answers."""
    _check_image(image)
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image).with_exposed_ports(5672)
    try:
        container.start()
    except Exception as exc:
        hint = ""
        if "ryuk" in str(exc).lower():
            hint = "; set TESTCONTAINERS_RYUK_DISABLED=true where Ryuk's image cannot be pulled"
        raise _NoContainer(f"the container of {image!r} did not start ({exc}){hint}") from exc
    stack.callback(container.stop)
    host = container.get_container_host_ip()
    url = f"amqp://guest:guest@{host}:{container.get_exposed_port(5672)}/"
    try:
        wait_for_broker(url, timeout=120)
    except BrokerHarnessError as exc:
        raise _NoContainer(f"the container of {image!r} started but {exc}") from exc
    return url


@contextlib.contextmanager
def broker_url(
    *, image: str | None = None, container: ContainerMode | None = None, timeout: float = 60.0
) -> Iterator[str]:
    """Yield the AMQP URL of a broker for tests, starting one if needed.

    In order: ``RABBITMQ_URL`` when set (checked, never changed); a private
    :class:`RabbitMQNode` of the version ``DELAYED_RETRY_TEST_RABBITMQ`` names
    (``4.0`` or ``4.3``: see :mod:`harness.chroot`); a container
    of ``image`` (default: ``DELAYED_RETRY_TEST_IMAGE``, else
    :data:`DEFAULT_IMAGE`) when ``container`` (default: from
    ``DELAYED_RETRY_TEST_CONTAINER``) asks for one; else a private
    :class:`RabbitMQNode`. When a container was preferred but cannot be had
    (no engine, an image the engine cannot provide, a container that does not
    start), one warning says why and a private node is used; with
    ``container="require"`` that is a :class:`BrokerHarnessError` instead.
    Whatever it started is stopped on exit. Use it for a session-wide broker
    that tests share with unique names; tests that break the broker want their
    own :class:`RabbitMQNode`.
    """
    given = os.environ.get("RABBITMQ_URL")
    if given:
        log.info("using the broker at RABBITMQ_URL=%s", redact_url(given))
        wait_for_broker(given, timeout=timeout)
        yield given
        return
    version = os.environ.get(VERSION_ENV)
    if version:
        log.info("%s=%s: starting a private RabbitMQ %s node", VERSION_ENV, version, version)
        with RabbitMQNode(version=version) as node:
            yield node.url
        return
    mode = container if container is not None else container_mode(os.environ.get(CONTAINER_ENV))
    image = image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE
    if mode != "off":
        with contextlib.ExitStack() as stack:
            try:
                url = _open_container(image, stack)
            except _NoContainer as exc:
                if mode == "require":
                    raise BrokerHarnessError(
                        f"{CONTAINER_ENV}=require, but {exc}; start a Docker engine with the "
                        f"image, or unset {CONTAINER_ENV} to use a private node"
                    ) from exc
                log.warning("no container broker, using a private node instead: %s", exc)
            else:
                log.info("using a %s container at %s", image, url)
                yield url
                return
    with RabbitMQNode() as node:
        yield node.url
