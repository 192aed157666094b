"""delayed-retry for FastStream: ``RabbitBroker(url, middlewares=[DelayedRetry(...)])``.

Installed with the ``delayed-retry[faststream]`` extra (FastStream 0.7).
"""

from delayed_retry.faststream.in_memory import InMemoryDecision
from delayed_retry.faststream.middleware import DelayedRetry, HandedOver
from delayed_retry.faststream.startup import check_subscribers
from delayed_retry.faststream.state import CurrentRetryState
from delayed_retry.faststream.subscribers import SUPPORTED_ACK_POLICIES, AckPolicyRefusedError

__all__ = [
    # the middleware
    "DelayedRetry",
    "check_subscribers",
    "SUPPORTED_ACK_POLICIES",
    # in the handler
    "CurrentRetryState",
    # under TestRabbitBroker
    "InMemoryDecision",
    # signals and errors
    "HandedOver",
    "AckPolicyRefusedError",
]
