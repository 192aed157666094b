"""Tests of ``delayed_retry.amqp``: declaring, publishing into the chain, channels, consumers,
batching."""
