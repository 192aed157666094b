"""The command line finds the chain a queue is bound to (management API) and refuses another.

Starts a private node with the management plugin (about 10-20 s): bindings cannot be read
over AMQP, so this is the only way to show it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aio_pika
import pytest

from delayed_retry import DelayTopology
from delayed_retry.cli import main
from delayed_retry.delivery.front_door import FrontDoor
from tests.support.nodes import private_node_with_management
from tests.support.queues import declare_queue

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def management_node() -> Iterator[tuple[str, str]]:
    """(AMQP URL, management URL) of a private node with the management plugin."""
    for node, port in private_node_with_management():
        yield node.url, f"http://127.0.0.1:{port}"


def test_a_queue_bound_to_another_chain_is_refused_and_a_missing_prefix_found(
    management_node: tuple[str, str],
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, management = management_node
    monkeypatch.setenv("RABBITMQ_MANAGEMENT_URL", management)
    monkeypatch.delenv("DELAYED_RETRY_PREFIX", raising=False)
    asyncio.run(declare_queue(url, unique))
    ours = ["--prefix", f"{unique}-a", "--levels", "6"]
    assert main(["--url", url, "declare", *ours, "--bind", unique]) == 0
    assert main(["--url", url, "declare", "--prefix", f"{unique}-b", "--levels", "6"]) == 0
    capsys.readouterr()

    # Another chain that exists: refused, naming the chain the queue is bound to.
    code = main(
        ["--url", url, "status", "--queue", unique, "--prefix", f"{unique}-b", "--levels", "6"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert (
        f"queue {unique!r} is bound to the delay chain of --prefix {unique}-a --levels 6" in err[0]
    )

    # No prefix given: the chain the queue is bound to is used.
    assert main(["--url", url, "status", "--queue", unique, "--json"]) == 0
    assert f'"prefix": "{unique}-a"' in capsys.readouterr().out

    # --levels alone is an option given too: never overridden by the chain found, refused
    # with both chains named.
    code = main(["--url", url, "status", "--queue", unique, "--levels", "20"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert (
        f"queue {unique!r} is bound to the delay chain of --prefix {unique}-a --levels 6, not "
        "to --prefix delayed-retry --levels 20" in err[0]
    )


async def _front_door(url: str, topology: DelayTopology, exchange: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection, FrontDoor(connection, exchange=exchange, topology=topology):
        pass


def test_teardown_lists_the_forwarding_it_finds_and_removes_it_when_asked(
    management_node: tuple[str, str],
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, management = management_node
    monkeypatch.setenv("RABBITMQ_MANAGEMENT_URL", management)
    topology = DelayTopology(prefix=unique, levels=4, queue_type="classic")
    topo = ["--prefix", unique, "--levels", "4", "--queue-type", "classic"]
    exchange = f"{unique}-x"
    asyncio.run(_front_door(url, topology, exchange))
    teardown = ["--url", url, "teardown", *topo]

    assert main([*teardown, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"kept: forwarding to exchange {exchange!r} ({unique}.forward.{exchange}, " in out
    assert f"queue    {exchange}.delay" not in out

    assert main([*teardown, "--forwarding", "--yes"]) == 0
    assert f"removed chain {unique!r}: 11 queue(s), 9 exchange(s)" in capsys.readouterr().out
    assert main([*teardown, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kept:" not in out and "nothing to remove" in out
