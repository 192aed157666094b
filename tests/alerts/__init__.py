"""Tests of ``delayed_retry.alerts``: grouping of parking arrivals, the alerts consumer and its
sinks."""
