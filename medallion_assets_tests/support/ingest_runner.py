"""The bronze ingest (``availableNow``) in a process of its own, for crash tests.

``python -m medallion_assets_tests.support.ingest_runner LAKE_ROOT STREAM [MAX_FILES]`` runs
:func:`medallion_assets.ingest.start_bronze_stream` (or, for ``orders_kafka``,
:func:`~medallion_assets.ingest.start_kafka_stream` on the broker the
``MEDALLION_KAFKA_*`` variables name, MAX_FILES messages per batch) to completion, on the Delta
engine the environment names (``MEDALLION_DELTA_ENGINE``, ``DELTA_SPARK_JARS``, the Maven switches,
as the deployed Spark resource reads them). Nothing in it waits for a test: a
crash test watches the checkpoint and the table from outside and SIGKILLs the
process group (see :mod:`medallion_assets_tests.support.kill_points`).

It prints ``engine <name>`` to stderr once the session is up, so a test's log
tells which engine ran.
"""

from __future__ import annotations

import os
import sys


def spark_resource():
    """The Spark resource of a runner: small, no UI, on the environment's Delta engine.

    ``medallion_assets.resources.spark_resource("local")`` names the engine
    with ``EnvVar``s, which only Dagster resolves; a plain process reads the
    same variables itself.
    """
    from medallion_assets.resources import SparkResource
    from medallion_assets.settings import switch

    return SparkResource(
        spark_config={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
        },
        delta_engine=os.environ.get("MEDALLION_DELTA_ENGINE") or "auto",
        delta_spark_jars=os.environ.get("DELTA_SPARK_JARS") or None,
        delta_spark_maven=switch("MEDALLION_DELTA_SPARK_MAVEN", unset=None),
        kafka_connector_jars=os.environ.get("KAFKA_SPARK_JARS") or None,
        kafka_connector_maven=bool(switch("MEDALLION_KAFKA_MAVEN", unset=False)),
    )


def main(argv: list[str]) -> int:
    root, stream = argv[0], argv[1]
    max_files = int(argv[2]) if len(argv) > 2 else None
    from medallion_assets.feeds import feed_named
    from medallion_assets.ingest import start_bronze_stream
    from medallion_assets.project import project_feeds, the_kafka_feed
    from medallion_assets.resources import LakeResource

    resource = spark_resource()
    spark = resource.spark_session
    spark.sparkContext.setLogLevel("ERROR")
    print(f"engine {resource.delta_engine_in_use.name}", file=sys.stderr, flush=True)
    if stream == "orders_kafka":
        # The broker and topic from MEDALLION_KAFKA_*; MAX_FILES is then the messages per batch.
        from medallion_assets.ingest import start_kafka_stream
        from medallion_assets.kafka import KafkaResource
        from medallion_assets.resources import KAFKA_VARIABLES

        settings = {field: os.environ[name] for name, field in KAFKA_VARIABLES.items() if os.environ.get(name)}
        kafka = KafkaResource(**settings, max_offsets_per_trigger=max_files)
        query = start_kafka_stream(spark, LakeResource(root=root), kafka, the_kafka_feed())
    else:
        feed = feed_named(stream, project_feeds())
        query = start_bronze_stream(spark, LakeResource(root=root), feed, max_files_per_trigger=max_files)
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
