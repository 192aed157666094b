"""Settings of the test cluster that its tests check against."""

from __future__ import annotations

CONFIRM_TIMEOUT_MS = 10_000
"""The test cluster's ``dead_letter_worker_publisher_confirm_timeout``.

A failover can catch a message between two levels of the chain; the
at-least-once dead-letter worker sends it again when its publish confirm
times out (180 s by default). 10 s keeps a failover test about failover, not
about that wait.
"""
