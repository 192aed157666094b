"""The command line's layout: each ``cli/<name>_cmd.py`` adds the command it is named after.

Pure: builds parsers and reads the import graph, no broker.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import grimp
import pytest

import delayed_retry.cli
from delayed_retry.cli.main import SUBCOMMAND_MODULES, build_parser

CLI = Path(delayed_retry.cli.__file__).parent


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _command_of(module: str) -> str:
    return module.rsplit(".", 1)[1].removesuffix("_cmd").replace("_", "-")


@pytest.mark.parametrize("module", SUBCOMMAND_MODULES)
def test_each_command_module_adds_the_command_it_is_named_after(module: str) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).COMMAND.add_to(sub)
    assert set(sub.choices) == {_command_of(module)}


def test_a_module_of_its_own_holds_one_verb_of_its_command() -> None:
    registered = {m.rsplit(".", 1)[1] for m in SUBCOMMAND_MODULES}
    commands = _subcommands(build_parser())
    verb_modules = sorted(p.stem for p in CLI.glob("*_cmd.py") if p.stem not in registered)
    assert verb_modules == ["topology_discard_cmd", "topology_migrate_cmd"]
    for stem in verb_modules:
        command, verb = stem.removesuffix("_cmd").split("_", 1)
        assert verb in _subcommands(commands[command]), stem


def test_the_command_line_modules_import_one_another_without_cycles() -> None:
    graph = grimp.build_graph("delayed_retry", cache_dir=None)
    cycles = []
    for module in sorted(m for m in graph.modules if m.startswith("delayed_retry.cli.")):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported.startswith("delayed_retry.cli.") and graph.find_shortest_chain(
                importer=imported, imported=module
            ):
                cycles.append(f"{module} <-> {imported}")
    assert cycles == [], "move what both need into a module both import (output.py, common.py)"
