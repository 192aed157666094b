"""Tests of ``delayed_retry.parking.moving``: the engine of replays and purges, canaries."""
