"""A RabbitMQ cluster of private nodes on this machine, for failover tests."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .chroot import VERSION_ENV, ensure_chroot
from .node import NODE_HOST, RabbitMQNode, secrets_hex, write_cookie
from .probe import BrokerHarnessError

log = logging.getLogger(__name__)


class RabbitMQCluster:
    """``size`` private :class:`RabbitMQNode` s joined into one cluster.

    Use it for what a single node cannot show: quorum queue replication,
    leader failover, a client reconnecting to another node. It is slow to
    start (tens of seconds), so share one per test module or session and give
    each test its own queue names. Nodes are numbered from 0; node 0 is the
    one the others joined. Everything is killed and deleted on :meth:`close`.
    ``rabbit_env`` goes to every node (see :class:`RabbitMQNode`); ``version``
    (default ``$DELAYED_RETRY_TEST_RABBITMQ``) is every node's RabbitMQ version.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        start_timeout: float = 180.0,
        rabbit_env: Mapping[str, int] | None = None,
        version: str | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, not {size}")
        self.size = size
        self.start_timeout = start_timeout
        self.version = version if version is not None else os.environ.get(VERSION_ENV) or None
        # A 4.x node runs in a chroot and sees only the files inside it: so do its folders.
        root = None if self.version in (None, "3.10") else ensure_chroot(str(self.version))
        self.base_dir = Path(
            tempfile.mkdtemp(prefix="drtest-cluster-", dir=None if root is None else root / "tmp")
        )
        self.home = self.base_dir / "home"  # one Erlang cookie for every node
        prefix = f"drtest-{secrets_hex()}"
        self.nodes = [
            RabbitMQNode(
                name=f"{prefix}-{index + 1}@{NODE_HOST}",
                base_dir=self.base_dir / f"node{index + 1}",
                home=self.home,
                start_timeout=start_timeout,
                rabbit_env=rabbit_env,
                version=self.version,
            )
            for index in range(size)
        ]
        self.last_start_seconds: float | None = None
        _live_clusters.add(self)

    @property
    def urls(self) -> list[str]:
        """AMQP URL of every node, in node order."""
        return [node.url for node in self.nodes]

    def start(self) -> None:
        """Start every node, join nodes 1.. to node 0, and wait until all run together."""
        began = time.monotonic()
        write_cookie(self.home)
        _start_together(self.nodes)
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            node.rabbitmqctl("stop_app")
            node.rabbitmqctl("join_cluster", seed.name)
            node.rabbitmqctl("start_app")
        self.wait_until_running(self.size)
        self.last_start_seconds = time.monotonic() - began
        log.info("RabbitMQ cluster of %d nodes ready in %.1f s", self.size, self.last_start_seconds)

    def cluster_status(self) -> dict[str, Any]:
        """``rabbitmqctl cluster_status`` as JSON, asked of the first running node."""
        result: dict[str, Any] = json.loads(
            self._any_running().rabbitmqctl("cluster_status", "--formatter", "json")
        )
        return result

    def running_node_names(self) -> list[str]:
        """Names of the nodes the cluster reports as running."""
        return [str(name) for name in self.cluster_status().get("running_nodes", [])]

    def wait_until_running(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` nodes report running, e.g. after :meth:`start_node`."""
        deadline = time.monotonic() + timeout
        while True:
            running = self.running_node_names()
            if len(running) >= count:
                return
            if time.monotonic() > deadline:
                raise BrokerHarnessError(
                    f"cluster reports {len(running)} running nodes ({running}), expected {count} "
                    f"within {timeout:.0f} s; node logs are under {self.base_dir}"
                )
            time.sleep(0.5)

    def flush_metadata(self) -> None:
        """Save every running node's lazily written metadata now.

        See :meth:`RabbitMQNode.flush_metadata`. Call it before killing a node
        when quorum queues were declared or elected leaders in the last few
        seconds.
        """
        for node in self.nodes:
            if node.running:
                node.flush_metadata()

    def stop_node(self, index: int) -> None:
        """Stop node ``index`` gracefully; it stays a cluster member."""
        self.nodes[index].stop()

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index``, as a crash or power loss would."""
        self.nodes[index].kill()

    def start_node(self, index: int) -> None:
        """Start node ``index`` again; it rejoins with its old data."""
        self.nodes[index].start()

    def restart_node(self, index: int) -> None:
        """Stop then start node ``index``."""
        self.nodes[index].restart()

    def ensure_all_running(self) -> None:
        """Start every node that is down, together, and wait until all run as one cluster.

        Use it to put a shared cluster back after a test stopped or killed
        nodes. Nodes start in parallel because a node that was stopped last
        waits for its peers before it accepts clients.
        """
        _start_together([node for node in self.nodes if not node.running])
        self.wait_until_running(self.size)

    def leader_of(self, queue: str, vhost: str = "/") -> int:
        """Index of the node leading quorum queue ``queue``."""
        leader = self._queue_info(queue, vhost)["leader"]
        return self._index_of(str(leader), queue)

    def members_of(self, queue: str, vhost: str = "/") -> list[int]:
        """Indexes of the nodes holding a replica of quorum queue ``queue``."""
        members = self._queue_info(queue, vhost)["members"]
        return sorted(self._index_of(str(member), queue) for member in members)

    def list_queues(self, *columns: str, vhost: str = "/") -> list[dict[str, Any]]:
        """``rabbitmqctl list_queues`` with ``columns``, asked of the first running node.

        Use it to say where messages are when a test times out, e.g.
        ``cluster.list_queues("name", "messages", "leader")``.
        """
        output = self._any_running().rabbitmqctl(
            "list_queues", "-p", vhost, *columns, "--formatter", "json"
        )
        rows: list[dict[str, Any]] = json.loads(output)
        return rows

    def _queue_info(self, queue: str, vhost: str) -> dict[str, Any]:
        for row in self.list_queues("name", "type", "leader", "members", vhost=vhost):
            if row.get("name") == queue:
                if row.get("type") != "quorum":
                    raise BrokerHarnessError(
                        f"queue {queue!r} in vhost {vhost!r} is a {row.get('type')} queue; "
                        "only quorum queues have a leader and members"
                    )
                info: dict[str, Any] = row
                return info
        raise BrokerHarnessError(f"queue {queue!r} does not exist in vhost {vhost!r}")

    def _index_of(self, node_name: str, queue: str) -> int:
        for index, node in enumerate(self.nodes):
            if node.name == node_name:
                return index
        raise BrokerHarnessError(f"queue {queue!r} names node {node_name!r}, not in this cluster")

    def _any_running(self) -> RabbitMQNode:
        for node in self.nodes:
            if node.running:
                return node
        raise BrokerHarnessError("no node of the cluster is running; start one with start_node(i)")

    def close(self) -> None:
        """Kill every node and delete the cluster's folder; safe to call twice."""
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.base_dir, ignore_errors=True)
        _live_clusters.discard(self)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RabbitMQCluster {[repr(node) for node in self.nodes]}>"


def _start_together(nodes: list[RabbitMQNode]) -> None:
    if not nodes:
        return
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="rmq-start") as pool:
        for future in [pool.submit(node.start) for node in nodes]:
            future.result()


_live_clusters: set[RabbitMQCluster] = set()


@atexit.register
def _close_live_clusters() -> None:
    for cluster in list(_live_clusters):
        with contextlib.suppress(Exception):
            cluster.close()
