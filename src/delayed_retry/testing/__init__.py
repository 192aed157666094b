"""Real RabbitMQ brokers for tests: one shared URL, private nodes, local clusters."""

from .broker import (
    BrokerHarnessError,
    RabbitMQNode,
    TLSFiles,
    broker_url,
    free_port,
    release_port,
    wait_for_broker,
)
from .cluster import RabbitMQCluster

__all__ = [
    # brokers
    "RabbitMQCluster",
    "RabbitMQNode",
    "TLSFiles",
    "broker_url",
    # helpers
    "free_port",
    "release_port",
    "wait_for_broker",
    # errors
    "BrokerHarnessError",
]
