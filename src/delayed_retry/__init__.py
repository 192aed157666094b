"""delayed-retry: delayed retries, parking and scheduling for aio-pika consumers, in RabbitMQ."""

from importlib import metadata as _metadata

from delayed_retry.alerts import (
    Alert,
    AlertSink,
    AlertSinkError,
    CallbackSink,
    LoggingSink,
    ParkingAlerts,
    SinkRetry,
    WebhookSink,
)
from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.consumer.consume import consume
from delayed_retry.consumer.decorator import with_delayed_retry
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.consumer.hooks import FailureEvent
from delayed_retry.consumer.options import HandlerOptions, RouterOptions, SubscriberOptions
from delayed_retry.consumer.outbox import Outbox, current_outbox
from delayed_retry.consumer.retry_state import current_retry_state, retry_state
from delayed_retry.consumer.router import ConsumerRejected, RetryRouter
from delayed_retry.delivery.forwarder import Forwarder
from delayed_retry.delivery.front_door import FrontDoor
from delayed_retry.delivery.ordered import (
    declare_ordered_queues,
    ordered_queue_names,
    publish_ordered,
)
from delayed_retry.delivery.schedule import publish_delayed
from delayed_retry.errors import (
    ConfigurationError,
    DelayedRetryError,
    DelayOutOfRangeError,
    HandlerSignal,
    MessageCrashedError,
    NotFoundError,
    ParkMessage,
    PublishError,
    PublishNotConfirmedError,
    PublishTimeoutError,
    RetryAfter,
    TopologyMismatchError,
)
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.observability.gauges import ChainMonitor
from delayed_retry.observability.instrumentation import Instrumentation, NoInstrumentation
from delayed_retry.observability.otel import OpenTelemetryInstrumentation
from delayed_retry.parking.shortcuts import ParkedMessage, ReplayResult, peek_parked, replay_parked
from delayed_retry.rabbitmq.work_queues import WORK_QUEUE_DELIVERY_LIMIT, work_queue_arguments
from delayed_retry.recovery.crash_guard import CrashGuard
from delayed_retry.recovery.hold import DEFAULT_HOLD, Hold
from delayed_retry.recovery.ordering import partition_for
from delayed_retry.recovery.policy import DEFAULT_MAX_RETRIES, DEFAULT_WAIT, RetryPolicy
from delayed_retry.recovery.throttle import Throttle

try:
    __version__ = _metadata.version("delayed-retry")
    """The installed distribution's version; ``pyproject.toml`` is its one source."""
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    # consuming with retries
    "with_delayed_retry",
    "HandlerOptions",
    "SubscriberOptions",
    "consume",
    "RetryingHandler",
    "RetryPolicy",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_WAIT",
    "RetryState",
    "Hold",
    "DEFAULT_HOLD",
    "Throttle",
    "CrashGuard",
    "retry_state",
    "current_retry_state",
    "FailureEvent",
    "Outbox",
    "current_outbox",
    "declare_ordered_queues",
    "ordered_queue_names",
    "publish_ordered",
    "partition_for",
    # retries for consumers in any language
    "RetryRouter",
    "RouterOptions",
    "ConsumerRejected",
    # scheduling
    "publish_delayed",
    "Forwarder",
    "FrontDoor",
    # parking
    "peek_parked",
    "replay_parked",
    "ParkedMessage",
    "ReplayResult",
    # topology
    "DelayTopology",
    "DEFAULT_TOPOLOGY",
    "declare_topology",
    "work_queue_arguments",
    "WORK_QUEUE_DELIVERY_LIMIT",
    # telemetry
    "Instrumentation",
    "NoInstrumentation",
    "OpenTelemetryInstrumentation",
    "ChainMonitor",
    # alerts on parked messages
    "ParkingAlerts",
    "Alert",
    "AlertSink",
    "CallbackSink",
    "LoggingSink",
    "WebhookSink",
    "SinkRetry",
    # handler signals
    "HandlerSignal",
    "RetryAfter",
    "ParkMessage",
    # errors
    "DelayedRetryError",
    "ConfigurationError",
    "DelayOutOfRangeError",
    "MessageCrashedError",
    "NotFoundError",
    "TopologyMismatchError",
    "PublishError",
    "PublishNotConfirmedError",
    "PublishTimeoutError",
    "AlertSinkError",
]
