"""Free TCP ports for private nodes, claimed machine-wide so parallel test runs never share one."""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import socket
import tempfile
import threading
import time
from pathlib import Path

# Ports no private node may take: epmd, the usual AMQP and dist ports, and the
# range rabbitmqctl itself listens on while it runs.
_RESERVED_PORTS = frozenset({4369, 5671, 5672, 15672, 25672, *range(35672, 35683)})
_claimed_ports: set[int] = set()
_claimed_lock = threading.Lock()
_CLAIMS_DIR = Path(tempfile.gettempdir()) / "delayed-retry-ports"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a free TCP port on 127.0.0.1 that no other node on this machine has claimed.

    Ports come from below the kernel's ephemeral range, so an outgoing
    connection cannot grab a node's port between a kill and a restart; a
    claim file per port keeps other test processes off it meanwhile too.
    Give a port back with :func:`release_port`.
    """
    low, _ = _ephemeral_range()
    top = min(low - 1, 32000)
    with _claimed_lock:
        if top > 10000:
            for _ in range(500):
                port = random.randint(10000, top)
                if port in _RESERVED_PORTS or port in _claimed_ports:
                    continue
                if _port_is_free(port) and _claim(port):
                    _claimed_ports.add(port)
                    return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        _claimed_ports.add(port)
        return port


def release_port(port: int) -> None:
    """Give back a port from :func:`free_port` once nothing will listen on it again."""
    with _claimed_lock:
        _claimed_ports.discard(port)
        path = _CLAIMS_DIR / str(port)
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == os.getpid():
                path.unlink()


def _claim(port: int) -> bool:
    """Claim ``port`` machine-wide with an exclusive file; claims of dead pids are taken over."""
    path = _CLAIMS_DIR / str(port)
    for _ in range(2):
        try:
            _CLAIMS_DIR.mkdir(mode=0o777, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _claim_is_stale(path):
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        except OSError:
            return True  # no shared folder to claim in: rely on the bind check alone
        with os.fdopen(fd, "w") as claim:
            claim.write(str(os.getpid()))
        return True
    return False


def _claim_is_stale(path: Path) -> bool:
    try:
        owner = int(path.read_text())
    except ValueError:
        # Being written right now, or left empty by a crash long ago.
        with contextlib.suppress(OSError):
            return time.time() - path.stat().st_mtime > 10
        return True
    except OSError:
        return True
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@atexit.register
def _release_claimed_ports() -> None:
    for port in list(_claimed_ports):
        release_port(port)
