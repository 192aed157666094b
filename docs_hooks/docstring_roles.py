"""Griffe extension: the docstrings' reStructuredText habits, as Markdown for the API reference.

- Roles. The package's docstrings name other objects the reStructuredText way
  (``:class:`~delayed_retry.recovery.hold.Hold```, ``:func:`consume```). Markdown has no
  such roles; each becomes a cross-reference to the object when it can be
  resolved from where the docstring is, marked optional, so a name the
  reference does not render reads as code instead of failing the build.
- Option lists. A line ending in ``:`` followed by indented ``name: text``
  lines (``Options (keyword-only):`` then ``  queue: the queue ...``) would run
  together into one paragraph; they become a bulleted list.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const):`(?P<target>[^`]+)`")


def _link(obj: griffe.Object, match: re.Match[str]) -> str:
    target = match["target"]
    short = target.startswith("~")
    name = target.lstrip("~.")
    title = name.rsplit(".", 1)[-1] if short else name
    if name.endswith("()"):
        name = name[:-2]
    identifier: str | None
    try:
        identifier = obj.resolve(name)
    except (griffe.NameResolutionError, KeyError, ValueError):
        identifier = name if "." in name else None
    if identifier is None:
        return f"`{title}`"
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


OPTION = re.compile(r"^(?P<indent>\s+)(?P<name>[A-Za-z_][\w.*]*): (?P<text>.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def option_lists(text: str) -> str:
    """``text`` with each indented ``name: text`` block after a ``...:`` line as a list."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        first = OPTION.match(lines[i]) if i < len(lines) else None
        if not line.rstrip().endswith(":") or first is None:
            continue
        if _indent(lines[i]) <= _indent(line):
            continue
        base = len(first["indent"])
        out.append("")
        while i < len(lines) and lines[i].strip() and _indent(lines[i]) >= base:
            item = OPTION.match(lines[i])
            if item is not None and len(item["indent"]) == base:
                out.append(f"{' ' * _indent(line)}- `{item['name']}`: {item['text']}")
            else:  # a continuation line of the item above
                out[-1] += " " + lines[i].strip()
            i += 1
        out.append("")
    return "\n".join(out)


def _rewrite(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        text = option_lists(obj.docstring.value)
        obj.docstring.value = ROLE.sub(lambda m: _link(obj, m), text)
    for member in obj.members.values():
        if not member.is_alias:
            _rewrite(member)  # type: ignore[arg-type]


class DocstringRoles(griffe.Extension):
    """Rewrite the roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _rewrite(pkg)
