"""The ``delayed-retry`` command line: one module per subcommand group."""

from delayed_retry.cli.main import main

__all__ = ["main"]
