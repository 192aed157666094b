"""Reading the broker's refusal of a declaration (pure: the texts are the broker's own)."""

from __future__ import annotations

from delayed_retry.amqp.refusals import existing_in_memory_argument

# What RabbitMQ 3.10.8 and 4.0.5 say, word for word, when a declaration differs.
LACKS = (
    "PRECONDITION_FAILED - inequivalent arg 'x-max-in-memory-length' for queue "
    "'delayed-retry.level.07' in vhost '/': received none but current is the value '0' of "
    "type 'byte'"
)
ADDS = (
    "PRECONDITION_FAILED - inequivalent arg 'x-max-in-memory-bytes' for queue 'q' in vhost "
    "'/': received the value '0' of type 'byte' but current is none"
)
OTHER = (
    "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
    "received the value '128' of type 'signedint' but current is the value '5' of type 'byte'"
)


def test_the_existing_in_memory_argument_is_read_from_the_refusal() -> None:
    assert existing_in_memory_argument(LACKS) == ("x-max-in-memory-length", 0)
    assert existing_in_memory_argument(LACKS.replace("'0'", "'1000'")) == (
        "x-max-in-memory-length",
        1000,
    )
    # The queue lacking what a declaration sends, or another argument: not tolerated.
    assert existing_in_memory_argument(ADDS) is None
    assert existing_in_memory_argument(OTHER) is None
