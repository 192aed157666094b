"""The ``delayed-retry`` command line: one ``<command>_cmd.py`` module per command."""

from delayed_retry.cli.main import main

__all__ = ["main"]
