"""The baseline: landing -> silver -> gold in plain PySpark, no Dagster, no Delta.

Run by hand from the repository root, on a landing folder the simulator wrote::

    python benchmarks/plain_pipeline.py --landing LAKE/landing --out OUT [--json FILE]

It does the work a whole-graph materialization does for one landed delivery,
as a single hand-written Spark job would, and writes every table with Spark's
own Parquet writer:

- reads the landing files with batch reads (order event lines as text,
  customer changes as CSV, the newest snapshot of each reference table);
- silver: the project's own pure transforms (``medallion_assets.transforms``):
  order events parsed, validated, deduplicated and reduced to the latest state
  (deletes applied) into ``orders`` and ``lineitem``; customer changes into
  ``customers`` (PII masked) and ``customers_history``; the reference tables
  conformed; the silver expectations of ``assets/silver.py`` split off the
  ``drop`` rows; rejected lines and dropped rows go to ``quarantine/orders``
  and ``quarantine/customers``;
- gold: the TPC-H answers (Q1, Q3, Q5, Q6) and the business tables
  (``daily_revenue`` over every month, ``monthly_revenue``,
  ``customer_lifetime_value``) from the silver Parquet just written.

The logic is the project's (same transforms, same expectation conditions),
on purpose: what this measures against is the Dagster framework and Delta,
not a re-implementation. What it leaves out is exactly that: no bronze tables,
no incremental MERGE (one delivery from scratch is the full state), no merge
sequence column, no asset checks or expectation counts, no output metadata,
no schema-drift scan. The frames the silver assets cache (the winning order
events, the parsed customer changes) are cached here too, as any script that
uses them twice would.

It prints (or writes to ``--json``) seconds per written table, the session
start-up, the total work time and its CPU seconds (the Python driver's, the
JVM's by kind of thread); ``--row-counts`` adds each table's rows
(read from the Parquet footers, outside the timing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from engine_runs import CodegenSpend, CpuSplit, jobs_so_far, jvm_pid


def _session(app_name: str = "plain-pipeline"):
    """An embedded session with the Dagster project's settings, and no Delta."""
    from pyspark.sql import SparkSession

    from medallion_assets.resources import EMBEDDED_SPARK_CONFIG

    builder = SparkSession.builder.appName(app_name).master(os.environ.get("PLAIN_SPARK_MASTER", "local[*]"))
    config = {str(k): str(v) for k, v in EMBEDDED_SPARK_CONFIG.items()}
    if not os.environ.get("PYSPARK_PYTHON"):
        config["spark.pyspark.python"] = sys.executable
    for key, value in config.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _split_expectations(frame, expectations, table_name):
    """``(kept, quarantined)``: ``apply_expectations``'s split without its check counts."""
    from pyspark.sql import functions as F

    from medallion_assets.expectations import quarantine_rows

    flags = [(~e.met).alias(f"_reason_{i}") for i, e in enumerate(expectations)]
    flagged = frame.select("*", *flags)
    dropping = [i for i, e in enumerate(expectations) if e.action in ("drop", "fail")]
    any_failed = F.lit(False)
    for i in dropping:
        any_failed = any_failed | F.col(f"_reason_{i}")
    reason = F.concat_ws(
        "; ",
        *[
            F.when(F.col(f"_reason_{i}"), F.lit(f"{expectations[i].name}: {expectations[i].condition}"))
            for i in dropping
        ],
    )
    names = [f"_reason_{i}" for i in range(len(expectations))]
    bad = flagged.where(any_failed).withColumn("_reason", reason).drop(*names)
    return flagged.where(~any_failed).drop(*names), quarantine_rows(bad, table_name, F.col("_reason"))


def _rejects_to_quarantine(rejects, table_name):
    from pyspark.sql import functions as F

    from medallion_assets.expectations import quarantine_rows

    return quarantine_rows(rejects.withColumnRenamed("reason", "_reason_text"), table_name, F.col("_reason_text"))


def _newest_snapshot(folder: Path) -> str | None:
    from medallion_assets.transforms.bronze import latest_snapshot

    if not folder.is_dir():
        return None
    newest = latest_snapshot([folder / name for name in os.listdir(folder)])
    return str(newest) if newest is not None else None


class Timer:
    """Seconds per named write, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def write(self, name: str, frame, path: Path) -> None:
        started = time.perf_counter()
        frame.write.mode("overwrite").parquet(str(path))
        self.seconds[name] = round(time.perf_counter() - started, 3)


def run(spark, landing: Path, out: Path, timer: Timer) -> None:
    """The whole pipeline: silver, then gold from the silver just written."""
    from pyspark.sql import functions as F

    from medallion_assets.pipelines.tpch import gold_transforms as G
    from medallion_assets.pipelines.tpch import transforms as T
    from medallion_assets.pipelines.tpch.feeds import CUSTOMERS_EXPECTATIONS
    from medallion_assets.pipelines.tpch.silver import LINEITEM_EXPECTATIONS, ORDERS_EXPECTATIONS
    from medallion_assets.transforms import bronze as B

    # ---- landing, read as batches (what bronze holds, without storing it)
    lines = spark.read.option("pathGlobFilter", "*.json").text(str(landing / "orders"))
    orders_raw = B.landed_lines(lines)
    csv = (
        spark.read.option("pathGlobFilter", "*.csv")
        .schema(T.CUSTOMERS_CSV_READ_SCHEMA)
        .options(**T.CUSTOMERS_CSV_OPTIONS)
        .csv(str(landing / "customers"))
    )
    customers_cdc = T.customers_cdc(csv)

    # ---- silver: orders and lineitem (assets/silver.py orders_and_lineitem, schema drift 'ignore')
    events, rejects = T.parse_order_events(orders_raw)
    unique_events = T.deduplicate_events(events)
    winner_files = unique_events.groupBy("o_orderkey", "event_time", "event_id").agg(
        F.max("_source_file").alias("_source_file")
    )
    changes = (
        T.latest_order_changes(unique_events)
        .join(winner_files, ["o_orderkey", "event_time", "event_id"], "left")
        .cache()
    )
    upserts = changes.where(F.col("op") == "upsert")
    order_upserts = T.order_rows(upserts).join(upserts.select("o_orderkey", "_source_file"), "o_orderkey")
    orders, orders_dropped = _split_expectations(order_upserts, ORDERS_EXPECTATIONS, "orders")
    lineitem_upserts = T.lineitem_rows(upserts).join(
        upserts.select(F.col("o_orderkey").alias("l_orderkey"), "_source_file"), "l_orderkey"
    )
    lineitem, lineitem_dropped = _split_expectations(lineitem_upserts, LINEITEM_EXPECTATIONS, "lineitem")
    quarantine_orders = (
        _rejects_to_quarantine(rejects, "orders").unionByName(orders_dropped).unionByName(lineitem_dropped)
    )
    timer.write("quarantine/orders", quarantine_orders, out / "quarantine" / "orders")
    timer.write("silver/orders", orders.drop("_source_file"), out / "silver" / "orders")
    timer.write("silver/lineitem", lineitem.drop("_source_file"), out / "silver" / "lineitem")
    changes.unpersist()

    # ---- silver: customers and their history (customers_and_history, customers_history)
    customer_changes, customer_rejects = T.parse_customer_changes(customers_cdc)
    customer_changes = customer_changes.cache()
    customer_files = customer_changes.groupBy("c_custkey", "updated_at").agg(
        F.max("_source_file").alias("_source_file")
    )
    latest = T.latest_customer_changes(customer_changes).join(customer_files, ["c_custkey", "updated_at"], "left")
    customer_upserts_src = latest.where(F.col("op") != "D")
    customer_upserts = T.mask_customer_pii(T.customer_rows(customer_upserts_src)).join(
        customer_upserts_src.select("c_custkey", "_source_file"), "c_custkey"
    )
    customers, customers_dropped = _split_expectations(customer_upserts, CUSTOMERS_EXPECTATIONS, "customers")
    timer.write(
        "quarantine/customers",
        _rejects_to_quarantine(customer_rejects, "customers").unionByName(customers_dropped),
        out / "quarantine" / "customers",
    )
    timer.write("silver/customers", customers.drop("_source_file"), out / "silver" / "customers")
    timer.write(
        "silver/customers_history",
        T.mask_customer_pii(T.customer_history_rows(customer_changes)),
        out / "silver" / "customers_history",
    )
    customer_changes.unpersist()

    # ---- silver: reference tables (the newest snapshot of each)
    from medallion_assets.pipelines.tpch.contract import REFERENCE_TABLES

    for table in REFERENCE_TABLES:
        newest = _newest_snapshot(landing / "reference" / table)
        if newest is None:
            raise FileNotFoundError(f"no snapshot of {table} under {landing / 'reference' / table}")
        timer.write(f"silver/{table}", T.conform_reference(spark.read.parquet(newest), table), out / "silver" / table)

    # ---- gold, from the silver just written
    def silver(name: str):
        return spark.read.parquet(str(out / "silver" / name))

    customer, orders_s, lineitem_s = silver("customers"), silver("orders"), silver("lineitem")
    gold = {
        "pricing_summary": G.pricing_summary(lineitem_s),
        "shipping_priority": G.shipping_priority(customer, orders_s, lineitem_s),
        "local_supplier_volume": G.local_supplier_volume(
            customer, orders_s, lineitem_s, silver("supplier"), silver("nation"), silver("region")
        ),
        "forecasting_revenue_change": G.forecasting_revenue_change(lineitem_s),
        "daily_revenue": G.daily_revenue(orders_s, lineitem_s, customer),
        "monthly_revenue": G.monthly_revenue(orders_s, lineitem_s),
        "customer_lifetime_value": G.customer_lifetime_value(customer, orders_s),
    }
    for name, frame in gold.items():
        timer.write(f"gold/{name}", frame, out / "gold" / name)


def parquet_rows(folder: Path) -> int:
    """Rows of a Parquet folder Spark wrote, from the file footers."""
    import pyarrow.parquet as pq

    return sum(
        pq.ParquetFile(folder / name).metadata.num_rows
        for name in os.listdir(folder)
        if name.endswith(".parquet") and not name.startswith(("_", "."))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--landing", required=True, type=Path, help="the landing folder (<lake root>/landing)")
    parser.add_argument("--out", required=True, type=Path, help="folder for silver/, quarantine/ and gold/ (replaced)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here instead of printing it")
    parser.add_argument("--row-counts", action="store_true", help="add each table's rows (outside the timing)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    spark = _session()
    session_start = time.perf_counter() - started
    timer = Timer()
    cpu, jobs_before = CpuSplit(jvm_pid(spark)), jobs_so_far(spark)
    codegen = CodegenSpend(spark)
    work_started = time.perf_counter()
    run(spark, args.landing, args.out, timer)
    work = time.perf_counter() - work_started
    report = {
        "session_start_s": round(session_start, 3),
        "work_s": round(work, 3),
        "work_cpu": cpu.seconds(),
        "spark_jobs": jobs_so_far(spark) - jobs_before,
        **codegen.since(),
        "writes_s": timer.seconds,
        "spark_version": spark.version,
    }
    if args.row_counts:
        report["rows"] = {name: parquet_rows(args.out / name) for name in timer.seconds}
    spark.stop()
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
