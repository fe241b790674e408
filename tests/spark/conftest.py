"""The one SparkSession of a test run (``local[2]``, tasks retried up to 4 times), made
on first use and stopped at the end; the tests that use it are marked ``spark``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pyspark = pytest.importorskip("pyspark", reason="the [spark] extra is not installed")
    # Spark's Python workers must run this interpreter (it has the package installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        pyspark.sql.SparkSession.builder.master("local[2,4]")  # 4 attempts per task
        .appName("pykka-delivery-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
