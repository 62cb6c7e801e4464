"""Delta tables read and written by deltalake (delta-rs) in this process, without Spark: :class:`ArrowDeltaClient`.

The writer of pandas, polars and Arrow outputs, and of the small Spark writes
:func:`~medallion_assets.storage.writers.choose_writer` gives it; the reader
of inputs computed on without Spark. Knows neither Dagster nor DataFrame
libraries: Arrow in, Arrow out.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake.exceptions import DeltaError

from medallion_assets.delta import (
    UnsupportedFeatureError,
    add_assigned_fields,
    check_read_support,
    conform_source,
    map_values_grown_error,
)
from medallion_assets.object_store import storage_options_for
from medallion_assets.storage.engines import user_metadata
from medallion_assets.storage.merge_clauses import MergeClause, with_unacted_matches_kept
from medallion_assets.storage.write_spec import WriteSpec, check_engine_reads, declared_table_properties

#: What delta-rs raises where it cannot read a location or a table (a Hadoop-only scheme, a lake only
#: a Spark server sees, deletion vectors, column mapping): callers that have Spark read with it instead.
DELTA_RS_CANNOT_READ = (DeltaError, UnsupportedFeatureError, OSError, ValueError, pa.ArrowException)


@dataclass(frozen=True)
class TimeWindowFilter:
    """Rows of one time-window partition: ``start <= column < end``.

    Attributes:
        column: the upstream's ``partition_expr`` column.
        start: the window's start (inclusive).
        end: the window's end (exclusive).
    """

    column: str
    start: Any
    end: Any

    def expression(self, schema: pa.Schema) -> ds.Expression:
        """The filter as a pyarrow dataset expression, with bounds cast to the column's type."""
        kind = schema.field(self.column).type
        if pa.types.is_date(kind):
            start, end = self.start.date(), self.end.date()
        else:
            # Compare in the column's own time zone (or none): Arrow refuses to mix them.
            start, end = (_as_zone(moment, getattr(kind, "tz", None)) for moment in (self.start, self.end))
        low, high = pa.scalar(start, type=kind), pa.scalar(end, type=kind)
        return (pc.field(self.column) >= low) & (pc.field(self.column) < high)


def _as_zone(moment: Any, tz: str | None) -> Any:
    if tz is None:
        return moment.replace(tzinfo=None) if moment.tzinfo else moment
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def rows_by_statistics(add_actions: pa.Table) -> int | None:
    """A version's rows from its files' ``num_records`` (delta-rs' add actions); None when some file has none."""
    if add_actions.num_rows == 0:
        return 0
    if "num_records" not in add_actions.column_names:
        return None
    counts = add_actions.column("num_records")
    return None if counts.null_count else int(pc.sum(counts).as_py())


def files_size(add_actions: pa.Table) -> int:
    """A version's bytes of data files, from delta-rs' add actions."""
    return int(pc.sum(add_actions.column("size_bytes")).as_py() or 0) if add_actions.num_rows else 0


def logged_rows(table: deltalake.DeltaTable) -> int | None:
    """The rows of the version delta-rs opened, from its log's statistics alone; None when a file has none."""
    return rows_by_statistics(pa.table(table.get_add_actions(flatten=True)))


class ArrowDeltaClient:
    """Reads and writes Delta tables with delta-rs (``deltalake``), without Spark.

    Args:
        storage_options: passed to ``deltalake`` for every table; none: each table's own, from its
            location (:func:`~medallion_assets.object_store.storage_options_for`: a table in the
            lake's bucket gets the store of the environment's settings, a local one none).
    """

    def __init__(self, *, storage_options: Mapping[str, str] | None = None) -> None:
        self.storage_options = dict(storage_options) if storage_options else None

    def _options(self, path: str) -> dict[str, str] | None:
        return self.storage_options if self.storage_options is not None else storage_options_for(path)

    def open_table(self, path: str, version: int | None = None) -> deltalake.DeltaTable:
        """The table at ``version`` (the latest by default) as delta-rs opens it, unchecked.

        :meth:`readable_table` also refuses a table whose files delta-rs would misread.
        """
        return deltalake.DeltaTable(path, version=version, storage_options=self._options(path))

    def exists(self, path: str) -> bool:
        """Whether ``path`` holds a Delta table."""
        return deltalake.DeltaTable.is_deltatable(path, storage_options=self._options(path))

    def latest_version(self, path: str) -> int:
        """The table's current version."""
        return self.open_table(path).version()

    def dataset(
        self,
        path: str,
        *,
        version: int | None = None,
        columns: Sequence[str] | None = None,
        window: TimeWindowFilter | None = None,
    ) -> ds.Dataset:
        """The table (at ``version``) as a lazy pyarrow dataset, pruned to ``columns`` and ``window``.

        Nothing is read yet: the filter on a partition column skips whole
        files, and the selected columns are the only ones a scan reads.

        Raises:
            UnsupportedFeatureError: the table's files cannot be read as plain
                Parquet (column mapping, deletion vectors).
        """
        return self.pruned_dataset(self.readable_table(path, version=version), path, columns=columns, window=window)

    @staticmethod
    def pruned_dataset(
        table: deltalake.DeltaTable,
        path: str,
        *,
        columns: Sequence[str] | None = None,
        window: TimeWindowFilter | None = None,
    ) -> ds.Dataset:
        """A table :meth:`readable_table` opened, as :meth:`dataset` makes it; ``path`` names it in errors."""
        dataset = table.to_pyarrow_dataset()
        if window is not None:
            dataset = dataset.filter(window.expression(dataset.schema))
        if columns:
            missing = [name for name in columns if name not in dataset.schema.names]
            if missing:
                raise ValueError(
                    f"delta/columns names {missing}, which the Delta table {path} does not have "
                    f"(its columns: {', '.join(dataset.schema.names)}): fix the input's metadata"
                )
            dataset = dataset.replace_schema(pa.schema([dataset.schema.field(name) for name in columns]))
        return dataset

    def readable_table(self, path: str, *, version: int | None = None) -> deltalake.DeltaTable:
        """The table at ``version`` (the latest by default) as delta-rs opens it, for a reader that plans on it.

        DataFusion's ``register_table`` takes it and reads only the columns
        and files its query needs; :meth:`pruned_dataset` makes it a pyarrow dataset.

        Raises:
            UnsupportedFeatureError: the table's files cannot be read as plain
                Parquet (deletion vectors, column mapping).
        """
        table = self.open_table(path, version)
        # delta-rs opens a column-mapped table of reader version 2 and reads its renamed
        # columns as nulls, without an error: refuse it here.
        check_read_support(table, path)
        return table

    def readable_rows(self, path: str, *, version: int | None = None) -> tuple[int, int | None]:
        """``(version, rows)`` of the table at ``version`` (the latest by default), from its log alone.

        ``rows`` sums the files' statistics, None when a file has none.

        Raises:
            UnsupportedFeatureError: the table's files cannot be read as plain
                Parquet (deletion vectors, column mapping).
        """
        table = self.readable_table(path, version=version)
        return table.version(), logged_rows(table)

    def files_bytes(self, path: str) -> int:
        """The total size of the files of the table's current version, from its log alone."""
        return files_size(pa.table(self.open_table(path).get_add_actions(flatten=True)))

    def computed_from(self, path: str) -> str | None:
        """The ``computed_from`` fingerprint of the table's newest commit, if it has one."""
        return self.newest_commit(path)[1].get("computed_from")

    def newest_commit(self, path: str) -> tuple[dict[str, Any], dict[str, str]]:
        """The newest commit's ``history()`` entry and its custom metadata."""
        history = self.open_table(path).history(1)
        info = history[0] if history else {}
        return info, user_metadata(info.get("userMetadata"))

    def write(
        self,
        data: pa.Table,
        path: str,
        spec: WriteSpec,
        *,
        asset: str,
        replace_where: str | None,
        commit_metadata: Mapping[str, str],
        transaction: tuple[str, int] | None,
    ) -> str | None:
        """Write ``data`` as ``spec`` says: overwrite, append, or merge on the merge keys.

        Args:
            data: the rows.
            path: the table's location.
            spec: the asset's declaration.
            asset: names the asset in errors.
            replace_where: the partition an overwrite replaces (SQL, as the Spark path's).
            commit_metadata: custom keys of the commit (each key, and all as ``userMetadata``
                JSON, which both engines read back).
            transaction: ``(application id, version)`` of an append: a retry of a
                step whose append committed does not append again.

        Returns:
            Why nothing was written, or ``None`` when a commit was made.

        Raises:
            ValueError: a merge the delta-rs route does not do (deletes, replace groups), or a
                table declared with properties delta-rs could not read back (deletion vectors).
        """
        check_engine_reads(declared_table_properties(spec), path=path, engine="delta-rs")
        custom = _custom_metadata(commit_metadata)
        exists = self.exists(path)
        if spec.mode == "replace_keys":
            raise ValueError(
                f"asset {asset}: write mode 'replace_keys' is not supported for pandas, polars and Arrow outputs "
                "(delta-rs route); return a Spark DataFrame from the asset, or overwrite the table"
            )
        if spec.mode == "merge":
            return self._merge(data, path, spec, asset=asset, exists=exists, custom=custom)
        if transaction is not None and exists and self._committed(path, transaction):
            return f"already appended by this run (transaction {transaction[0]})"
        if spec.mode == "append" and data.num_rows == 0:
            return "no new rows"
        # The stubs take a predicate with mode 'overwrite' only; an append passes None, as deltalake allows.
        deltalake.write_deltalake(  # type: ignore[misc]
            path,
            data,
            mode=spec.mode,  # type: ignore[arg-type]
            partition_by=list(spec.partition_columns) or None,
            configuration=declared_table_properties(spec) or None,
            schema_mode=None if spec.schema_mode == "strict" else spec.schema_mode,
            predicate=replace_where,
            storage_options=self._options(path),
            commit_properties=_commit_properties(commit_metadata, transaction),
        )
        return None

    def _committed(self, path: str, transaction: tuple[str, int]) -> bool:
        """Whether the table's log holds ``transaction``'s application at that version or a later one."""
        app_id, version = transaction
        done = self.open_table(path).transaction_version(app_id)
        return done is not None and done >= version

    def append_to_existing(
        self,
        data: pa.Table | None,
        path: str,
        *,
        commit_metadata: Mapping[str, str],
        transaction: tuple[str, int] | None,
    ) -> str | None:
        """Append ``data`` to the existing table at ``path`` as one commit.

        The rows take the table's column types (Spark's Arrow types name the
        same values: a session-zone timestamp, a narrower string). Without
        rows the commit carries only ``commit_metadata`` and ``transaction``,
        as delta-spark's empty commit does.

        Args:
            data: the rows, with exactly the table's columns, in any order; ``None``: no row.
            path: the table's location.
            commit_metadata: custom keys of the commit, as :meth:`write` records them.
            transaction: ``(application id, version)``: not committed again when the
                table already holds it (a retried step).

        Returns:
            Why nothing was committed, or ``None`` when a commit was made.

        Raises:
            ValueError: ``data``'s columns are not the table's (a new column is the
                Spark route's schema evolution).
            DELTA_RS_CANNOT_READ: a table delta-rs does not read (deletion vectors, column mapping).
            deltalake.exceptions.DeltaProtocolError: a writer feature delta-rs does not write.
        """
        table = self.open_table(path)
        check_read_support(table, path)
        schema = pa.schema(table.schema())
        data = schema.empty_table() if data is None else data
        if sorted(data.column_names) != sorted(schema.names):
            raise ValueError(f"the rows' columns {data.column_names} are not the columns of {path}: {schema.names}")
        if transaction is not None and self._committed(path, transaction):
            return f"already committed by this run (transaction {transaction[0]})"
        deltalake.write_deltalake(
            table,
            data.select(schema.names).cast(schema),
            mode="append",
            commit_properties=_commit_properties(commit_metadata, transaction),
        )
        return None

    def merge_into_existing(
        self,
        data: pa.Table,
        path: str,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        commit_metadata: Mapping[str, str],
    ) -> dict[str, Any]:
        """MERGE ``data`` (alias ``s``) into the existing table at ``path`` (alias ``t``) as one commit.

        The Spark client's MERGE, clause for clause, run by delta-rs in this
        process. Source columns the table also has take the table's types.
        delta-rs holds the rewrite of the files with matched keys in memory, so
        the process grows with them; callers bound the table's size
        (:meth:`files_bytes`). A matched row that none of ``clauses`` acts on is
        kept as it is by a last, unconditional update, and delta-rs' metrics
        count it as updated.

        Args:
            data: the merge source.
            path: the table's location.
            on: the match condition, SQL over ``t.`` and ``s.`` columns.
            clauses: the ``WHEN`` clauses, in order.
            commit_metadata: custom keys of the commit, as :meth:`write` records them.

        Returns:
            delta-rs' metrics of the merge.

        Raises:
            DELTA_RS_CANNOT_READ: a table delta-rs does not read (deletion vectors, column
                mapping), or a condition delta-rs does not parse.
            deltalake.exceptions.DeltaProtocolError: a writer feature delta-rs does not write.
            deltalake.exceptions.CommitFailedError: another writer committed in between.
        """
        table = self.open_table(path)
        check_read_support(table, path)
        # No spill bound (max_spill_size): under one, deltalake 1.6.6's MERGE can deadlock once it spills,
        # its repartitioning waiting on itself (delta-io/delta-rs#4614), and it offers no way to run on one
        # partition. A step that never ends is worse than one that holds more memory.
        merger = table.merge(
            conform_source(data, pa.schema(table.schema()), path),
            on,
            source_alias="s",
            target_alias="t",
            commit_properties=_commit_properties(commit_metadata, None),
        )
        return _with_clauses(merger, clauses, table).execute()

    def _merge(
        self, data: pa.Table, path: str, spec: WriteSpec, *, asset: str, exists: bool, custom: dict[str, str]
    ) -> str | None:
        if spec.delete_column or spec.replace_group:
            raise ValueError(
                f"asset {asset}: write mode 'merge' with delete_column or replace_group is not supported for "
                "pandas, polars and Arrow outputs (delta-rs route); return a Spark DataFrame from the asset, "
                "or declare a plain merge on merge_keys"
            )
        if data.num_rows == 0:
            return "no new rows"
        if not exists:
            deltalake.write_deltalake(
                path,
                data,
                mode="append",
                partition_by=list(spec.partition_columns) or None,
                configuration=declared_table_properties(spec) or None,
                storage_options=self._options(path),
                commit_properties=deltalake.CommitProperties(custom_metadata=custom),
            )
            return None
        predicate = " AND ".join(f"t.`{key}` = s.`{key}`" for key in spec.merge_keys)
        newer = f"s.`{spec.sequence_column}` > t.`{spec.sequence_column}`" if spec.sequence_column else None
        every_column = {column: f"s.`{column}`" for column in data.column_names}
        table = self.open_table(path)
        if spec.schema_mode == "merge":
            add_assigned_fields(table, data.schema, None)
        merger = table.merge(
            data,
            predicate,
            source_alias="s",
            target_alias="t",
            merge_schema=spec.schema_mode == "merge",
            commit_properties=deltalake.CommitProperties(custom_metadata=custom),
        )
        clauses = [MergeClause("update", newer, every_column), MergeClause("insert", None, every_column)]
        try:
            _with_clauses(merger, clauses, table).execute()
        except DeltaError as error:
            grown = map_values_grown_error(error, action=f"MERGE into {asset}", table=path)
            if grown is None:
                raise
            raise grown from error
        return None


def _with_clauses(
    merger: deltalake.table.TableMerger, clauses: Sequence[MergeClause], target: deltalake.DeltaTable
) -> deltalake.table.TableMerger:
    """``merger`` with ``clauses`` in order, and the last one that keeps rows no clause acts on."""
    # The target's own first column: a source column could be one that schema evolution adds.
    for clause in with_unacted_matches_kept(clauses, column=target.schema().fields[0].name):
        if clause.action == "delete":
            merger = merger.when_matched_delete(clause.condition)
        elif clause.action == "update":
            merger = merger.when_matched_update(dict(clause.assignments or {}), clause.condition)
        else:
            merger = merger.when_not_matched_insert(dict(clause.assignments or {}), clause.condition)
    return merger


def _custom_metadata(commit_metadata: Mapping[str, str]) -> dict[str, str]:
    """A commit's custom keys: each on its own, and all as ``userMetadata`` JSON, which both engines read back."""
    return {
        **{key: str(value) for key, value in commit_metadata.items()},
        "userMetadata": json.dumps(dict(commit_metadata), sort_keys=True),
    }


def _commit_properties(
    commit_metadata: Mapping[str, str], transaction: tuple[str, int] | None
) -> deltalake.CommitProperties:
    """A commit carrying ``commit_metadata`` (:func:`_custom_metadata`) and, if given, the application transaction."""
    return deltalake.CommitProperties(
        custom_metadata=_custom_metadata(commit_metadata),
        app_transactions=[deltalake.Transaction(*transaction)] if transaction is not None else None,
    )
