"""One broker URL for a test session: a given URL, a container, or a private node.

Use :func:`broker_url` in test fixtures: it picks whatever broker this machine
can offer. Use :class:`~delayed_retry.testing.RabbitMQNode` directly when a test
must kill, stop or restart the broker, or needs TLS; such tests must never
touch a shared broker.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
from collections.abc import Iterator

from delayed_retry.urls import redact_url

from .node import RabbitMQNode
from .probe import wait_for_broker

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "rabbitmq:3.10"
"""Container image for :func:`broker_url`; the same series as Debian bookworm's broker."""


def _docker_reachable(timeout: float = 2.0) -> bool:
    """Whether testcontainers is installed and a Docker engine answers a ping."""
    if importlib.util.find_spec("testcontainers") is None:
        return False
    try:
        # Both are optional (the `testcontainers` extra); imported here, untyped.
        docker = importlib.import_module("docker")
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@contextlib.contextmanager
def _container_url(image: str) -> Iterator[str]:
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(image).with_exposed_ports(5672)
    container.start()
    try:
        host = container.get_container_host_ip()
        url = f"amqp://guest:guest@{host}:{container.get_exposed_port(5672)}/"
        wait_for_broker(url, timeout=120)
        yield url
    finally:
        container.stop()


@contextlib.contextmanager
def broker_url(*, image: str = DEFAULT_IMAGE, timeout: float = 60.0) -> Iterator[str]:
    """Yield the AMQP URL of a broker for tests, starting one if needed.

    In order: ``RABBITMQ_URL`` when set (checked, never changed); a
    ``testcontainers`` container of ``image`` when a Docker engine answers;
    else a private :class:`RabbitMQNode`. Whatever it started is stopped on
    exit. Use it for a session-wide broker that tests share with unique
    names; tests that break the broker want their own :class:`RabbitMQNode`.
    """
    given = os.environ.get("RABBITMQ_URL")
    if given:
        log.info("using the broker at RABBITMQ_URL=%s", redact_url(given))
        wait_for_broker(given, timeout=timeout)
        yield given
        return
    if _docker_reachable():
        log.info("Docker engine found; starting a %s container", image)
        with _container_url(image) as url:
            yield url
        return
    with RabbitMQNode() as node:
        yield node.url
