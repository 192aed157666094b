"""Debian's headless Chromium, for the tests that render a page (the web view, the Spark report)."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""Flags for a headless run as root in a container or CI, with nothing fetched from the network."""


def chromium() -> str:
    """The path of the ``chromium`` executable; fails the test naming the fix when it is missing."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed; run scripts/bootstrap (apt-get install chromium)")
    return found
