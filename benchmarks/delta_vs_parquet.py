"""Write and read a few million rows through each Delta engine and through Spark's Parquet.

Run by hand (not a test), from the project root:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \
        python benchmarks/delta_vs_parquet.py --rows 4000000 --repeat 3

Both engines of the project are measured, each in a child process of its own
(one Python process holds one SparkContext) whose session is built by the
project's ``SparkResource`` as for an embedded ``local[*]`` deployment:
``EMBEDDED_SPARK_CONFIG`` plus, for delta-spark, the jars and
``spark.databricks.delta.snapshotPartitions`` = the local core count. Every
figure is a ratio to Spark's native Parquet measured in the same child, on the
same cached rows.

Each write runs ``--repeat`` times and each read twice per repeat after an
untimed warm-up pass, alternating the formats so that load on the machine hits
them alike (each repeat starts its writes one later than the repeat before, on
both engines). Before
each timed step the files written so far are flushed to disk (``os.sync``,
untimed): a 4M-row write leaves about 170 MB for the kernel to write back
over the next seconds, which would otherwise land on whichever step runs
then. The median times and the ratios against Parquet are printed as one
Markdown table, with the middle half of each repeat's own ratio. Besides
wall seconds it prints the CPU seconds of the whole process tree (driver,
JVM, Python workers) for each step, which other load on
the machine does not inflate.

delta-spark rows: its write of a new table with Delta's default statistics;
writes into an empty table created as the IO manager creates silver's
``lineitem`` (statistics on what its declaration names: ``l_orderkey`` and ``l_shipdate``),
once as an overwrite and once as an append (how the IO manager loads a merge table first); the first
read of the freshly written table (it builds the table's snapshot state);
later reads (the state is cached); and the same three with Delta's default
of 50 snapshot partitions (``untuned``), and a write that collects no
per-file column statistics, to show what they cost (skip these four with
``--no-extra-rows``). With ``--write-jobs`` it also splits the Parquet write
and the Delta writes into the Spark jobs each ran, from the session's UI:
the job writing the rows, the jobs building the state of the version an
overwrite replaces, Delta's other jobs, and the time outside any job
(planning, the commit). ``--stats-columns`` times, instead, what each kept
column costs: first loads appended to tables keeping statistics on none,
two, three, five and six of lineitem's columns.

delta-rs rows: the ``write_delta`` fast route (Spark's Parquet writer, one
delta-rs commit), ``format("delta")`` write, the ``read_delta`` fast route and the
``format("delta")`` read; and three rows measuring the floor that Spark's Python
Data Source API sets for any writer or reader built on it: a writer that
discards the Arrow batches Spark hands it, a writer that only encodes them with
plain pyarrow (no statistics, no Delta log), and a reader that hands over
batches from uncompressed Arrow IPC files (no Parquet decoding).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
from engine_runs import (
    DELTA_DEFAULT_SNAPSHOT_PARTITIONS,
    LoadSampler,
    Timings,
    add_engine_arguments,
    build_session,
    describe_load,
    describe_session,
    last_job_id,
    run_benchmark,
    seconds_inside_jobs,
    spark_jobs,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from medallion_assets.io_manager.spec import write_spec_from_metadata
from medallion_assets.pipelines.tpch.silver import LINEITEM, orders_and_lineitem
from medallion_assets.storage.engines import engine_for
from medallion_assets.storage.write_spec import table_properties_for


def make_frame(spark: SparkSession, rows: int):
    """TPC-H lineitem-like rows: keys, decimals, dates, short strings, comments, and silver's sequence.

    Every column is nullable, as every column of silver's ``lineitem`` is (its
    values are casts of parsed text). A column ``spark.range`` derives as
    never null would become a NOT NULL column of a table the IO manager
    creates from this schema, which Delta then checks on every row written.
    """
    # A condition the optimizer cannot fold away (an id is never negative), so the column stays nullable.
    nullable = lambda column: F.when(F.col("id") >= 0, column)  # noqa: E731
    return spark.range(rows, numPartitions=max(2, os.cpu_count() or 2)).select(
        nullable(F.col("id")).alias("l_orderkey"),
        (F.col("id") % 200_000).alias("l_partkey"),
        (F.col("id") % 7).cast("int").alias("l_linenumber"),
        ((F.col("id") % 5000) / 100).cast("decimal(15,2)").alias("l_extendedprice"),
        ((F.col("id") % 11) / 100).cast("decimal(15,2)").alias("l_discount"),
        F.date_add(F.lit("1992-01-01").cast("date"), (F.col("id") % 2500).cast("int")).alias("l_shipdate"),
        F.date_add(F.lit("1992-01-31").cast("date"), (F.col("id") % 2470).cast("int")).alias("l_commitdate"),
        F.date_add(F.lit("1992-01-02").cast("date"), (F.col("id") % 2530).cast("int")).alias("l_receiptdate"),
        nullable(
            F.element_at(
                F.array(*[F.lit(m) for m in ("AIR", "MAIL", "SHIP", "TRUCK", "RAIL")]),
                (F.col("id") % 5 + 1).cast("int"),
            )
        ).alias("l_shipmode"),
        nullable(F.concat(F.lit("comment "), F.sha1(F.col("id").cast("string")).substr(1, 20))).alias("l_comment"),
        # The merge's sequence, as silver writes it: the event's time and id as one sortable text.
        F.concat_ws(
            "|",
            F.date_format(F.timestamp_seconds(F.col("id") % 86_400 + 820_454_400), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"),
            F.concat(F.lit("e"), F.col("id").cast("string")),
        ).alias("_sequence"),
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
                writer = pq.ParquetWriter(
                    os.path.join(self.path, f"{uuid.uuid4()}.parquet"),
                    batch.schema,
                    compression="snappy",
                    store_decimal_as_integer=True,
                )
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


def reset_folder(folder: str) -> None:
    """Empty ``folder``: every repeat writes fresh tables (no Delta log cache outlives its table)."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)


class session_conf:  # noqa: N801 - used as a context manager, like a function
    """Run a block with the session setting ``key`` set to ``value``, then restore it."""

    def __init__(self, spark: SparkSession, key: str, value: str) -> None:
        self.spark, self.key, self.value, self.previous = spark, key, value, None

    def __enter__(self) -> None:
        self.previous = self.spark.conf.get(self.key, None)
        self.spark.conf.set(self.key, self.value)

    def __exit__(self, *exc: object) -> None:
        if self.previous is None:
            self.spark.conf.unset(self.key)
        else:
            self.spark.conf.set(self.key, self.previous)


def untuned(spark: SparkSession) -> session_conf:
    """Delta's default number of snapshot partitions instead of the project's (the core count)."""
    return session_conf(spark, "spark.databricks.delta.snapshotPartitions", DELTA_DEFAULT_SNAPSHOT_PARTITIONS)


def without_statistics(spark: SparkSession) -> session_conf:
    """Writes that collect no per-file column statistics (no data skipping; to explain a cost only)."""
    return session_conf(spark, "spark.databricks.delta.stats.collect", "false")


#: silver.lineitem's declaration, read from the TPC-H order step's metadata: statistics on what it
#: declares readers filter and merge on.
LINEITEM_SPEC = write_spec_from_metadata(orders_and_lineitem.metadata_by_key[LINEITEM])


def create_as_the_io_manager_does(spark: SparkSession, path: str, schema) -> None:
    """An empty table with the properties the IO manager gives a new lineitem table (its statistics columns).

    Created by the session's engine, as the IO manager creates it. An
    overwrite keeps a table's properties, so the timed write then collects
    statistics on those columns only.
    """
    engine_for(spark).create_table(spark, path, schema, properties=table_properties_for(LINEITEM_SPEC, schema))


def same_rows(found: int, expected: int, what: str) -> None:
    if found != expected:
        raise AssertionError(f"{what} does not hold the rows written")


def warm_up(spark: SparkSession, work: str) -> None:
    """Write and read a small table through Parquet and ``delta`` once, untimed.

    Loads the classes and starts the Python workers, so that the first
    repeat's first Delta step does not pay for them alone.
    """
    small = make_frame(spark, 10_000)
    for fmt in ("parquet", "delta"):
        path = os.path.join(work, f"warm-up-{fmt}")
        small.write.format(fmt).mode("overwrite").save(path)
        scan_all(spark.read.format(fmt).load(path))


#: The parts a write's wall time is split into by ``--write-jobs``.
WRITE_PARTS = ("writing the rows", "state of the replaced version", "other Spark jobs", "outside Spark jobs")


class WriteJobs:
    """Where each timed write's wall time went, by the Spark jobs it ran (from the session's UI)."""

    def __init__(self, spark: SparkSession, timings: Timings) -> None:
        self.spark, self.timings = spark, timings
        self.parts: dict[str, list[dict[str, float]]] = {}

    def run(self, name: str, write) -> None:
        before = last_job_id(self.spark)
        self.timings.run(name, write)
        wall = self.timings.wall[name][-1]
        jobs = [job for job in spark_jobs(self.spark) if job["jobId"] > before]
        # The job the writer's own call starts is named after that call site
        # (``save``, ``parquet``); Delta names the jobs it runs for its log.
        rows = [job for job in jobs if job["name"].startswith(("save at ", "parquet at "))]
        if len(rows) != 1:
            raise RuntimeError(f"{name}: expected one job writing the rows, found {[j['name'] for j in jobs]}")
        state = [job for job in jobs if job.get("description", "").startswith("Delta: Compute snapshot")]
        other = [job for job in jobs if job not in rows and job not in state]
        self.parts.setdefault(name, []).append(
            {
                "writing the rows": seconds_inside_jobs(rows),
                "state of the replaced version": seconds_inside_jobs(state),
                "other Spark jobs": seconds_inside_jobs(other),
                "outside Spark jobs": wall - seconds_inside_jobs(jobs),
                "jobs": len(jobs),
            }
        )

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            name: {part: statistics.median(sample[part] for sample in samples) for part in (*WRITE_PARTS, "jobs")}
            for name, samples in self.parts.items()
        }


def measure_delta_spark(
    spark: SparkSession, source, work: str, repeat: int, extra: bool, write_jobs: bool = False
) -> tuple[Timings, dict | None]:
    """delta-spark writes and reads against Parquet.

    ``extra`` adds the explanatory rows: Delta's default snapshot partitions
    (write, first read, read) and a write without column statistics.
    ``write_jobs`` splits each write into the Spark jobs it ran (the
    session's UI must be on).

    Returns:
        The timings, and with ``write_jobs`` the medians of each write's parts.
    """
    timings = Timings(settle=os.sync)
    jobs = WriteJobs(spark, timings) if write_jobs else None
    timed_write = jobs.run if jobs else timings.run
    warm_up(spark, work)
    delta = lambda path: spark.read.format("delta").load(path)  # noqa: E731
    for i in range(repeat):
        reset_folder(work)
        parquet_path, delta_path, untuned_path, no_stats_path, declared_path, appended_path = (
            os.path.join(work, f"{name}-{i}")
            for name in ("parquet", "delta", "untuned", "no-stats", "declared", "appended")
        )
        write_delta = lambda path: source.write.format("delta").mode("overwrite").save(path)  # noqa: E731
        writes = [  # (step, untimed preparation, timed write)
            ("parquet write", None, lambda: source.write.mode("overwrite").parquet(parquet_path)),
            ("delta-spark write", None, lambda: write_delta(delta_path)),
            (
                "delta-spark write, project statistics",
                partial(create_as_the_io_manager_does, spark, declared_path, source.schema),
                lambda: write_delta(declared_path),
            ),
            (
                "delta-spark append, project statistics",
                partial(create_as_the_io_manager_does, spark, appended_path, source.schema),
                lambda: source.write.format("delta").mode("append").save(appended_path),
            ),
        ]
        # Each repeat starts with the next write, so none always runs first or after the same one.
        for name, prepare, write in writes[i % len(writes) :] + writes[: i % len(writes)]:
            if prepare is not None:
                prepare()
            timed_write(name, write)
        if extra:
            with untuned(spark):
                timed_write("delta-spark write, untuned", lambda: write_delta(untuned_path))
            with without_statistics(spark):
                timed_write("delta-spark write, no statistics", lambda: write_delta(no_stats_path))
        expected = scan_all(spark.read.parquet(parquet_path))  # untimed: warms the page cache and the JIT
        same_rows(timings.run("delta-spark first read", lambda: scan_all(delta(delta_path))), expected, "delta-spark")
        if extra:
            with untuned(spark):
                same_rows(
                    timings.run("delta-spark first read, untuned", lambda: scan_all(delta(untuned_path))),
                    expected,
                    "delta-spark, untuned",
                )
        for _ in range(2):
            timings.run("parquet read", lambda: scan_all(spark.read.parquet(parquet_path)))
            timings.run("delta-spark read", lambda: scan_all(delta(delta_path)))
            if extra:
                with untuned(spark):
                    timings.run("delta-spark read, untuned", lambda: scan_all(delta(untuned_path)))
    return timings, (jobs.medians() if jobs else None)


#: ``--stats-columns``: the statistics each appended table keeps, by step name (None: none collected).
STATISTICS_VARIANTS = {
    "append, statistics on l_orderkey and l_shipdate": ("l_orderkey", "l_shipdate"),
    "append, statistics on the keys and l_shipdate": ("l_orderkey", "l_linenumber", "l_shipdate"),
    "append, statistics on the keys and three dates": (
        "l_orderkey",
        "l_linenumber",
        "l_shipdate",
        "l_commitdate",
        "l_receiptdate",
    ),
    "append, statistics on the keys, three dates and _sequence": (
        "l_orderkey",
        "l_linenumber",
        "_sequence",
        "l_shipdate",
        "l_commitdate",
        "l_receiptdate",
    ),
    "append, no statistics": None,
}


def measure_statistics(spark: SparkSession, source, work: str, repeat: int) -> Timings:
    """What each kept column costs: appends to empty tables keeping statistics on more and more columns.

    Each variant is a first load (an append to an empty table); they and
    Parquet's write rotate their order from one repeat to the next.
    """

    def create(path: str, columns: tuple[str, ...] | None) -> None:
        properties = {} if columns is None else {"delta.dataSkippingStatsColumns": ",".join(columns)}
        engine_for(spark).create_table(spark, path, source.schema, properties=properties)

    def append(path: str, columns: tuple[str, ...] | None) -> None:
        with without_statistics(spark) if columns is None else contextlib.nullcontext():
            source.write.format("delta").mode("append").save(path)

    timings = Timings(settle=os.sync)
    warm_up(spark, work)
    for i in range(repeat):
        reset_folder(work)
        writes = [("parquet write", lambda: source.write.mode("overwrite").parquet(os.path.join(work, "parquet")))]
        for n, (name, columns) in enumerate(STATISTICS_VARIANTS.items()):
            path = os.path.join(work, f"variant-{n}")
            create(path, columns)
            writes.append((name, partial(append, path, columns)))
        for name, write in writes[i % len(writes) :] + writes[: i % len(writes)]:
            timings.run(name, write)
    return timings


def measure_delta_rs(spark: SparkSession, source, work: str, repeat: int) -> Timings:
    """The delta-rs engine's writes and reads, and the Data Source API floors, against Parquet."""
    from medallion_assets.delta import read_delta, write_delta

    spark.dataSource.register(FloorSource)
    timings = Timings(settle=os.sync)
    warm_up(spark, work)
    scan_all(read_delta(spark, os.path.join(work, "warm-up-delta")))
    write_delta(make_frame(spark, 10_000), os.path.join(work, "warm-up-write-delta"), mode="overwrite")
    for i in range(repeat):
        reset_folder(work)
        parquet_path, delta_path, fast_path, plain_path, ipc_path = (
            os.path.join(work, f"{name}-{i}") for name in ("parquet", "delta", "write-delta", "pyarrow", "ipc")
        )
        writes = [
            ("parquet write", lambda: source.write.mode("overwrite").parquet(parquet_path)),
            ("write_delta write", lambda: write_delta(source, fast_path, mode="overwrite")),
            ("delta write", lambda: source.write.format("delta").mode("overwrite").save(delta_path)),
            (
                "discard write",
                lambda: source.write.format("bench_floor").option("kind", "discard").mode("append").save(),
            ),
            (
                "pyarrow write",
                lambda: source.write.format("bench_floor").option("kind", "pyarrow").mode("append").save(plain_path),
            ),
        ]
        # As for delta-spark: each repeat starts with the next write, so the Parquet
        # baseline is not always the first step after the previous repeat's reads.
        for name, write in writes[i % len(writes) :] + writes[: i % len(writes)]:
            timings.run(name, write)
        parquet_to_ipc(parquet_path, ipc_path)
        ipc_frame = lambda: spark.read.format("bench_floor").schema(source.schema).load(ipc_path)  # noqa: E731
        # One untimed pass each warms the page cache and the JIT for all the readers alike.
        expected = scan_all(spark.read.parquet(parquet_path))
        same_rows(scan_all(read_delta(spark, delta_path)), expected, "read_delta")
        same_rows(scan_all(read_delta(spark, fast_path)), expected, "write_delta")
        same_rows(scan_all(spark.read.format("delta").load(delta_path)), expected, "format('delta')")
        same_rows(scan_all(ipc_frame()), expected, "the IPC floor")
        for _ in range(2):
            timings.run("parquet read", lambda: scan_all(spark.read.parquet(parquet_path)))
            timings.run("delta toDF read", lambda: scan_all(read_delta(spark, delta_path)))
            timings.run("delta format read", lambda: scan_all(spark.read.format("delta").load(delta_path)))
            timings.run("ipc read", lambda: scan_all(ipc_frame()))
    return timings


def run_one_engine(args: argparse.Namespace) -> dict:
    """Measure one engine in this process; the figures as a JSON-ready dict."""
    write_jobs = args.write_jobs and args.engine == "delta-spark"
    spark, _ = build_session(
        args.engine,
        args.master,
        args.delta_spark_jars,
        f"delta-vs-parquet-{args.engine}",
        {"spark.ui.enabled": "true"} if write_jobs else None,
    )
    work = tempfile.mkdtemp(prefix="delta-bench-")
    try:
        with LoadSampler() as load:
            source = make_frame(spark, args.rows).cache()
            source.count()
            parts = None
            if args.engine == "delta-spark" and args.stats_columns:
                timings = measure_statistics(spark, source, work, args.repeat)
            elif args.engine == "delta-spark":
                timings, parts = measure_delta_spark(spark, source, work, args.repeat, args.extra_rows, write_jobs)
            else:
                timings = measure_delta_rs(spark, source, work, args.repeat)
        return {
            "facts": describe_session(spark, args.engine),
            "rows": args.rows,
            "repeat": args.repeat,
            "steps": timings.medians(),
            "write_jobs": parts,
            "load": load.samples,
            "paired": timings.paired_ratios((name, base) for name, base, _, _ in TABLE_ROWS[args.engine]),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


#: Per engine, the table rows: step, its Parquet baseline, label, target ratio.
TABLE_ROWS = {
    "delta-spark": [
        ("parquet write", "parquet write", "Parquet write (baseline)", None),
        ("delta-spark write", "parquet write", "write, Delta's default statistics (every column)", None),
        (
            "delta-spark write, project statistics",
            "parquet write",
            "write, the project's default statistics (silver lineitem's: l_orderkey and l_shipdate)",
            "1.10x",
        ),
        (
            "delta-spark append, project statistics",
            "parquet write",
            "the same, appended to the new table (a merge table's first load)",
            "1.10x",
        ),
        ("delta-spark write, untuned", "parquet write", "write, untuned (50 snapshot partitions)", None),
        (
            "delta-spark write, no statistics",
            "parquet write",
            "write without column statistics (`stats.collect=false`; explains the gap, not a setting)",
            None,
        ),
        ("parquet read", "parquet read", "Parquet read (baseline)", None),
        ("delta-spark first read", "parquet read", "first read of the new table (builds its snapshot)", None),
        ("delta-spark read", "parquet read", "read (snapshot cached)", "1.1x"),
        ("delta-spark first read, untuned", "parquet read", "first read, untuned (50 snapshot partitions)", None),
        ("delta-spark read, untuned", "parquet read", "read (snapshot cached), untuned", None),
        *(
            (name, "parquet write", f"a first load, {name.removeprefix('append, ')}", None)
            for name in STATISTICS_VARIANTS
        ),
    ],
    "delta-rs": [
        ("parquet write", "parquet write", "Parquet write (baseline)", None),
        (
            "write_delta write",
            "parquet write",
            "`write_delta` write (Spark's Parquet writer + delta-rs commit)",
            "1.15x",
        ),
        ("delta write", "parquet write", '`format("delta")` write', "1.25x (aim 1.1x)"),
        ("discard write", "parquet write", "floor: hand-off to Python only", None),
        ("pyarrow write", "parquet write", "floor: hand-off + plain pyarrow encoding", None),
        ("parquet read", "parquet read", "Parquet read (baseline)", None),
        ("delta toDF read", "parquet read", "`read_delta` / `toDF()` read", "1.15x"),
        ("delta format read", "parquet read", '`format("delta")` read', "1.6x"),
        ("ipc read", "parquet read", "floor: hand-off from Python only", None),
    ],
}


def describe_run(result: dict) -> str:
    facts = result["facts"]
    tuning = (
        f", snapshotPartitions {facts['snapshot_partitions']} (set by SparkResource)"
        if facts["engine"] == "delta-spark"
        else ""
    )
    return (
        f"* {facts['engine']}: {facts['delta']}{tuning}; Spark {facts['spark']}, {facts['master']}, "
        f"{facts['cores']} cores, driver memory {facts['driver_memory']}, Python {facts['python']}; "
        f"{describe_load(result['load'])}"
    )


def print_markdown(results: list[dict]) -> None:
    first = results[0]
    print(
        f"\n{first['rows']:,} rows; each engine in its own process, against Spark's Parquet in that process; "
        f"median of {first['repeat']} writes and {2 * first['repeat']} reads "
        f"(first reads: {first['repeat']})\n"
    )
    for result in results:
        print(describe_run(result))
    print(
        "\nRatio to Parquet: of the medians. Paired: the median of each repeat's own ratio (the step "
        "against the baseline of the same repeat, under that moment's load); its middle half: the first "
        "to the third quartile of those ratios.\n"
    )
    print(
        "| engine | step | wall s | ratio to Parquet | paired | paired, middle half "
        "| CPU s | CPU ratio | paired | target |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        steps, engine, paired = result["steps"], result["facts"]["engine"], result["paired"]
        for name, base, label, target in TABLE_ROWS[engine]:
            if name not in steps:
                continue
            step, baseline = steps[name], steps[base]
            pair = {kind: f"{paired[name][kind]:.2f}x" if name in paired else "-" for kind in ("wall", "cpu")}
            quartiles = paired.get(name, {}).get("wall_quartiles")
            middle = f"{quartiles[0]:.2f} to {quartiles[1]:.2f}x" if quartiles else "-"
            print(
                f"| {engine} | {label} | {step['wall']:.2f} | {step['wall'] / baseline['wall']:.2f}x | {pair['wall']} "
                f"| {middle} "
                f"| {step['cpu']:.2f} | {step['cpu'] / baseline['cpu']:.2f}x | {pair['cpu']} | {target or '-'} |"
            )
    for result in results:
        if result.get("write_jobs"):
            print_write_jobs(result["write_jobs"])


def print_write_jobs(parts: dict[str, dict[str, float]]) -> None:
    """Each write's median wall seconds split by the Spark jobs it ran (``--write-jobs``)."""
    labels = {name: label for name, _, label, _ in TABLE_ROWS["delta-spark"]}
    baseline = parts["parquet write"]["writing the rows"]
    print("\nWhere a write's wall seconds went (medians; jobs that overlap count once):\n")
    print("| write | " + " | ".join(WRITE_PARTS) + " | rows' job / Parquet's | Spark jobs |")
    print("| --- |" + " ---: |" * (len(WRITE_PARTS) + 2))
    for name, part in parts.items():
        print(
            f"| {labels[name]} | "
            + " | ".join(f"{part[p]:.2f}" for p in WRITE_PARTS)
            + f" | {part['writing the rows'] / baseline:.2f}x | {part['jobs']:g} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--no-extra-rows",
        dest="extra_rows",
        action="store_false",
        help="skip delta-spark's explanatory rows (Delta's default of 50 snapshot partitions; "
        "a write without column statistics)",
    )
    parser.add_argument(
        "--stats-columns",
        action="store_true",
        help="delta-spark: instead of the usual rows, what each column's statistics cost: a first "
        "load appended to tables keeping statistics on 0, 2, 3, 5 and 6 of lineitem's columns",
    )
    parser.add_argument(
        "--write-jobs",
        action="store_true",
        help="delta-spark: split each write's time into the Spark jobs it ran (writing the rows, "
        "building the state of the version an overwrite replaces, other jobs) and the time "
        "outside any job; turns the session's UI on",
    )
    add_engine_arguments(parser)
    run_benchmark(parser, argv, os.path.abspath(__file__), run_one_engine, print_markdown)


if __name__ == "__main__":
    main()
