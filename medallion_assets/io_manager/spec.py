"""How an asset declares its storage: :class:`WriteSpec`, :func:`delta_table` and the ``delta/*`` metadata keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator
from pyspark.sql.types import (
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

#: Metadata keys an asset declares its storage with (see :func:`delta_table`).
WRITE_MODE = "delta/write_mode"
MERGE_KEYS = "delta/merge_keys"
SEQUENCE_COLUMN = "delta/sequence_column"
DELETE_COLUMN = "delta/delete_column"
SCHEMA_MODE = "delta/schema_mode"
PARTITION_COLUMNS = "delta/partition_columns"
TABLE_PROPERTIES = "delta/table_properties"
PARTITION_EXPR = "delta/partition_expr"
REPLACE_GROUP = "delta/replace_group"
FILTERED_BY = "delta/filtered_by"
APPEND_KEYS = "delta/append_keys"
#: Column name -> description, shown in the ``dagster/column_schema`` of each materialization.
COLUMN_DESCRIPTIONS = "delta/column_descriptions"
#: Input metadata: ``"changes"`` reads only what the upstream gained since this step last consumed it.
READ = "delta/read"
VERSION = "delta/version"
COLUMNS = "delta/columns"
#: Output metadata an asset may attach to name what it was computed from
#: (e.g. the reference snapshot file); part of the unchanged-input test.
SOURCE = "medallion/source"
#: Kinds of an asset kept as a Delta table and computed with Spark (the UI shows them as its storage).
DELTA_KINDS = frozenset({"spark", "delta"})
#: The table property that has a MERGE mark the rows it replaces instead of rewriting their files.
DELETION_VECTORS = "delta.enableDeletionVectors"


class WriteSpec(BaseModel):
    """How one output is written, read from the asset's metadata.

    Validated when built, so a typo in an asset's metadata fails the run before
    any data is written.
    """

    mode: Literal["overwrite", "append", "merge", "replace_keys"] = Field(
        default="overwrite",
        description=(
            "overwrite (default), append, merge on merge_keys, or replace_keys: the rows hold every row of "
            "each merge_keys value they name, which replace that value's stored rows (others are kept)."
        ),
    )
    merge_keys: tuple[str, ...] = Field(default=(), description="Key columns a merge matches on.")
    sequence_column: str | None = Field(
        default=None,
        description="Merge only: a change applies only if its value here is newer than the stored one.",
    )
    delete_column: str | None = Field(
        default=None,
        description="Merge only: boolean column; a true row deletes its key (and is remembered as a tombstone).",
    )
    schema_mode: Literal["strict", "merge", "overwrite"] = Field(
        default="strict",
        description=(
            "strict, merge (add new columns; in a merge, table columns the rows lack are stored as null) "
            "or overwrite (replace the schema)."
        ),
    )
    partition_columns: tuple[str, ...] = Field(
        default=(), description="Columns the table is partitioned by when it is created."
    )
    table_properties: dict[str, str] = Field(
        default_factory=dict, description="Delta table properties set when the table is created."
    )
    partition_expr: str | None = Field(
        default=None,
        description=(
            "Column that holds the time of a time-window partitioned asset; "
            "its partition is replaced with replaceWhere."
        ),
    )
    replace_group: str | None = Field(
        default=None,
        description=(
            "Merge only: a newer change of a group (e.g. an order) replaces all its stored rows "
            "(e.g. its line items); needs sequence_column and delete_column."
        ),
    )
    filtered_by: tuple[str, ...] | None = Field(
        default=None,
        description=(
            "Columns readers filter the table on (e.g. gold's date ranges): a new table keeps per-file "
            "min/max on them besides its keys. None (default): every date and timestamp column."
        ),
    )
    append_keys: tuple[str, ...] = Field(
        default=(),
        description=(
            "Append only: columns that tell a row from every other. A step re-reading upstream changes this "
            "table already took in part of appends only rows the table does not hold on them."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> WriteSpec:
        if self.mode in ("merge", "replace_keys") and not self.merge_keys:
            raise ValueError(f"write mode {self.mode!r} needs merge_keys")
        if self.mode != "merge" and (self.sequence_column or self.delete_column or self.replace_group):
            raise ValueError("sequence_column, delete_column and replace_group apply to write mode 'merge' only")
        if self.replace_group and not (self.sequence_column and self.delete_column):
            raise ValueError("replace_group needs sequence_column and delete_column")
        if self.append_keys and self.mode != "append":
            raise ValueError("append_keys apply to write mode 'append' only")
        return self

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns the declaration says identify a row (what output previews are sorted by).

        The merge keys, else the partition columns and the time column of
        ``partition_expr``; empty when the declaration names none.
        """
        if self.merge_keys:
            return self.merge_keys
        return tuple(dict.fromkeys(self.partition_columns + ((self.partition_expr,) if self.partition_expr else ())))

    @property
    def newest_first(self) -> bool:
        """Whether output previews show the newest rows: a table only appended to (a quarantine, a log)
        is looked at for what the last runs added, which its first rows by any column are not."""
        return self.mode == "append"

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> WriteSpec:
        """Build the spec from asset definition metadata (``delta/*`` keys)."""

        def raw(key: str, default: Any = None) -> Any:
            value = metadata.get(key, default)
            return getattr(value, "value", value)  # MetadataValue wrappers

        return cls(
            mode=raw(WRITE_MODE, "overwrite"),
            merge_keys=tuple(raw(MERGE_KEYS, ()) or ()),
            sequence_column=raw(SEQUENCE_COLUMN),
            delete_column=raw(DELETE_COLUMN),
            schema_mode=raw(SCHEMA_MODE, "strict"),
            partition_columns=tuple(raw(PARTITION_COLUMNS, ()) or ()),
            table_properties=dict(raw(TABLE_PROPERTIES, {}) or {}),
            partition_expr=raw(PARTITION_EXPR),
            replace_group=raw(REPLACE_GROUP),
            filtered_by=None if raw(FILTERED_BY) is None else tuple(raw(FILTERED_BY)),
            append_keys=tuple(raw(APPEND_KEYS, ()) or ()),
        )


_SKIPPING_TYPES = (
    IntegralType,
    FloatType,
    DoubleType,
    DecimalType,
    StringType,
    DateType,
    TimestampType,
    TimestampNTZType,
)
#: Table properties that choose the columns Delta keeps per-file statistics of.
_STATS_PROPERTIES = ("delta.dataSkippingStatsColumns", "delta.dataSkippingNumIndexedCols")


def skipping_stats_columns(spec: WriteSpec, schema: StructType) -> list[str]:
    """The columns whose per-file min/max a new table keeps, unless its declaration chooses.

    What readers filter and merge on: the merge keys, the time column of a
    time-window partition, and the ``filtered_by`` columns (when not declared,
    every date or timestamp column: what a time filter or window reads).

    With a ``replace_group``, the group column stands for the merge keys: every
    merge replaces a group's rows as a whole and finds them by the group, and
    the other key columns only tell a group's rows apart (``l_linenumber``'s
    1 to 7 is in every file). Left out too: partition columns (their values
    are in the path, and Delta refuses them here), the delete column, which is
    not stored, and the sequence column: a MERGE compares it row by row after
    its join and no reader filters on it, so its min/max never skip a file.
    delta-spark pays for each kept column on every row it writes (about four
    hundredths of a Parquet write of 4M rows per date or number column, a
    tenth for a text sequence: ``docs/performance-record.md``). Delta's default (the
    first 32 columns) also keeps min/max of comments and raw text, which no
    reader filters on and which fill the log.

    Args:
        spec: the table's declaration.
        schema: the rows it is created with.

    Raises:
        ValueError: ``filtered_by`` names a column the rows lack, or one whose
            type Delta keeps no min/max of.
    """
    # Delta keeps min/max of these types only; it refuses a table naming another type here.
    stored = {f.name for f in schema.fields if isinstance(f.dataType, _SKIPPING_TYPES)}
    if spec.filtered_by is None:
        filtered = [
            f.name for f in schema.fields if isinstance(f.dataType, (DateType, TimestampType, TimestampNTZType))
        ]
    else:
        filtered = list(spec.filtered_by)
        unknown = [name for name in filtered if name not in schema.fieldNames()]
        if unknown:
            raise ValueError(
                f"filtered_by names column(s) {unknown} that the table's rows lack (they have "
                f"{schema.fieldNames()}): name columns the asset returns, or leave filtered_by out"
            )
        unkept = [f"{name} ({schema[name].dataType.simpleString()})" for name in filtered if name not in stored]
        if unkept:
            raise ValueError(
                f"filtered_by names {unkept}: Delta keeps per-file min/max of numbers, text, dates and "
                "timestamps only; leave these columns out of filtered_by"
            )
    keys = [spec.replace_group] if spec.replace_group else list(spec.merge_keys)
    excluded = set(spec.partition_columns) | {spec.delete_column}
    named = dict.fromkeys([*keys, spec.partition_expr, *filtered])
    return [name for name in named if name in stored and name not in excluded]


def declared_table_properties(spec: WriteSpec) -> dict[str, str]:
    """The properties the declaration names, each with Delta's ``delta.`` prefix.

    ``appendOnly`` becomes ``delta.appendOnly``.
    """
    return {key if key.startswith("delta.") else f"delta.{key}": value for key, value in spec.table_properties.items()}


def table_properties_for(spec: WriteSpec, schema: StructType) -> dict[str, str]:
    """The Delta properties of a new table: the declared ones, and statistics on :func:`skipping_stats_columns`.

    A declaration that sets ``delta.dataSkippingStatsColumns`` or
    ``delta.dataSkippingNumIndexedCols`` keeps its own choice; a table with
    none of those columns keeps Delta's default.
    """
    properties = declared_table_properties(spec)
    columns = skipping_stats_columns(spec, schema)
    if columns and not any(key in properties for key in _STATS_PROPERTIES):
        properties["delta.dataSkippingStatsColumns"] = ",".join(columns)
    return properties


def check_engine_reads(properties: Mapping[str, str], *, path: str, engine: str) -> None:
    """Refuse, before any work, a declaration whose table the writing engine could not read.

    delta-rs 1.6 creates a table with deletion vectors but cannot read one: on
    the delta-rs engine (or a pandas/Arrow write, which delta-rs does) the
    table would be created, then fail its own first read; an existing one could
    not be written either.

    Args:
        properties: the declared Delta properties (``delta.``-prefixed).
        path: the table, for the message.
        engine: what writes it: ``delta-spark``, or ``delta-rs`` (also pandas/Arrow writes).

    Raises:
        ValueError: ``delta.enableDeletionVectors`` is true and the engine is not delta-spark.
    """
    if engine != "delta-spark" and str(properties.get(DELETION_VECTORS, "")).strip().lower() == "true":
        raise ValueError(
            f"cannot write {path} with deletion vectors ({DELETION_VECTORS}=true) on the {engine} engine: "
            "delta-rs cannot read a table that uses them, so nothing was written. Write it with delta-spark "
            "(MEDALLION_DELTA_ENGINE=delta-spark, its jars in DELTA_SPARK_JARS), or declare it without them "
            "(deletion_vectors=False on the feed's ApplyChanges, or no delta.enableDeletionVectors in "
            "table_properties)"
        )


def column_descriptions(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The column descriptions an asset declares (:data:`COLUMN_DESCRIPTIONS`), empty if none.

    Args:
        metadata: the asset's definition metadata.

    Returns:
        Column name -> description.
    """
    value = metadata.get(COLUMN_DESCRIPTIONS)
    return dict(getattr(value, "value", value) or {})  # MetadataValue wrappers


def delta_table(
    *,
    write_mode: Literal["overwrite", "append", "merge", "replace_keys"] = "overwrite",
    merge_keys: Sequence[str] = (),
    sequence_column: str | None = None,
    delete_column: str | None = None,
    schema_mode: Literal["strict", "merge", "overwrite"] = "strict",
    partition_columns: Sequence[str] = (),
    table_properties: Mapping[str, str] | None = None,
    partition_expr: str | None = None,
    replace_group: str | None = None,
    filtered_by: Sequence[str] | None = None,
    append_keys: Sequence[str] = (),
    column_descriptions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Asset metadata declaring how the Delta IO manager stores an asset.

    Validates the combination now (at definition time), so mistakes surface in
    ``dagster definitions validate``.

    Args:
        write_mode: overwrite, append, merge, or replace_keys: every stored row
            of each ``merge_keys`` value the output names is replaced by the
            output's rows of that value, in one MERGE; other values keep theirs
            (e.g. a history rebuilt for the keys that changed).
        merge_keys: columns a merge matches on (replace_keys: the keys replaced).
        sequence_column: a change is applied only if newer than the stored row.
        delete_column: boolean column marking deletes (merge only).
        schema_mode: strict, merge or overwrite.
        partition_columns: physical partition columns of a new table.
        table_properties: Delta properties of a new table.
        partition_expr: time column of a time-window partitioned asset.
        replace_group: merge by groups: a group's newer change replaces all its rows.
        filtered_by: columns readers filter the table on; a new table keeps
            per-file min/max on them besides its keys (None: every date and
            timestamp column; ``()``: none besides the keys).
        append_keys: append only: columns that tell a row from every other
            (a quarantine's table, reason, record and source). A step's
            ``changes`` input starts after the oldest version its tables took
            in; when this table took in more (it was written by a run whose
            other tables were not), the rows computed again from that part are
            left out where the table holds rows equal on these columns, so
            each is appended once. Otherwise the table is not read.
        column_descriptions: column name -> what its values are; the IO manager
            puts them in the ``dagster/column_schema`` of every write, and fails
            the write if one names a column the table does not have.

    Returns:
        Metadata to pass to ``@asset(metadata=...)``.

    Raises:
        ValueError: the combination is invalid, or a column description is empty.
    """
    descriptions = dict(column_descriptions or {})
    blank = sorted(name for name, text in descriptions.items() if not (isinstance(text, str) and text.strip()))
    if blank:
        raise ValueError(f"column_descriptions: give column(s) {blank} a non-empty description, or leave them out")
    spec = WriteSpec(
        mode=write_mode,
        merge_keys=tuple(merge_keys),
        sequence_column=sequence_column,
        delete_column=delete_column,
        schema_mode=schema_mode,
        partition_columns=tuple(partition_columns),
        table_properties=dict(table_properties or {}),
        partition_expr=partition_expr,
        replace_group=replace_group,
        filtered_by=None if filtered_by is None else tuple(filtered_by),
        append_keys=tuple(append_keys),
    )
    optional = {
        MERGE_KEYS: list(spec.merge_keys),
        SEQUENCE_COLUMN: spec.sequence_column,
        DELETE_COLUMN: spec.delete_column,
        PARTITION_COLUMNS: list(spec.partition_columns),
        TABLE_PROPERTIES: dict(spec.table_properties),
        PARTITION_EXPR: spec.partition_expr,
        REPLACE_GROUP: spec.replace_group,
        APPEND_KEYS: list(spec.append_keys),
        COLUMN_DESCRIPTIONS: descriptions,
    }
    # Only what the asset sets: unset keys keep the spec's defaults when read back.
    declared = {k: v for k, v in optional.items() if v}
    if spec.filtered_by is not None:  # also when empty: () is a choice (the keys only), None the default
        declared[FILTERED_BY] = list(spec.filtered_by)
    return {WRITE_MODE: spec.mode, SCHEMA_MODE: spec.schema_mode, **declared}
