"""What a write is asked to do: :class:`WriteSpec` (mode, keys, schema mode, partitioning, properties).

The properties of a new table follow from it (:func:`table_properties_for`);
:func:`check_engine_reads` refuses, before any work, a declaration whose table
the writing engine could not read back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

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
            "Column that holds the time of a time-window partitioned asset; its partition is replaced with "
            "replaceWhere."
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
    delta-spark pays for each kept column on every row it writes
    (docs/decisions/0009-statistics-on-filtered-columns.md). Delta's default (the
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
