"""The parser every command is built on: one-line usage errors; values may start with ``-``.

:func:`delayed_retry.cli.main.build_parser` makes the root parser a
:class:`CommandLineParser`; argparse gives each subparser the class of its
parent, so every command and verb reports a bad command line the same way.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from delayed_retry.cli import output

__all__ = ["CommandLineParser"]

_STARTS_LIKE_A_NUMBER = re.compile(r"^-\.?\d")


class CommandLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose usage errors are one line, exit 2.

    Use it for the root parser only (subparsers inherit it). argparse prints
    the whole usage before an error, often ten lines; here the error is the
    line ``delayed-retry: error: ...`` and ``--help`` is named for the rest.
    A word starting with ``-`` and a digit (``-5s``, ``-1h``, ``-.5``) is a
    value, not an option, so the option's type can refuse it with its reason
    ("must not be negative") instead of argparse's "expected one argument".
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse only takes plain negative numbers (-5, -.5) as values.
        self._negative_number_matcher = _STARTS_LIKE_A_NUMBER

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Parse; a command (a parser without subcommands) refuses words it does not know.

        argparse leaves them to the root parser, whose error would name
        ``delayed-retry --help`` instead of the command's own help.
        """
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line and exit 2 (the command line is wrong)."""
        # The option types of this package name the fix after a ';'; argparse's own
        # messages (unknown option, missing option, bad int) do not: point to --help.
        if ";" not in message:
            message = f"{message}; '{self.prog} --help' lists the options"
        output.print_error(message)
        self.exit(output.EXIT_USAGE)
