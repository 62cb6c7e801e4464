"""Shared fixtures: one real SparkSession for the whole test session."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local SparkSession with the ``delta`` format, shared by every test.

    Starting a JVM costs seconds, so the whole suite shares one; Dagster runs
    made in-process pick it up through ``getOrCreate``.
    """
    from pyspark.sql import SparkSession

    from medallion_assets.delta import enable_delta

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("medallion-assets-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    enable_delta(session)
    yield session
    session.stop()
