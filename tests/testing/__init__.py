"""Tests of ``delayed_retry.testing``: the fake channel users test with."""
