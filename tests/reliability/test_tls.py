"""``amqps://``: retries and scheduling over TLS, with a certificate made for the test."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq
import pytest
import tenacity
import trustme
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import (
    DelayTopology,
    consume,
    current_retry_state,
    publish_delayed,
    with_delayed_retry,
)
from harness import RabbitMQNode, TLSFiles
from tests.support.nodes import private_node
from tests.support.waiting import wait_until

from ._support import QUORUM, Ledger

pytestmark = pytest.mark.broker


def write_ca(folder: Path, name: str) -> trustme.CA:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(folder / f"{name}-ca.pem"))
    return ca


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQNode]:
    certs = tmp_path_factory.mktemp("tls")
    ca = write_ca(certs, "good")
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(certs / "cert.pem"))
    server.private_key_pem.write_to_path(str(certs / "key.pem"))
    write_ca(certs, "other")
    yield from private_node(
        tls=TLSFiles(
            certfile=certs / "cert.pem", keyfile=certs / "key.pem", cacertfile=certs / "good-ca.pem"
        )
    )


async def test_retry_and_schedule_over_amqps(tls_node: RabbitMQNode, unique: str) -> None:
    url = tls_node.tls_url
    assert url.startswith("amqps://")
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12)
    ledger = Ledger(sent={1, 2})
    attempts: Counter[int] = Counter()

    @with_delayed_retry(max_retries=2, wait=tenacity.wait_fixed(0.1), topology=topology)
    async def handle(message: AbstractIncomingMessage) -> None:
        i = json.loads(message.body)["id"]
        attempts[i] += 1
        state = current_retry_state()
        assert state is not None
        if state.attempt == 1 and i == 1:
            raise RuntimeError("fails once, retried through the chain over TLS")
        ledger.handled[i] += 1

    connection = await aio_pika.connect_robust(url)
    try:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, durable=True, arguments=QUORUM)
        await consume(q, handle)
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"id": 1}', message_id="1"), routing_key=queue
        )
        await publish_delayed(
            channel,
            aio_pika.Message(b'{"id": 2}', message_id="2"),
            queue=queue,
            delay=0.2,
            topology=topology,
        )
        await wait_until(
            lambda: set(ledger.handled) >= ledger.sent, timeout=30, what="both messages handled"
        )
        assert attempts == {1: 2, 2: 1}
        assert ledger.report("tls")["lost"] == 0
        # The broker saw a TLS connection.
        out = tls_node.rabbitmqctl("list_connections", "ssl", "ssl_protocol")
        assert "true" in out
    finally:
        await connection.close()


async def test_a_server_certificate_from_another_ca_is_refused(tls_node: RabbitMQNode) -> None:
    other_ca = Path(tls_node.tls_url.split("cafile=")[1]).with_name("other-ca.pem")
    url = tls_node.tls_url.split("?")[0] + f"?cafile={other_ca}"
    with pytest.raises(aiormq.exceptions.AMQPConnectionError) as failure:
        await aio_pika.connect(url, timeout=10)
    assert "CERTIFICATE_VERIFY_FAILED" in str(failure.value)
    assert isinstance(failure.value.__cause__, ssl.SSLCertVerificationError)


async def test_batched_bulk_connection_publishes_over_amqps(
    tls_node: RabbitMQNode, unique: str
) -> None:
    from pamqp import commands as spec

    from delayed_retry.amqp.batching import connect_batched
    from delayed_retry.amqp.publish import publish_confirmed

    batched = await connect_batched(tls_node.tls_url, timeout=30)
    try:
        channel = await batched.channel(publisher_confirms=True)
        await channel.queue_declare(unique, durable=True)
        await asyncio.gather(
            *(
                publish_confirmed(
                    channel,
                    exchange="",
                    routing_key=unique,
                    body=b"%d" % i,
                    properties=spec.Basic.Properties(delivery_mode=2),
                    wait_for_write=False,
                )
                for i in range(200)
            )
        )
        declared = await channel.queue_declare(unique, passive=True)
        assert declared.message_count == 200
        assert "true" in tls_node.rabbitmqctl("list_connections", "ssl")
    finally:
        await batched.close()
