"""How delta-rs' MERGE uses the Python process's memory, with and without a spill bound, by source size.

Run by hand (not a test), from the project root, on a table of a lake that
``incremental.py --folder`` (or a pipeline run) left behind:

    python benchmarks/merge_memory_pool.py --table LAKE/silver/lineitem \\
        --keys l_orderkey l_linenumber --group l_orderkey --fractions 0.01 0.1 0.3 --pools 0 256 1024

    python benchmarks/merge_memory_pool.py --table LAKE/silver/orders \\
        --keys o_orderkey --group o_orderkey --fractions 0.01 --pools 0 --row-group-rows 0 131072

deltalake alone, no Spark: the question is delta-rs' own behaviour. Neither
the IO manager's MERGEs by deltalake (sources of at most
``arrow_write_max_rows`` rows, tables of at most ``arrow_merge_max_table_mb``)
nor the delta-rs engine's set ``max_spill_size``: a bound fails a large source,
and near it the MERGE can deadlock (delta-io/delta-rs#4614). This measures
what a bound would save, and what the process holds without one.

For each ``--fractions`` share, the source is the stored rows of that share
of the ``--group`` values (an integer column; a group is chosen by a hash
of its value, so every run takes the same rows), read once with
pyarrow and kept as a Parquet file. Then, for each ``--pools`` size (MB; 0:
no bound), in a child process of its own (a fresh peak), on a copy of
``--table``: the source read back, and one MERGE on ``--keys`` that updates
every matched row and inserts the rest. It prints the source's rows and
Arrow size, the MERGE's seconds, the process's peak resident memory above
where it stood with the source in hand, the table's rows afterwards, and
delta-rs' error when the bound was too small for the MERGE.

``--row-group-rows`` also runs each MERGE with the files it rewrites cut into
row groups of at most that many rows (0: deltalake's default writer, up to
1,048,576 rows a row group). Its writer properties name Snappy, deltalake's
default codec: ``WriterProperties`` without a codec writes uncompressed files.

``--change-data-feed off on`` also runs each MERGE on a copy with
``delta.enableChangeDataFeed`` set, and then reads the change feed of the
version it wrote (its before and after images), as a gold table maintained
from silver's changes would: the MERGE's seconds with and without the feed,
and the feed's rows and the seconds to read them.

    python benchmarks/merge_memory_pool.py --table LAKE/silver/lineitem \\
        --keys l_orderkey l_linenumber --group l_orderkey --fractions 0.01 --pools 0 --change-data-feed off on
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from engine_runs import emit_json, memory_kb, reset_peak_rss, run_child


def write_source(table: str, group: str, fraction: float, folder: str) -> str:
    """The stored rows of ``fraction`` of the ``group`` values, as a Parquet file in ``folder``."""
    import deltalake
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # Chosen by a multiplicative hash of the value (Knuth's), so every run takes the same rows
    # and the share holds for keys with gaps (TPC-H's order keys use a quarter of the integers).
    bucket = pc.bit_wise_and(pc.shift_right(pc.multiply(pc.field(group), 2654435761), 16), 1023)
    chosen = bucket < round(fraction * 1024)
    path = os.path.join(folder, f"source_{fraction}.parquet")
    pq.write_table(deltalake.DeltaTable(table).to_pyarrow_dataset().to_table(filter=chosen), path)
    return path


def measure(args: argparse.Namespace) -> dict:
    import deltalake
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    work = tempfile.mkdtemp(prefix="merge_pool_")
    path = os.path.join(work, "table")
    shutil.copytree(args.table, path)
    try:
        table = deltalake.DeltaTable(path)
        if args.feed:
            table.alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
        source = pq.read_table(args.source)
        reset_peak_rss(os.getpid())
        before = memory_kb(os.getpid(), "VmRSS")
        on = " AND ".join(f"t.`{key}` = s.`{key}`" for key in args.keys)
        options = {"max_spill_size": args.pool * 1024 * 1024} if args.pool else {}
        if args.row_group:
            options["writer_properties"] = deltalake.WriterProperties(
                max_row_group_size=args.row_group, compression="SNAPPY"
            )
        started = time.perf_counter()
        error = None
        try:
            (
                table.merge(source, on, source_alias="s", target_alias="t", **options)
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        except Exception as exc:  # delta-rs' own error is the result being measured
            error = str(exc).splitlines()[0][:300]
        seconds = time.perf_counter() - started
        merged = deltalake.DeltaTable(path)
        rows_after = pa.table(merged.get_add_actions(flatten=True))["num_records"]
        feed_rows = feed_seconds = None
        if args.feed and error is None:
            started = time.perf_counter()
            feed_rows = merged.load_cdf(starting_version=merged.version()).read_all().num_rows
            feed_seconds = round(time.perf_counter() - started, 2)
        return {
            "change_data_feed": bool(args.feed),
            "feed_rows": feed_rows,
            "feed_read_s": feed_seconds,
            "fraction": args.fraction,
            "pool_mb": args.pool,
            "row_group_rows": args.row_group,
            "source_rows": source.num_rows,
            "source_mb": round(source.nbytes / 2**20),
            "seconds": round(seconds, 2),
            "peak_growth_mb": round((memory_kb(os.getpid(), "VmHWM") - before) / 1024),
            "rows_after": pc.sum(rows_after).as_py(),
            "error": error,
            "load_average": round(os.getloadavg()[0], 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True, help="folder of an existing Delta table (it is copied, not changed)")
    parser.add_argument("--keys", nargs="+", required=True, help="the MERGE's keys")
    parser.add_argument("--group", required=True, help="an integer column; a share of its values picks the source rows")
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.01, 0.1, 0.3])
    parser.add_argument("--pools", nargs="+", type=int, default=[0, 256, 1024], help="max_spill_size in MB; 0 for none")
    parser.add_argument(
        "--row-group-rows",
        nargs="+",
        type=int,
        default=[0],
        help="the rewritten files' row groups, at most this many rows; 0 for deltalake's default",
    )
    parser.add_argument(
        "--change-data-feed",
        nargs="+",
        choices=("off", "on"),
        default=["off"],
        help="run each MERGE without and/or with the table's change data feed",
    )
    parser.add_argument("--fraction", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--feed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--pool", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--row-group", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fraction is not None:
        emit_json(measure(args))
        return
    print(
        "| share of groups | source rows | source MB | spill bound | row groups up to | change feed | MERGE s "
        "| peak above the source in hand, MB | rows after | feed rows | feed read s | error | load |"
    )
    print("| ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    sources = tempfile.mkdtemp(prefix="merge_pool_sources_")
    try:
        for fraction in args.fractions:
            source = write_source(args.table, args.group, fraction, sources)
            for pool in args.pools:
                for row_group in args.row_group_rows:
                    for feed in args.change_data_feed:
                        print_run(fraction, pool, row_group, feed == "on", source)
    finally:
        shutil.rmtree(sources, ignore_errors=True)


def print_run(fraction: float, pool: int, row_group: int, feed: bool, source: str) -> None:
    r = run_child(
        [
            *sys.argv,
            "--fraction",
            str(fraction),
            "--pool",
            str(pool),
            "--row-group",
            str(row_group),
            "--feed",
            str(int(feed)),
            "--source",
            source,
        ],
        f"the run at {fraction} with a {pool} MB bound, row groups {row_group}, change feed {feed}",
    )
    bound = f"{r['pool_mb']} MB" if r["pool_mb"] else "none"
    groups = f"{r['row_group_rows']:,} rows" if r["row_group_rows"] else "default"
    feed_rows = "" if r["feed_rows"] is None else f"{r['feed_rows']:,}"
    print(
        f"| {r['fraction']:.0%} | {r['source_rows']:,} | {r['source_mb']} | {bound} | {groups} "
        f"| {'on' if r['change_data_feed'] else 'off'} | {r['seconds']} | {r['peak_growth_mb']} | {r['rows_after']:,} "
        f"| {feed_rows} | {r['feed_read_s'] if r['feed_read_s'] is not None else ''} | {r['error'] or ''} "
        f"| {r['load_average']} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
