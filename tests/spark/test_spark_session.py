"""Session sizing: shuffle partitions from the input's size, the local driver's heap (pure)."""

from __future__ import annotations

import pytest

from delayed_retry.spark.session import local_driver_memory, shuffle_partitions_for

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
