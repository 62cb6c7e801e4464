"""Silver: typed, deduplicated latest state, merged in from what bronze gained.

Built from the feeds' declarations. A change feed (``ApplyChanges``) gets one
step: parse its new bronze rows (the IO manager's ``delta/read: changes``
input), validate them, keep each key's latest change, mask PII, check the
declared expectations, merge into ``silver.<table>``, and append rejected
records and rows that fail a drop/fail expectation to ``quarantine.<table>``
with the reason. With ``history=True`` it also keeps ``silver.<table>_history``
(type 2), rebuilt each run for the keys that changed (an input of
:class:`~medallion_assets.io_manager.ChangesWithTable`), downstream of
``silver.<table>``: it reads silver and its tombstones to take in only the
changes silver's rules let in (:func:`~medallion_assets.transforms.silver.history_rows`). A snapshot feed
with ``ApplyChanges`` gets the same step and history, applied to the changes
its bronze table derives from each new snapshot (``Feed.change_feed``); one
with ``Replace`` gets a table with exactly its declared fields and types.

Each run the step also reports what it set aside: the
``<table>_rejected_rows`` check on ``silver.<table>`` (failed WARN when any row
was rejected, ERROR when a landed file was rejected whole or above the
declaration's ``max_rejected_share``, naming the files) and the counts as
numeric metadata of both materializations. The check is blocking: failed at
ERROR, it fails the step after its writes, so the run fails and nothing
downstream runs on that delivery; the step also tags the run
(:func:`~medallion_assets.expectations.tag_failed_checks`). The quarantine tables
form their own asset group, ``quarantine``.

The step writes its quarantine last. Its read position is the oldest of its
tables' (:class:`~medallion_assets.io_manager.DeltaIOManager`), so a run
killed after the merge and before the quarantine's append reads the same
increment again, merges it again (a no-op) and quarantines it once. A failed
``fail`` expectation leaves silver unwritten and the quarantine written, so
the next runs read the increment again (each retry blocked on it, then the
run after the producer's fix): the quarantine's append leaves out the rows it
holds already (``append_keys``), so each reject is quarantined once.
"""

# No ``from __future__ import annotations``: Dagster reads the annotations at runtime.
from collections.abc import Iterable, Sequence

from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetOut,
    AssetsDefinition,
    MetadataValue,
    Output,
    asset,
    multi_asset,
)
from pyspark.sql import DataFrame

from medallion_assets.expectations import (
    ObservedInput,
    apply_expectations,
    cache_rows,
    check_specs,
    count_rejected,
    has_no_rows,
    rejected_rows_check_spec,
    rejected_rows_result,
    rejects_to_quarantine,
    step_output,
    tag_failed_checks,
)
from medallion_assets.feeds import ApplyChanges, Feed, Replace
from medallion_assets.io_manager import DELETION_VECTORS, DELTA_KINDS, READ, ChangesWithTable, delta_table
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.client import DeltaTableClient
from medallion_assets.transforms import silver as T

#: The columns of every quarantine table (``medallion_assets.expectations.quarantine_rows`` writes them).
QUARANTINE_DESCRIPTIONS = {
    "table_name": "The silver table the row was meant for.",
    "reason": "Why it was rejected: the parser's reason, or the drop or fail expectation it broke.",
    "record": "The rejected row as JSON: the landed line, or the parsed row (declared PII masked).",
    "_source_file": "URI of the landed file the row came from (null where the row had none).",
    "_quarantined_at": "When the run that rejected it wrote it here, UTC.",
}

#: Every quarantine table: appended to, never merged. A row is told apart by everything but when it was
#: written: a run that reads again what a blocked run quarantined appends none of it twice.
QUARANTINE = delta_table(
    write_mode="append",
    append_keys=("table_name", "reason", "record", "_source_file"),
    column_descriptions=QUARANTINE_DESCRIPTIONS,
)

#: The columns a change feed's silver table adds to its fields.
_CHANGE_DESCRIPTIONS = {
    "_sequence": (
        "The adopted change's position in the feed, as sortable text: its sequence fields, then its file. "
        "A change replaces the row only when its _sequence is greater."
    ),
}

#: The asset group of the quarantine tables (their silver tables stay in ``silver``).
QUARANTINE_GROUP = "quarantine"

#: Definition metadata of a quarantine table: the silver table whose rejected rows it holds.
GUARDS = "medallion/guards"


def quarantine_out(*, key: AssetKey, source: str, guards: Sequence[AssetKey]) -> AssetOut:
    """The output of a step's quarantine table, in the ``quarantine`` group, linked to the table(s) it guards.

    Args:
        key: the quarantine table (``quarantine.<table>``).
        source: what its rows came from, for the description (the feed's name).
        guards: the silver tables the step writes; the first one carries the rejected-rows check.
    """
    tables = " and ".join(".".join(g.path) for g in guards)
    return AssetOut(
        key=key,
        kinds=set(DELTA_KINDS),  # AssetOut takes a set
        is_required=False,
        group_name=QUARANTINE_GROUP,
        metadata={**QUARANTINE, GUARDS: MetadataValue.asset(guards[0])},
        description=(
            f"Rows of {source} rejected by {tables}: parse errors and failed drop/fail expectations, "
            "with the reason; appended, never merged."
        ),
    )


_HISTORY_DESCRIPTIONS = {
    "valid_from": "When this version of the row became current (the change's first sequence field).",
    "valid_to": "When the next change replaced it; null while current.",
    "is_current": "Whether this is the key's latest version.",
    "is_deleted": "Whether this change deleted the key.",
}

_SNAPSHOT_HISTORY = {
    "valid_from": "When this version of the row became current: when bronze took in the first snapshot showing it.",
    "valid_to": "When bronze took in the snapshot that changed or lacked the row; null while current.",
}


def silver_descriptions(feed: Feed) -> dict[str, str]:
    """The declared descriptions of the columns silver stores."""
    return {f.name: f.description for f in feed.silver_fields if f.description}


def _change_feed_step(declared: Feed) -> AssetsDefinition:
    # A snapshot feed's bronze table holds its snapshots' changes: the step applies those.
    feed = declared.change_feed
    changes = feed.apply_changes
    table, key, quarantine_key = changes.table, feed.silver_key, feed.quarantine_key
    quarantine_output = f"quarantine_{table}"

    @multi_asset(
        name=f"{table}_from_{feed.name}",
        outs={
            table: AssetOut(
                key=key,
                kinds=set(DELTA_KINDS),  # AssetOut takes a set
                is_required=False,
                group_name="silver",
                description=f"Latest state per ({', '.join(changes.keys)}) of {feed.name}, deletes applied.",
                metadata=delta_table(
                    write_mode="merge",
                    merge_keys=list(changes.keys),
                    sequence_column="_sequence",
                    delete_column="_deleted",
                    filtered_by=changes.filtered_by,
                    column_descriptions={**silver_descriptions(feed), **_CHANGE_DESCRIPTIONS},
                    table_properties={DELETION_VECTORS: "true"} if changes.deletion_vectors else None,
                ),
            ),
            quarantine_output: quarantine_out(key=quarantine_key, source=feed.name, guards=[key]),
        },
        ins={"bronze_rows": AssetIn(key=feed.bronze_key, metadata={READ: "changes"})},
        check_specs=[
            *check_specs(key, feed.expectations),
            rejected_rows_check_spec(key, table=table, max_rejected_share=changes.max_rejected_share),
        ],
        can_subset=False,
    )
    def _apply_changes(context: AssetExecutionContext, bronze_rows: DataFrame):
        no_rows = has_no_rows(bronze_rows)
        # Counted as the parse reads them: the step's aggregations read every row.
        observed = ObservedInput(bronze_rows)
        # Cached: the expectation counts parse every row once, and the rejects are read back.
        judged = cache_rows(T.judge_changes(observed.frame, feed), no_rows=no_rows)
        records, rejects = T.typed_changes(judged, feed), T.rejected_changes(judged)
        latest = cache_rows(T.latest_changes(records, feed), no_rows=no_rows)
        # Masked before the expectations, so quarantined records carry no PII either.
        outcome = apply_expectations(
            T.silver_rows(latest, feed), feed.expectations, asset_key=key, table_name=table, no_rows=no_rows
        )
        # Cached: counted here, then written from the cache by the IO manager.
        quarantined = cache_rows(
            rejects_to_quarantine(rejects, table).unionByName(outcome.quarantined), no_rows=no_rows
        )
        rejected = count_rejected(quarantined, input_rows=observed.rows, no_rows=no_rows, judged=judged)
        judged.unpersist()  # what reads it next is cached: the latest changes and the quarantined rows
        rejected_check = rejected_rows_result(
            rejected, asset_key=key, table=table, max_rejected_share=changes.max_rejected_share
        )
        tag_failed_checks(context, [*outcome.check_results, rejected_check])
        try:
            yield from outcome.check_results
            if (
                not outcome.blocked
            ):  # a failed expectation: the table stays as it is; the blocking check stops downstream
                rows = T.rows_to_merge(outcome.kept, T.deleted_keys(latest, feed))
                yield Output(step_output(rows, no_rows=no_rows), output_name=table, metadata=rejected.metadata)
            # Last: see the module's docstring.
            yield Output(
                step_output(quarantined, no_rows=no_rows), output_name=quarantine_output, metadata=rejected.metadata
            )
        finally:
            # Written by now (each output is written as it is yielded): later steps get the memory back.
            for frame in (quarantined, latest):
                frame.unpersist()
            outcome.release()
        yield rejected_check

    return _apply_changes


def _history_asset(declared: Feed) -> AssetsDefinition:
    feed = declared.change_feed
    changes = feed.apply_changes
    table = f"{changes.table}_history"

    @asset(
        key=["silver", table],
        ins={"bronze_rows": AssetIn(key=feed.bronze_key), "silver": AssetIn(key=feed.silver_key)},
        group_name="silver",
        kinds=DELTA_KINDS,
        description=(
            f"Type-2 history of {changes.table} (valid_from, valid_to, is_current, is_deleted), PII masked: "
            "the changes that passed the parse and the drop/fail expectations, up to the one silver adopted "
            "for the key, so a key's current row is silver's. Each run rebuilds the history of the keys bronze "
            "gained changes of, from every bronze change of those keys, and replaces their rows: a change "
            "arriving in a later run closes the row before it (and a late, older change slots in between); "
            "other keys' rows are not rewritten."
        ),
        metadata=delta_table(
            write_mode="replace_keys",
            merge_keys=list(changes.keys),
            schema_mode="merge",
            column_descriptions={
                **silver_descriptions(feed),
                **_HISTORY_DESCRIPTIONS,
                **(_SNAPSHOT_HISTORY if declared.applies_snapshots else {}),
            },
        ),
    )
    def _history(
        bronze_rows: ChangesWithTable, silver: DataFrame, spark: SparkResource, lake: LakeResource
    ) -> DataFrame:
        # Rejects are quarantined by the change step; silver and its tombstones say what it adopted.
        records, _ = T.parse_changes(bronze_rows.table, feed)
        changed, _ = T.parse_changes(bronze_rows.changes, feed)
        client = DeltaTableClient(spark.session_by_path, spark.delta_engine_in_use)
        tombstones = DeltaTableClient.tombstone_path(lake.table_path(feed.silver_key.path))
        deleted = client.read(tombstones) if client.exists(tombstones) else None
        return T.history_of_changed_keys(records, changed, feed, T.adopted_sequences(silver, deleted, feed))

    return _history


def _snapshot_asset(feed: Feed, silver: Replace) -> AssetsDefinition:
    @asset(
        key=feed.silver_key,
        ins={"snapshot": AssetIn(key=feed.bronze_key)},
        group_name="silver",
        kinds=DELTA_KINDS,
        description=f"{silver.table} with its declared columns and types.",
        metadata=delta_table(
            write_mode="overwrite", schema_mode="overwrite", column_descriptions=silver_descriptions(feed)
        ),
    )
    def _conformed(snapshot: DataFrame) -> DataFrame:
        return T.conform_snapshot(snapshot, feed)

    return _conformed


def silver_assets(feeds: Iterable[Feed]) -> list[AssetsDefinition]:
    """The silver assets of every feed that declares its silver table (``silver=None``: the pipeline builds its own)."""
    built = []
    for feed in feeds:
        if isinstance(feed.silver, ApplyChanges):
            built.append(_change_feed_step(feed))
            if feed.silver.history:
                built.append(_history_asset(feed))
        elif isinstance(feed.silver, Replace):
            built.append(_snapshot_asset(feed, feed.silver))
    return built
