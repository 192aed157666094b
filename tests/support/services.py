"""Start a service command as a real process and read its health and metrics ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import delayed_retry

SRC = Path(delayed_retry.__file__).resolve().parent.parent
"""The ``src`` folder this test run imports; the child processes import the same tree."""


_MAIN = "import sys; from delayed_retry.cli import main; sys.exit(main())"


def start_command(
    args: Sequence[str], *, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``delayed-retry ARGS`` in a new process, its output (both streams) in one text pipe."""
    return subprocess.Popen(
        [sys.executable, "-c", _MAIN, *args],
        env={**os.environ, **(env or {}), "PYTHONPATH": str(SRC), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def lines_until_running(proc: subprocess.Popen[str]) -> list[str]:
    """The lines a command from :func:`start_command` prints up to the one that says it is
    running; fails with the exit code if it exits first. Reads from the pipe: call it with
    ``asyncio.to_thread`` from a test that serves the command meanwhile."""
    assert proc.stdout is not None, "start the command with start_command: its output is piped"
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if "running" in line:
            return lines
    output = "\n".join(lines)
    raise AssertionError(f"the command exited with {proc.wait()} before running:\n{output}")


def get(port: int, path: str, *, host: str = "127.0.0.1") -> tuple[int | None, str]:
    """(status, body) of ``GET http://host:port/path``; status ``None`` when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (OSError, urllib.error.URLError) as exc:
        return None, repr(exc)


def wait_status(
    port: int,
    path: str,
    status: int,
    *,
    timeout: float = 60.0,
    proc: subprocess.Popen[str] | None = None,
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """Poll until ``path`` answers ``status``; its JSON body. Fails naming the last answer."""
    deadline = time.monotonic() + timeout
    last: tuple[int | None, str] = (None, "")
    while time.monotonic() < deadline:
        last = get(port, path, host=host)
        if last[0] == status:
            body: dict[str, Any] = json.loads(last[1])
            return body
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the service exited with {proc.returncode}:\n{output}")
        time.sleep(0.05)
    raise AssertionError(f"{path} on port {port} did not answer {status} in {timeout} s: {last}")


def wait_readiness(
    port: int,
    accept: Callable[[int, dict[str, Any]], bool],
    *,
    what: str,
    timeout: float = 60.0,
    proc: subprocess.Popen[str] | None = None,
) -> dict[str, Any]:
    """Poll ``/readyz`` until ``accept(status, body)``; its JSON body. Fails naming ``what``."""
    deadline = time.monotonic() + timeout
    last: tuple[int | None, str] = (None, "")
    while time.monotonic() < deadline:
        last = get(port, "/readyz")
        if last[0] in (200, 503):
            body: dict[str, Any] = json.loads(last[1])
            if accept(last[0], body):
                return body
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the service exited with {proc.returncode}:\n{output}")
        time.sleep(0.05)
    raise AssertionError(f"/readyz on port {port}: not {what} in {timeout} s: {last}")


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of the Prometheus series ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            return float(value)
    return None


def stop(proc: subprocess.Popen[str], *, timeout: float = 30.0) -> tuple[int, float, str]:
    """SIGTERM ``proc``; (exit code, seconds it took, its whole output)."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError(f"no exit {timeout} s after SIGTERM:\n{output}") from None
    return proc.returncode, time.monotonic() - began, output
