"""Real RabbitMQ brokers for the project's tests, benchmarks, examples and demo.

A development-only package: it lives in the repository beside ``src/`` and is not part of the
wheel (it builds Debian chroots, reads ``/proc`` and starts clusters; a user of the library needs
none of that). The editable install made by ``scripts/bootstrap`` puts it on the path. Users who
test their own handlers without a broker want :mod:`delayed_retry.testing` instead.
"""

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
