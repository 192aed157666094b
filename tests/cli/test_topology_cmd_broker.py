"""``topology verify`` and ``topology show`` against real brokers.

The management-API checks run on a private node with the management plugin
(never enabled on a shared broker); the AMQP-only path runs on the session's
broker with the API pointed at a closed port.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import timedelta

import aio_pika
import pytest

from delayed_retry import DelayTopology, publish_delayed
from delayed_retry.cli import main
from harness import RabbitMQNode, free_port
from tests.support.nodes import private_node_with_management
from tests.support.queues import delete_all

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def management_node() -> Iterator[tuple[RabbitMQNode, str]]:
    """A private node with the management plugin, and its API's URL."""
    for node, port in private_node_with_management():
        yield node, f"http://guest:guest@127.0.0.1:{port}/"


async def _declare_queue(url: str, name: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind("amq.topic", routing_key="#")  # unrelated to the chain


async def _stray_binding(url: str, exchange: str, queue: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await (await channel.get_queue(queue)).bind(exchange, routing_key="#")


def test_verify_through_the_management_api(
    management_node: tuple[RabbitMQNode, str], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, api = management_node
    url = node.url
    topo = ["--prefix", unique, "--levels", "6"]
    asyncio.run(_declare_queue(url, unique))
    assert main(["--url", url, "declare", *topo, "--bind", unique]) == 0
    capsys.readouterr()

    verify = ["--url", url, "topology", "verify", *topo, "--queue", unique]
    assert main([*verify, "--management-url", api]) == 0
    captured = capsys.readouterr()
    assert f"✓ the live chain {unique!r} matches the configuration" in captured.out
    assert "note:" not in captured.err

    # Break it the ways operators do: a policy on the chain, a stray binding.
    node.rabbitmqctl(
        "set_policy",
        "--apply-to",
        "queues",
        "short",
        f"^{unique}\\.level\\.05$",
        '{"message-ttl": 5, "max-length": 3}',
    )
    asyncio.run(_stray_binding(url, f"{unique}.level.03", unique))
    assert main([*verify, "--management-url", api, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["complete"] is True and report["checked_through"] == "management API"
    found = {(d["object"], d["problem"].split(",")[0]) for d in report["differences"]}
    assert (
        f"queue '{unique}.level.05'",
        "policy 'short' applies to it with message-ttl=5",
    ) in found
    (stray,) = [
        d
        for d in report["differences"]
        if d["object"] == f"binding '{unique}.level.03' → queue '{unique}' (key '#')"
    ]
    assert stray["fix"].endswith("destination_type=queue properties_key=%23)")
    assert len(found) == 2

    # The settings the chain was not declared with: every level's TTL differs.
    assert (
        main(
            [
                *verify[:4],
                "--prefix",
                unique,
                "--levels",
                "6",
                "--unit-ms",
                "2",
                "--management-url",
                api,
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert f"✗ queue '{unique}.level.00': arguments differ: x-message-ttl=1 (wants 2)" in out


async def _rebind_as_pass_through(url: str, topology: DelayTopology, *, only: bool) -> None:
    """Add the pass-through bindings (as declared before 0.1.0); with ``only``, drop the
    skip-zero bindings too, leaving a pass-through chain."""
    connection = await aio_pika.connect(url)
    async with connection:
        raw = await (await connection.channel()).get_underlay_channel()
        for destination, source, key in topology.retired_bindings():
            await raw.exchange_bind(destination, source, routing_key=key)
        if not only:
            return
        for level in range(topology.levels):
            for source, key in topology.level_queue_bindings(level)[1:]:
                await raw.queue_unbind(topology.level_name(level), source, routing_key=key)
        for destination, source, key in topology.exchange_bindings()[1:]:
            await raw.exchange_unbind(destination, source, routing_key=key)


def test_leaders_are_read_through_the_management_api_and_a_single_node_is_not_lopsided(
    management_node: tuple[RabbitMQNode, str], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, api = management_node
    url = node.url
    topo = ["--prefix", unique, "--levels", "6"]
    assert main(["--url", url, "declare", *topo]) == 0
    capsys.readouterr()
    try:
        assert main(["--url", url, "topology", "verify", *topo, "--management-url", api]) == 0
        assert "leads" not in capsys.readouterr().out
        status = ["--url", url, "status", *topo, "--management-url", api]
        assert main([*status, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["leaders_per_node"] == {node.name: 6}
        assert {(row["leader"], tuple(row["members"])) for row in report["chain"]} == {
            (node.name, (node.name,))
        }
        assert main([*status, "--all-levels"]) == 0
        out = capsys.readouterr().out
        assert f"level leaders per node: {node.name} 6" in out
        assert "leader (members)" in out  # the column, shown once the API answered
    finally:
        asyncio.run(_delete_chain(url, DelayTopology(prefix=unique, levels=6), []))


def test_rebalance_prints_the_policies_for_the_brokers_version_and_the_rebalance(
    management_node: tuple[RabbitMQNode, str], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, _ = management_node
    rebalance = ["--url", node.url, "topology", "rebalance", "--prefix", unique, "--json"]
    assert main(rebalance) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = "balanced" if node.version not in (None, "3.10") else "least-leaders"
    assert expected in printed["policies"][0]
    assert printed["rebalance"].startswith("rabbitmq-queues rebalance quorum")
    assert main([*rebalance[:-1], "--rabbitmq-major", "4"]) == 0
    out = capsys.readouterr().out
    assert '"queue-leader-locator":"balanced"' in out and "min-masters" not in out


def test_verify_tells_pass_through_bindings_apart_and_declare_moves_them_on(
    management_node: tuple[RabbitMQNode, str], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, api = management_node
    url = node.url
    topology = DelayTopology(prefix=unique, levels=6)
    topo = ["--prefix", unique, "--levels", "6"]
    verify = ["--url", url, "topology", "verify", *topo, "--management-url", api]
    assert main(["--url", url, "declare", *topo]) == 0
    assert main(verify) == 0
    assert "skip-zeros bindings)" in capsys.readouterr().out

    # A process that declares pass-through bindings runs beside: both kinds of bindings.
    asyncio.run(_rebind_as_pass_through(url, topology, only=False))
    assert main([*verify, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["bindings"] == "mixed"
    (mixed,) = report["differences"]
    assert mixed["problem"].startswith("5 pass-through binding(s) (as declared before 0.1.0)")
    assert "once no process declares pass-through bindings" in mixed["fix"]

    # A pass-through chain alone: one line, not one per skip-zero binding it lacks.
    asyncio.run(_rebind_as_pass_through(url, topology, only=True))
    assert main([*verify, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["bindings"] == "pass-through"
    (pass_through,) = report["differences"]
    assert pass_through["object"] == f"bindings of chain {unique!r}"
    assert pass_through["fix"].startswith(f"run delayed-retry declare --prefix {unique}")

    # Declaring the chain moves it to the skip-zero bindings.
    assert main(["--url", url, "declare", *topo]) == 0
    assert main(verify) == 0
    assert "skip-zeros bindings)" in capsys.readouterr().out


def test_verify_over_amqp_only_says_what_it_did_not_check(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = ["--prefix", unique, "--levels", "3", "--queue-type", "classic"]
    closed = f"http://127.0.0.1:{free_port()}/"
    try:
        code = main(
            ["--url", rabbitmq_url, "topology", "verify", *topo, "--management-url", closed]
        )
        captured = capsys.readouterr()
        assert code == 1
        assert captured.out.startswith(f"✗ chain {unique!r}: does not exist on this vhost")
        assert "bindings, alternate exchanges in use and policies were NOT checked" in captured.err

        assert main(["--url", rabbitmq_url, "declare", *topo]) == 0
        capsys.readouterr()
        verify = ["--url", rabbitmq_url, "topology", "verify", "--no-management"]
        assert main([*verify, *topo]) == 0
        assert "as far as AMQP can tell" in capsys.readouterr().out
        assert main([*verify, "--prefix", unique, "--levels", "3"]) == 1  # quorum wanted
        out = capsys.readouterr().out
        assert f"✗ queue '{unique}.level.00': declared differently" in out
        assert "x-queue-type" in out
    finally:
        asyncio.run(_delete_chain(rabbitmq_url, DelayTopology(prefix=unique, levels=3), []))


def test_show_counts_levels_and_says_when_they_are_due(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = DelayTopology(prefix=unique, levels=24, queue_type="classic")
    topo = ["--prefix", unique, "--levels", "24", "--queue-type", "classic"]
    try:
        asyncio.run(_schedule(rabbitmq_url, topology, unique, [timedelta(hours=1)] * 2))
        assert main(["--url", rabbitmq_url, "topology", "show", *topo]) == 0
        out = capsys.readouterr().out
        # One hour is 3,600,000 ms: its highest bit is level 21 (2^21 ms, 34 m 57 s).
        row = r"^\s*21\s+34 m 57 s\s+34 m 57 s – 1 h 10 m\s+2\s+within 1 h 10 m$"
        assert re.search(row, out, re.MULTILINE), out
        assert "(23 empty level(s) hidden; --all lists them)" in out
        assert "2 message(s) waiting, all due within 1 h 10 m" in out

        assert main(["--url", rabbitmq_url, "topology", "show", *topo, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["levels"][21]["messages"] == 2
        assert shown["levels"][20]["messages"] == 0
        assert shown["queues"]["rejected"] == 0

        assert main(["--url", rabbitmq_url, "topology", "show", "--prefix", unique + "x"]) == 1
        assert "queue(s) of the chain are missing" in capsys.readouterr().err
    finally:
        asyncio.run(_delete_chain(rabbitmq_url, topology, [unique]))


async def _schedule(url: str, topology: DelayTopology, queue: str, delays: list[timedelta]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)
        for delay in delays:
            await publish_delayed(
                channel, aio_pika.Message(b"later"), queue=queue, delay=delay, topology=topology
            )


async def _delete_chain(url: str, topology: DelayTopology, queues: list[str]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        await delete_all(connection, topology=topology, queues=queues)


def test_teardown_names_other_work_queues_parking_queues_it_leaves_behind(
    management_node: tuple[RabbitMQNode, str], unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node, api = management_node
    topo = ["--prefix", unique, "--levels", "3", "--queue-type", "classic"]
    url = ["--url", node.url]
    for work_queue in (f"{unique}-orders", f"{unique}-other"):
        assert main([*url, "declare", *topo, "--bind", work_queue, "--create"]) == 0
    capsys.readouterr()
    teardown = [*url, "teardown", *topo, "--queue", f"{unique}-orders", "--yes"]
    try:
        # Without the management API it cannot see them, and says so.
        closed = f"http://127.0.0.1:{free_port()}/"
        assert main([*teardown, "--dry-run", "--management-url", closed]) == 0
        assert "cannot be listed without the management API" in capsys.readouterr().out

        assert main([*teardown, "--management-url", api]) == 0
        out = capsys.readouterr().out
        assert (
            f"left behind: parking queue '{unique}-other.parking' of work queue "
            f"'{unique}-other'" in out
        )
        assert f"--queue {unique}-other" in out
        assert f"left behind: parking queue '{unique}-orders.parking'" not in out
        assert f"removed chain {unique!r}" in out
    finally:
        asyncio.run(
            _delete_chain(
                node.url,
                DelayTopology(prefix=unique, levels=3, queue_type="classic"),
                [f"{unique}-orders", f"{unique}-other"],
            )
        )
