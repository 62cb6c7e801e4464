"""The TPC-H source tables: generated once with ``tpchgen-cli``, then streamed in chunks of rows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medallion_assets.pipelines.tpch.contract import (
    TPCH_SCHEMAS,
)


def tpchgen_executable() -> str:
    """The path of ``tpchgen-cli``: next to the interpreter, else on PATH.

    Raises:
        FileNotFoundError: When the generator is not installed.
    """
    beside_python = Path(sys.executable).parent / "tpchgen-cli"
    if beside_python.exists():
        return str(beside_python)
    on_path = shutil.which("tpchgen-cli")
    if on_path is None:
        raise FileNotFoundError("tpchgen-cli not found; install the tpchgen-cli package")
    return on_path


def default_work_dir() -> Path:
    """Where generated TPC-H data is cached when no work dir is given."""
    return Path(tempfile.gettempdir()) / "medallion_assets_tpch"


def _scale_factor_text(scale_factor: float) -> str:
    return format(Decimal(str(scale_factor)).normalize(), "f")


def tpch_folder(work_dir: Path | str | None = None, scale_factor: float = 0.01) -> Path:
    """The folder of the generated TPC-H Parquet files, generating them if needed.

    The generator runs once per scale factor and work dir; later calls find
    the cached files.

    Args:
        work_dir: Cache folder; defaults to :func:`default_work_dir`.
        scale_factor: TPC-H scale factor.

    Returns:
        A folder with ``<table>.parquet`` for every TPC-H table.
    """
    folder = Path(work_dir or default_work_dir()) / f"tpch-sf{_scale_factor_text(scale_factor)}"
    if not (folder / "_SUCCESS").exists():
        _generate_tpch(folder, scale_factor)
    return folder


def tpch_tables(work_dir: Path | str | None = None, scale_factor: float = 0.01) -> dict[str, pa.Table]:
    """The TPC-H tables at ``scale_factor``, with the contract's column types.

    This loads every table whole; the simulator itself streams them.

    Args:
        work_dir: Cache folder; defaults to :func:`default_work_dir`.
        scale_factor: TPC-H scale factor.

    Returns:
        Table name -> Arrow table cast to :data:`TPCH_SCHEMAS`.
    """
    folder = tpch_folder(work_dir, scale_factor)
    return {name: pq.read_table(folder / f"{name}.parquet").cast(schema) for name, schema in TPCH_SCHEMAS.items()}


def _generate_tpch(folder: Path, scale_factor: float) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Generate into a private folder and rename it into place, so concurrent
    # callers never read a half-written data set.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        subprocess.run(
            [
                tpchgen_executable(),
                "parquet",
                "--scale-factor",
                _scale_factor_text(scale_factor),
                "--output-dir",
                str(staging),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        (staging / "_SUCCESS").touch()
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / "_SUCCESS").exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def table_chunks(path: Path, schema: pa.Schema, rows: int) -> Iterator[pa.Table]:
    """Stream a Parquet file in slices of exactly ``rows`` rows (the last one shorter).

    Slicing by row count, not by the file's row groups, keeps the plan (and so
    the output) independent of how the generator laid out its files.

    Args:
        path: The Parquet file.
        schema: The contract schema to cast to.
        rows: Rows per slice.

    Yields:
        Tables with one chunk per column.
    """
    pending: list[pa.RecordBatch] = []
    count = 0
    # Without pre-buffering the reader holds one column chunk at a time, not a row group.
    for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=rows):
        pending.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(pending)
            chunk = table.slice(0, rows).cast(schema).combine_chunks()
            rest = table.slice(rows)
            pending, count = rest.to_batches(), rest.num_rows
            # Hold nothing but the rest while the consumer works on the chunk.
            del table, rest
            yield chunk
    if count:
        yield pa.Table.from_batches(pending).cast(schema).combine_chunks()


def orders_with_lineitems(folder: Path, rows: int) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Stream orders in chunks of ``rows`` orders, each with its line items.

    Both tables are sorted by order key (``tpchgen-cli`` writes them so), which
    lets one pass over each file pair them up.

    Yields:
        ``(orders, lineitem)``: the line items are those of the chunk's orders,
        in file order.

    Raises:
        ValueError: When the files are not sorted by order key.
    """
    lineitem_schema = TPCH_SCHEMAS["lineitem"]
    lineitem_chunks = table_chunks(folder / "lineitem.parquet", lineitem_schema, rows)
    pending = lineitem_schema.empty_table()
    for orders in table_chunks(folder / "orders.parquet", TPCH_SCHEMAS["orders"], rows):
        last_key = orders["o_orderkey"][-1].as_py()
        while pending.num_rows == 0 or pending["l_orderkey"][-1].as_py() <= last_key:
            more = next(lineitem_chunks, None)
            if more is None:
                break
            pending = pa.concat_tables([pending, more])
        split = int(np.searchsorted(pending["l_orderkey"].to_numpy(), last_key, side="right"))
        lineitem = pending.slice(0, split).combine_chunks()
        pending = pending.slice(split)
        yield orders, lineitem
    if pending.num_rows or next(lineitem_chunks, None) is not None:
        raise ValueError(f"{folder}: line items after the last order; expected files sorted by order key")


def item_ranges(orders: pa.Table, lineitem: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Where each order's line items are in ``lineitem``: (first row, count).

    Raises:
        ValueError: When the rows are not sorted by order key or some line item
            has no order in the chunk.
    """
    order_keys = orders["o_orderkey"].to_numpy()
    item_keys = lineitem["l_orderkey"].to_numpy()
    if np.any(np.diff(order_keys) <= 0) or np.any(np.diff(item_keys) < 0):
        raise ValueError("TPC-H orders and lineitem must be sorted by order key")
    starts = np.searchsorted(item_keys, order_keys, side="left")
    counts = np.searchsorted(item_keys, order_keys, side="right") - starts
    if counts.sum() != len(item_keys):
        raise ValueError("a line item's order is missing from TPC-H orders")
    return starts, counts


def max_key(path: Path, column: str) -> int:
    """The largest value of an integer column, read one column at a time."""
    largest = None
    for batch in pq.ParquetFile(path).iter_batches(columns=[column]):
        chunk_max = pc.max(batch.column(0)).as_py()
        if chunk_max is not None and (largest is None or chunk_max > largest):
            largest = chunk_max
    return 0 if largest is None else int(largest)
