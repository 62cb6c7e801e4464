"""Bronze: landed files and Kafka messages as delivered, plus where and when they came in.

Order events and customer changes stream in from landing/ (``availableNow``:
each run takes the files its checkpoint has not seen); order events also
stream in from a Kafka topic into a table of their own, ``bronze.orders_kafka``
(each run takes the offsets its checkpoint has not committed); reference
snapshots are batch loads.
"""


from dagster import AssetExecutionContext, AssetKey, Config, MaterializeResult, MetadataValue, Output, asset
from pydantic import Field

from medallion_assets.ingest import (
    ensure_kafka_table,
    full_refresh_stream,
    load_reference_snapshot,
    start_bronze_stream,
    start_kafka_stream,
)
from medallion_assets.kafka import KAFKA_STREAM, KafkaResource
from medallion_assets.io_manager import DELTA_KINDS, SOURCE, DeltaTableClient, delta_table, table_metadata
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.transforms.bronze import REFERENCE_TABLES


class BronzeStreamConfig(Config):
    """Run options of a streaming bronze asset."""

    full_refresh: bool = Field(
        default=False,
        description="Drop the stream's checkpoint and table first and re-ingest all of landing/. "
        "Refused unless the asset is defined with allow_full_refresh=True.",
    )


def _run_to_end(query, client: DeltaTableClient, path: str) -> tuple[dict, list[dict]]:
    """Wait for an ``availableNow`` query; the table's metadata with what this run took in, and its progress."""
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    metadata = table_metadata(client, path) if client.exists(path) else {"dagster/row_count": 0}
    return {**metadata, "new_rows": sum(int(p["numInputRows"]) for p in progress), "micro_batches": len(progress)}, progress


def _stream_asset(stream_name: str, description: str, *, allow_full_refresh: bool = False):
    @asset(
        key=["bronze", stream_name],
        group_name="bronze",
        kinds=DELTA_KINDS,
        description=description,
        deps=[AssetKey(["landing", "simulated_batch"])],
        metadata={"delta/write_mode": "append (Structured Streaming sink)", "allow_full_refresh": allow_full_refresh},
    )
    def _bronze_stream(
        context: AssetExecutionContext, config: BronzeStreamConfig, spark: SparkResource, lake: LakeResource
    ) -> MaterializeResult:
        if config.full_refresh:
            full_refresh_stream(lake, stream_name, allowed=allow_full_refresh)
        session = spark.spark_session
        query = start_bronze_stream(
            session, lake, stream_name, commit_metadata={"dagster_run_id": context.run_id}
        )
        metadata, _ = _run_to_end(query, DeltaTableClient(session), lake.table_path(["bronze", stream_name]))
        return MaterializeResult(metadata=metadata)

    _bronze_stream.__name__ = stream_name
    return _bronze_stream


orders_raw = _stream_asset("orders_raw", "Order event lines from landing/orders, as delivered (text).")
customers_cdc = _stream_asset("customers_cdc", "Customer change rows from landing/customers, every column a string.")


@asset(
    key=["bronze", KAFKA_STREAM],
    group_name="bronze",
    kinds=DELTA_KINDS,
    # The simulator can publish its order events to the topic when it lands a batch.
    deps=[AssetKey(["landing", "simulated_batch"])],
    description="Order event messages from the Kafka topic, as delivered, with topic, partition, offset and "
    "Kafka timestamp. Empty where the deployment has no Kafka source.",
    metadata={"delta/write_mode": "append (Structured Streaming sink)"},
)
def orders_kafka(context: AssetExecutionContext, spark: SparkResource, lake: LakeResource,
                 kafka: KafkaResource) -> MaterializeResult:
    session = spark.spark_session
    client = DeltaTableClient(session)
    if not kafka.configured:
        path = ensure_kafka_table(session, lake)
        return MaterializeResult(metadata={
            **table_metadata(client, path), "new_rows": 0,
            "note": "no Kafka source in this deployment (MEDALLION_KAFKA_BOOTSTRAP_SERVERS is not set)",
        })
    context.log.info(f"reading {kafka.describe()}")
    query = start_kafka_stream(session, lake, kafka, commit_metadata={"dagster_run_id": context.run_id})
    metadata, progress = _run_to_end(query, client, lake.table_path(["bronze", KAFKA_STREAM]))
    ends = progress[-1]["sources"][0].get("endOffset") if progress else None
    return MaterializeResult(metadata={
        **metadata, "kafka_topic": kafka.topic, "kafka_end_offsets": MetadataValue.json(ends or {}),
    })


def _reference_asset(table: str):
    @asset(
        key=["bronze", table],
        group_name="bronze",
        kinds=DELTA_KINDS,
        description=f"The newest landed snapshot of {table}.",
        deps=[AssetKey(["landing", "simulated_batch"])],
        output_required=False,
        metadata=delta_table(write_mode="overwrite", schema_mode="overwrite"),
    )
    def _bronze_reference(spark: SparkResource, lake: LakeResource):
        snapshot = load_reference_snapshot(spark.spark_session, lake, table)
        if snapshot is not None:
            # The file name lets the IO manager skip rewriting an unchanged snapshot.
            yield Output(snapshot.frame, metadata={SOURCE: snapshot.source_file})

    _bronze_reference.__name__ = table
    return _bronze_reference


reference_assets = [_reference_asset(table) for table in REFERENCE_TABLES]

bronze_assets = [orders_raw, customers_cdc, orders_kafka, *reference_assets]
