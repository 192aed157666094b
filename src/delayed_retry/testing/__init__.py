"""Unit-test a decorated handler without a broker: a fake channel and the messages it delivers.

Use these in your own tests to check what a handler wrapped by
:func:`~delayed_retry.with_delayed_retry` does with each outcome (success, a
retry into the chain, parking, a publish the broker does not confirm) in
milliseconds. What only a broker can show (routing through the chain, delivery
limits, restarts) wants a real RabbitMQ.
"""

from typing import TYPE_CHECKING

from .fake import Answer, FakeChannel, FakeConnection, Published, fake_message

__all__ = [
    # the fake broker side
    "FakeChannel",
    "FakeConnection",
    "Answer",
    # messages in and out
    "fake_message",
    "Published",
]

_MOVED = frozenset(
    {
        "BrokerHarnessError",
        "RabbitMQCluster",
        "RabbitMQNode",
        "TLSFiles",
        "broker_url",
        "free_port",
        "release_port",
        "wait_for_broker",
    }
)
"""Names 0.1.0 exported here that belong to the project's broker harness, not the package."""

if not TYPE_CHECKING:  # for type checkers, the names above do not exist here at all

    def __getattr__(name: str) -> object:
        if name in _MOVED:
            raise ImportError(
                f"delayed_retry.testing.{name} is no longer part of the package: the broker "
                "harness that starts RabbitMQ nodes and clusters stays in the project's "
                "repository (harness/) for its own tests. Run your tests against a broker of "
                "your own (RABBITMQ_URL, a CI service, a testcontainers RabbitMqContainer), or "
                "without one on delayed_retry.testing.FakeChannel"
            )
        raise AttributeError(f"module 'delayed_retry.testing' has no attribute {name!r}")
