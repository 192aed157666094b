"""A cached Debian chroot holding a newer RabbitMQ, for running a private 4.x node.

Use it through :class:`~harness.node.RabbitMQNode` (``version="4.0"`` or
``"4.3"``) or the ``DELAYED_RETRY_TEST_RABBITMQ`` environment variable; call
:func:`ensure_chroot` directly only to build the cache ahead of a test run.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .probe import BrokerHarnessError

log = logging.getLogger(__name__)

CACHE_DIR = Path(os.environ.get("DELAYED_RETRY_CACHE_DIR", "/var/cache/delayed-retry"))
"""Where built chroots are kept between runs (override with ``DELAYED_RETRY_CACHE_DIR``)."""

DEFAULT_MIRROR = "http://deb.debian.org/debian"

VERSION_ENV = "DELAYED_RETRY_TEST_RABBITMQ"
"""Environment variable naming the RabbitMQ version private test nodes run (``4.0``, ``4.3``)."""

DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
"""Where debootstrap keeps one script per suite it knows."""


@dataclass(frozen=True, kw_only=True)
class BrokerRelease:
    """A RabbitMQ release that a Debian suite ships, and how to build its chroot.

    ``script`` names the debootstrap script to use when the host's debootstrap
    has none for ``suite`` (bookworm's knows no suite newer than trixie; the
    ``sid`` script builds any newer one). ``files`` are written into the chroot
    (path relative to its root, content) after debootstrap and before the node
    first boots.
    """

    version: str
    suite: str
    script: str | None = None
    files: tuple[tuple[str, str], ...] = ()

    @property
    def root(self) -> Path:
        return CACHE_DIR / f"rabbitmq-{self.version}-{self.suite}"


RELEASES = {
    release.version: release
    for release in (
        BrokerRelease(version="4.0", suite="trixie"),
        BrokerRelease(
            version="4.3",
            suite="forky",
            script="sid",
            # No /etc/hosts here (trixie's comes from netbase, which forky's chroot
            # lacks); without it the node stops at boot: epmd_error "localhost" nxdomain.
            files=(("etc/hosts", "127.0.0.1\tlocalhost\n"),),
        ),
    )
}
"""Versions :func:`ensure_chroot` can build (3.10 is the host's own package, no chroot)."""


def debian_mirror() -> str:
    """The Debian mirror named in the host's apt sources, else deb.debian.org."""
    sources = [*sorted(Path("/etc/apt/sources.list.d").glob("*")), Path("/etc/apt/sources.list")]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"]:
                uri = next((w for w in words[1:] if "://" in w), None)
                if uri and "security" not in uri:
                    return uri
    return DEFAULT_MIRROR


def debootstrap_command(
    release: BrokerRelease,
    target: Path,
    *,
    debootstrap: str = "debootstrap",
    mirror: str = DEFAULT_MIRROR,
    scripts: Path = DEBOOTSTRAP_SCRIPTS,
) -> list[str]:
    """The debootstrap command line that builds ``release`` into ``target``.

    The release's fallback script is passed only when ``scripts`` has none named
    after its suite, so a newer debootstrap uses its own.
    """
    command = [
        debootstrap,
        "--variant=minbase",
        "--include=rabbitmq-server",
        release.suite,
        str(target),
        mirror,
    ]
    if release.script is not None and not (scripts / release.suite).exists():
        command.append(str(scripts / release.script))
    return command


def write_files(release: BrokerRelease, root: Path) -> None:
    """Write the release's extra files into the chroot at ``root``."""
    for relative, content in release.files:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def ready(release: BrokerRelease) -> bool:
    """True when the chroot for ``release`` is built and complete."""
    return (release.root / ".delayed-retry-complete").exists()


def ensure_chroot(version: str, *, timeout: float = 1200.0) -> Path:
    """Return the root of a chroot with RabbitMQ ``version``, building it once if missing.

    The build runs ``debootstrap`` (a few minutes, about 360 MB) into a temporary
    folder beside the cache and renames it into place, under a file lock, so
    concurrent test runs build it once and never see half a chroot.
    """
    release = RELEASES.get(version)
    if release is None:
        raise BrokerHarnessError(
            f"no chroot recipe for RabbitMQ {version!r}; known versions: {sorted(RELEASES)}"
        )
    if ready(release):
        return release.root
    if os.geteuid() != 0:
        raise BrokerHarnessError(
            f"building the RabbitMQ {version} chroot at {release.root} needs root "
            "(debootstrap and chroot); run the tests as root or build it once with "
            f"`python -m harness.chroot {version}` as root"
        )
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise BrokerHarnessError(
            f"debootstrap is missing, so the RabbitMQ {version} chroot cannot be built; "
            "install it with `apt-get install debootstrap`"
        )
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    lock_path = CACHE_DIR / f".{release.root.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready(release):
            return release.root
        building = release.root.with_name(release.root.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(release.root, ignore_errors=True)
        command = debootstrap_command(
            release, building, debootstrap=debootstrap, mirror=debian_mirror()
        )
        log.info("building RabbitMQ %s chroot: %s", version, " ".join(command))
        began = time.monotonic()
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise BrokerHarnessError(
                f"`{' '.join(command)}` failed with code {result.returncode}; its output ends:\n"
                + "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            )
        server = building / "usr/lib/rabbitmq/bin/rabbitmq-server"
        if not server.exists():
            raise BrokerHarnessError(
                f"the {release.suite} chroot at {building} has no {server.name}; "
                "delete it and check the Debian mirror"
            )
        write_files(release, building)
        (building / ".delayed-retry-complete").write_text(f"{version}\n")
        building.rename(release.root)
        log.info("RabbitMQ %s chroot built in %.0f s", version, time.monotonic() - began)
    return release.root


def _mounted(path: Path) -> bool:
    target = str(path.resolve())
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


def ensure_mounts(root: Path) -> None:
    """Mount ``proc`` and bind ``/dev`` into ``root`` unless already there (the node needs both).

    The mounts stay for later runs; they hold nothing but the host's own views.
    """
    with (root.parent / f".{root.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for target, command in (
            (root / "proc", ["mount", "-t", "proc", "proc", str(root / "proc")]),
            (root / "dev", ["mount", "--bind", "/dev", str(root / "dev")]),
        ):
            if _mounted(target):
                continue
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise BrokerHarnessError(
                    f"`{' '.join(command)}` failed ({result.stderr.strip()}); a RabbitMQ node "
                    f"in the chroot {root} needs it: run the tests as root"
                )


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    sys.stdout.write(f"{ensure_chroot(sys.argv[1] if len(sys.argv) > 1 else '4.0')}\n")
