"""Fixtures for the PySpark tests: one local-mode SparkSession, helpers to build archives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delayed_retry.spark.session import get_spark


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession for the whole run (quiet, no UI, few shuffle partitions)."""
    session = get_spark(
        master="local[2]",
        config={
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.driver.memory": "1g",
        },
    )
    yield session
    session.stop()
