"""The shape of the core, read from the source tree with ``ast`` (see docs/architecture.md).

- One way into the delay chain: only ``amqp/chain.py`` calls its low-level publish;
  every other module sends with ``send_into_chain`` (or ``keep_unroutable``).
- No function in the core folders is longer than a screen (:data:`MAX_LINES`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import delayed_retry
import delayed_retry.amqp.chain

PACKAGE = Path(delayed_retry.__file__).parent

CHAIN_MODULE = "amqp/chain.py"
LOW_LEVEL_PUBLISH = "_publish"
"""The function of ``amqp/chain.py`` that publishes into the chain; no other module calls it."""

RETIRED_NAMES = frozenset({"publish_into_chain"})
"""Former ways into the chain: no module defines or calls them any more."""

CORE_FOLDERS = ("consumer", "amqp", "delivery", "faststream")
MAX_LINES = 60
"""The longest a function in :data:`CORE_FOLDERS` may be, signature and docstring included."""

LONGER_ALLOWED: frozenset[str] = frozenset()
"""Functions still over :data:`MAX_LINES`, each in a file whose rework is under way; emptied as
they are split, never added to."""


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def chain_bypasses(module: str, tree: ast.Module) -> list[str]:
    """Where ``tree`` (the module at ``module``) reaches into the chain other than by its API."""
    if module == CHAIN_MODULE:
        return []
    public = set(delayed_retry.amqp.chain.__all__)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "delayed_retry.amqp.chain":
            found += [
                f"{module}:{node.lineno} imports {alias.name}"
                for alias in node.names
                if alias.name not in public
            ]
        elif isinstance(node, ast.Attribute) and node.attr == LOW_LEVEL_PUBLISH:
            if isinstance(node.value, ast.Name) and node.value.id == "chain":
                found.append(f"{module}:{node.lineno} calls chain.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in RETIRED_NAMES:
            found.append(f"{module}:{node.lineno} calls {node.id}")
    return found


def function_lengths(module: str, tree: ast.Module) -> dict[str, int]:
    """``module:function`` to its length in lines, for every function of ``tree``."""
    return {
        f"{module}:{node.name}": node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno
    }


def _core_lengths() -> dict[str, int]:
    return {
        name: length
        for module, tree in _modules()
        if module.split("/")[0] in CORE_FOLDERS
        for name, length in function_lengths(module, tree).items()
    }


def test_only_the_chain_module_publishes_into_the_chain() -> None:
    bypasses = [found for module, tree in _modules() for found in chain_bypasses(module, tree)]
    assert not bypasses, (
        "send into the delay chain with delayed_retry.amqp.chain.send_into_chain "
        f"(or keep_unroutable), not its low-level publish: {bypasses}"
    )


def test_the_chain_check_finds_a_bypass() -> None:
    tree = ast.parse(
        "from delayed_retry.amqp.chain import _publish, send_into_chain\n"
        "from delayed_retry.amqp import chain\n"
        "async def f():\n"
        "    await chain._publish()\n"
        "    await publish_into_chain()\n"
    )
    assert len(chain_bypasses("consumer/x.py", tree)) == 3
    assert chain_bypasses(CHAIN_MODULE, tree) == []


def test_the_low_level_publish_is_in_the_chain_module() -> None:
    assert callable(getattr(delayed_retry.amqp.chain, LOW_LEVEL_PUBLISH))


def test_no_core_function_is_over_a_screen() -> None:
    too_long = [
        f"{name} ({length} lines)"
        for name, length in _core_lengths().items()
        if length > MAX_LINES and name not in LONGER_ALLOWED
    ]
    assert not too_long, (
        f"functions over {MAX_LINES} lines in {', '.join(CORE_FOLDERS)}: {too_long}; "
        "split each into named steps"
    )


def test_the_length_check_counts_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    tree = ast.parse(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    assert function_lengths("consumer/x.py", tree) == {
        "consumer/x.py:long": MAX_LINES + 1,
        "consumer/x.py:short": 2,
    }


def test_every_allowed_long_function_is_still_long() -> None:
    """An entry of the allow-list goes once its function is split."""
    lengths = _core_lengths()
    stale = sorted(name for name in LONGER_ALLOWED if lengths.get(name, 0) <= MAX_LINES)
    assert not stale, f"no longer over {MAX_LINES} lines; remove from LONGER_ALLOWED: {stale}"
