"""What a command of the command line is: its name, its help, its options and what runs it.

Each ``cli/<name>_cmd.py`` ends with one :class:`Command` named ``COMMAND``;
:func:`delayed_retry.cli.main.build_parser` adds them all. A command with verbs
(``parking list``) lists them as Commands of their own in ``verbs``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Command"]


def _no_options(parser: argparse.ArgumentParser) -> None:
    del parser


@dataclass(frozen=True, kw_only=True)
class Command:
    """One command or verb: what ``--help`` says of it, its options, and what runs it.

    ``run`` takes the parsed arguments and returns the exit code, or a
    coroutine returning it (run to its end here); a command with ``verbs``
    has no ``run`` of its own. ``defaults`` are set on the parsed arguments
    as they are, for two verbs that share one ``run``.
    """

    name: str
    help: str
    description: str | None = None
    options: Callable[[argparse.ArgumentParser], None] = _no_options
    run: Callable[[argparse.Namespace], int | Coroutine[Any, Any, int]] | None = None
    verbs: tuple[Command, ...] = ()
    verbs_metavar: str = "VERB"
    defaults: Mapping[str, object] = field(default_factory=dict)

    def add_to(self, subparsers: Any) -> argparse.ArgumentParser:
        """Add this command (and its verbs) to ``subparsers``; returns its parser."""
        parser: argparse.ArgumentParser = subparsers.add_parser(
            self.name, help=self.help, description=self.description
        )
        self.options(parser)
        if self.verbs:
            verbs = parser.add_subparsers(
                dest=f"{self.name}_command", required=True, metavar=self.verbs_metavar
            )
            for verb in self.verbs:
                verb.add_to(verbs)
        if self.run is not None:
            parser.set_defaults(func=self._call, **self.defaults)
        return parser

    def _call(self, args: argparse.Namespace) -> int:
        assert self.run is not None
        result = self.run(args)
        return result if isinstance(result, int) else asyncio.run(result)
