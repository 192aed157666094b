"""MkDocs hook: the command line's reference page, written from the real parser at build time.

``render`` walks :func:`delayed_retry.cli.main.build_parser` and prints each
command's ``--help``, so the page cannot drift from the options the command
line takes. ``on_files`` adds it to the site as ``reference/cli.md``; nothing is
written into ``docs/``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files

PAGE = "reference/cli.md"
"""Where the page lands in the site (a path under ``docs/``, which holds no such file)."""

WIDTH = "80"
"""Columns argparse wraps the help to, whatever terminal builds the site."""

ENVIRONMENT = ("RABBITMQ_URL", "RABBITMQ_MANAGEMENT_URL", "DELAYED_RETRY_PREFIX")
"""Variables some defaults are read from: left out, so the page shows the built-in defaults."""

INTRO = """\
# Every command

Generated from the command line's parser when the site is built: each section is what
`delayed-retry COMMAND --help` prints. The conventions every command follows (the broker URL,
the topology options, filters, durations, output and exit codes) are in
[Command line](command-line.md).
"""


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Each parser under ``parser`` with its command path, the root first, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


@contextlib.contextmanager
def _help_environment() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in (*ENVIRONMENT, "COLUMNS")}
    for name in ENVIRONMENT:
        os.environ.pop(name, None)
    os.environ["COLUMNS"] = WIDTH
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def render() -> str:
    """The whole page, in Markdown: one section per command and verb."""
    with _help_environment():
        from delayed_retry.cli.main import build_parser

        parser = build_parser()
        sections = [INTRO]
        for path, sub in commands(parser):
            title = " ".join(("delayed-retry", *path))
            sections.append(f"## `{title}`\n\n```text\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(sections)


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    """Add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
