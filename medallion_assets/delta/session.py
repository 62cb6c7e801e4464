"""Registering the ``delta`` data source on a SparkSession."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from medallion_assets.delta.datasource import DeltaDataSource

_NATIVE_DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_NATIVE_DELTA_SOURCE = "org.apache.spark.sql.delta.sources.DeltaDataSource"


def has_native_delta(spark: SparkSession) -> bool:
    """Whether the session already runs delta-spark, the JVM connector.

    Such a session reads and writes ``format("delta")`` natively; registering
    the Python source over it would shadow the real thing.
    """
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if _NATIVE_DELTA_EXTENSION in extensions:
        return True
    jvm = getattr(getattr(spark, "sparkContext", None), "_jvm", None) if _is_classic(spark) else None
    if jvm is None:
        return False
    try:
        jvm.java.lang.Class.forName(_NATIVE_DELTA_SOURCE)
    except Exception:
        return False
    return True


def _is_classic(spark: SparkSession) -> bool:
    return hasattr(spark, "_jsparkSession")


def use_driver_interpreter(spark: SparkSession) -> None:
    """Make Python workers run this interpreter unless the deployment chose one.

    The data source classes are pickled by reference, so workers must import
    this package: on an embedded session that means running the driver's own
    interpreter (its virtual environment), whatever ``python3`` is on PATH.
    """
    if not _is_classic(spark):
        return
    # The registered source carries the context's interpreter, which PySpark takes from
    # PYSPARK_PYTHON only: a session configured with spark.pyspark.python would otherwise
    # plan a table read by name (CREATE TABLE ... USING delta) with whatever python3 is.
    explicit = os.environ.get("PYSPARK_PYTHON") or spark.conf.get("spark.pyspark.python", None)
    spark.sparkContext.pythonExec = explicit or sys.executable


def enable_delta(spark: SparkSession) -> SparkSession:
    """Register the ``delta`` format on ``spark`` and return the session.

    A no-op when the session already has the native delta-spark connector.
    Registration is per session and cheap, so call it wherever a session is made.

    Args:
        spark: the session to enable Delta Lake on.

    Returns:
        The same session, for chaining.

    Example:
        >>> from pyspark.sql import SparkSession
        >>> from medallion_assets.delta import enable_delta
        >>> spark = enable_delta(SparkSession.builder.master("local[1]").getOrCreate())
        >>> spark.range(3).write.format("delta").mode("overwrite").save("/tmp/doc_ids")
        >>> spark.read.format("delta").load("/tmp/doc_ids").count()
        3
    """
    if has_native_delta(spark):
        return spark
    use_driver_interpreter(spark)
    # The reader skips files with pushed filters; Spark refuses a reader that
    # implements pushFilters while this switch is off.
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(DeltaDataSource)
    return spark
