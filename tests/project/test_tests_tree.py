"""tests/ mirrors the package, and a file's name says whether it needs a broker (tests/README.md).

Pure: reads the two trees, and which tests the broker mark selects (pytest in a process of its
own collects the whole tree, whatever this run selected).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.support.nodes import starts_own_node

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "delayed_retry"

OUTSIDE_THE_MIRROR = {"reliability", "project", "support", "harness", "artifacts"}
"""Folders of tests/ that are no package folder: faults across the system, checks of the
checkout, shared helpers, the broker harness (``harness/`` beside ``src/``), screenshots."""

WITHOUT_TIERS = {"reliability", "harness"}
"""Folders whose subject is the broker itself: nearly every test starts or breaks a node."""


def folders_without_package(tests: Path, package: Path) -> list[str]:
    """Each folder under ``tests`` that names no folder of ``package``, as ``tests/x/y``."""
    found = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        relative = folder.relative_to(tests)
        if relative.parts[0] in OUTSIDE_THE_MIRROR or "__pycache__" in relative.parts:
            continue
        if relative.parts[0].startswith("."):
            continue
        if not (package / relative).is_dir():
            found.append(f"tests/{relative.as_posix()}")
    return found


def misnamed_tiers(tests: Iterable[tuple[str, bool]]) -> list[str]:
    """Each file holding a broker test without the ``_broker.py`` suffix, from pairs of
    (path relative to the checkout, needs a broker)."""
    found = set()
    for path, needs_broker in tests:
        parts = Path(path).parts
        if len(parts) > 1 and parts[1] in WITHOUT_TIERS:
            continue
        if needs_broker and not path.endswith("_broker.py"):
            found.add(path)
    return sorted(found)


def test_every_folder_of_tests_names_a_folder_of_the_package() -> None:
    assert folders_without_package(TESTS, PACKAGE) == [], (
        "a test folder that mirrors no package folder; put the tests where their module is "
        "(tests/README.md), or add the folder to OUTSIDE_THE_MIRROR with its reason"
    )


def broker_test_files() -> list[tuple[str, bool]]:
    """(path, True) for each test the ``broker`` mark selects in the whole tree."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    listed = subprocess.run(
        [*command, "-m", "broker", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [(line.split("::")[0], True) for line in listed.splitlines() if "::" in line]


def test_every_file_with_a_broker_test_ends_in_broker() -> None:
    found = broker_test_files()
    assert len(found) > 100, "the broker tests were not listed: the check would pass on anything"
    assert misnamed_tiers(found) == [], (
        "a file holds tests that need a RabbitMQ node but its name does not end in _broker.py; "
        "rename it (tests/README.md)"
    )


NODE_STARTERS = {"RabbitMQNode", "RabbitMQCluster", "private_node", "private_node_with_management"}
"""What starts a RabbitMQ node of a test's own."""


def _names(node: ast.AST) -> set[str]:
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Name | ast.Attribute)
    }


def unmarked_node_starters(source: str, path: str) -> list[str]:
    """Each fixture or test in ``source`` that starts a node of its own and that
    ``scripts/test`` would still run: a fixture must be named ``node`` or ``*_node`` (the
    tests using it are marked ``private_node`` by tests/conftest.py), a test must carry the
    ``private_node`` mark itself or through its module's ``pytestmark``."""
    tree = ast.parse(source)
    module_marked = any(
        isinstance(statement, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in statement.targets)
        and "private_node" in _names(statement.value)
        for statement in tree.body
    )
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        called = {
            call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
            for call in ast.walk(function)
            if isinstance(call, ast.Call)
        }
        if not called & NODE_STARTERS:
            continue
        decorators = set().union(*(_names(d) for d in function.decorator_list))
        if "fixture" in decorators:
            if not starts_own_node(function.name):
                found.append(f"{path}::{function.name} (a fixture: name it *_node)")
        elif function.name.startswith("test_") and not (
            module_marked or "private_node" in decorators
        ):
            found.append(f"{path}::{function.name} (a test: mark it private_node)")
    return found


def test_every_test_that_starts_a_node_of_its_own_is_marked() -> None:
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        relative = path.relative_to(ROOT).as_posix()
        found += unmarked_node_starters(path.read_text(encoding="utf-8"), relative)
    assert found == [], (
        "tests that start RabbitMQ nodes of their own run in scripts/test-nodes, not in "
        "scripts/test; these would run in the wrong one"
    )


def test_the_node_check_catches_an_unmarked_fixture_and_test() -> None:
    source = """
import pytest
@pytest.fixture(scope="module")
def managed():
    with RabbitMQNode() as started:
        yield started
@pytest.fixture
def tls_node():
    yield from private_node(tls=True)
def test_inline():
    with RabbitMQNode() as node:
        pass
@pytest.mark.private_node
def test_marked():
    RabbitMQNode().start()
def test_uses(tls_node):
    pass
"""
    assert unmarked_node_starters(source, "t.py") == [
        "t.py::managed (a fixture: name it *_node)",
        "t.py::test_inline (a test: mark it private_node)",
    ]
    assert (
        unmarked_node_starters(
            "pytestmark = pytest.mark.private_node\n"
            + source.replace("def managed", "def managed_node"),
            "t.py",
        )
        == []
    )


def test_the_checks_catch_a_misplaced_folder_and_a_misnamed_file(tmp_path: Path) -> None:
    (tmp_path / "src" / "consumer").mkdir(parents=True)
    for folder in ("consumer", "consumers", "reliability", "support"):
        (tmp_path / "tests" / folder).mkdir(parents=True)
    assert folders_without_package(tmp_path / "tests", tmp_path / "src") == ["tests/consumers"]
    assert misnamed_tiers(
        [
            ("tests/consumer/test_handler.py", False),
            ("tests/consumer/test_decorator.py", True),
            ("tests/consumer/test_decorator.py", False),
            ("tests/consumer/test_router_broker.py", True),
            ("tests/reliability/test_crash.py", True),
            ("tests/test_topology.py", True),
        ]
    ) == ["tests/consumer/test_decorator.py", "tests/test_topology.py"]
