"""Where the driver JVM's class cache lives, and how a run reads or writes it (no JVM here)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from delayed_retry.spark.class_cache import (
    ABANDONED_AFTER,
    CACHE_ENV,
    class_cache_path,
    plan_class_cache,
)


def test_the_cache_lives_in_the_users_cache_folder_and_can_be_turned_off() -> None:
    home = Path("/home/ann")
    path = class_cache_path({"PATH": os.environ.get("PATH", "")}, home=home)
    assert path is not None
    assert path.parent == Path("/home/ann/.cache/delayed-retry")
    assert path.name.startswith("spark-classes-") and path.suffix == ".jsa"
    elsewhere = class_cache_path(
        {"PATH": os.environ.get("PATH", ""), "XDG_CACHE_HOME": "/var/cache/ann"}, home=home
    )
    assert elsewhere == Path("/var/cache/ann/delayed-retry") / path.name
    for off in ("off", "OFF", "0", "no"):
        assert class_cache_path({CACHE_ENV: off}, home=home) is None


def test_another_java_gets_another_archive(tmp_path: Path) -> None:
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("")
    ours = class_cache_path({"PATH": os.environ.get("PATH", "")}, home=tmp_path)
    other = class_cache_path({"JAVA_HOME": str(java_home)}, home=tmp_path)
    assert ours is not None and other is not None and ours.name != other.name


def test_a_run_reads_an_archive_there_is_else_writes_one_under_a_name_of_its_own(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cache" / "spark-classes-abc.jsa"
    writing = plan_class_cache(path)
    assert writing.writing is not None and writing.writing.parent == path.parent
    assert writing.writing != path and writing.writing.name.endswith(".tmp")
    assert f"-XX:ArchiveClassesAtExit={writing.writing}" in writing.java_options
    assert "-Xlog:cds=off" in writing.java_options

    path.write_bytes(b"an archive")
    reading = plan_class_cache(path)
    assert reading.writing is None
    assert f"-XX:SharedArchiveFile={path}" in reading.java_options


@pytest.mark.parametrize(("age", "kept"), [(ABANDONED_AFTER + 60, False), (60, True)])
def test_a_temporary_archive_left_by_a_run_that_died_is_removed_once_old(
    tmp_path: Path, age: float, kept: bool
) -> None:
    path = tmp_path / "spark-classes-abc.jsa"
    left = tmp_path / "spark-classes-abc.jsa.4242.tmp"
    left.write_bytes(b"half an archive")
    then = time.time() - age
    os.utime(left, (then, then))
    plan_class_cache(path)
    assert left.exists() == kept  # a young one may still be being written
