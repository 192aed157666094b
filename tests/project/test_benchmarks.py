"""The benchmark suite's registry loads, and every workload the docs name is in it.

Pure: runs ``benchmarks/suite.py --list`` (imports every workload module, starts no
broker) and reads ``docs/``. A figure in the docs names the command that reproduces it;
a command naming a workload the suite does not have would reproduce nothing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ONLY = re.compile(r"benchmarks/run\b[^`\n]*?--only((?: [a-z][a-z0-9-]*)+)")
HISTORY = "73f1787"
"""The commit that holds the removed experiments; a command quoted as run there is history."""


def _registered() -> set[str]:
    listing = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "suite.py"), "--list"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


def _named_in_docs() -> dict[str, set[str]]:
    named: dict[str, set[str]] = {}
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for line in page.read_text().splitlines():
            if HISTORY in line:
                continue
            for match in ONLY.finditer(line):
                for name in match.group(1).split():
                    named.setdefault(name, set()).add(page.name)
    return named


def test_every_workload_module_loads_and_lists() -> None:
    registered = _registered()
    assert {"overhead", "throughput", "precision", "hops", "capacity"} <= registered


def test_every_workload_the_docs_name_is_registered() -> None:
    registered = _registered()
    named = _named_in_docs()
    assert named, "no `benchmarks/run --only NAME` found in the docs"
    unknown = {name: sorted(pages) for name, pages in named.items() if name not in registered}
    assert unknown == {}, "workloads the docs name that benchmarks/workloads.py does not have"
