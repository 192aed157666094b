"""Tests of ``delayed_retry.recovery``: the retry policy, immediate retries, the hold, the
throttle."""
