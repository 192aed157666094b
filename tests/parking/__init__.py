"""Tests of ``delayed_retry.parking``: records, ids, the lot, refresh."""
