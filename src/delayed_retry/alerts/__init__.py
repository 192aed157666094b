"""Alerts on parking-queue arrivals: consume the alert queue, group, deliver to sinks."""

from delayed_retry.alerts.consumer import ParkingAlerts
from delayed_retry.alerts.grouping import (
    Alert,
    AlertGroup,
    AlertWindow,
    ParkedArrival,
    arrival_from,
    group_arrivals,
)
from delayed_retry.alerts.sinks import (
    AlertSink,
    AlertSinkError,
    CallbackSink,
    LoggingSink,
    SinkRetry,
    WebhookSink,
    deliver,
)

__all__ = [
    # consumer
    "ParkingAlerts",
    # sinks
    "AlertSink",
    "CallbackSink",
    "LoggingSink",
    "WebhookSink",
    "SinkRetry",
    "deliver",
    # grouping
    "Alert",
    "AlertGroup",
    "AlertWindow",
    "ParkedArrival",
    "arrival_from",
    "group_arrivals",
    # errors
    "AlertSinkError",
]
