"""What the built wheel carries: the library and its test fake, never the broker harness.

Builds the wheel from the checkout with ``python -m build --wheel`` (as
``scripts/package-check`` does from the sdist) and reads its file list.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"


def harness_modules() -> set[str]:
    """The broker harness's module files (``node.py``, ``chroot.py`` …), from ``harness/``."""
    return {p.name for p in HARNESS.glob("*.py")} - {"__init__.py"}


def harness_files(names: Iterable[str]) -> list[str]:
    """Those of a wheel's ``names`` that are the broker harness, wherever they sit in it."""
    modules = harness_modules()
    return sorted(
        name
        for name in names
        if name.startswith("harness/")
        or (name.startswith("delayed_retry/testing/") and Path(name).name in modules)
    )


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, f"python -m build --wheel failed:\n{build.stdout}{build.stderr}"
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_harness_is_the_one_the_check_looks_for() -> None:
    # The check below is only as good as this list: it must name the modules that start
    # brokers, so that one moved back into the package would be seen.
    assert {"node.py", "cluster.py", "chroot.py", "ports.py", "probe.py"} <= harness_modules()


def test_the_check_finds_harness_files_wherever_they_are() -> None:
    names = [
        "delayed_retry/__init__.py",
        "delayed_retry/testing/fake.py",
        "delayed_retry/testing/node.py",
        "delayed_retry/testing/chroot.py",
        "harness/__init__.py",
    ]
    assert harness_files(names) == [
        "delayed_retry/testing/chroot.py",
        "delayed_retry/testing/node.py",
        "harness/__init__.py",
    ]


def test_the_wheel_carries_no_broker_harness(wheel_names: set[str]) -> None:
    assert harness_files(wheel_names) == []
    assert not [n for n in wheel_names if Path(n).name in harness_modules()], (
        "a module named like the broker harness's is in the wheel"
    )


def test_the_wheel_carries_the_testing_fake(wheel_names: set[str]) -> None:
    assert {
        "delayed_retry/testing/__init__.py",
        "delayed_retry/testing/fake.py",
        "delayed_retry/py.typed",
    } <= wheel_names
    testing = sorted(n for n in wheel_names if n.startswith("delayed_retry/testing/"))
    assert testing == ["delayed_retry/testing/__init__.py", "delayed_retry/testing/fake.py"]
