"""The chroots that hold newer RabbitMQ releases: their recipes, the build, one real 4.3 boot."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from harness import BrokerHarnessError, RabbitMQNode, chroot
from harness.chroot import (
    RELEASES,
    BrokerRelease,
    debootstrap_command,
    ensure_chroot,
    write_files,
)
from tests.support.nodes import private_node


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """A debootstrap scripts folder like bookworm's: trixie and sid, no forky."""
    folder = tmp_path / "scripts"
    folder.mkdir()
    for name in ("trixie", "sid"):
        (folder / name).write_text("# a debootstrap script\n")
    return folder


def test_4_0_is_built_from_trixie_with_its_own_script(scripts: Path, tmp_path: Path) -> None:
    command = debootstrap_command(RELEASES["4.0"], tmp_path / "root", scripts=scripts)
    assert command == [
        "debootstrap",
        "--variant=minbase",
        "--include=rabbitmq-server",
        "trixie",
        str(tmp_path / "root"),
        "http://deb.debian.org/debian",
    ]
    assert RELEASES["4.0"].root.name == "rabbitmq-4.0-trixie"


def test_4_3_is_built_from_forky_with_the_sid_script_where_debootstrap_lacks_forky(
    scripts: Path, tmp_path: Path
) -> None:
    release = RELEASES["4.3"]
    assert release.root.name == "rabbitmq-4.3-forky"
    command = debootstrap_command(
        release,
        tmp_path / "root",
        debootstrap="/usr/sbin/debootstrap",
        mirror="http://mirror.example/debian",
        scripts=scripts,
    )
    assert command == [
        "/usr/sbin/debootstrap",
        "--variant=minbase",
        "--include=rabbitmq-server",
        "forky",
        str(tmp_path / "root"),
        "http://mirror.example/debian",
        str(scripts / "sid"),
    ]
    # A debootstrap that knows forky uses its own script.
    (scripts / "forky").write_text("# a debootstrap script\n")
    assert debootstrap_command(release, tmp_path / "root", scripts=scripts)[-1] == (
        "http://deb.debian.org/debian"
    )


def test_4_3_chroot_resolves_localhost(tmp_path: Path) -> None:
    # Without /etc/hosts the 4.3 node stops at boot: epmd_error "localhost" nxdomain.
    (tmp_path / "etc").mkdir()
    write_files(RELEASES["4.3"], tmp_path)
    lines = [line.split() for line in (tmp_path / "etc/hosts").read_text().splitlines()]
    assert ["127.0.0.1", "localhost"] in lines
    write_files(RELEASES["4.0"], tmp_path / "other")  # trixie's netbase writes its own
    assert not (tmp_path / "other").exists()


def test_unknown_version_names_the_known_ones() -> None:
    with pytest.raises(BrokerHarnessError, match=r"'4\.9'.*\['4\.0', '4\.3'\]"):
        ensure_chroot("4.9")


def test_build_writes_the_extra_files_before_marking_the_chroot_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole build with a stand-in debootstrap that records its arguments."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "debootstrap"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'mkdir -p "$4/usr/lib/rabbitmq/bin" "$4/etc"\n'
        'touch "$4/usr/lib/rabbitmq/bin/rabbitmq-server"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(chroot, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the build needs root
    release = BrokerRelease(
        version="9.9", suite="nowhere", script="sid", files=(("etc/hosts", "127.0.0.1 x\n"),)
    )
    monkeypatch.setitem(RELEASES, "9.9", release)

    root = ensure_chroot("9.9")
    assert root == tmp_path / "cache" / "rabbitmq-9.9-nowhere"
    assert (root / "etc/hosts").read_text() == "127.0.0.1 x\n"
    assert (root / ".delayed-retry-complete").read_text() == "9.9\n"
    (args,) = calls.read_text().splitlines()
    assert args.split()[:4] == [
        "--variant=minbase",
        "--include=rabbitmq-server",
        "nowhere",
        f"{root}.building",
    ]
    assert args.endswith("/sid")
    assert ensure_chroot("9.9") == root  # cached: debootstrap is not run again
    assert len(calls.read_text().splitlines()) == 1


@pytest.fixture(scope="module")
def chroot_node() -> Iterator[RabbitMQNode]:
    yield from private_node(version="4.3")


@pytest.mark.broker
@pytest.mark.private_node
async def test_a_4_3_node_boots_in_its_chroot_and_serves(chroot_node: RabbitMQNode) -> None:
    assert chroot_node.root == RELEASES["4.3"].root
    connection = await aio_pika.connect(chroot_node.url)
    async with connection:
        assert connection.transport is not None
        version = connection.transport.connection.server_properties["version"]
        assert str(version).startswith("4.3."), version
        channel = await connection.channel()
        queue = await channel.declare_queue(
            "t-chroot-4-3", durable=True, arguments={"x-queue-type": "quorum"}
        )
        await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=queue.name)
        message = await queue.get(no_ack=True, timeout=10)
        assert message.body == b"x"
        await queue.delete(if_unused=False, if_empty=False)
    assert "t-chroot-4-3" not in chroot_node.rabbitmqctl("list_queues", "name")
