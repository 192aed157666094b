"""Tests of ``delayed_retry.faststream``: DelayedRetry in FastStream apps."""
