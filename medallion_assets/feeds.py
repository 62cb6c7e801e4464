"""Feeds as declarations: what a feed is, said once, in the module of the pipeline that owns it.

A :class:`Feed` names its source (files landed under ``landing/<folder>`` as
NDJSON or CSV, a Kafka topic, or Parquet snapshots), its typed fields with
their descriptions, and what silver does with it (:class:`ApplyChanges`: keys,
sequence, deletes, history, PII masks, expectations, for change feeds and
for snapshots with keys, whose snapshots are diffed into changes; or
:class:`Replace`, a snapshot overwriting silver). Everything else is built
from the declaration by the layers: the bronze stream asset and its
checkpoint, the checkpoint sensor, the ``stream_health`` check, the landing
sensor's coverage, continuous mode, the schema-drift rule, the silver parse
-> validate -> quarantine -> merge step and its checks. No code outside a pipeline module branches on a feed's name.

Pipelines live in :mod:`medallion_assets.pipelines`: every module there is
read by :func:`medallion_assets.project.project_feeds` (its :class:`Feed` objects) and by the
definitions (its Dagster assets and checks). Nothing is read at import.

Example:
    >>> from pyspark.sql.types import DecimalType, TimestampType
    >>> payments = Feed(
    ...     name="payments_raw",
    ...     description="Card payments, one JSON object per line.",
    ...     source=LandingFiles(folder="payments", format="ndjson"),
    ...     fields=(
    ...         Field("payment_id", description="The payment's id."),
    ...         Field("amount", DecimalType(12, 2), description="Amount paid."),
    ...         Field("paid_at", TimestampType(), description="When it was paid, UTC."),
    ...     ),
    ...     silver=ApplyChanges(table="payments", keys=("payment_id",), sequence_by=("paid_at",)),
    ... )
    >>> payments.silver_key.to_user_string()
    'silver/payments'
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import cached_property
from typing import Literal

from dagster import AssetKey
from pyspark.sql.types import (
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from medallion_assets.expectations import DEFAULT_MAX_REJECTED_SHARE, Expectation

#: The field types silver validates text against (see ``transforms.silver.validated``).
SUPPORTED_TYPES = (StringType, LongType, IntegerType, DecimalType, DateType, TimestampType)

#: The file extension each landed format is read from, unless the source names another.
DEFAULT_SUFFIX = {"ndjson": ".json", "csv": ".csv"}

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class FeedDeclarationError(ValueError):
    """A feed declaration that cannot be built: the message names the feed, the setting, the value and the fix."""


@dataclass(frozen=True)
class MaskDigits:
    """Mask a text's digits with ``*``, keeping its first ``keep`` characters (a phone's country code)."""

    keep: int = 0


#: How a PII field is masked in silver: ``"sha256"`` (hex digest, so joins on it still work) or :class:`MaskDigits`.
Mask = Literal["sha256"] | MaskDigits


@dataclass(frozen=True)
class Field:
    """One field of a feed, as the producer delivers it.

    Args:
        name: the field's name in the delivered record (a column name of silver).
        type: its Spark type; text is validated against it (integers, decimals
            that fit, ``YYYY-MM-DD`` dates, ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z`` timestamps).
        description: what the value is; shown in ``dagster/column_schema``.
        nullable: may be missing or empty. Otherwise a change that lacks it is
            quarantined with ``missing <name>`` (a delete needs only its keys,
            sequence and delete marker).
        values: the only values allowed, if any (``op`` in ``("I", "U", "D")``).
        mask: PII: masked wherever the silver step writes (silver, history,
            quarantine, tombstones), before the expectations. ``"sha256"``: the
            hex SHA-256 of the value's UTF-8 bytes; :class:`MaskDigits`: see
            there. A rejected line of a feed with masked fields is quarantined
            with them masked, or as ``sha256:<hex>`` of its text when it cannot
            be split into its fields. Raw values live in landing and bronze only.
    """

    name: str
    type: DataType = field(default_factory=StringType)
    _: KW_ONLY
    description: str = ""
    nullable: bool = False
    values: tuple[str, ...] = ()
    mask: Mask | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))


@dataclass(frozen=True, kw_only=True)
class LandingFiles:
    """Files the producer lands under ``landing/<folder>/``, each written once and then left alone.

    Args:
        folder: the sub-folder of ``landing/``.
        format: ``ndjson`` (bronze keeps each line as text; silver parses it) or
            ``csv`` (with a header; every field kept as text).
        suffix: the data files' name ending (default ``.json`` / ``.csv``); other files are not data.
        options: Spark CSV reader options over the defaults (RFC 4180 quoting, header, UTF-8).
    """

    folder: str
    format: Literal["ndjson", "csv"]
    suffix: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def file_suffix(self) -> str:
        return self.suffix or DEFAULT_SUFFIX[self.format]


@dataclass(frozen=True, kw_only=True)
class KafkaTopic:
    """Messages of a Kafka topic, each value one NDJSON line, on the deployment's broker (the ``kafka`` resource).

    Args:
        topic: the topic; a deployment may read another (``MEDALLION_KAFKA_TOPIC``).
        format: the messages' format.
    """

    topic: str
    format: Literal["ndjson"] = "ndjson"


@dataclass(frozen=True, kw_only=True)
class LandingSnapshots:
    """Full Parquet snapshots under ``landing/<folder>/``; the greatest file name is the current state.

    With :class:`Replace`, silver is the newest snapshot. With
    :class:`ApplyChanges` (keys needed), each snapshot newer than the last
    applied one is diffed, in name order, against the state before it
    (inserts, updates, deletes of the keys it lacks) and applied as changes;
    a snapshot whose name sorts at or before the last applied one is ignored
    and named in the bronze materialization's metadata.
    """

    folder: str

    @property
    def file_suffix(self) -> str:
        return ".parquet"


@dataclass(frozen=True, kw_only=True)
class ApplyChanges:
    """Silver keeps the latest state per key, merged in from each run's new bronze rows.

    Args:
        table: the silver table (``silver.<table>``; its rejects go to ``quarantine.<table>``).
        keys: the fields that identify a row.
        sequence_by: the fields that order a key's changes; the greatest wins, ties
            go to the later landed file. A snapshot feed (:class:`LandingSnapshots`)
            declares none: its changes are ordered by their snapshot, and the
            history's ``valid_from`` is when bronze took that snapshot in.
        delete_when: ``(field, value)``: a change with that value deletes its key.
            A snapshot feed declares none: a key absent from a snapshot is deleted.
        except_fields: fields kept out of the silver table (the change marker, the sequence).
        history: also keep ``silver.<table>_history``, type 2 (valid_from, valid_to,
            is_current, is_deleted), the history of silver: a key's changes that
            parsed and meet the drop/fail expectations, up to the one silver
            adopted for the key, so its current row is silver's (or its delete).
        max_rejected_share: the share of a run's input rows (0 to 1) that may go to
            quarantine before the ``<table>_rejected_rows`` check fails with severity
            ERROR (above it; the default 0.05: more than 5%); the check is an ERROR
            too when every line of a landed file of the run was rejected (garbage, a
            CSV header that is not the declaration's). Any other rejected row fails
            the check with severity WARN. The check is blocking: an ERROR fails the
            step after its writes, and so the run, and stops what is downstream.
            1: ERROR for a file rejected whole only; None: never ERROR (WARN only).
        deletion_vectors: create the silver table with deletion vectors, so that a
            MERGE marks the rows it replaces instead of rewriting every file that
            holds one (delta-spark only; docs/decisions/0006-deletion-vectors-off.md
            says why it is off by default). The cost: delta-rs 1.6 cannot
            read such a table, so the delta-rs engine refuses to create it and
            pandas/Arrow loads of it fail; Spark and DuckDB's delta extension read it.
            Applies when the table is created (an existing one: ``ALTER TABLE ... SET
            TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')``).
        filtered_by: the fields readers filter the silver table on (a date range,
            a region); a new table keeps per-file min/max on them besides its keys,
            which delta-spark pays for on every row it writes. None (the default):
            every date and timestamp field; ``()``: the keys only.
    """

    table: str
    keys: tuple[str, ...]
    sequence_by: tuple[str, ...] = ()
    delete_when: tuple[str, str] | None = None
    except_fields: tuple[str, ...] = ()
    history: bool = False
    max_rejected_share: float | None = DEFAULT_MAX_REJECTED_SHARE
    deletion_vectors: bool = False
    filtered_by: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class Replace:
    """Silver is the newest snapshot with exactly the declared fields and types (``silver.<table>``).

    Args:
        table: the silver table.
        keys: the fields that identify a row, if any (checked present and unique).
    """

    table: str
    keys: tuple[str, ...] = ()


Source = LandingFiles | KafkaTopic | LandingSnapshots

#: The columns a snapshot feed's bronze table adds to its fields: when bronze took the snapshot in,
#: its file name, and the change (see :attr:`Feed.change_feed`).
SNAPSHOT_AT, SNAPSHOT, CHANGE = "_snapshot_at", "_snapshot", "_change"
SNAPSHOT_CHANGE_COLUMNS = (SNAPSHOT_AT, SNAPSHOT, CHANGE)
#: The values of ``_change``.
UPSERT, DELETE = "upsert", "delete"


@dataclass(frozen=True, kw_only=True)
class Feed:
    """One feed: where it lands, what it holds, and what silver makes of it.

    Args:
        name: the bronze table, its stream and checkpoint (``bronze.<name>``).
        description: shown on the bronze asset.
        source: :class:`LandingFiles`, :class:`KafkaTopic` or :class:`LandingSnapshots`.
        fields: the delivered fields, in delivery (CSV header) order.
        silver: :class:`ApplyChanges`, :class:`Replace`, or None when the
            pipeline's own code builds silver from the bronze table. Snapshots
            declare :class:`Replace` or :class:`ApplyChanges` (then with keys,
            and no ``sequence_by`` or ``delete_when``).
        expectations: checked on silver's rows before the merge (warn / drop / fail).
        allow_full_refresh: a run may drop the stream's checkpoint and table and re-ingest landing/.
        unknown_fields: the drift rule for one NDJSON line, for nested records
            (default: its top-level keys that are not declared fields).

    Raises:
        FeedDeclarationError: a setting that cannot work, named with its value and the fix.
    """

    name: str
    description: str
    source: Source
    fields: tuple[Field, ...]
    silver: ApplyChanges | Replace | None = None
    expectations: tuple[Expectation, ...] = ()
    allow_full_refresh: bool = False
    unknown_fields: Callable[[str], set[str]] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        object.__setattr__(self, "expectations", tuple(self.expectations))
        if not _IDENTIFIER.match(self.name or ""):
            self._fail("name", self.name, "use letters, digits and underscores, not starting with a digit")
        if not isinstance(self.source, (LandingFiles, KafkaTopic, LandingSnapshots)):
            self._fail("source", self.source, "declare LandingFiles(...), KafkaTopic() or LandingSnapshots(...)")
        if isinstance(self.source, LandingFiles) and self.source.format not in DEFAULT_SUFFIX:
            self._fail(
                "source.format", self.source.format, "use 'ndjson' or 'csv' (Parquet snapshots: LandingSnapshots)"
            )
        if not self.fields:
            self._fail("fields", (), "declare at least one Field")
        names = [f.name for f in self.fields]
        for f in self.fields:
            if not _IDENTIFIER.match(f.name or ""):
                self._fail("fields", f.name, "a field name is a plain identifier")
            if not isinstance(f.type, SUPPORTED_TYPES):
                self._fail(
                    f"fields[{f.name}].type",
                    f.type,
                    "use StringType, LongType, IntegerType, DecimalType, DateType or TimestampType",
                )
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            self._fail("fields", duplicated, "declare each field once")
        if isinstance(self.silver, ApplyChanges):
            changes = self.silver
            if not _IDENTIFIER.match(changes.table or ""):
                self._fail("silver.table", changes.table, "name the silver table with a plain identifier")
            if not changes.keys:
                self._fail("silver.keys", changes.keys, "name the field(s) that identify a row")
            snapshots = isinstance(self.source, LandingSnapshots)
            if snapshots:
                if changes.sequence_by:
                    self._fail(
                        "silver.sequence_by",
                        changes.sequence_by,
                        "leave it out: a snapshot feed's changes are ordered by their snapshot's file name",
                    )
                if changes.delete_when is not None:
                    self._fail(
                        "silver.delete_when",
                        changes.delete_when,
                        "leave it out: a key absent from a newer snapshot is deleted",
                    )
                reserved = [n for n in names if n in SNAPSHOT_CHANGE_COLUMNS]
                if reserved:
                    self._fail(
                        "fields",
                        reserved,
                        f"rename them: {', '.join(SNAPSHOT_CHANGE_COLUMNS)} are the columns of a snapshot's changes",
                    )
            elif not changes.sequence_by:
                self._fail("silver.sequence_by", changes.sequence_by, "name the field(s) that order a key's changes")
            for setting, used in (
                ("silver.keys", changes.keys),
                ("silver.sequence_by", changes.sequence_by),
                ("silver.except_fields", changes.except_fields),
                ("silver.filtered_by", changes.filtered_by or ()),
                ("silver.delete_when", changes.delete_when[:1] if changes.delete_when else ()),
            ):
                unknown = [n for n in used if n not in names]
                if unknown:
                    self._fail(setting, unknown, f"use declared fields: {', '.join(names)}")
            dropped = [n for n in changes.filtered_by or () if n in changes.except_fields]
            if dropped:
                self._fail("silver.filtered_by", dropped, "filter on fields the silver table keeps (not except_fields)")
            if (
                changes.history
                and not snapshots
                and not isinstance(self.field(changes.sequence_by[0]).type, (TimestampType, DateType))
            ):
                self._fail(
                    "silver.history",
                    True,
                    "history's valid_from is the first sequence field: make it a timestamp or date",
                )
            share = changes.max_rejected_share
            if share is not None and (
                isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1
            ):
                self._fail(
                    "silver.max_rejected_share",
                    share,
                    "give a share of the input rows from 0 to 1 (0.05: more than 5% rejected is an ERROR), "
                    "or None for WARN only",
                )
            if not isinstance(changes.deletion_vectors, bool):
                self._fail(
                    "silver.deletion_vectors",
                    changes.deletion_vectors,
                    "say True (MERGEs mark replaced rows; delta-spark only) or False",
                )
        elif isinstance(self.silver, Replace):
            unknown = [n for n in self.silver.keys if n not in names]
            if unknown:
                self._fail("silver.keys", unknown, f"use declared fields: {', '.join(names)}")
            if not isinstance(self.source, LandingSnapshots):
                self._fail(
                    "silver",
                    self.silver,
                    "Replace(...) is for snapshots (LandingSnapshots); a change feed declares ApplyChanges(...)",
                )
        elif self.silver is not None:
            self._fail("silver", self.silver, "declare ApplyChanges(...), Replace(...) or None")
        elif isinstance(self.source, LandingSnapshots):
            self._fail(
                "silver",
                None,
                "snapshots (LandingSnapshots) declare Replace(...) (silver is the newest "
                "snapshot) or ApplyChanges(...) with keys (each snapshot applied as changes)",
            )
        checks = [e.name for e in self.expectations]
        if len(set(checks)) != len(checks):
            self._fail("expectations", checks, "give each expectation its own name")

    def _fail(self, setting: str, value: object, fix: str) -> None:
        raise FeedDeclarationError(f"feed {getattr(self, 'name', '?')!r}: {setting} = {value!r} cannot work: {fix}")

    # ---- what the layers build from it -----------------------------------------
    @property
    def applies_snapshots(self) -> bool:
        """Whether each new snapshot is diffed into changes that silver applies (snapshots with ApplyChanges)."""
        return isinstance(self.source, LandingSnapshots) and isinstance(self.silver, ApplyChanges)

    @cached_property
    def change_feed(self) -> Feed:
        """The declaration the silver change step applies: this feed, or for :attr:`applies_snapshots` the
        feed of its bronze table, the snapshots' changes.

        That feed has the declared fields and :data:`SNAPSHOT_CHANGE_COLUMNS`
        (kept out of silver): ``_snapshot_at`` (when bronze took the snapshot
        in, the history's ``valid_from``) and ``_snapshot`` (its file name)
        order the changes, and ``_change = 'delete'`` deletes a key. It is
        the machinery's reading of a validated declaration, so it is not
        validated again (a user may not declare those columns).
        """
        if not self.applies_snapshots or CHANGE in self.field_names:  # a change feed already
            return self
        changes = self.apply_changes
        derived = copy.copy(self)
        object.__setattr__(
            derived,
            "fields",
            (
                *self.fields,
                Field(SNAPSHOT_AT, TimestampType(), description="When bronze took in the snapshot, UTC."),
                Field(SNAPSHOT, description="The file name of the snapshot the change came from."),
                Field(
                    CHANGE,
                    values=(UPSERT, DELETE),
                    description="upsert: the key's row is new or changed; delete: the snapshot lacks the key.",
                ),
            ),
        )
        object.__setattr__(
            derived,
            "silver",
            replace(
                changes,
                sequence_by=(SNAPSHOT_AT, SNAPSHOT),
                delete_when=(CHANGE, DELETE),
                except_fields=(*changes.except_fields, *SNAPSHOT_CHANGE_COLUMNS),
            ),
        )
        return derived

    @property
    def is_stream(self) -> bool:
        """Whether bronze takes it in with a checkpointed stream (landed files or Kafka)."""
        return not isinstance(self.source, LandingSnapshots)

    @property
    def bronze_key(self) -> AssetKey:
        return AssetKey(["bronze", self.name])

    @property
    def silver_table(self) -> str | None:
        return self.silver.table if self.silver is not None else None

    @property
    def apply_changes(self) -> ApplyChanges:
        """The silver declaration of a feed whose silver applies changes.

        Raises:
            FeedDeclarationError: the feed's silver is not :class:`ApplyChanges`.
        """
        if not isinstance(self.silver, ApplyChanges):
            raise FeedDeclarationError(f"feed {self.name!r} does not apply changes to silver (silver={self.silver!r})")
        return self.silver

    @property
    def silver_keys(self) -> tuple[str, ...]:
        """The fields that identify a silver row (``silver.keys``)."""
        if self.silver is None:
            raise FeedDeclarationError(f"feed {self.name!r} declares no silver table (silver=None)")
        return self.silver.keys

    @property
    def silver_key(self) -> AssetKey:
        if self.silver is None:
            raise FeedDeclarationError(f"feed {self.name!r} declares no silver table (silver=None)")
        return AssetKey(["silver", self.silver.table])

    @property
    def quarantine_key(self) -> AssetKey:
        return AssetKey(["quarantine", self.silver_key.path[-1]])

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"feed {self.name!r} has no field {name!r}; its fields: {', '.join(self.field_names)}")

    @property
    def schema(self) -> StructType:
        """The declared fields with their types."""
        return StructType([StructField(f.name, f.type, True) for f in self.fields])

    @property
    def silver_fields(self) -> tuple[Field, ...]:
        """The fields silver stores (ApplyChanges' ``except_fields`` left out)."""
        left_out = self.silver.except_fields if isinstance(self.silver, ApplyChanges) else ()
        return tuple(f for f in self.fields if f.name not in left_out)

    @property
    def descriptions(self) -> dict[str, str]:
        """Field name -> description, for the fields that have one."""
        return {f.name: f.description for f in self.fields if f.description}

    def unknown_fields_of_line(self, line: str) -> set[str]:
        """The fields of one NDJSON line this feed does not declare (schema drift)."""
        if self.unknown_fields is not None:
            return self.unknown_fields(line)
        try:
            record = json.loads(line)
        except ValueError:
            return set()
        return {key for key in record if key not in self.field_names} if isinstance(record, dict) else set()


# ---- feeds of a given list ----------------------------------------------------------


def stream_feeds(feeds: Iterable[Feed]) -> tuple[Feed, ...]:
    """The feeds of ``feeds`` that bronze streams in (landed files and Kafka)."""
    return tuple(f for f in feeds if f.is_stream)


def feed_named(name: str, feeds: Iterable[Feed]) -> Feed:
    """The feed of ``feeds`` called ``name``: where a name (CLI, job config) becomes a feed.

    Raises:
        FeedDeclarationError: no feed has that name; the message lists the declared ones.
    """
    candidates = tuple(feeds)
    for feed in candidates:
        if feed.name == name:
            return feed
    raise FeedDeclarationError(
        f"no feed is named {name!r}; declared feeds: {', '.join(f.name for f in candidates) or 'none'}. "
        "Declare it with Feed(...) in a module of medallion_assets/pipelines/"
    )


def kafka_feed(feed: Feed) -> Feed:
    """``feed``, checked to be read from a Kafka topic.

    Raises:
        ValueError: ``feed`` is not a Kafka feed.
    """
    if not isinstance(feed.source, KafkaTopic):
        raise ValueError(f"bronze.{feed.name} is not read from Kafka (its source is {feed.source!r})")
    return feed
