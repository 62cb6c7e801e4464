"""Processes that use the lake's tables by name, for the catalog tests (each a process of its own).

``python -m medallion_assets_tests.support.metastore_clients run NAME``
    One Dagster run of the project (its resources, from the environment's
    ``MEDALLION_*`` settings) materializing ``gold/NAME``: an asset that reads
    ``gold.pricing_summary`` by name with SQL. Prints a JSON line: the table
    name Dagster recorded and the rows the asset read.

``python -m medallion_assets_tests.support.metastore_clients project OUT TABLE...``
    A new session of the project's Spark resource, as a notebook makes it
    (``spark_resource("local").process_config_and_initialize()``): each table,
    read with ``spark.sql("SELECT * FROM TABLE")``, is written as Parquet under ``OUT``.
"""

import json
import os
import sys


def run(name: str) -> dict:
    from dagster import asset, materialize

    from medallion_assets.definitions import resources_for
    from medallion_assets.io_manager import delta_table
    from medallion_assets.resources import SparkResource

    read = {}

    @asset(key=["gold", name], metadata=delta_table(write_mode="overwrite", schema_mode="overwrite"))
    def by_name(spark: SparkResource):
        frame = spark.spark_session.sql("SELECT l_returnflag, l_linestatus, count_order FROM gold.pricing_summary")
        read["rows"] = sorted(tuple(row) for row in frame.collect())
        return frame

    resources = resources_for("local")
    result = materialize([by_name], resources={key: resources[key] for key in ("spark", "lake", "io_manager")})
    [event] = result.get_asset_materialization_events()
    return {"table_name": event.materialization.metadata["dagster/table_name"].value, "rows": read["rows"]}


def project(out: str, tables: list[str]) -> None:
    from medallion_assets.resources import spark_resource

    spark = spark_resource("local").process_config_and_initialize().spark_session
    for table in tables:
        spark.sql(f"SELECT * FROM {table}").toPandas().to_parquet(os.path.join(out, f"{table}.parquet"))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        print(json.dumps(run(sys.argv[2])))
    else:
        project(sys.argv[2], sys.argv[3:])
