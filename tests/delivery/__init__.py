"""Tests of ``delayed_retry.delivery``: the forwarder and the front door."""
