"""delta-spark's ``DeltaMergeBuilder``, executed by delta-rs on the driver."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from medallion_assets.delta._schema import delta_to_spark_schema, refuse_growth_inside_maps
from medallion_assets.delta._sql import to_sql
from medallion_assets.delta.errors import DeltaOptionError, SchemaMismatchError, translated

if TYPE_CHECKING:
    import deltalake
    from pyspark.sql import Column, SparkSession

__all__ = ["DeltaMergeBuilder", "MergeTarget", "conform_source", "source_alias"]


class MergeTarget(Protocol):
    """What a MERGE needs of its target (:class:`~medallion_assets.delta.tables.DeltaTable` is one)."""

    _alias: str | None
    lastOperationMetrics: dict[str, Any] | None

    @property
    def path(self) -> str: ...

    @property
    def _spark(self) -> SparkSession | None: ...

    def _table(self) -> deltalake.DeltaTable: ...


_METRICS_SCHEMA = T.StructType(
    [
        T.StructField("num_affected_rows", T.LongType()),
        T.StructField("num_updated_rows", T.LongType()),
        T.StructField("num_deleted_rows", T.LongType()),
        T.StructField("num_inserted_rows", T.LongType()),
    ]
)


def source_alias(df: DataFrame) -> str | None:
    """The alias given with ``df.alias(name)``.

    Spark Connect keeps it on the client's plan (a ``SubqueryAlias`` node);
    classic Spark in the analyzed plan on the JVM.
    """
    connect_plan = getattr(df, "_plan", None)
    if connect_plan is not None and type(connect_plan).__name__ == "SubqueryAlias":
        return getattr(connect_plan, "_alias", None)
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return None
    try:
        plan = jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() == "SubqueryAlias":
            return str(plan.alias())
    except Exception:
        return None
    return None


def conform_source(source: pa.Table, target: pa.Schema, table: str) -> pa.Table:
    """Cast source columns that the target also has to the target's types (safe casts only)."""
    by_name = {f.name.lower(): f for f in target}
    columns, fields = [], []
    for field, column in zip(source.schema, source.columns, strict=False):
        want = by_name.get(field.name.lower())
        typ = field.type
        if pa.types.is_string_view(typ) or pa.types.is_large_string(typ):
            typ = pa.string()
        if want is not None and not want.type.equals(field.type):
            typ = want.type
        if not typ.equals(field.type):
            try:
                column = column.cast(typ, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SchemaMismatchError(
                    f"MERGE source column '{field.name}' is {field.type} and cannot be cast safely to the "
                    f"table's {typ}: {exc}. Cast it in the source DataFrame.",
                    table=table,
                ) from exc
        columns.append(column)
        fields.append(pa.field(field.name, typ, True))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _with_nullable_fields(field: pa.Field) -> pa.Field:
    # Rows already stored have no value for a field the schema gains, at any depth.
    typ = field.type
    if pa.types.is_struct(typ):
        typ = pa.struct([_with_nullable_fields(typ.field(i)) for i in range(typ.num_fields)])
    elif pa.types.is_list(typ):
        typ = pa.list_(_with_nullable_fields(typ.value_field))
    elif pa.types.is_large_list(typ):
        typ = pa.large_list(_with_nullable_fields(typ.value_field))
    elif pa.types.is_map(typ):
        typ = pa.map_(typ.key_field, _with_nullable_fields(typ.item_field))
    return field.with_type(typ).with_nullable(True)


def _lacks_fields(stored: pa.DataType | None, incoming: pa.DataType) -> bool:
    """Whether ``incoming`` has a field, at any depth, that ``stored`` lacks (``None``: a new column).

    Names match case-insensitively, as Delta's columns do. Types are not
    compared: a field both have is not new, whatever its type.
    """
    if stored is None:
        return True
    if pa.types.is_struct(incoming) and pa.types.is_struct(stored):
        known = {stored.field(i).name.lower(): stored.field(i).type for i in range(stored.num_fields)}
        return any(
            _lacks_fields(known.get(incoming.field(i).name.lower()), incoming.field(i).type)
            for i in range(incoming.num_fields)
        )
    lists = (pa.types.is_list, pa.types.is_large_list)
    if any(a(incoming) for a in lists) and any(b(stored) for b in lists):
        return _lacks_fields(stored.value_type, incoming.value_type)
    if pa.types.is_map(incoming) and pa.types.is_map(stored):
        return _lacks_fields(stored.item_type, incoming.item_type)
    return False


def add_assigned_fields(table: deltalake.DeltaTable, source: pa.Schema, assigned: set[str] | None) -> None:
    """Add to ``table`` the columns and nested fields that a MERGE with schema evolution assigns and it lacks.

    deltalake 1.6.6's MERGE gives a column it adds the source's value in every
    row that has a source row, whatever the clauses say: a matched row that no
    clause changes (a stale change) would store its source's value, where
    delta-spark keeps it null. A struct column that gains a field is worse:
    the stale change's whole struct replaces the stored one, fields the table
    had included. Once the schema is the table's, the MERGE reads the target's
    own values. So the schema grows first, in a commit of its own: an append
    of no rows with ``schema_mode="merge"``, delta-rs merging the schemas. If
    the MERGE then fails, the table keeps the new, empty, fields. Fields that
    the structs inside a map gain are refused before that commit
    (:func:`~medallion_assets.delta._schema.refuse_growth_inside_maps`).

    Args:
        table: the MERGE's target.
        source: the source's schema.
        assigned: the columns the clauses assign; ``None`` for every source column
            (an update-all or insert-all clause). ``table`` is left at the version
            with the grown schema, if it grew.
    """
    stored = {f.name.lower(): f.type for f in pa.schema(table.schema().to_arrow())}
    wanted = None if assigned is None else {name.lower() for name in assigned}
    growing = [
        _with_nullable_fields(f)
        for f in source
        if (wanted is None or f.name.lower() in wanted) and _lacks_fields(stored.get(f.name.lower()), f.type)
    ]
    if growing:
        refuse_growth_inside_maps(
            delta_to_spark_schema(table.schema()), from_arrow_schema(pa.schema(growing)), table=table.table_uri
        )
        write_deltalake(
            table,
            pa.schema(growing).empty_table(),
            mode="append",
            schema_mode="merge",
            commit_properties=CommitProperties(custom_metadata={"mergeSchema": "true"}),
        )
        table.update_incremental()


class DeltaMergeBuilder:
    """Builds a MERGE like delta-spark's ``DeltaMergeBuilder``; get one from :meth:`DeltaTable.merge`.

    **Runs on the driver**: ``execute()`` collects the source DataFrame to the
    driver as Arrow (``source.toArrow()``) and delta-rs performs the MERGE in
    this process, as one commit. The source must fit in driver memory.

    Conditions and expressions are SQL strings or Columns, parsed by delta-rs
    as DataFusion SQL: ``t.id = s.id``, ``s.seq > t.seq``, ``s.op = 'D'``,
    ``CASE WHEN ... END`` and common functions such as ``coalesce`` work.
    Clauses of one kind are tried in the order added, like delta-spark.

    Attributes:
        metrics: delta-rs' raw metrics dict of the executed merge (``None``
            before ``execute()``); also on ``DeltaTable.lastOperationMetrics``.

    Example:
        >>> (DeltaTable.forPath(spark, path).alias("t")
        ...     .merge(changes.alias("s"), "t.id = s.id")
        ...     .whenMatchedDelete(condition="s.op = 'D'")
        ...     .whenMatchedUpdateAll(condition="s.seq > t.seq")
        ...     .whenNotMatchedInsertAll(condition="s.op <> 'D'")
        ...     .whenNotMatchedBySourceDelete()
        ...     .execute()).show()  # doctest: +SKIP
    """

    def __init__(self, table: MergeTarget, source: DataFrame, condition: str | Column) -> None:
        if not isinstance(source, DataFrame):
            raise DeltaOptionError(
                f"merge source must be a Spark DataFrame, got {type(source).__name__}", table=table.path
            )
        self._delta = table
        self._source = source
        self._condition = to_sql(condition, what="merge condition")
        self._clauses: list[tuple[str, Any, Any]] = []
        self._merge_schema = False
        self._commit_info: dict[str, Any] = {}
        self.metrics: dict[str, Any] | None = None

    # The target alias and source alias are needed to read assignment keys.
    @property
    def _target_alias(self) -> str:
        return self._delta._alias or "target"

    def _assignments(self, mapping: dict[str, str | Column] | None, what: str) -> dict[str, str]:
        if not mapping:
            raise DeltaOptionError(
                f"{what} needs a non-empty mapping of target column to expression", table=self._delta.path
            )
        out = {}
        prefix = self._target_alias + "."
        for key, value in mapping.items():
            if not isinstance(key, str):
                raise DeltaOptionError(f"{what}: column names must be strings, got {key!r}", table=self._delta.path)
            name = key[len(prefix) :] if key.startswith(prefix) else key
            out[name] = to_sql(value, what=f"{what} expression for '{key}'")
        return out

    def _cond(self, condition, what: str) -> str | None:
        return None if condition is None else to_sql(condition, what=f"{what} condition")

    def _add(self, kind: str, condition, mapping=None) -> DeltaMergeBuilder:
        self._clauses.append((kind, condition, mapping))
        return self

    def whenMatchedUpdate(
        self, condition: str | Column | None = None, set: dict[str, str | Column] | None = None
    ) -> DeltaMergeBuilder:
        """Update matched target rows (where ``condition`` holds) with ``set``."""
        return self._add(
            "matched_update", self._cond(condition, "whenMatchedUpdate"), self._assignments(set, "whenMatchedUpdate")
        )

    def whenMatchedUpdateAll(self, condition: str | Column | None = None) -> DeltaMergeBuilder:
        """Update every column of matched target rows from the source's same-named columns."""
        return self._add("matched_update_all", self._cond(condition, "whenMatchedUpdateAll"))

    def whenMatchedDelete(self, condition: str | Column | None = None) -> DeltaMergeBuilder:
        """Delete matched target rows (where ``condition`` holds)."""
        return self._add("matched_delete", self._cond(condition, "whenMatchedDelete"))

    def whenNotMatchedInsert(
        self, condition: str | Column | None = None, values: dict[str, str | Column] | None = None
    ) -> DeltaMergeBuilder:
        """Insert unmatched source rows with ``values`` (target column -> expression)."""
        return self._add(
            "not_matched_insert",
            self._cond(condition, "whenNotMatchedInsert"),
            self._assignments(values, "whenNotMatchedInsert"),
        )

    def whenNotMatchedInsertAll(self, condition: str | Column | None = None) -> DeltaMergeBuilder:
        """Insert unmatched source rows, every column from the source's same-named column."""
        return self._add("not_matched_insert_all", self._cond(condition, "whenNotMatchedInsertAll"))

    def whenNotMatchedBySourceUpdate(
        self, condition: str | Column | None = None, set: dict[str, str | Column] | None = None
    ) -> DeltaMergeBuilder:
        """Update target rows no source row matches (where ``condition`` holds) with ``set``."""
        return self._add(
            "not_matched_by_source_update",
            self._cond(condition, "whenNotMatchedBySourceUpdate"),
            self._assignments(set, "whenNotMatchedBySourceUpdate"),
        )

    def whenNotMatchedBySourceDelete(self, condition: str | Column | None = None) -> DeltaMergeBuilder:
        """Delete target rows no source row matches (where ``condition`` holds)."""
        return self._add("not_matched_by_source_delete", self._cond(condition, "whenNotMatchedBySourceDelete"))

    def withSchemaEvolution(self) -> DeltaMergeBuilder:
        """Let the MERGE add source columns the table lacks (delta-rs ``merge_schema``)."""
        self._merge_schema = True
        return self

    def withCommitInfo(self, metadata: dict[str, Any]) -> DeltaMergeBuilder:
        """Record extra key/values in the MERGE's commit (e.g. the run that wrote it).

        delta-spark takes commit metadata from session configuration; here it is
        explicit. ``userMetadata`` lands where delta-spark puts it.
        """
        self._commit_info.update(metadata)
        return self

    def execute(self) -> DataFrame:
        """Run the MERGE (on the driver, in delta-rs) as one commit.

        Returns:
            A one-row DataFrame with delta-spark's metrics: ``num_affected_rows``,
            ``num_updated_rows``, ``num_deleted_rows``, ``num_inserted_rows``.
            delta-rs' raw metrics are on :attr:`metrics`.

        Raises:
            ConcurrentWriteError: a concurrent commit conflicted; nothing was committed.
            SchemaMismatchError: a source column cannot be cast to the table's type, or with schema
                evolution a struct inside a map would gain fields (nothing is committed).
            DeltaError: delta-rs rejected a condition or expression (message says why).
        """

        if not self._clauses:
            raise DeltaOptionError(
                "the MERGE has no clause: add whenMatched.../whenNotMatched... before execute()",
                table=self._delta.path,
            )
        path = self._delta.path
        s_alias = source_alias(self._source) or "source"
        t_alias = self._target_alias
        if s_alias == t_alias:
            raise DeltaOptionError(f"the source and the target have the same alias '{s_alias}'", table=path)
        with translated(path, "MERGE"):
            table = self._delta._table()
            source = self._source.toArrow()
            if self._merge_schema:
                # Before the source takes the table's types, which would drop a struct's new fields.
                every = any(kind.endswith("_all") for kind, _, _ in self._clauses)
                assigned = None if every else {name for _, _, mapping in self._clauses for name in (mapping or {})}
                add_assigned_fields(table, source.schema, assigned)
            source = conform_source(source, pa.schema(table.schema().to_arrow()), path)
            # No spill bound (max_spill_size): delta-rs cannot spill a hash join's input, so a bound fails
            # a large source ("Resources exhausted"), and near it the MERGE can deadlock
            # (delta-io/delta-rs#4614; docs/decisions/0005-driver-memory-bounds.md).
            merger = table.merge(
                source,
                self._condition,
                source_alias=s_alias,
                target_alias=t_alias,
                merge_schema=self._merge_schema,
                commit_properties=CommitProperties(custom_metadata=dict(self._commit_info))
                if self._commit_info
                else None,
            )
            for kind, cond, mapping in self._clauses:
                if kind == "matched_update":
                    merger.when_matched_update(mapping, cond)
                elif kind == "matched_update_all":
                    merger.when_matched_update_all(cond)
                elif kind == "matched_delete":
                    merger.when_matched_delete(cond)
                elif kind == "not_matched_insert":
                    merger.when_not_matched_insert(mapping, cond)
                elif kind == "not_matched_insert_all":
                    merger.when_not_matched_insert_all(cond)
                elif kind == "not_matched_by_source_update":
                    merger.when_not_matched_by_source_update(mapping, cond)
                elif kind == "not_matched_by_source_delete":
                    merger.when_not_matched_by_source_delete(cond)
            metrics = merger.execute()
        self.metrics = metrics
        self._delta.lastOperationMetrics = metrics
        updated = int(metrics.get("num_target_rows_updated", 0) or 0)
        deleted = int(metrics.get("num_target_rows_deleted", 0) or 0)
        inserted = int(metrics.get("num_target_rows_inserted", 0) or 0)
        row = (updated + deleted + inserted, updated, deleted, inserted)
        spark = self._delta._spark or self._source.sparkSession
        return spark.createDataFrame([row], _METRICS_SCHEMA)
