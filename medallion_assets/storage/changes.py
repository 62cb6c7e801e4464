"""Applying changes to a table: MERGE clauses, the merge strategies, replaced groups and tombstones.

:class:`~medallion_assets.storage.merge_clauses.MergeClause` is one ``WHEN``
clause of a MERGE, the language every engine and the deltalake writer take a merge in.

A plain merge upserts on the merge keys, applying a change only when its
``sequence_column`` is newer than the stored row, and deletes the keys whose
``delete_column`` is true. A merge with ``replace_group`` applies a group's
newest change to every stored row of the group. Write mode ``replace_keys``
replaces every stored row of the key values its rows name by those rows.
Both replace through one MERGE with a marker row per group or key value.

Tombstones: the keys a merge with a ``delete_column`` deleted are kept in
``<table>__tombstones`` (:func:`tombstone_path`), next to the table in the
same layer folder. Each merge that deletes appends, per deleted key (the
merge keys, or the ``replace_group`` column), the sequence value of the
delete; a key's newest delete is the largest value it has there, so a change
older than a delete that arrives in a later run cannot bring the row back.
Appended, not merged: an append is one write job, where a MERGE of a few keys
pays a MERGE's fixed cost (finding the files to rewrite, then rewriting
them) in every step that deletes, and a key deleted again only adds a row.
It is an ordinary Delta table, written by the same client, so the
maintenance job, which compacts and vacuums every table of a layer,
maintains it too. ``delta/tombstones`` in the table's output metadata names
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from medallion_assets.delta import grown_type
from medallion_assets.storage.merge_clauses import MergeClause
from medallion_assets.storage.write_spec import WriteSpec

if TYPE_CHECKING:
    # Type only: the Tables protocol names the client's engine.
    from medallion_assets.storage.engines import DeltaEngine


class Tables(Protocol):
    """What a merge needs of the client (:class:`~medallion_assets.storage.client.DeltaTableClient`).

    A protocol, so this module does not import the client that calls it.
    """

    spark: SparkSession
    engine: DeltaEngine

    def exists(self, path: str) -> bool: ...

    def read(self, path: str) -> DataFrame: ...

    def write(self, frame: DataFrame, path: str, spec: WriteSpec) -> Any: ...

    def merge(
        self,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        spec: WriteSpec,
        schema_evolution: bool,
        metadata: Mapping[str, str],
        max_rows: int,
    ) -> None: ...


def tombstone_path(path: str) -> str:
    """Where the deleted keys of a merge-with-deletes table are kept."""
    return path.rstrip("/") + "__tombstones"


def merge(
    client: Tables,
    frame: DataFrame,
    path: str,
    spec: WriteSpec,
    commit_metadata: Mapping[str, str],
    *,
    rows: int,
    new_table: bool = False,
) -> str | None:
    """Upsert ``frame`` on the merge keys (on the delta-rs engine, in delta-rs on the driver).

    ``rows``: how many rows ``frame`` has. Each MERGE hands the client an upper
    bound of its source's rows, by which the client picks who runs it
    (:meth:`~medallion_assets.storage.client.DeltaTableClient.merge`).

    With a delete column, deleted keys are kept with their sequence value in
    a tombstone table next to the target, so a change older than a delete
    that arrives later cannot bring the row back.

    ``new_table``: the write created the table just now, so it has no rows.
    A MERGE into it would only insert the changes that do not delete, so
    those are appended instead: a MERGE searches and rewrites the table (and
    on the delta-rs engine collects the source to the driver), where an append
    is one write job (docs/decisions/0010-writes-computed-once.md).

    Returns:
        Why no row was merged, or ``None`` when the merge was committed.
    """
    if spec.mode == "replace_keys":
        return _replace_keys(client, frame, path, spec, commit_metadata, rows=rows, new_table=new_table)
    if spec.replace_group:
        return _merge_groups(client, frame, path, spec, commit_metadata, rows=rows, new_table=new_table)
    if not spec.delete_column:
        return _upsert(client, frame, path, spec, commit_metadata, rows=rows, new_table=new_table)
    seq = spec.sequence_column
    tombstones = _newest_deletes(client, path, spec.merge_keys, seq) if seq else None
    if tombstones is None or not seq:
        skipped = _upsert(client, frame, path, spec, commit_metadata, rows=rows, new_table=new_table)
    else:
        # Cached and counted, as the client counts a source: the tombstones are read
        # once, and the MERGE knows the size of the changes newer than them.
        source = _newer_than_deletes(frame, tombstones, spec.merge_keys, seq).cache()
        try:
            newer = source.count()
            if newer == 0:
                return "every change is older than a delete"
            skipped = _upsert(client, source, path, spec, commit_metadata, rows=newer, new_table=new_table)
        finally:
            source.unpersist()
    _remember_deletes(client, frame, path, spec)
    return skipped


def _upsert(
    client: Tables,
    source: DataFrame,
    path: str,
    spec: WriteSpec,
    commit_metadata: Mapping[str, str],
    *,
    rows: int,
    new_table: bool,
) -> str | None:
    if new_table:
        inserts = source.where(~F.col(spec.delete_column)) if spec.delete_column else source
        return _append_to_new_table(client, inserts, path, commit_metadata)
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in spec.merge_keys)
    seq = spec.sequence_column
    newer = f"s.`{seq}` > t.`{seq}`" if seq else None
    stored_schema = client.engine.schema(client.spark, path)
    source, new_columns, evolves = _evolve_source(source, stored_schema, spec)
    # Explicit assignments so the delete flag is never stored in the table.
    assignments = {c: f"s.`{c}`" for c in [*stored_schema.fieldNames(), *new_columns]}
    if spec.delete_column:
        deleted = f"s.`{spec.delete_column}`"
        not_deleted = f"NOT {deleted}"
        clauses = [
            MergeClause("delete", f"{deleted} AND {newer}" if newer else deleted),
            MergeClause("update", f"{not_deleted} AND {newer}" if newer else not_deleted, assignments),
            MergeClause("insert", not_deleted, assignments),
        ]
    else:
        clauses = [MergeClause("update", newer, assignments), MergeClause("insert", None, assignments)]
    client.merge(
        path,
        source,
        on=on,
        clauses=clauses,
        spec=spec,
        schema_evolution=evolves,
        metadata=commit_metadata,
        max_rows=rows,
    )
    return None


def _replace_keys(
    client: Tables,
    frame: DataFrame,
    path: str,
    spec: WriteSpec,
    commit_metadata: Mapping[str, str],
    *,
    rows: int,
    new_table: bool,
) -> str | None:
    """Replace every stored row of each merge-key value ``frame`` names by ``frame``'s rows of that value."""
    if new_table:
        return _append_to_new_table(client, frame, path, commit_metadata)
    stored_schema = client.engine.schema(client.spark, path)
    frame, new_columns, evolves = _evolve_source(frame, stored_schema, spec)
    keys = list(spec.merge_keys)
    # Each value is in the source once per row and once as its marker.
    _replace_groups(
        client,
        frame.select(*stored_schema.fieldNames(), *new_columns),
        frame.select(*keys).distinct(),
        path,
        keys,
        spec=spec,
        schema_evolution=evolves,
        commit_metadata=commit_metadata,
        max_rows=2 * rows,
    )
    return None


def _append_to_new_table(client: Tables, rows: DataFrame, path: str, commit_metadata: Mapping[str, str]) -> str | None:
    """Append ``rows`` to a table this write created, as a MERGE into it would insert them.

    Returns:
        Why nothing was written (every change deletes its key), or ``None``.
    """
    # Appended without asking first whether there is a row: that question computed the
    # rows once more (docs/decisions/0010-writes-computed-once.md). The commit answers it instead:
    # delta-spark commits no empty append, and the delta-rs engine's commit counts no
    # row. On delta-rs the client's empty commit then follows that one (two commits
    # where there was one, only when every first change deletes its key).
    created = client.engine.latest_commit(client.spark, path).version
    stored = client.engine.schema(client.spark, path).fieldNames()
    client.engine.save(
        rows.select(*stored), path, mode="append", options=client.engine.commit_metadata_options(commit_metadata)
    )
    appended = client.engine.latest_commit(client.spark, path)
    if appended.version == created or appended.operation_metrics.get("numOutputRows") == "0":
        return "no change inserts a row: each deletes its key"
    return None


def _merge_groups(
    client: Tables,
    frame: DataFrame,
    path: str,
    spec: WriteSpec,
    commit_metadata: Mapping[str, str],
    *,
    rows: int,
    new_table: bool,
) -> str | None:
    """Merge where a group's newest change replaces every stored row of the group.

    ``frame`` holds, per changed group, its new rows (delete flag false) or
    one row with the delete flag set. A change applies only when its
    sequence is newer than the group's stored rows and its tombstone;
    stored rows of an applied group that the change lacks are deleted.
    """
    group, seq, deleted = spec.replace_group, spec.sequence_column, spec.delete_column
    assert group and seq and deleted, "WriteSpec: replace_group needs sequence_column and delete_column"
    changes = frame.groupBy(group).agg(
        F.max(seq).alias("_change_seq"), F.max(F.col(deleted).cast("int")).cast("boolean").alias("_change_deletes")
    )
    tombstones = _newest_deletes(client, path, (group,), seq)
    if tombstones is not None:
        changes = _newer_than_deletes(changes, tombstones, (group,), "_change_seq")
    if new_table:
        # No stored rows: every change newer than its tombstone applies, and its rows are all there is.
        kept_groups = changes.where(~F.col("_change_deletes")).select(group)
        skipped = _append_to_new_table(
            client, frame.where(~F.col(deleted)).join(kept_groups, group, "left_semi"), path, commit_metadata
        )
    else:
        # Cached and counted before the table is read, so that the planner knows its
        # true size: a batch that changes a few groups is broadcast into the scans of
        # the stored rows, which then neither shuffle nor aggregate the table.
        changes = changes.cache()
        try:
            changes.count()
            skipped = _replace_changed_groups(client, frame, changes, path, spec, commit_metadata, rows=rows)
        finally:
            changes.unpersist()
    # Also when nothing was merged: a delete that arrives before its group's rows must outlive them.
    _append_tombstones(client, frame.where(F.col(deleted)).groupBy(group).agg(F.max(seq).alias(seq)), path)
    return skipped


def _replace_changed_groups(
    client: Tables,
    frame: DataFrame,
    changes: DataFrame,
    path: str,
    spec: WriteSpec,
    commit_metadata: Mapping[str, str],
    *,
    rows: int,
) -> str | None:
    group, seq = spec.replace_group, spec.sequence_column
    assert group and seq, "WriteSpec: replace_group needs sequence_column"
    stored = client.read(path)
    frame, new_columns, evolves = _evolve_source(frame, stored.schema, spec)
    # Only the changed groups' stored rows decide which changes apply.
    stored_groups = (
        stored.join(changes.select(group), group, "left_semi")
        .groupBy(group)
        .agg(F.max(seq).alias("_stored_seq"), F.count(F.lit(1)).alias("_stored_rows"))
    )
    applied = (
        changes.join(stored_groups, group, "left")
        .where(F.col("_stored_seq").isNull() | (F.col("_change_seq") > F.col("_stored_seq")))
        .cache()
    )
    try:
        # The MERGE's source is empty exactly when no applied change brings rows and
        # none removes stored ones: decided on the small applied frame. Aggregated, not
        # asked for a first row: the aggregate computes the cache whole, which then knows
        # its size, so the MERGE broadcasts it where it is joined. The same pass counts
        # the applied groups: the source holds the changes' rows and one marker per group.
        effect = applied.agg(
            F.count_if(~F.col("_change_deletes") | F.col("_stored_rows").isNotNull()).alias("effective"),
            F.count(F.lit(1)).alias("groups"),
        ).first()
        assert effect is not None, "an aggregate without grouping returns one row"
        if effect["effective"] == 0:
            skipped = "every change is older than the stored state"
        else:
            skipped = None
            _merge_applied(
                client,
                frame,
                stored,
                applied,
                new_columns,
                path,
                spec,
                commit_metadata,
                evolves=evolves,
                max_rows=rows + int(effect["groups"]),
            )
    finally:
        applied.unpersist()
    return skipped


def _merge_applied(
    client: Tables,
    frame: DataFrame,
    stored: DataFrame,
    applied: DataFrame,
    new_columns: list[str],
    path: str,
    spec: WriteSpec,
    commit_metadata: Mapping[str, str],
    *,
    evolves: bool,
    max_rows: int,
) -> None:
    group, deleted = spec.replace_group, spec.delete_column
    assert group and deleted, "WriteSpec: replace_group needs delete_column"
    rows = (
        frame.where(~F.col(deleted))
        .join(applied.where(~F.col("_change_deletes")).select(group), group, "left_semi")
        .select(*stored.columns, *new_columns)
    )
    _replace_groups(
        client,
        rows,
        applied.select(group),
        path,
        (group,),
        spec=spec,
        schema_evolution=evolves,
        commit_metadata=commit_metadata,
        max_rows=max_rows,
    )


#: The source column that marks a group's marker row in :func:`_replace_groups`.
_MARKER = "_replaces_group"


def _replace_groups(
    client: Tables,
    rows: DataFrame,
    groups: DataFrame,
    path: str,
    group_columns: Sequence[str],
    *,
    spec: WriteSpec,
    schema_evolution: bool,
    commit_metadata: Mapping[str, str],
    max_rows: int,
) -> None:
    """One MERGE that deletes every stored row of ``groups`` and inserts ``rows``.

    ``groups``: distinct values of ``group_columns``; ``rows``: the new rows
    of those groups (a group without rows is only deleted), with the
    table's columns. One marker row per group joins the MERGE's source; the
    match condition takes markers only, so every stored row of a group meets
    exactly one source row (its marker, which deletes it) and a new row never
    matches (it is inserted). Nothing in the source is read from the table,
    where replacing row by row needed the stored rows the group loses (a
    scan of the table) to delete them.

    ``max_rows``: an upper bound of the source's rows (``rows`` plus the groups).
    """
    markers = groups.select(
        *(F.col(c).cast(rows.schema[c].dataType).alias(c) for c in group_columns),
        *(F.lit(None).cast(rows.schema[c].dataType).alias(c) for c in rows.columns if c not in group_columns),
    )
    source = rows.withColumn(_MARKER, F.lit(False)).unionByName(markers.withColumn(_MARKER, F.lit(True)))
    on = " AND ".join([*(f"t.`{c}` = s.`{c}`" for c in group_columns), f"s.`{_MARKER}`"])
    assignments = {c: f"s.`{c}`" for c in rows.columns}
    clauses = [MergeClause("delete", None), MergeClause("insert", f"NOT s.`{_MARKER}`", assignments)]
    client.merge(
        path,
        source,
        on=on,
        clauses=clauses,
        spec=spec,
        schema_evolution=schema_evolution,
        metadata=commit_metadata,
        max_rows=max_rows,
    )


def _remember_deletes(client: Tables, frame: DataFrame, path: str, spec: WriteSpec) -> None:
    assert spec.delete_column, "called for merges with a delete column"
    columns = [*spec.merge_keys, *([spec.sequence_column] if spec.sequence_column else [])]
    _append_tombstones(client, frame.where(F.col(spec.delete_column)).select(*columns), path)


def _newest_deletes(client: Tables, path: str, keys: tuple[str, ...], seq: str) -> DataFrame | None:
    """Per deleted key, the sequence of its newest delete as ``_deleted_at``; ``None`` before any delete."""
    tombstones_path = tombstone_path(path)
    if not client.exists(tombstones_path):
        return None
    return client.read(tombstones_path).groupBy(*keys).agg(F.max(seq).alias("_deleted_at"))


def _newer_than_deletes(frame: DataFrame, tombstones: DataFrame, keys: tuple[str, ...], seq: str) -> DataFrame:
    """The rows of ``frame`` whose ``seq`` is newer than their key's newest delete, or whose key has none."""
    return (
        frame.join(tombstones, list(keys), "left")
        .where(F.col("_deleted_at").isNull() | (F.col(seq) > F.col("_deleted_at")))
        .select(*frame.columns)
    )


def _append_tombstones(client: Tables, deletes: DataFrame, path: str) -> None:
    # The client skips an append without rows (and creates the table on the first that has some).
    client.write(deletes, tombstone_path(path), WriteSpec(mode="append"))


def _evolve_source(frame: DataFrame, stored: StructType, spec: WriteSpec) -> tuple[DataFrame, list[str], bool]:
    """Line a merge source up with the table when ``schema_mode`` is ``merge``.

    A merged row replaces the stored one, so a table column the source lacks
    is stored as null (a typed null column is added to the source). Returned
    with the source: the source columns the table lacks, for the merge to
    add, and whether the schema grows, by those columns or by a field nested
    in a column the table has. With any other schema mode the source is
    returned as it is, and the schema does not grow.
    """
    if spec.schema_mode != "merge":
        return frame, [], False
    present = {c.lower() for c in frame.columns}
    stored_types = {f.name.lower(): f.dataType for f in stored.fields}
    missing = [F.lit(None).cast(f.dataType).alias(f.name) for f in stored.fields if f.name.lower() not in present]
    new_columns = [c for c in frame.columns if c.lower() not in stored_types and c != spec.delete_column]
    grows = bool(new_columns) or any(
        grown_type(stored_types[f.name.lower()], f.dataType) not in (None, stored_types[f.name.lower()])
        for f in frame.schema.fields
        if f.name.lower() in stored_types
    )
    return (frame.select("*", *missing) if missing else frame), new_columns, grows
