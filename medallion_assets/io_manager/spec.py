"""How an asset declares its storage: :func:`delta_table`, the ``delta/*`` metadata keys, and the
:class:`~medallion_assets.storage.write_spec.WriteSpec` they stand for (:func:`write_spec_from_metadata`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from medallion_assets.storage.write_spec import WriteSpec

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


def write_spec_from_metadata(metadata: Mapping[str, Any]) -> WriteSpec:
    """The write an asset's definition metadata declares (its ``delta/*`` keys).

    Raises:
        pydantic.ValidationError: the declaration is inconsistent (e.g. a merge without keys).
    """

    def raw(key: str, default: Any = None) -> Any:
        value = metadata.get(key, default)
        return getattr(value, "value", value)  # MetadataValue wrappers

    return WriteSpec(
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
