"""Reaching a broker: is anything answering AMQP at a URL yet."""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import aio_pika

from delayed_retry.errors import DelayedRetryError
from delayed_retry.rabbitmq.urls import redact_url


class BrokerHarnessError(DelayedRetryError, RuntimeError):
    """A test broker could not be found, started or reached; the message says what to do."""


def _port_open(url: str, timeout: float) -> bool:
    parts = urlsplit(url)
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    try:
        with socket.create_connection((parts.hostname or "localhost", port), timeout=timeout):
            return True
    except OSError:
        return False


def check_connect(url: str, timeout: float) -> None:
    """Log in at ``url`` and close again; raise if that fails."""

    async def attempt() -> None:
        connection = await aio_pika.connect(url, timeout=timeout)
        await connection.close()

    # Probing the port first keeps the client from logging an error per refused attempt.
    if not _port_open(url, timeout):
        raise ConnectionRefusedError(f"nothing listens at {redact_url(url)}")
    # A private event loop in a worker thread: callers may already run one.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="broker-probe") as pool:
        pool.submit(asyncio.run, attempt()).result()


def wait_for_broker(url: str, timeout: float = 60.0) -> None:
    """Block until an AMQP client can log in at ``url``, or raise after ``timeout`` seconds.

    Use it after starting a broker you do not manage through this module (a
    CI service container, a restarted cluster node reached through a proxy).
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        remaining = deadline - time.monotonic()
        try:
            check_connect(url, timeout=max(0.5, min(5.0, remaining)))
            return
        except Exception as exc:  # any failure means "not yet"
            last_error = exc
        if time.monotonic() >= deadline:
            raise BrokerHarnessError(
                f"no AMQP broker answered at {redact_url(url)} within {timeout:.0f} s "
                f"(last error: {last_error!r}); start one there or point RABBITMQ_URL elsewhere"
            ) from last_error
        time.sleep(0.2)
