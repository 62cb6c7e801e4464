"""The reader and writer options of the ``delta`` format, parsed and validated.

Option names are case-insensitive, as in Spark. An unknown option is an error
rather than silently ignored: a misspelt ``replaceWhere`` must not turn a
partition overwrite into a full overwrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from medallion_assets.delta.errors import DeltaOptionError

# Options Spark or common tooling may pass through that carry no meaning here.
_PASS_THROUGH = {"path", "paths", "queryname", "checkpointlocation", "__checkpointlocation"}
#: What Spark's session catalog adds to the options of a table read by name: its
#: reserved table properties, which say nothing about how to read the Delta log.
_CATALOG_PROPERTIES = {
    "owner",
    "provider",
    "location",
    "external",
    "comment",
    "is_managed_location",
    "collation",
    "transient_lastddltime",
    "spark.sql.create.version",
}

WRITE_OPTIONS = {
    "replacewhere": "replaceWhere",
    "mergeschema": "mergeSchema",
    "overwriteschema": "overwriteSchema",
    "usermetadata": "userMetadata",
    "txnappid": "txnAppId",
    "txnversion": "txnVersion",
    "partitionoverwritemode": "partitionOverwriteMode",
    "maxrecordsperfile": "maxRecordsPerFile",
    "targetfilesize": "targetFileSize",
    "dataChange".lower(): "dataChange",
}
READ_OPTIONS = {
    "versionasof": "versionAsOf",
    "timestampasof": "timestampAsOf",
    "readchangefeed": "readChangeFeed",
    "readchangedata": "readChangeFeed",
    "startingversion": "startingVersion",
    "endingversion": "endingVersion",
    "startingtimestamp": "startingTimestamp",
    "endingtimestamp": "endingTimestamp",
    "maxpartitionbytes": "maxPartitionBytes",
    "maxfilespertrigger": "maxFilesPerTrigger",
    "maxbytespertrigger": "maxBytesPerTrigger",
    "ignoredeletes": "ignoreDeletes",
    "ignorechanges": "ignoreChanges",
    "skipchangecommits": "skipChangeCommits",
}


# Spark lowercases option keys, but Delta property names are case-sensitive:
# restore the spelling of the properties Delta defines.
TABLE_PROPERTIES = [
    "delta.appendOnly",
    "delta.autoOptimize.autoCompact",
    "delta.autoOptimize.optimizeWrite",
    "delta.checkpoint.writeStatsAsJson",
    "delta.checkpoint.writeStatsAsStruct",
    "delta.checkpointInterval",
    "delta.checkpointPolicy",
    "delta.columnMapping.mode",
    "delta.dataSkippingNumIndexedCols",
    "delta.dataSkippingStatsColumns",
    "delta.deletedFileRetentionDuration",
    "delta.enableChangeDataFeed",
    "delta.enableDeletionVectors",
    "delta.enableExpiredLogCleanup",
    "delta.enableRowTracking",
    "delta.enableTypeWidening",
    "delta.isolationLevel",
    "delta.logRetentionDuration",
    "delta.minReaderVersion",
    "delta.minWriterVersion",
    "delta.randomizeFilePrefixes",
    "delta.setTransactionRetentionDuration",
    "delta.targetFileSize",
    "delta.tuneFileSizesForRewrites",
]
_PROPERTY_SPELLING = {name.lower(): name for name in TABLE_PROPERTIES}


def canonical_property(key: str) -> str:
    """A table property name as Delta spells it (``delta.enablechangedatafeed`` -> ``delta.enableChangeDataFeed``)."""
    return _PROPERTY_SPELLING.get(key.lower(), key)


def _bool(name: str, value: str | None, *, table: str) -> bool:
    if value is None:
        return False
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise DeltaOptionError(f"option {name}='{value}' must be true or false", table=table)


def _int(name: str, value: str | None, *, table: str, minimum: int = 0) -> int | None:
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise DeltaOptionError(f"option {name}='{value}' must be a whole number", table=table) from None
    if number < minimum:
        raise DeltaOptionError(f"option {name}={number} must be at least {minimum}", table=table)
    return number


_SIZE_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def parse_bytes(name: str, value: str | None, *, table: str) -> int | None:
    """A byte size such as ``134217728``, ``128m`` or ``1g``."""
    if value is None:
        return None
    text = str(value).strip().lower()
    number = text.rstrip("bkmg")
    unit = text[len(number) :] or "b"
    try:
        size = int(float(number) * _SIZE_UNITS[unit])
    except (ValueError, KeyError):
        raise DeltaOptionError(
            f"option {name}='{value}' must be a size such as 1048576, 128m or 1g", table=table
        ) from None
    if size <= 0:
        raise DeltaOptionError(f"option {name}='{value}' must be positive", table=table)
    return size


def split_options(options: Mapping[str, str], known: dict[str, str], *, table: str, kind: str):
    """Split options into (known by canonical name, delta.* properties, commitInfo.* metadata).

    Raises:
        DeltaOptionError: for an option that is neither known nor a table property.
    """
    values: dict[str, str] = {}
    properties: dict[str, str] = {}
    commit_info: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower in known:
            values[known[lower]] = value
        elif lower.startswith("delta."):
            # Property names are case-sensitive in the log; keep delta-spark's spelling.
            properties[canonical_property(key)] = value
        elif lower.startswith("commitinfo."):
            # Spark hands keys over lowercased: use snake_case keys, e.g. commitInfo.dagster_run_id.
            commit_info[key[len("commitInfo.") :]] = value
        elif lower in _PASS_THROUGH or lower in _CATALOG_PROPERTIES or lower.startswith("spark.sql.sources."):
            continue
        else:
            raise DeltaOptionError(
                f"unknown {kind} option '{key}'; the delta format takes: "
                f"{', '.join(sorted(set(known.values())))}, delta.<table property>"
                + (", commitInfo.<key>" if kind == "write" else ""),
                table=table,
            )
    return values, properties, commit_info


@dataclass(frozen=True)
class WriteOptions:
    """The options of one batch or streaming write."""

    replace_where: str | None = None
    merge_schema: bool = False
    overwrite_schema: bool = False
    user_metadata: str | None = None
    txn_app_id: str | None = None
    txn_version: int | None = None
    dynamic_partition_overwrite: bool = False
    max_records_per_file: int | None = None
    target_file_size: int | None = None
    data_change: bool = True
    properties: dict[str, str] = field(default_factory=dict)
    commit_info: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, table: str, mode: Literal["append", "overwrite"]) -> WriteOptions:
        values, properties, commit_info = split_options(options, WRITE_OPTIONS, table=table, kind="write")
        txn_app_id = values.get("txnAppId")
        txn_version = _int("txnVersion", values.get("txnVersion"), table=table)
        if (txn_app_id is None) != (txn_version is None):
            raise DeltaOptionError("txnAppId and txnVersion go together; set both or neither", table=table)
        overwrite_mode = (values.get("partitionOverwriteMode") or "static").lower()
        if overwrite_mode not in ("static", "dynamic"):
            raise DeltaOptionError(
                f"partitionOverwriteMode='{values['partitionOverwriteMode']}' must be static or dynamic", table=table
            )
        parsed = cls(
            replace_where=values.get("replaceWhere") or None,
            merge_schema=_bool("mergeSchema", values.get("mergeSchema"), table=table),
            overwrite_schema=_bool("overwriteSchema", values.get("overwriteSchema"), table=table),
            user_metadata=values.get("userMetadata"),
            txn_app_id=txn_app_id,
            txn_version=txn_version,
            dynamic_partition_overwrite=overwrite_mode == "dynamic",
            max_records_per_file=_int("maxRecordsPerFile", values.get("maxRecordsPerFile"), table=table, minimum=1),
            target_file_size=parse_bytes("targetFileSize", values.get("targetFileSize"), table=table),
            data_change="dataChange" not in values or _bool("dataChange", values.get("dataChange"), table=table),
            properties=properties,
            commit_info=commit_info,
        )
        if mode == "append" and (parsed.replace_where or parsed.overwrite_schema or parsed.dynamic_partition_overwrite):
            used = [
                n
                for n, v in (
                    ("replaceWhere", parsed.replace_where),
                    ("overwriteSchema", parsed.overwrite_schema),
                    ("partitionOverwriteMode", parsed.dynamic_partition_overwrite),
                )
                if v
            ]
            raise DeltaOptionError(f"{', '.join(used)} only applies to mode('overwrite'), not append", table=table)
        if parsed.replace_where and parsed.dynamic_partition_overwrite:
            raise DeltaOptionError("replaceWhere and partitionOverwriteMode=dynamic cannot be combined", table=table)
        if parsed.overwrite_schema and (parsed.replace_where or parsed.dynamic_partition_overwrite):
            raise DeltaOptionError(
                "overwriteSchema replaces the whole table; it cannot be combined with "
                "replaceWhere or a dynamic partition overwrite",
                table=table,
            )
        return parsed


@dataclass(frozen=True)
class ReadOptions:
    """The options of a batch or streaming read."""

    version_as_of: int | None = None
    timestamp_as_of: str | None = None
    read_change_feed: bool = False
    starting_version: int | str | None = None
    ending_version: int | None = None
    starting_timestamp: str | None = None
    ending_timestamp: str | None = None
    max_partition_bytes: int = 128 * 1024 * 1024
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    ignore_deletes: bool = False
    ignore_changes: bool = False
    skip_change_commits: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str], *, table: str) -> ReadOptions:
        values, properties, _ = split_options(options, READ_OPTIONS, table=table, kind="read")
        if properties:
            raise DeltaOptionError(
                f"table properties ({', '.join(properties)}) are not read options; set them when writing "
                "or with DeltaTable.setProperties",
                table=table,
            )
        starting = values.get("startingVersion")
        if starting is not None and str(starting).strip().lower() != "latest":
            starting = _int("startingVersion", starting, table=table)
        elif starting is not None:
            starting = "latest"
        parsed = cls(
            version_as_of=_int("versionAsOf", values.get("versionAsOf"), table=table),
            timestamp_as_of=values.get("timestampAsOf"),
            read_change_feed=_bool("readChangeFeed", values.get("readChangeFeed"), table=table),
            starting_version=starting,
            ending_version=_int("endingVersion", values.get("endingVersion"), table=table),
            starting_timestamp=values.get("startingTimestamp"),
            ending_timestamp=values.get("endingTimestamp"),
            max_partition_bytes=parse_bytes("maxPartitionBytes", values.get("maxPartitionBytes"), table=table)
            or 128 * 1024 * 1024,
            max_files_per_trigger=_int("maxFilesPerTrigger", values.get("maxFilesPerTrigger"), table=table, minimum=1),
            max_bytes_per_trigger=parse_bytes("maxBytesPerTrigger", values.get("maxBytesPerTrigger"), table=table),
            ignore_deletes=_bool("ignoreDeletes", values.get("ignoreDeletes"), table=table),
            ignore_changes=_bool("ignoreChanges", values.get("ignoreChanges"), table=table),
            skip_change_commits=_bool("skipChangeCommits", values.get("skipChangeCommits"), table=table),
        )
        if parsed.version_as_of is not None and parsed.timestamp_as_of is not None:
            raise DeltaOptionError("give versionAsOf or timestampAsOf, not both", table=table)
        return parsed
