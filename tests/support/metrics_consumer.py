"""A consumer process that exports its metrics for Prometheus, as an application would.

    python metrics_consumer.py URL METRICS_PORT PARKS_QUEUE HEALS_QUEUE

Runs a :class:`~delayed_retry.ChainMonitor` (depths every second), consumes two queues it
declares, then serves ``/metrics`` on 127.0.0.1:METRICS_PORT (OpenTelemetry's Prometheus
reader), so an answer there means it consumes. On PARKS_QUEUE the handler always fails
(one retry, then parked; a throttle trips after two failures in a row); on HEALS_QUEUE it
fails once and succeeds on the retry. Runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage
from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

from delayed_retry import (
    ChainMonitor,
    DelayTopology,
    Throttle,
    consume,
    current_retry_state,
    with_delayed_retry,
    work_queue_arguments,
)


class GatewayDown(Exception):
    """The dependency the handlers call is away."""


@with_delayed_retry(
    max_retries=1, wait=tenacity.wait_fixed(0.05), throttle=Throttle(consecutive=2, probe_every=0.2)
)
async def always_fails(message: AbstractIncomingMessage) -> None:
    raise GatewayDown("the gateway did not answer")


@with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(0.05))
async def heals_on_retry(message: AbstractIncomingMessage) -> None:
    state = current_retry_state()
    if state is None or state.attempt < 2:
        raise GatewayDown("the gateway did not answer")


async def main() -> None:
    url, port, parks, heals = sys.argv[1:5]
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
    topology = DelayTopology()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    monitor = ChainMonitor(
        url=url,
        topology=topology,
        parking_queues=[topology.default_parking_queue(q) for q in (parks, heals)],
        interval=1,
    )
    connection = await aio_pika.connect(url)
    async with connection, monitor:
        channel = await connection.channel()
        for name, handler in ((parks, always_fails), (heals, heals_on_retry)):
            queue = await channel.declare_queue(
                name, durable=True, arguments=work_queue_arguments(name)
            )
            await consume(queue, handler)
        start_http_server(int(port), addr="127.0.0.1")  # answering means consuming
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
