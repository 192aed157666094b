"""Unit-test a decorated handler without a broker: a fake channel and the messages it delivers.

Use these in your own tests to check what a handler wrapped by
:func:`~delayed_retry.with_delayed_retry` does with each outcome (success, a
retry into the chain, parking, a publish the broker does not confirm) in
milliseconds. What only a broker can show (routing through the chain, delivery
limits, restarts) wants a real RabbitMQ.
"""

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
