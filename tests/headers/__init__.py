"""Tests of ``delayed_retry.headers``: header names, the retry state, the parking record, values
safe to re-publish, bounded text."""
