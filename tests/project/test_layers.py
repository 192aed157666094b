"""The layers of the package, as contracts on its import graph (see docs/architecture.md).

- The vocabulary (every module at the top of the package, and in a folder that is
  not a layer: ``chain/``, ``recovery/``, ``rabbitmq/``, ``headers/``)
  and the few pure modules inside the layers import no I/O library, directly or
  through another module.
- Every folder imports only itself and the folders below it: ``amqp/`` knows
  only the vocabulary; ``consumer/`` nothing of ``delivery/``, ``parking/`` or
  ``admin/``; the command line sits on top of everything.
- Nothing in the package imports the broker harness (``harness/``), which the
  wheel does not carry.

Modules that appear later are checked as soon as they exist: the layer of a
module comes from its folder, and a new module outside the layers is pure by place.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import grimp
import pytest

PACKAGE = "delayed_retry"

PURE_IN_SUBPACKAGES = (
    "consumer.rejections",
    "consumer.startup",
    "parking.records",
    "parking.moving.report",
    "parking.moving.canary_rules",
    "parking.ids",
    "parking.fingerprint",
    "admin.live_chain",
    "admin.chain_bindings",
    "admin.chain_diff",
    "admin.other_chains",
    "admin.waiting",
)
"""Pure modules inside a layer, beside the I/O they serve. Every module outside the layers
(``delayed_retry.<name>``, and the modules of a folder not in :data:`LAYERS`: ``chain/``,
``recovery/``, ``rabbitmq/``, ``headers/``) is pure too: the vocabulary."""

HARNESS = "harness"
"""The repository's broker harness (``harness/``): tests, benchmarks and the demo script use it;
the package never does, since the wheel does not carry it."""

IO_LIBRARIES = (
    "aio_pika",
    "aiormq",
    "pamqp",
    "opentelemetry",
    "aiohttp",
    "pyspark",
    "pyarrow",
    "faststream",
)

LAYERS = (
    "cli",
    "testing",
    "web",
    "faststream",
    "spark",
    "alerts",
    "admin",
    "parking",
    "delivery",
    "consumer",
    "observability",
    "amqp",
)
"""Subpackages above the pure vocabulary, highest first; the modules outside them are the
vocabulary, at the bottom. So ``consumer/`` imports nothing from ``delivery/``,
``parking/`` or ``admin/``, and ``amqp/`` nothing but the vocabulary."""


def layer_of(module: str, package: str = PACKAGE) -> int:
    """0 for the command line, rising downwards; the vocabulary is ``len(LAYERS)``."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return len(LAYERS)


def pure_modules(graph: grimp.ImportGraph, package: str = PACKAGE) -> list[str]:
    """The modules outside the layers (the vocabulary) and :data:`PURE_IN_SUBPACKAGES`."""
    vocabulary = [
        m for m in graph.modules if m.startswith(f"{package}.") and m.split(".")[1] not in LAYERS
    ]
    named = [f"{package}.{name}" for name in PURE_IN_SUBPACKAGES]
    return sorted(set(vocabulary) | {m for m in named if m in graph.modules})


def pure_violations(graph: grimp.ImportGraph, package: str = PACKAGE) -> list[str]:
    """Each chain from a pure module to an I/O library, as ``a -> b -> aio_pika``."""
    found = []
    for module in pure_modules(graph, package):
        for library in IO_LIBRARIES:
            if library in graph.modules:
                chain = graph.find_shortest_chain(importer=module, imported=library)
                if chain:
                    found.append(" -> ".join(chain))
    return found


def layer_violations(graph: grimp.ImportGraph, package: str = PACKAGE) -> list[str]:
    """Each direct import of a higher layer, as ``importer -> imported (line)``.

    The package's ``__init__`` is the public facade and may re-export from any
    layer; no module in the package imports it, which is checked too (importing
    it would pull every layer in).
    """
    found = []
    for importer in sorted(m for m in graph.modules if m.startswith(f"{package}.")):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported == package:
                found.append(f"{importer} -> {package} (the facade; import the module instead)")
            elif imported.startswith(f"{package}.") and layer_of(imported) < layer_of(importer):
                lines = graph.get_import_details(importer=importer, imported=imported)
                where = ", ".join(f"line {d['line_number']}" for d in lines)
                found.append(f"{importer} -> {imported} ({where})")
    return found


def harness_importers(graph: grimp.ImportGraph, package: str = PACKAGE) -> list[str]:
    """Each module of the package that imports the broker harness, which the wheel lacks."""
    if HARNESS not in graph.modules:
        return []
    found = []
    for importer in sorted(graph.find_modules_that_directly_import(HARNESS)):
        if importer.startswith(f"{package}."):
            lines = graph.get_import_details(importer=importer, imported=HARNESS)
            where = ", ".join(f"line {d['line_number']}" for d in lines)
            found.append(f"{importer} -> {HARNESS} ({where})")
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, include_external_packages=True, cache_dir=None)


def test_the_pure_core_imports_no_io_library(graph: grimp.ImportGraph) -> None:
    assert pure_violations(graph) == [], (
        "a pure module reaches an I/O library; move the I/O next to its caller"
    )


def test_the_instrumentation_protocol_does_not_reach_opentelemetry(
    graph: grimp.ImportGraph,
) -> None:
    # The protocol stays apart from its implementation: the default instrumentation is
    # built in observability/otel.py, which imports the protocol, never the reverse.
    chain = graph.find_shortest_chain(
        importer=f"{PACKAGE}.observability.instrumentation", imported="opentelemetry"
    )
    assert chain is None, " -> ".join(chain or ())


def test_each_layer_imports_only_itself_and_the_layers_below(graph: grimp.ImportGraph) -> None:
    assert layer_violations(graph) == [], "a module imports a layer above it"


def test_the_package_does_not_import_the_broker_harness(graph: grimp.ImportGraph) -> None:
    assert harness_importers(graph) == [], (
        "a module imports the broker harness, which the wheel does not carry; keep what users "
        "need in delayed_retry.testing, and start brokers in tests, scripts or examples"
    )


def test_the_contracts_catch_a_violation(tmp_path: Path) -> None:
    # A small package that breaks both contracts, checked in a process of its own
    # (grimp imports nothing, but finds packages on sys.path).
    root = tmp_path / "layered"
    for folder in ("", "cli", "alerts", "names"):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    (root / "cli" / "main.py").write_text("X = 1\n")
    (root / "alerts" / "sinks.py").write_text("import aiohttp\n")
    (root / "headers.py").write_text("from layered import policy\n")
    (root / "names" / "wire.py").write_text("import aiohttp\n")  # a vocabulary folder
    (root / "policy.py").write_text("from layered.alerts import sinks\n")
    (root / "middleware.py").write_text("from layered.cli.main import X\n")
    (root / "cli" / "demo.py").write_text("import json\n\nfrom harness import broker_url\n")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(Path(__file__).parents[2])!r}]
        import grimp
        from tests.project.test_layers import harness_importers, layer_violations, pure_violations
        graph = grimp.build_graph("layered", include_external_packages=True, cache_dir=None)
        for line in (
            pure_violations(graph, "layered")
            + layer_violations(graph, "layered")
            + harness_importers(graph, "layered")
        ):
            print(line)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert sorted(out) == [
        "layered.cli.demo -> harness (line 3)",
        "layered.headers -> layered.policy -> layered.alerts.sinks -> aiohttp",
        "layered.middleware -> layered.cli.main (line 1)",
        "layered.names.wire -> aiohttp",
        "layered.policy -> layered.alerts.sinks (line 1)",
        "layered.policy -> layered.alerts.sinks -> aiohttp",
    ]


def test_no_module_imports_one_that_imports_it_back(graph: grimp.ImportGraph) -> None:
    """No import cycle between modules, imports inside functions included (a deferred import
    hides a cycle from Python, not from a reader). A package's ``__init__`` is a facade that
    re-exports its modules, so the chains do not go through packages."""
    ours = {m for m in graph.modules if m.split(".")[0] == PACKAGE}
    packages = {m for m in ours if graph.find_children(m)}
    edges = {
        m: {
            n for n in graph.find_modules_directly_imported_by(m) if n in ours and n not in packages
        }
        for m in ours - packages
    }

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for n in edges.get(todo.pop(), ()):
                if n == goal:
                    return True
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return False

    cycles = sorted((m, n) for m, imported in edges.items() for n in imported if reaches(n, m))
    assert edges, "no modules read: the check would pass on anything"
    assert cycles == [], (
        f"import cycles (module, a module it imports that imports it back): {cycles}"
    )


PAIRED = ("hold", "immediate", "crash_guard", "throttle")
"""Ideas with a pure half in ``recovery/`` and a broker half in ``consumer/``, of one name."""


def test_each_pure_half_and_its_broker_half_share_a_name(graph: grimp.ImportGraph) -> None:
    """``recovery/<idea>.py`` decides without a broker, ``consumer/<idea>.py`` acts it out: a
    reader finds one from the other by name, so a rename of one half renames the other."""
    missing = [
        f"{half}/{idea}.py"
        for idea in PAIRED
        for half in ("recovery", "consumer")
        if f"{PACKAGE}.{half}.{idea}" not in graph.modules
    ]
    assert missing == [], (
        f"an idea lost one of its halves: {missing}; name the pure half and the broker half alike"
    )
