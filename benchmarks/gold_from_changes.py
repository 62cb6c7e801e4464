"""What a gold table maintained from silver's changes would cost a 1% batch, against recomputing it.

Run by hand (not a test), from the project root:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/gold_from_changes.py --scale-factor 1 --share 0.01

A design probe for the incremental-run target, not product code: the
pipeline recomputes every gold table from all of silver, so a batch pays for
gold what a full run pays. This measures the other way on one table,
``gold.daily_revenue`` (revenue and orders per order date and market
segment, :func:`~medallion_assets.pipelines.tpch.gold_transforms.daily_revenue`):

1. It builds TPC-H's ``orders``, ``lineitem`` and ``customer`` at the scale
   factor with delta-spark, through the project's client and merge code and
   silver's merge declarations, three times: as the project creates them;
   with ``delta.enableChangeDataFeed``, which the other way needs; and with
   the feed and deletion vectors, so that a MERGE marks the rows it replaces
   instead of copying the rest of their files.
2. It computes ``daily_revenue`` from them (the gold table before the batch).
3. It applies the same batch to each copy: ``--share`` of the orders
   restated (a day later, with their line items' prices changed; one in ten
   of them deleted instead) and ``--share`` of the customers moved to another
   segment. The time of the three MERGEs is the change feed's price.
4. Then gold two ways: recomputed from all of silver and overwritten, as the
   pipeline does; and from the changes: the orders the batch touched (read
   from the three tables' change feeds, and the orders of the customers that
   changed) have their old contribution, read at the versions before the
   batch, taken off the stored gold rows, and their new one added (once per
   copy with the feed). Every result must hold the recomputed rows.

It prints the seconds and CPU seconds of each, and the load average.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from engine_runs import (
    LoadSampler,
    Timings,
    add_delta_spark_arguments,
    delta_spark_session,
    describe_load,
    describe_session,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from medallion_assets.io_manager import DELETION_VECTORS

SEQUENCE, DELETED = "_sequence", "_deleted"
#: Each variant: its name, and the properties its silver tables are created with.
PLAIN = "as the project creates them"
WITH_FEED = "with the change data feed"
WITH_FEED_AND_VECTORS = "with the change data feed and deletion vectors"
FEED = {"delta.enableChangeDataFeed": "true"}
VARIANTS = {PLAIN: {}, WITH_FEED: FEED, WITH_FEED_AND_VECTORS: {**FEED, DELETION_VECTORS: "true"}}
SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")
GOLD_KEYS = ("o_orderdate", "c_mktsegment")


def silver_specs(properties: dict[str, str]) -> dict:
    """Silver's merge declarations of the three tables (``pipelines/tpch/silver.py``, ``feeds.py``)."""
    from medallion_assets.io_manager.spec import WriteSpec

    def merge(**kwargs) -> WriteSpec:
        return WriteSpec(mode="merge", sequence_column=SEQUENCE, table_properties=properties, **kwargs)

    return {
        "orders": merge(merge_keys=("o_orderkey",), delete_column=DELETED),
        "lineitem": merge(merge_keys=("l_orderkey", "l_linenumber"), replace_group="l_orderkey", delete_column=DELETED),
        "customers": merge(merge_keys=("c_custkey",)),
    }


def picked(column: str, share: float, salt: str = "") -> F.Column:
    return F.abs(F.xxhash64(column, F.lit(salt))) % max(int(round(1 / share)), 1) == 0


def first_load(frame: DataFrame, *, deletes: bool) -> DataFrame:
    flags = [F.lit(False).alias(DELETED)] if deletes else []
    return frame.select("*", F.lit(1).cast("long").alias(SEQUENCE), *flags)


def batch(tables: dict[str, DataFrame], share: float) -> dict[str, DataFrame]:
    """The changes: restated and deleted orders with their line items, customers moved to another segment."""
    orders, lineitem, customers = tables["orders"], tables["lineitem"], tables["customers"]
    changed = orders.where(picked("o_orderkey", share))
    deleted = picked("o_orderkey", 0.1, "delete")
    restated = changed.where(~deleted).select(
        *[F.date_add("o_orderdate", 1).alias(c) if c == "o_orderdate" else F.col(c) for c in orders.columns],
        F.lit(2).cast("long").alias(SEQUENCE),
        F.lit(False).alias(DELETED),
    )
    gone = changed.where(deleted).select(
        *orders.columns, F.lit(2).cast("long").alias(SEQUENCE), F.lit(True).alias(DELETED)
    )
    lines = lineitem.join(
        changed.select(F.col("o_orderkey").alias("l_orderkey"), deleted.alias("_gone")), "l_orderkey", "inner"
    )
    line_changes = (
        lines.where(~F.col("_gone"))
        .select(
            *[(F.col(c) + 1).alias(c) if c == "l_extendedprice" else F.col(c) for c in lineitem.columns],
            F.lit(2).cast("long").alias(SEQUENCE),
            F.lit(False).alias(DELETED),
        )
        .unionByName(
            lines.where(F.col("_gone") & (F.col("l_linenumber") == 1)).select(
                *lineitem.columns, F.lit(2).cast("long").alias(SEQUENCE), F.lit(True).alias(DELETED)
            )
        )
    )
    segments = F.array(*[F.lit(s) for s in SEGMENTS])
    position = F.array_position(segments, F.col("c_mktsegment"))  # 1-based; the next segment, round
    moved = customers.where(picked("c_custkey", share)).select(
        *[
            F.element_at(segments, (position % len(SEGMENTS)).cast("int") + 1).alias(c)
            if c == "c_mktsegment"
            else F.col(c)
            for c in customers.columns
        ],
        F.lit(2).cast("long").alias(SEQUENCE),
    )
    return {"orders": restated.unionByName(gone), "lineitem": line_changes, "customers": moved}


def read(spark: SparkSession, path: str, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path).drop(SEQUENCE)


def changed_keys(spark: SparkSession, path: str, key: str, after: int, to: int) -> DataFrame:
    """Every key with a row in the change feed of versions ``after + 1 .. to`` (inserts, updates, deletes)."""
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", after + 1)
        .option("endingVersion", to)
        .load(path)
        .select(key)
    )


def contributions(orders: DataFrame, lineitem: DataFrame, customers: DataFrame, touched: DataFrame) -> DataFrame:
    """``daily_revenue``'s aggregate over the ``touched`` orders only (disjoint sets of orders add up)."""
    from medallion_assets.pipelines.tpch import gold_transforms as G

    return G.daily_revenue(
        orders.join(touched, "o_orderkey", "left_semi"),
        lineitem.join(touched.withColumnRenamed("o_orderkey", "l_orderkey"), "l_orderkey", "left_semi"),
        customers,
    )


def gold_from_changes(
    spark: SparkSession,
    paths: dict[str, str],
    before: dict[str, int],
    after: dict[str, int],
    gold_before: DataFrame,
    write,
) -> None:
    """``write`` the stored gold rows, less the touched orders' old contribution, plus their new one."""
    orders_changed = changed_keys(spark, paths["orders"], "o_orderkey", before["orders"], after["orders"])
    lines_changed = changed_keys(spark, paths["lineitem"], "l_orderkey", before["lineitem"], after["lineitem"])
    customers_changed = changed_keys(spark, paths["customers"], "c_custkey", before["customers"], after["customers"])
    now = {name: read(spark, path, after[name]) for name, path in paths.items()}
    then = {name: read(spark, path, before[name]) for name, path in paths.items()}
    # An order not in the orders' feed kept its customer, so the current orders find those of a moved customer.
    of_moved_customers = (
        now["orders"]
        .join(customers_changed.withColumnRenamed("c_custkey", "o_custkey"), "o_custkey", "left_semi")
        .select("o_orderkey")
    )
    touched = (
        orders_changed.unionByName(lines_changed.withColumnRenamed("l_orderkey", "o_orderkey"))
        .unionByName(of_moved_customers)
        .distinct()
        .cache()
    )
    try:
        touched.count()
        old = contributions(then["orders"], then["lineitem"], then["customers"], touched)
        new = contributions(now["orders"], now["lineitem"], now["customers"], touched)
        schema = gold_before.schema
        delta = (
            new.select(*GOLD_KEYS, "revenue", "order_count")
            .unionByName(
                old.select(
                    *GOLD_KEYS, (-F.col("revenue")).alias("revenue"), (-F.col("order_count")).alias("order_count")
                )
            )
            .groupBy(*GOLD_KEYS)
            .agg(F.sum("revenue").alias("_d_revenue"), F.sum("order_count").alias("_d_count"))
        )
        merged = gold_before.join(delta, list(GOLD_KEYS), "full_outer").select(
            *GOLD_KEYS,
            (F.coalesce("revenue", F.lit(0)) + F.coalesce("_d_revenue", F.lit(0)))
            .cast(schema["revenue"].dataType)
            .alias("revenue"),
            (F.coalesce("order_count", F.lit(0)) + F.coalesce("_d_count", F.lit(0)))
            .cast(schema["order_count"].dataType)
            .alias("order_count"),
        )
        # A day and segment left with no order has no row, as when recomputed.
        write(merged.where(F.col("order_count") > 0).orderBy(*GOLD_KEYS))
    finally:
        touched.unpersist()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--share", type=float, default=0.01, help="share of the orders and customers changed")
    parser.add_argument("--work-dir", help="the simulator's TPC-H cache (default: its own)")
    add_delta_spark_arguments(parser)
    args = parser.parse_args(argv)

    from medallion_assets.io_manager.spec import WriteSpec
    from medallion_assets.pipelines.tpch import gold_transforms as G
    from medallion_assets.pipelines.tpch.simulator import tpch_folder
    from medallion_assets.storage.client import DeltaTableClient

    spark = delta_spark_session(parser, args, "gold-from-changes")
    folder = tpch_folder(args.work_dir, args.scale_factor)
    client = DeltaTableClient(spark)
    work = Path(tempfile.mkdtemp(prefix="gold-from-changes-"))
    overwrite = WriteSpec(mode="overwrite", schema_mode="overwrite")
    timings = Timings()

    def recompute(paths: dict[str, str], gold_path: str) -> None:
        now = {name: read(spark, path) for name, path in paths.items()}
        client.write(G.daily_revenue(now["orders"], now["lineitem"], now["customers"]), gold_path, overwrite)

    try:
        source = {
            "orders": spark.read.parquet(str(folder / "orders.parquet")),
            "lineitem": spark.read.parquet(str(folder / "lineitem.parquet")),
            "customers": spark.read.parquet(str(folder / "customer.parquet")),
        }
        changes = {name: frame.cache() for name, frame in batch(source, args.share).items()}
        counts = {name: frame.count() for name, frame in changes.items()}
        paths: dict[str, dict[str, str]] = {}
        before: dict[str, dict[str, int]] = {}
        after: dict[str, dict[str, int]] = {}
        with LoadSampler() as load:
            for number, (variant, properties) in enumerate(VARIANTS.items()):
                specs = silver_specs(properties)
                paths[variant] = {name: str(work / f"{number}-{name}") for name in specs}
                for name, spec in specs.items():
                    client.write(first_load(source[name], deletes=bool(spec.delete_column)), paths[variant][name], spec)
                before[variant] = {n: client.last_commit_info(p)["version"] for n, p in paths[variant].items()}
            gold_path = str(work / "gold-before")
            recompute(paths[PLAIN], gold_path)
            for variant in VARIANTS:
                specs = silver_specs(VARIANTS[variant])

                def apply_batch(variant=variant, specs=specs) -> None:
                    for name in ("customers", "orders", "lineitem"):
                        client.write(changes[name], paths[variant][name], specs[name])

                timings.run(f"the batch's three MERGEs, {variant}", apply_batch)
                after[variant] = {n: client.last_commit_info(p)["version"] for n, p in paths[variant].items()}
            recomputed = str(work / "gold-recomputed")
            shutil.copytree(gold_path, recomputed)

            def maintain(variant: str, maintained: str) -> None:
                # Read whole before the overwrite replaces what it reads.
                stored = client.read(maintained).cache()
                try:
                    stored.count()
                    gold_from_changes(
                        spark,
                        paths[variant],
                        before[variant],
                        after[variant],
                        stored,
                        lambda frame: client.write(frame, maintained, overwrite),
                    )
                finally:
                    stored.unpersist()

            timings.run(
                "gold recomputed from all of silver, as the pipeline does", lambda: recompute(paths[PLAIN], recomputed)
            )
            maintained = {}
            for number, variant in enumerate(v for v in VARIANTS if v != PLAIN):
                maintained[variant] = str(work / f"gold-maintained-{number}")
                shutil.copytree(gold_path, maintained[variant])
                timings.run(
                    f"gold from silver's changes, {variant}",
                    lambda variant=variant: maintain(variant, maintained[variant]),
                )
        expected = client.read(recomputed)
        for path in maintained.values():
            assertDataFrameEqual(client.read(path), expected)
        changed_rows = expected.exceptAll(client.read(gold_path)).count()
        facts = describe_session(spark, "delta-spark")
        print(
            f"SF {args.scale_factor:g}: `daily_revenue` has {expected.count():,} rows, {changed_rows:,} of them "
            f"changed by the batch ({counts['orders']:,} order changes, {counts['lineitem']:,} line item "
            f"changes, {counts['customers']:,} customers moved); {facts['delta']}, {facts['cores']} cores; "
            f"{describe_load(load.samples)}\n"
        )
        print("| step | s | CPU s |")
        print("| --- | ---: | ---: |")
        for name, figures in timings.medians().items():
            print(f"| {name} | {figures['wall']:.1f} | {figures['cpu']:.1f} |")
        print("\nThe gold tables from the changes hold the same rows as the recomputed one (assertDataFrameEqual).")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
