"""Fixtures for the PySpark tests: one local-mode SparkSession, a standalone cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delayed_retry.spark.session import get_spark
from tests.support.spark_standalone import SparkStandalone, SparkStandaloneError


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "spark" in fixtures or "spark_standalone" in fixtures:
            item.add_marker(pytest.mark.spark)
        if "spark_standalone" in fixtures:
            item.add_marker(pytest.mark.spark_cluster)


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


@pytest.fixture(scope="module")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    """A Spark standalone master and two 1-core workers on loopback, stopped after the module."""
    cluster = SparkStandalone(folder=tmp_path_factory.mktemp("spark-standalone"))
    try:
        try:
            cluster.start()
        except SparkStandaloneError as exc:
            pytest.fail(f"could not start a Spark standalone cluster: {exc}", pytrace=False)
        yield cluster
    finally:
        # Whatever failed, every JVM started so far is stopped.
        cluster.stop()
