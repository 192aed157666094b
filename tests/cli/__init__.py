"""Tests of ``delayed_retry.cli``: the commands, their output, refusals and exit codes, the
services."""
