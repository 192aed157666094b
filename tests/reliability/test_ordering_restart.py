"""Order per key across a broker restart: the keys waiting in the order queues, their
messages in the chain and the consumers' partitions all come back in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import RabbitMQNode
from tests.support.nodes import private_node

from ._ordering import missing, out_of_order, run_order_scenario
from .test_crash import Child

pytestmark = pytest.mark.private_node


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQNode]:
    """A node of this module's own, to restart under two consumer processes."""
    yield from private_node()


@pytest.mark.timeout(600)
async def test_keys_keep_their_order_across_a_broker_restart(
    node: RabbitMQNode, unique: str, tmp_path: Path
) -> None:
    async def restart(children: list[Child]) -> None:
        await asyncio.to_thread(node.restart)
        for child in children:  # their robust connections came back; none died
            assert child.proc is not None and child.proc.poll() is None

    by_key = await run_order_scenario(node.url, unique, tmp_path, mode="ordered", fault=restart)
    assert missing(by_key) == 0
    assert out_of_order(by_key) == {}
