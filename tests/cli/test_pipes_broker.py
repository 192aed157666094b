"""A command whose reader goes away (``| head -1``) ends quietly, as Unix tools do."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aio_pika
import pytest

from delayed_retry.cli.main import EXIT_BROKEN_PIPE
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.headers import X_EXCEPTION_TYPE, X_PARKED_AT, X_PARKED_REASON
from tests.support.chain import Scenario

pytestmark = pytest.mark.broker

CLI = (sys.executable, "-c", "import sys; from delayed_retry.cli import main; sys.exit(main())")


def _read_one_line_and_leave(command: list[str]) -> tuple[bytes, str, int]:
    """Run ``command``, read its first line, close the pipe as ``head -1`` does; wait for it."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read().decode()
    return first, stderr, process.wait(timeout=120)


async def test_a_reader_that_stops_early_gets_no_error(quorum: Scenario, rabbitmq_url: str) -> None:
    s = quorum
    queue = s.name("q")
    s.track_queue(queue, f"{queue}.parking")
    await s.ch.declare_queue(queue, durable=True)
    await s.ch.declare_queue(f"{queue}.parking", durable=True)
    for n in range(1500):  # far more lines than a pipe holds: still writing when the reader goes
        headers: dict[str, aio_pika.abc.FieldValue] = {
            X_PARKED_REASON: "max-retries",
            X_PARKED_AT: to_epoch_ms(utcnow()),
            X_EXCEPTION_TYPE: f"billing.gateway.errors.PaymentGatewayTimedOutError{n:05d}",
        }
        await s.ch.default_exchange.publish(
            aio_pika.Message(b"x", message_id=f"m-{n}", headers=headers),
            routing_key=f"{queue}.parking",
        )
    command = [*CLI, "--url", rabbitmq_url, "parking", "list", "--queue", queue, "--limit", "1500"]
    command += ["--prefix", s.topology.prefix, "--levels", str(s.topology.levels)]
    first, stderr, code = await asyncio.to_thread(_read_one_line_and_leave, command)
    assert first, "the command printed nothing"
    assert stderr == "", f"a closed pipe printed: {stderr}"
    assert code == EXIT_BROKEN_PIPE
