"""deploy/prometheus and deploy/grafana against a real Prometheus, scraping real processes.

A consumer process (tests/support/metrics_consumer.py) and the ``alerts`` service run on a
private node with RabbitMQ's own Prometheus plugin; a Prometheus loaded with the rules file
scrapes the three every second. A failing handler parks messages: the parking alert goes
from inactive to firing, and every query of the dashboard returns data.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from harness import BrokerHarnessError, RabbitMQNode, free_port
from tests.support import metrics_consumer
from tests.support.prometheus import (
    RULES,
    Prometheus,
    dashboard,
    dashboard_queries,
    runnable,
)
from tests.support.services import SRC, get, start_command, stop, wait_status
from tests.support.waiting import wait_until

PARKING_ALERT = "DelayedRetryMessagesParked"


@pytest.fixture(scope="module")
def metrics_node() -> Iterator[tuple[RabbitMQNode, int]]:
    """A private node, and the port of its Prometheus endpoint (per-queue series)."""
    port = free_port()
    started = RabbitMQNode(
        plugins=["rabbitmq_prometheus"],
        config={
            "prometheus.tcp.port": str(port),
            "prometheus.tcp.ip": "127.0.0.1",
            "prometheus.return_per_object_metrics": "true",
        },
    )
    with contextlib.closing(started):
        try:
            started.start()
        except BrokerHarnessError as exc:
            pytest.fail(f"could not start a private RabbitMQ node: {exc}", pytrace=False)
        yield started, port


def _start_consumer(url: str, port: int, parks: str, heals: str) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, metrics_consumer.__file__, url, str(port), parks, heals],
        env={**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{root}", "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def _publish(url: str, queue: str, count: int) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for n in range(count):
            await channel.default_exchange.publish(
                aio_pika.Message(f"order {n}".encode(), message_id=f"{queue}-{n}"),
                routing_key=queue,
            )


def _consuming(port: int, proc: subprocess.Popen[str]) -> bool:
    if proc.poll() is not None:
        output = proc.stdout.read() if proc.stdout else ""
        raise AssertionError(f"the consumer exited with {proc.returncode}:\n{output}")
    return get(port, "/metrics")[0] == 200


def _alert_states(prometheus: Prometheus, name: str) -> list[str]:
    return [a["state"] for a in prometheus.alerts() if a["labels"]["alertname"] == name]


def _rules_evaluated(prometheus: Prometheus) -> bool:
    groups = prometheus.api("/api/v1/rules")["groups"]
    return bool(groups) and all(g["lastEvaluation"][:4] not in ("0001", "") for g in groups)


async def test_the_parking_alert_fires_and_every_dashboard_query_has_data(
    metrics_node: tuple[RabbitMQNode, int],
) -> None:
    node, broker_metrics_port = metrics_node
    url = node.url
    parks, heals = f"prom-parks-{secrets.token_hex(3)}", f"prom-heals-{secrets.token_hex(3)}"
    consumer_port, health_port, service_port = free_port(), free_port(), free_port()
    consumer = _start_consumer(url, consumer_port, parks, heals)
    service: subprocess.Popen[str] | None = None
    prometheus: Prometheus | None = None
    try:
        await wait_until(
            lambda: _consuming(consumer_port, consumer), timeout=30, what="the consumer consuming"
        )
        ports = ["--health-port", str(health_port), "--metrics-port", str(service_port)]
        service = start_command(["alerts", "--log", *ports], env={"RABBITMQ_URL": url})
        wait_status(health_port, "/readyz", 200, proc=service, timeout=30)
        prometheus = Prometheus(
            scrape={
                "delayed-retry-consumers": f"127.0.0.1:{consumer_port}",
                "delayed-retry-services": f"127.0.0.1:{service_port}",
                "rabbitmq": f"127.0.0.1:{broker_metrics_port}",
            },
            rule_files=[RULES],
        )
        prometheus.wait_ready()
        await wait_until(lambda: _rules_evaluated(prometheus), timeout=15, what="a rule evaluation")
        assert _alert_states(prometheus, PARKING_ALERT) == []  # inactive before any park

        await _publish(url, parks, 4)
        await _publish(url, heals, 2)
        await wait_until(
            lambda: "firing" in _alert_states(prometheus, PARKING_ALERT),
            timeout=30,
            what=f"{PARKING_ALERT} firing",
        )
        fired = [a for a in prometheus.alerts() if a["labels"]["alertname"] == PARKING_ALERT]
        assert {a["labels"]["messaging_destination_name"] for a in fired} == {parks}

        queries = list(dashboard_queries(dashboard()))
        empty: list[str] = []

        def all_have_data() -> bool:
            empty[:] = [f"{t}: {e}" for t, e in queries if not prometheus.query(runnable(e))]
            return not empty

        try:
            await wait_until(all_have_data, timeout=30, interval=1.0, what="dashboard data")
        except AssertionError:
            attempts = [
                line
                for line in get(consumer_port, "/metrics")[1].splitlines()
                if line.startswith("delayed_retry_attempts_total")
            ]
            raise AssertionError(
                "dashboard queries without data:\n"
                + "\n".join(empty)
                + "\nthe consumer's attempts:\n"
                + "\n".join(attempts)
            ) from None
    finally:
        if prometheus is not None:
            prometheus.close()
        if service is not None:
            stop(service)
        stop(consumer)
