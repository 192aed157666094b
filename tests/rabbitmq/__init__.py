"""Tests of ``delayed_retry.rabbitmq``: work queues, delivery limits, policies."""
