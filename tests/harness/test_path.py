"""The broker harness is importable by whatever runs with the checkout's Python, from anywhere.

pytest puts the checkout's root on the path by itself; the examples, benchmarks and scripts
have only the editable install (``dev-mode-dirs`` in ``pyproject.toml``). So these checks run
in a process of their own, started in a folder outside the checkout. No broker: the examples
are loaded, not run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p for p in (ROOT / "examples").glob("*.py") if "from harness import" in p.read_text()
)


def run_outside(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_harness_is_imported_from_the_checkout(tmp_path: Path) -> None:
    run = run_outside(
        """
        import harness
        print(harness.__file__)
        """,
        tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()) == ROOT / "harness" / "__init__.py"


def test_some_examples_start_their_broker_with_the_harness() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"demo.py", "tracing_and_alerts.py"} <= names, names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_example_loads_outside_the_checkout(example: Path, tmp_path: Path) -> None:
    run = run_outside(
        f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("example", {str(example)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # defines, never runs: __name__ is not "__main__"
        print(module.broker_url.__module__)
        """,
        tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "harness.broker"
