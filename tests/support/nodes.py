"""Broker settings the tests' private nodes and cluster run with, and check against."""

from __future__ import annotations

CONFIRM_TIMEOUT_MS = 10_000
"""``dead_letter_worker_publisher_confirm_timeout`` of the test cluster and the broker-kill node.

A failover or a kill can catch a message between two levels of the chain;
the at-least-once dead-letter worker sends it again when its publish confirm
times out (180 s by default). 10 s keeps these tests about what arrives, not
about that wait.
"""
