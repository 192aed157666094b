"""MkDocs hook: the tables of retry options, written from their one definition at build time.

A page asks for a table with a line ``<!-- options: HandlerOptions -->`` (or
``SubscriberOptions``, ``RouterOptions``, ``ChainOptions``); :func:`render`
puts in its place one row per option of that class in
:mod:`delayed_retry.consumer.options`: name, type, default and help. So the
guide cannot drift from the options the code takes.
"""

from __future__ import annotations

import html
import re
import types
import typing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

MARKER = re.compile(r"^<!-- options: (?P<name>\w+) -->$", re.MULTILINE)
"""The line a page writes where a table of options goes."""


def type_text(hint: Any, aliases: dict[int, str] | None = None) -> str:
    """An option's type as a reader writes it: ``stop_base | None``, ``'queue' | 'exchange'``.

    ``aliases``: names for types written as aliases (``FailureHook``), by ``id``.
    """
    aliases = aliases or {}
    if typing.get_origin(hint) is typing.Annotated:
        return type_text(typing.get_args(hint)[0], aliases)
    if id(hint) in aliases:
        return aliases[id(hint)]
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(hint))
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " | ".join(type_text(arg, aliases) for arg in typing.get_args(hint))
    if hint is type(None):
        return "None"
    name = getattr(hint, "__name__", None)
    return name if isinstance(name, str) and typing.get_origin(hint) is None else str(hint)


def _markdown(text: str) -> str:
    """Plain help text, safe in a Markdown table cell (``<queue>``, ``stop_*``)."""
    return html.escape(text, quote=False).replace("*", "\\*").replace("|", "\\|")


def render(name: str) -> str:
    """The Markdown table of the options class ``name`` of :mod:`delayed_retry.consumer.options`."""
    from delayed_retry.consumer import options

    kind = getattr(options, name, None)
    if not isinstance(kind, type) or name not in options.__all__:
        raise ValueError(f"<!-- options: {name} -->: no such options class in {options.__name__}")
    hints = typing.get_type_hints(kind, include_extras=True)
    # The aliases the module spells types with, except Literals, whose values say more.
    aliases = {
        id(value): alias
        for alias, value in vars(options).items()
        if alias in ("FailureHook", "Duration")
    }
    rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for option, spec in options.option_specs(kind).items():
        kind_text = type_text(hints[option], aliases).replace("|", "\\|")
        default = spec.default_text.replace("|", "\\|")
        rows.append(f"| `{option}` | `{kind_text}` | `{default}` | {_markdown(spec.help)} |")
    return "\n".join(rows)


def expand(markdown: str) -> str:
    """``markdown`` with each options marker replaced by its table."""
    return MARKER.sub(lambda match: render(match["name"]), markdown)


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Put the tables of options into the pages that ask for them."""
    return expand(markdown)
