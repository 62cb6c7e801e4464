"""The bronze ingest (``availableNow``) in a process of its own, for crash tests.

``python -m medallion_assets_tests.ingest_runner LAKE_ROOT STREAM [MAX_FILES]`` runs
:func:`medallion_assets.ingest.start_bronze_stream` to completion. The pause
hooks of :mod:`medallion_assets.delta._streaming` (environment variables) let
a test SIGKILL it at a chosen point.
"""

import sys


def main(argv: list[str]) -> int:
    root, stream = argv[0], argv[1]
    max_files = int(argv[2]) if len(argv) > 2 else None
    from medallion_assets.ingest import start_bronze_stream
    from medallion_assets.resources import LakeResource, SparkResource

    spark = SparkResource(spark_config={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                        "spark.sql.session.timeZone": "UTC"}).spark_session
    spark.sparkContext.setLogLevel("ERROR")
    query = start_bronze_stream(spark, LakeResource(root=root), stream, max_files_per_trigger=max_files)
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
