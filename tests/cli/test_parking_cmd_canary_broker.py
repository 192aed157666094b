"""``delayed-retry parking replay --canary`` against a real broker and a still-failing consumer."""

from __future__ import annotations

import asyncio
import re
import threading

import aio_pika
import pytest

from delayed_retry import DelayTopology
from delayed_retry.cli import main
from tests.support.chain import Scenario
from tests.support.retrying import fail_with_retries, park_after_retries

pytestmark = pytest.mark.broker


class _FailingConsumer:
    """The consumer of :mod:`tests.support.retrying` on an event loop of its own thread.

    The command runs its own ``asyncio.run`` in the test's thread; the
    consumer keeps failing beside it until :meth:`stop`.
    """

    def __init__(self, url: str, scenario_name: str, queue: str, parked: int) -> None:
        self.url = url
        self.topology = DelayTopology(prefix=scenario_name, levels=16, queue_type="classic")
        self.unique = scenario_name
        self.queue = queue
        self.parked = parked
        self.ready = threading.Event()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="failing-consumer")

    def _run(self) -> None:
        try:
            asyncio.run(self._consume())
        except BaseException as exc:  # reported by the test through start()/stop()
            self.error = exc
            self.ready.set()

    async def _consume(self) -> None:
        connection = await aio_pika.connect_robust(self.url)
        scenario = Scenario(connection, self.unique, self.topology)
        scenario.track_queue(self.queue, self.queue + ".parking")
        await scenario.open()
        try:
            stop = await fail_with_retries(scenario, self.queue)
            await park_after_retries(scenario, self.queue, self.parked)
            self.ready.set()
            await asyncio.get_running_loop().run_in_executor(None, self._stop.wait)
            await stop()
        finally:
            await scenario.close(self.url)
            await connection.close()

    def start(self) -> None:
        self._thread.start()
        assert self.ready.wait(60), "the failing consumer did not park its messages in 60 s"
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_replay_reports_a_canary_that_parks_again_after_the_rest_and_warns_of_a_short_wait(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = f"{unique}.orders"
    consumer = _FailingConsumer(rabbitmq_url, unique, queue, parked=3)
    consumer.start()
    try:
        code = main(
            [
                "--url",
                rabbitmq_url,
                "parking",
                "replay",
                "--queue",
                queue,
                *("--prefix", unique, "--levels", "16", "--queue-type", "classic"),
                *("--canary", "1", "--canary-wait", "500ms"),
                "--yes",
            ]
        )
    finally:
        consumer.stop()
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "replayed 3 message(s)" in out
    assert "warning: canary wait 500 ms is shorter than the" in err
    assert "not confirmed yet: the canary can still park again" in err
    assert re.search(r"a canary parked again \(order-\d\) after the other 2 were replayed", err)
