"""Helpers shared by the test modules: waiting, queue depths, clean-up, scenarios, telemetry."""
