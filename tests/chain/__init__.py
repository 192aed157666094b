"""Tests of ``delayed_retry.chain``: the topology, routing keys, the chain on a broker."""
