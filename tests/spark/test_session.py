"""Session sizing: shuffle partitions from the input's size, the local driver's heap (pure)."""

from __future__ import annotations

import io

import pytest

from delayed_retry.spark.session import (
    QUICK_START_BYTES,
    QUICK_START_JAVA_OPTIONS,
    local_driver_memory,
    progress,
    quick_start_options,
    shuffle_partitions_for,
)

MB = 1024 * 1024
GB = 1024 * MB


@pytest.mark.parametrize(
    ("input_bytes", "cores", "partitions"),
    [
        (24 * 1024, 2, 4),  # a 10-row archive: two per core, merged further by AQE
        (67 * MB, 2, 5),  # 1,000,000 synthetic rows: ~268 MB decompressed, 64 MB each
        (670 * MB, 2, 42),  # 10,000,000 rows
        (0, 8, 16),
    ],
)
def test_shuffle_partitions_follow_the_input_size(
    input_bytes: int, cores: int, partitions: int
) -> None:
    assert shuffle_partitions_for(input_bytes, cores=cores) == partitions


@pytest.mark.parametrize(
    ("total", "heap"), [(2 * GB, "1g"), (8 * GB, "2g"), (24 * GB, "6g"), (256 * GB, "8g")]
)
def test_the_local_driver_gets_a_quarter_of_the_machine_within_bounds(
    total: int, heap: str
) -> None:
    assert local_driver_memory(total) == heap


@pytest.mark.parametrize(
    ("master", "size", "quick"),
    [
        ("local[*]", 40_000, True),
        ("local[2]", QUICK_START_BYTES, True),
        ("local[*]", QUICK_START_BYTES + 1, False),  # a large input pays for the optimiser
        ("local[*]", None, False),  # size unknown: the JVM's defaults
        ("spark://host:7077", 40_000, False),  # a cluster's executors are not ours to tune
    ],
)
def test_a_small_local_input_starts_a_jvm_for_a_short_run(
    master: str, size: int | None, quick: bool
) -> None:
    expected = QUICK_START_JAVA_OPTIONS if quick else None
    assert quick_start_options(master, input_bytes=size) == expected


class _Never:
    def sparkContext(self) -> None:
        raise AssertionError("progress off: Spark is not asked")


def test_progress_writes_nothing_to_a_stream_that_is_not_a_terminal() -> None:
    out = io.StringIO()
    with progress(_Never(), "analyzing", stream=out):
        pass
    assert out.getvalue() == ""
