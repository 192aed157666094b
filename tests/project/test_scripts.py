"""The checkout's scripts: what each one sets up for its purpose.

Runs the real scripts in this checkout, with ``apt-get`` and ``debootstrap``
replaced by stand-ins on ``PATH`` that record being called: a script that
installs what its purpose does not need is caught without installing anything.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _recording_path(tmp_path: Path) -> tuple[dict[str, str], Path]:
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("apt-get", "debootstrap"):
        stand_in = bin_dir / name
        stand_in.write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\nexit 1\n')
        stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return env, calls


def test_the_docs_bootstrap_installs_nothing_but_the_docs_needs(tmp_path: Path) -> None:
    env, calls = _recording_path(tmp_path)
    done = subprocess.run(
        [str(ROOT / "scripts" / "bootstrap"), "--docs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "ready for the documentation site" in done.stderr + done.stdout
    assert not calls.exists(), calls.read_text()
    for not_for_docs in ("RabbitMQ", "Chromium", "Java"):
        assert not_for_docs not in done.stderr + done.stdout


def test_the_docs_script_asks_bootstrap_for_the_docs_only() -> None:
    script = (ROOT / "scripts" / "docs").read_text()
    assert "scripts/bootstrap --docs" in script
