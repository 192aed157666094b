"""Tests of ``delayed_retry.observability``: metrics and spans."""
