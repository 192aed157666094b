"""The private-node harness: start, URLs, TLS, kill/stop/restart, errors, fixtures."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest
import trustme
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from pamqp.common import FieldTable

from harness import (
    BrokerHarnessError,
    RabbitMQNode,
    TLSFiles,
    broker_url,
    free_port,
    release_port,
    wait_for_broker,
)

pytestmark = pytest.mark.broker

QUORUM: FieldTable = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQNode]:
    """A private node with a TLS listener, for tests that break it; each leaves it running."""
    certs = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    ca.cert_pem.write_to_path(str(certs / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(certs / "cert.pem"))
    server.private_key_pem.write_to_path(str(certs / "key.pem"))
    tls = TLSFiles(
        certfile=certs / "cert.pem", keyfile=certs / "key.pem", cacertfile=certs / "ca.pem"
    )
    with RabbitMQNode(tls=tls) as started:
        yield started


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def process_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


async def publish_persistent(connection: AbstractConnection, queue: str, body: bytes) -> None:
    channel = await connection.channel()  # publisher confirms are on by default
    await channel.declare_queue(queue, durable=True, arguments=QUORUM)
    message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    await channel.default_exchange.publish(message, routing_key=queue)
    await channel.close()


async def get_one(connection: AbstractConnection, queue: str) -> bytes | None:
    channel = await connection.channel()
    declared = await channel.declare_queue(queue, durable=True, arguments=QUORUM)
    message = await declared.get(no_ack=True, fail=False, timeout=10)
    await declared.delete(if_unused=False, if_empty=False)
    await channel.close()
    return None if message is None else message.body


async def test_node_serves_amqp_and_cli(node: RabbitMQNode, unique: str) -> None:
    connection = await aio_pika.connect(node.url)
    async with connection:
        await publish_persistent(connection, unique, b"hello")
        assert unique in node.rabbitmqctl("list_queues", "name", "--no-table-headers")
        assert await get_one(connection, unique) == b"hello"
    assert node.name.endswith("@localhost")
    assert node.beam_pid is not None
    assert node.last_start_seconds is not None


async def test_tls_listener_accepts_clients(node: RabbitMQNode) -> None:
    assert node.tls_url.startswith("amqps://")
    connection = await aio_pika.connect(node.tls_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"tls"), routing_key=queue.name)
        message = await queue.get(no_ack=True, timeout=5)
        assert message.body == b"tls"


async def test_quorum_message_survives_kill_and_restart(node: RabbitMQNode, unique: str) -> None:
    connection = await aio_pika.connect(node.url)
    async with connection:
        await publish_persistent(connection, unique, b"durable")
    beam_pid, amqp_port = node.beam_pid, node.amqp_port
    assert beam_pid is not None

    node.flush_metadata()  # the queue is new: its registry entry may still be in memory only
    node.kill()
    assert not node.running
    assert process_gone(beam_pid)
    assert not accepts(amqp_port)

    node.restart()
    assert node.amqp_port == amqp_port
    assert node.beam_pid != beam_pid
    connection = await aio_pika.connect(node.url)
    async with connection:
        assert await get_one(connection, unique) == b"durable"


async def test_graceful_stop_then_start_keeps_messages(node: RabbitMQNode, unique: str) -> None:
    connection = await aio_pika.connect(node.url)
    async with connection:
        await publish_persistent(connection, unique, b"kept")
    began = time.monotonic()
    node.stop()
    assert not node.running
    assert time.monotonic() - began < 30
    assert not accepts(node.amqp_port)

    node.start()
    connection = await aio_pika.connect(node.url)
    async with connection:
        assert await get_one(connection, unique) == b"kept"


@pytest.mark.private_node
def test_failed_start_reports_log_and_cleans_up() -> None:
    broken = RabbitMQNode(config={"listeners.tcp.default": "not-a-port"})
    with pytest.raises(BrokerHarnessError, match="exited with code") as failure, broken:
        pass
    assert "its log ends" in str(failure.value)
    assert broken.pid is None
    assert not broken.base_dir.exists()


@pytest.mark.private_node
def test_missing_server_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(BrokerHarnessError, match="apt-get install rabbitmq-server"):
        RabbitMQNode(base_dir=tmp_path, bin_dir=tmp_path / "nowhere").start()


def test_broker_url_uses_rabbitmq_url_as_is(
    node: RabbitMQNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RABBITMQ_URL", node.url)
    with broker_url() as url:
        assert url == node.url


def test_wait_for_broker_gives_up_with_the_address() -> None:
    url = f"amqp://guest:secret@127.0.0.1:{free_port()}/"
    with pytest.raises(BrokerHarnessError, match=r"guest:\*\*\*@127\.0\.0\.1"):
        wait_for_broker(url, timeout=1)


def test_free_ports_differ_avoid_rabbitmq_defaults_and_are_claimed() -> None:
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    assert not ports & {4369, 5672, 25672}
    claims = Path(tempfile.gettempdir()) / "delayed-retry-ports"
    assert all((claims / str(port)).read_text() == str(os.getpid()) for port in ports)
    for port in ports:
        release_port(port)
    assert not any((claims / str(port)).exists() for port in ports)


async def test_shared_fixtures(
    rabbitmq_url: str, connection: AbstractRobustConnection, unique: str
) -> None:
    assert rabbitmq_url.startswith("amqp")
    assert unique.startswith("t-test-shared-fixtures-")
    channel = await connection.channel()
    queue = await channel.declare_queue(unique, auto_delete=True)
    await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=unique)
    message = await queue.get(no_ack=True, timeout=5)
    assert message.body == b"x"
    await queue.delete(if_unused=False, if_empty=False)
    assert os.environ.get("RABBITMQ_URL") in (None, rabbitmq_url)
