"""The soak as a marked test, outside the normal run: ``pytest -m soak tests/reliability``.

Runs ``benchmarks/soak.py`` (10 minutes by default; ``SOAK_MINUTES`` to shorten)
and fails when it reports a lost message or consumer memory growth.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).parents[2] / "benchmarks" / "soak.py"


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_soak_loses_nothing_and_does_not_grow() -> None:
    minutes = os.environ.get("SOAK_MINUTES", "10")
    result = subprocess.run(
        [sys.executable, str(SOAK), "--minutes", minutes],
        capture_output=True,
        text=True,
        check=False,
        timeout=float(minutes) * 60 + 900,
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "SOAK PASSED" in result.stdout
