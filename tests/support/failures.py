"""Exceptions the tests' handlers raise, named for what the retry policy does with them."""

from __future__ import annotations


class Flaky(Exception):
    """A failure worth retrying: the handler raises it for an attempt meant to fail."""
