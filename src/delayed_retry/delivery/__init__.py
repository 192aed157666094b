"""Delivering later: ``publish_delayed``, the forwarder and the front door."""
