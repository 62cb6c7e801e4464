"""Write and read a few million rows through ``delta`` and through Spark's Parquet.

Run by hand (not a test):

    python benchmarks/delta_vs_parquet.py --rows 3000000 --repeat 3

Each write runs ``--repeat`` times and each read twice per repeat after an
untimed warm-up pass, alternating the formats so that load on the machine hits
them alike; the median times and the ratios against Parquet are printed as a
Markdown table for the README.

Three more rows measure the floor that Spark's Python Data Source API sets for
any writer or reader built on it, in the same run: a writer that discards the
Arrow batches Spark hands it, a writer that only encodes them with plain
pyarrow (no statistics, no Delta log), and a reader that hands over batches
from uncompressed Arrow IPC files (no Parquet decoding).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage

from medallion_assets.delta import enable_delta, read_delta


def make_frame(spark: SparkSession, rows: int):
    """TPC-H lineitem-like rows: keys, decimals, dates, short strings, comments."""
    return spark.range(rows, numPartitions=max(2, os.cpu_count() or 2)).select(
        F.col("id").alias("l_orderkey"),
        (F.col("id") % 200_000).alias("l_partkey"),
        (F.col("id") % 7).cast("int").alias("l_linenumber"),
        ((F.col("id") % 5000) / 100).cast("decimal(15,2)").alias("l_extendedprice"),
        ((F.col("id") % 11) / 100).cast("decimal(15,2)").alias("l_discount"),
        F.date_add(F.lit("1992-01-01").cast("date"), (F.col("id") % 2500).cast("int")).alias("l_shipdate"),
        F.element_at(F.array(*[F.lit(m) for m in ("AIR", "MAIL", "SHIP", "TRUCK", "RAIL")]), (F.col("id") % 5 + 1).cast("int")).alias("l_shipmode"),
        F.concat(F.lit("comment "), F.sha1(F.col("id").cast("string")).substr(1, 20)).alias("l_comment"),
    )


# The floor sources live in this script; Spark pickles classes of __main__ by
# value, so the Python workers need not import it.


class _DiscardWriter(DataSourceArrowWriter):
    def write(self, iterator):
        for _ in iterator:
            pass
        return WriterCommitMessage()


class _PlainPyarrowWriter(DataSourceArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator):
        import uuid

        writer = None
        for batch in iterator:
            if writer is None:
                writer = pq.ParquetWriter(os.path.join(self.path, f"{uuid.uuid4()}.parquet"), batch.schema,
                                          compression="snappy", store_decimal_as_integer=True)
            writer.write_batch(batch, row_group_size=1_000_000)
        if writer is not None:
            writer.close()
        return WriterCommitMessage()


class _IpcReader(DataSourceReader):
    def __init__(self, files: list[str]) -> None:
        self.files = files

    def partitions(self):
        return [InputPartition(f) for f in self.files]

    def read(self, partition):
        with pa.memory_map(partition.value) as source:
            ipc = pa.ipc.open_file(source)
            for i in range(ipc.num_record_batches):
                yield ipc.get_batch(i)


class FloorSource(DataSource):
    """``bench_floor``: option ``kind`` = discard | pyarrow (write) or ipc (read, ``schema`` given)."""

    @classmethod
    def name(cls) -> str:
        return "bench_floor"

    def writer(self, schema, overwrite):
        if self.options["kind"] == "discard":
            return _DiscardWriter()
        os.makedirs(self.options["path"], exist_ok=True)
        return _PlainPyarrowWriter(self.options["path"])

    def reader(self, schema):
        folder = self.options["path"]
        return _IpcReader(sorted(os.path.join(folder, f) for f in os.listdir(folder)))


def parquet_to_ipc(parquet_folder: str, ipc_folder: str) -> None:
    """One uncompressed Arrow IPC file per Parquet file, 64k-row batches as the delta reader yields."""
    os.makedirs(ipc_folder, exist_ok=True)
    for name in sorted(f for f in os.listdir(parquet_folder) if f.endswith(".parquet")):
        table = pq.read_table(os.path.join(parquet_folder, name))
        with pa.ipc.new_file(os.path.join(ipc_folder, name + ".arrow"), table.schema) as sink:
            for batch in table.to_batches(max_chunksize=65_536):
                sink.write_batch(batch)


def scan_all(df) -> int:
    # Touch every column so that column pruning cannot skip work.
    return df.select(F.sum(F.hash(*df.columns))).first()[0]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("delta-vs-parquet")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    enable_delta(spark)
    work = tempfile.mkdtemp(prefix="delta-bench-")
    source = make_frame(spark, args.rows).cache()
    source.count()

    spark.dataSource.register(FloorSource)
    parquet_path, delta_path = os.path.join(work, "parquet"), os.path.join(work, "delta")
    plain_path, ipc_path = os.path.join(work, "pyarrow"), os.path.join(work, "ipc")
    steps = ("parquet write", "delta write", "discard write", "pyarrow write",
             "parquet read", "delta toDF read", "delta format read", "ipc read")
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.repeat):
        for path in (parquet_path, delta_path, plain_path, ipc_path):
            shutil.rmtree(path, ignore_errors=True)
        times["parquet write"].append(timed(lambda: source.write.mode("overwrite").parquet(parquet_path)))
        times["delta write"].append(timed(lambda: source.write.format("delta").mode("overwrite").save(delta_path)))
        times["discard write"].append(
            timed(lambda: source.write.format("bench_floor").option("kind", "discard").mode("append").save()))
        times["pyarrow write"].append(
            timed(lambda: source.write.format("bench_floor").option("kind", "pyarrow").mode("append").save(plain_path)))
        parquet_to_ipc(parquet_path, ipc_path)
        ipc_frame = lambda: spark.read.format("bench_floor").schema(source.schema).load(ipc_path)  # noqa: E731
        # One untimed pass each warms the page cache and the JIT for all the readers alike.
        expected = scan_all(spark.read.parquet(parquet_path))
        assert scan_all(read_delta(spark, delta_path)) == expected, "the delta table does not hold the same rows"
        assert scan_all(spark.read.format("delta").load(delta_path)) == expected
        assert scan_all(ipc_frame()) == expected
        for _ in range(2):
            times["parquet read"].append(timed(lambda: scan_all(spark.read.parquet(parquet_path))))
            times["delta toDF read"].append(timed(lambda: scan_all(read_delta(spark, delta_path))))
            times["delta format read"].append(timed(lambda: scan_all(spark.read.format("delta").load(delta_path))))
            times["ipc read"].append(timed(lambda: scan_all(ipc_frame())))

    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{args.rows:,} rows, {args.repeat} runs each (median), {args.master}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, Spark {spark.version}\n")
    print("| step | seconds | ratio to Parquet | target |")
    print("| --- | ---: | ---: | ---: |")
    rows = [
        ("parquet write", "parquet write", None),
        ("delta write", "parquet write", "1.25x (aim 1.1x)"),
        ("discard write", "parquet write", "floor: hand-off only"),
        ("pyarrow write", "parquet write", "floor: hand-off + encoding"),
        ("parquet read", "parquet read", None),
        ("delta toDF read", "parquet read", "1.15x"),
        ("delta format read", "parquet read", "1.6x"),
        ("ipc read", "parquet read", "floor: hand-off only"),
    ]
    for name, base, target in rows:
        ratio = median[name] / median[base]
        print(f"| {name} | {median[name]:.2f} | {ratio:.2f}x | {target or '-'} |")
    shutil.rmtree(work, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
