"""Tests of ``delayed_retry.consumer``: the decorator and every path out of a handler, hand-over,
hooks, throttling, the router."""
