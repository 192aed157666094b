"""Real RabbitMQ brokers for tests: one shared URL, private nodes, local clusters."""

from .broker import broker_url
from .cluster import RabbitMQCluster
from .node import RabbitMQNode, TLSFiles
from .ports import free_port, release_port
from .probe import BrokerHarnessError, wait_for_broker

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
