"""``declare --bind`` and ``status`` set up and check a work queue's defence against messages the
client cannot decode (a delivery limit with a dead-letter queue).

Queue arguments and policies cannot be read over AMQP: these tests start a private node with
the management plugin (about 10-20 s). Without the API the check says it was not made.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Iterator

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, consume, with_delayed_retry
from delayed_retry.admin.management import ManagementClient
from delayed_retry.cli import main
from delayed_retry.rabbitmq.work_queues import work_queue_policy_command
from harness import RabbitMQNode, free_port
from tests.support.queues import declare_queue, delete_all, wait_for_depth
from tests.support.undecodable import microseconds_now
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

CHAIN = ["--levels", "6"]


@pytest.fixture(scope="module")
def management_node() -> Iterator[tuple[RabbitMQNode, str]]:
    """A private node with the management plugin, and the API's URL."""
    port = free_port()
    node = RabbitMQNode(
        plugins=("rabbitmq_management",),
        config={"management.tcp.port": str(port), "management.tcp.ip": "127.0.0.1"},
    )
    with node:
        yield node, f"http://127.0.0.1:{port}"


@pytest.fixture
def api(
    management_node: tuple[RabbitMQNode, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[RabbitMQNode, ManagementClient]:
    node, url = management_node
    monkeypatch.setenv("RABBITMQ_MANAGEMENT_URL", url)
    monkeypatch.delenv("DELAYED_RETRY_PREFIX", raising=False)
    return node, ManagementClient.for_broker(node.url, management_url=url)


def test_create_makes_a_defended_queue_and_its_dead_letter_queue(
    api: tuple[RabbitMQNode, ManagementClient], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, client = api
    prefix = ["--prefix", unique, *CHAIN]
    assert main(["--url", node.url, "declare", *prefix, "--bind", unique, "--create"]) == 0
    out, err = capsys.readouterr()
    assert f"created queue {unique!r} (quorum, delivery limit 5)" in out
    assert f"declared '{unique}.dead-letter'" in out
    assert err == ""
    info = asyncio.run(client.queue(unique))
    assert info["arguments"]["x-delivery-limit"] == 5
    assert info["arguments"]["x-dead-letter-routing-key"] == f"{unique}.dead-letter"
    assert asyncio.run(client.queue(f"{unique}.dead-letter"))["type"] == "quorum"

    assert main(["--url", node.url, "status", *prefix, "--queue", unique, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["queues"][0]
    assert row["dead_lettered"] == 0 and row["warning"] is None


def test_create_takes_another_limit_and_refuses_a_limit_below_one(
    api: tuple[RabbitMQNode, ManagementClient], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, client = api
    prefix = ["--prefix", unique, *CHAIN]
    command = ["--url", node.url, "declare", *prefix, "--bind", unique, "--create"]
    assert main([*command, "--delivery-limit", "0"]) == 2
    assert "argument --delivery-limit: '0' is not a whole number of at least 1" in (
        capsys.readouterr().err
    )
    assert main([*command, "--delivery-limit", "12"]) == 0
    assert asyncio.run(client.queue(unique))["arguments"]["x-delivery-limit"] == 12


def test_a_classic_work_queue_is_warned_about_by_declare_and_status(
    api: tuple[RabbitMQNode, ManagementClient], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, _ = api
    asyncio.run(declare_queue(node.url, unique))
    prefix = ["--prefix", unique, *CHAIN]
    assert main(["--url", node.url, "declare", *prefix, "--bind", unique]) == 0
    err = capsys.readouterr().err
    assert f"warning: queue {unique!r} is a classic queue, which has no delivery limit" in err
    assert "work_queue_arguments" in err

    assert main(["--url", node.url, "status", *prefix, "--queue", unique]) == 0
    out, err = capsys.readouterr()
    assert "dead-lettered" in out
    assert f"queue {unique!r} is a classic queue" in err


def test_the_policy_the_warning_names_defends_an_existing_quorum_queue(
    api: tuple[RabbitMQNode, ManagementClient], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, client = api
    asyncio.run(declare_queue(node.url, unique, arguments={"x-queue-type": "quorum"}))
    prefix = ["--prefix", unique, *CHAIN]
    assert main(["--url", node.url, "declare", *prefix, "--bind", unique]) == 0
    capsys.readouterr()
    assert main(["--url", node.url, "status", *prefix, "--queue", unique]) == 0
    err = capsys.readouterr().err
    assert f"quorum queue {unique!r} has no delivery limit" in err
    fix = work_queue_policy_command(unique)
    assert fix in err

    node.rabbitmqctl(*shlex.split(fix)[1:])
    try:
        # The management API shows a queue's effective policy with its next statistics.
        asyncio.run(wait_until(lambda: _policy_shown(client, unique), timeout=60))
        # The policy names the dead-letter queue: declare --bind makes it, and warns no more.
        assert main(["--url", node.url, "declare", *prefix, "--bind", unique]) == 0
        out, err = capsys.readouterr()
        assert f"declared '{unique}.dead-letter'" in out
        assert "warning" not in err
        assert asyncio.run(client.queue(f"{unique}.dead-letter"))["type"] == "quorum"
        # And it does what the arguments do: an undecodable message is moved aside.
        handled = asyncio.run(_poison_then_ordinary(node.url, unique, prefix=unique))
        assert handled == [b"after"]
    finally:
        node.rabbitmqctl("clear_policy", f"{unique}.work-queue")


def test_a_limit_without_a_dead_letter_exchange_is_warned_about(
    api: tuple[RabbitMQNode, ManagementClient], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, _ = api
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": 7}
    asyncio.run(declare_queue(node.url, unique, arguments=arguments))
    prefix = ["--prefix", unique, *CHAIN]
    assert main(["--url", node.url, "declare", *prefix, "--bind", unique]) == 0
    err = capsys.readouterr().err
    assert f"quorum queue {unique!r} has no dead-letter exchange" in err
    assert "its delivery limit of 7 drops it without a trace" in err


def test_without_the_management_api_the_check_says_it_was_not_made(
    rabbitmq_url: str,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An address where nothing answers: the check is skipped with a note, never failed.
    monkeypatch.setenv("RABBITMQ_MANAGEMENT_URL", f"http://127.0.0.1:{free_port()}")
    prefix = ["--prefix", unique, *CHAIN]
    try:
        assert main(["--url", rabbitmq_url, "declare", *prefix, "--bind", unique, "--create"]) == 0
        capsys.readouterr()
        asyncio.run(delete_all(rabbitmq_url, queues=[f"{unique}.dead-letter"]))
        assert main(["--url", rabbitmq_url, "declare", *prefix, "--bind", unique]) == 0
        out, err = capsys.readouterr()
        # Its arguments are work_queue_arguments' (an AMQP declaration with them is accepted):
        # the dead-letter queue is declared again all the same.
        assert f"declared '{unique}.dead-letter'" in out
        assert f"note: not checked whether queue {unique!r} moves aside a message" in err
        assert "warning" not in err
        # status stays quiet about it: it is read often, and says what it can read.
        assert main(["--url", rabbitmq_url, "status", *prefix, "--queue", unique]) == 0
        assert "not checked" not in capsys.readouterr().err
    finally:
        assert main(["--url", rabbitmq_url, "teardown", *prefix, "--queue", unique, "--yes"]) == 0
        asyncio.run(delete_all(rabbitmq_url, queues=[unique, f"{unique}.dead-letter"]))


async def _poison_then_ordinary(url: str, queue: str, *, prefix: str) -> list[bytes]:
    """Consume ``queue`` with a decorated handler, publish a message whose timestamp is in
    microseconds and then an ordinary one; the bodies handled once the ordinary one was."""
    handled: list[bytes] = []

    @with_delayed_retry(topology=DelayTopology(prefix=prefix, levels=6))
    async def handle(message: AbstractIncomingMessage) -> None:
        handled.append(message.body)

    robust = await aio_pika.connect_robust(url, reconnect_interval=0.5)
    other = await aio_pika.connect(url)  # the consumer's connection drops at each poison
    async with robust, other:
        channel = await robust.channel()
        # One at a time: a message in the poison's prefetch window would be moved along.
        await channel.set_qos(prefetch_count=1)
        await consume(await channel.declare_queue(queue, passive=True), handle)
        publisher = await other.channel()
        await publisher.default_exchange.publish(
            aio_pika.Message(b"poison", timestamp=microseconds_now()), routing_key=queue
        )
        await publisher.default_exchange.publish(aio_pika.Message(b"after"), routing_key=queue)
        await wait_until(lambda: b"after" in handled, timeout=60, what="the ordinary message")
        # The poison, dead-lettered by the policy.
        await wait_for_depth(other, f"{queue}.dead-letter", 1, timeout=30)
    return handled


async def _policy_shown(client: ManagementClient, queue: str) -> bool:
    info = await client.queue(queue)
    return bool(info.get("effective_policy_definition"))
