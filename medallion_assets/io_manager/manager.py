"""The Dagster side of the Delta IO manager: :class:`DeltaIOManager` and :class:`SparkDataFrameTypeHandler`.

Inputs annotated, and outputs returned, as pandas, polars or Arrow objects go
to the handlers of :mod:`.arrow_handlers` instead: delta-rs, no SparkSession.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetKey,
    ConfigurableIOManager,
    DagsterEventType,
    InputContext,
    MetadataValue,
    OutputContext,
)
from pydantic import Field
from pyspark.sql import DataFrame

from medallion_assets.delta import UnsupportedFeatureError
from medallion_assets.io_manager.arrow_handlers import handler_for_object, handler_for_type
from medallion_assets.io_manager.metadata import (
    ENGINE_NAME,
    arrow_table_metadata,
    check_column_descriptions,
    latest_materialization_metadata,
    spark_table_schema,
    table_metadata,
    version_metadata,
)
from medallion_assets.io_manager.spec import (
    COLUMNS,
    PARTITION_EXPR,
    READ,
    SOURCE,
    VERSION,
    column_descriptions,
    write_spec_from_metadata,
)
from medallion_assets.io_manager.table_read import ARROW_READ_MAX_ROWS, ChangesWithTable, TableRead
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.arrow_client import DELTA_RS_CANNOT_READ, ArrowDeltaClient, TimeWindowFilter, logged_rows
from medallion_assets.storage.client import DeltaTableClient, WriteResult
from medallion_assets.storage.write_spec import WriteSpec
from medallion_assets.storage.writers import ARROW_MERGE_MAX_TABLE_BYTES, ARROW_WRITE_MAX_ROWS, WriterLimits

_CONSUMED_PREFIX = "medallion/consumed/"
#: Commit metadata key (``consumed.<layer>/<table>``) of the upstream version a write took in.
_CONSUMED_COMMIT_PREFIX = "consumed."
#: Output metadata: each upstream table the step read and the version(s) it read (absent when none).
_INPUTS = "medallion/inputs"
#: Commit metadata key of an overwrite's fingerprint (inputs' versions, partition, source) as JSON.
_COMPUTED_FROM = "computed_from"


@dataclass(frozen=True)
class _OutputWrite:
    """What a write of one output records and replaces, whoever writes it.

    Attributes:
        replace_where: the partition an overwrite replaces, for a partitioned asset.
        fingerprint: what an overwrite is computed from (its inputs' versions, partition,
            source), as recorded in its commit; None when it reads no table and names no source.
        descriptions: the asset's column descriptions.
        commit_metadata: custom keys of the commit.
        step_metadata: output metadata of the step's reads, whatever was written.
        transaction: the run's transaction of this output (and partition): an append commits it once.
        empty_commit: the transaction of a commit without rows recording newly consumed upstream commits.
        reads: what the step's inputs read.
    """

    replace_where: str | None
    fingerprint: str | None
    descriptions: dict[str, str]
    commit_metadata: dict[str, str]
    step_metadata: dict[str, Any]
    transaction: tuple[str, int]
    empty_commit: tuple[str, int] | None
    reads: _StepReads


@dataclass
class _StepReads:
    """What an executing step read: recorded on its ``LOADED_INPUT`` events, collected for its outputs.

    Attributes:
        consumed: upstream -> the version a ``changes`` input read up to.
        consumed_before: upstream -> the version a ``changes`` input read the changes after.
        advanced: whether a ``changes`` input read at least one new commit.
        inputs: upstream -> the version a whole-table input read.
    """

    consumed: dict[str, int] = field(default_factory=dict)
    consumed_before: dict[str, int] = field(default_factory=dict)
    advanced: bool = False
    inputs: dict[str, int] = field(default_factory=dict)

    def described(self) -> dict[str, dict[str, int]]:
        """Upstream -> what was read of it: ``version`` (up to which) and, for changes, ``changes_after_version``."""
        read: dict[str, dict[str, int]] = {table: {"version": version} for table, version in self.inputs.items()}
        for table, version in self.consumed.items():
            read[table] = {"changes_after_version": self.consumed_before[table], "version": version}
        return dict(sorted(read.items()))


#: Input metadata of each loaded input, read back when the step's outputs are handled.
_READ_TABLE = "delta/table"
_READ_VERSION = "delta/version"
_READ_CHANGES_FROM = "delta/changes_from_version"


class SparkDataFrameTypeHandler:
    """Spark DataFrames in and out of the Delta IO manager.

    pandas, polars and Arrow objects have their own handlers
    (:mod:`.arrow_handlers`), which do not start Spark.
    """

    supported_types = (DataFrame,)

    def handle_output(
        self,
        client: DeltaTableClient,
        frame: DataFrame,
        path: str,
        spec: WriteSpec,
        *,
        replace_where: str | None,
        commit_metadata: Mapping[str, str],
        transaction: tuple[str, int] | None = None,
        empty_commit: tuple[str, int] | None = None,
        column_descriptions: Mapping[str, str] | None = None,
        earlier: Mapping[str, Any] | None = None,
    ) -> tuple[WriteResult, dict[str, Any]]:
        """Write ``frame`` and describe the table afterwards (its columns with ``column_descriptions``).

        ``earlier``: the asset's latest materialization metadata, reused when
        no row was written (:func:`~.metadata.table_metadata`).
        """
        if not isinstance(frame, DataFrame):
            raise TypeError(
                f"the Delta IO manager stores Spark, pandas, polars and Arrow frames, got {type(frame).__name__}: "
                "return one of those from the asset"
            )
        result = client.write(
            frame,
            path,
            spec,
            replace_where=replace_where,
            commit_metadata=commit_metadata,
            transaction=transaction,
            empty_commit=empty_commit,
        )
        if not result.commit:
            return result, {"dagster/row_count": 0}
        if result.by_deltalake:
            # The session has not read that version: delta-rs describes it from the log it just wrote.
            metadata = arrow_table_metadata(
                ArrowDeltaClient(),
                path,
                column_descriptions=column_descriptions,
                key_columns=spec.key_columns,
                newest_first=spec.newest_first,
            )
            return result, _with_spark_column_types(metadata, frame, column_descriptions)
        return result, table_metadata(
            client,
            path,
            commit=result.commit,
            column_descriptions=column_descriptions,
            key_columns=spec.key_columns,
            newest_first=spec.newest_first,
            earlier=earlier,
        )

    def load_input(
        self, client: DeltaTableClient, path: str, *, version: int | None, columns: Sequence[str] | None
    ) -> DataFrame:
        """The table as a DataFrame."""
        return client.read(path, version=version, columns=columns)


def step_reads(instance: Any, run_id: str, step_key: str) -> _StepReads:
    """What a step's inputs read in a run, from the ``LOADED_INPUT`` events the IO manager recorded.

    The IO manager keeps no state between loading and storing, so it works
    with any executor; a retried step loads its inputs again, and its later
    events win.
    """
    records = instance.get_records_for_run(run_id=run_id, of_type=DagsterEventType.LOADED_INPUT).records
    reads = _StepReads()
    for record in records:
        entry = record.event_log_entry
        if entry.step_key != step_key or entry.dagster_event is None:
            continue
        loaded = entry.dagster_event.event_specific_data.metadata or {}
        if _READ_TABLE not in loaded or _READ_VERSION not in loaded:
            continue
        table, version = str(loaded[_READ_TABLE].value), int(loaded[_READ_VERSION].value)
        if _READ_CHANGES_FROM in loaded:
            first = int(loaded[_READ_CHANGES_FROM].value)
            reads.consumed[table] = version
            reads.consumed_before[table] = first - 1
            reads.advanced = reads.advanced or first <= version
        else:
            reads.inputs[table] = version
    return reads


#: Check metadata: each table the check's step read and the version it read.
CHECKED_VERSIONS = "medallion/checked_versions"
#: Check metadata of a result taken over from an earlier evaluation: that evaluation's run.
REUSED_FROM_RUN = "medallion/reused_from_run"


def check_once_per_version(
    context: Any, check_key: AssetCheckKey, evaluate: Callable[[], AssetCheckResult]
) -> AssetCheckResult:
    """A check's result, evaluated only when a table it reads changed since its latest evaluation.

    The step's inputs (read through this IO manager) name the versions they
    read. When the check's latest evaluation recorded the same versions, its
    result is returned again, marked with the run it came from: a run with
    nothing new re-checks nothing. Otherwise ``evaluate()`` runs and its
    result records the versions. A step that reads ``changes`` always
    evaluates (its input is what is new, not a version).

    Args:
        context: the executing asset's or check's context.
        check_key: the check.
        evaluate: computes the result.
    """
    reads = step_reads(context.instance, context.run.run_id, context.get_step_execution_context().step.key)
    versions: dict[str, Any] = reads.described()
    if versions and context.has_partition_key:
        # Another partition of the same tables is another check.
        versions["partition"] = context.partition_key
    if versions and not reads.consumed:
        # This run's own record (planned) comes first; a few back is the latest evaluation.
        history = context.instance.event_log_storage.get_asset_check_execution_history(check_key, limit=3)
        evaluated = [record for record in history if isinstance(record.evaluation, AssetCheckEvaluation)]
        earlier = evaluated[0].evaluation if evaluated else None
        recorded = earlier.metadata.get(CHECKED_VERSIONS) if earlier is not None else None
        if earlier is not None and recorded is not None and recorded.value == versions:
            # A repeated result names the run that computed it, however many runs repeated it since.
            origin = earlier.metadata.get(REUSED_FROM_RUN)
            return AssetCheckResult(
                asset_key=check_key.asset_key,
                check_name=check_key.name,
                passed=earlier.passed,
                severity=earlier.severity,
                description=earlier.description,
                metadata={**earlier.metadata, REUSED_FROM_RUN: origin.value if origin else evaluated[0].run_id},
            )
    result = evaluate()
    metadata = {key: value for key, value in (result.metadata or {}).items() if key != REUSED_FROM_RUN}
    return result.with_metadata({**metadata, CHECKED_VERSIONS: MetadataValue.json(versions)})


def _no_table_yet(key: AssetKey, path: str) -> FileNotFoundError:
    """The error of an input whose upstream table has not been written yet."""
    return FileNotFoundError(f"asset {key.to_user_string()} has no Delta table yet at {path}: materialize it first")


def _key_name(key: AssetKey) -> str:
    return "/".join(key.path)


class DeltaIOManager(ConfigurableIOManager):
    """Stores each asset as the Delta table ``<lake root>/<layer>/<table>``.

    Write behaviour comes from the asset's metadata (:func:`delta_table`);
    inputs read the latest version, a pinned ``delta/version``, selected
    ``delta/columns``, or with ``delta/read: changes`` only the rows the upstream
    gained since this step last consumed it.

    An overwrite whose inputs (upstream versions, partition, declared source)
    are the same as at its last materialization is not rewritten: rerunning with
    nothing new changes no table.
    """

    spark: SparkResource
    lake: LakeResource
    skip_unchanged: bool = Field(
        default=True,
        description="Do not rewrite an overwrite-mode table whose inputs have not changed since it was written.",
    )
    arrow_read_max_rows: int = Field(
        default=ARROW_READ_MAX_ROWS,
        ge=0,
        description=(
            "Inputs annotated TableRead (the table checks) are computed without Spark when delta-rs reads the "
            "version: as delta-rs' table whatever its size (the checks count it with DataFusion), and as Arrow "
            "in hand when it has at most this many rows. 0: always Spark. A deployment sets it with "
            "MEDALLION_ARROW_READ_MAX_ROWS."
        ),
    )
    arrow_write_max_rows: int = Field(
        default=ARROW_WRITE_MAX_ROWS,
        ge=0,
        description=(
            "A Spark DataFrame output written by overwrite (no partitions, no declared table properties) "
            "with at most this many rows is collected as Arrow and committed by deltalake (delta-rs), "
            "without the jobs delta-spark's overwrite runs whatever the rows; so is an append of at most "
            "this many rows to an existing unpartitioned table (a quarantine, a merge's tombstones, the "
            "empty commit that records what a write consumed), and a MERGE whose source has at most this "
            "many rows into such a table (deltalake merges it in this process, see arrow_merge_max_table_mb). "
            "Larger writes, tables deltalake cannot write, new columns, object-store lakes and Spark Connect "
            "sessions are written by Spark. 0: always Spark. A deployment sets it with "
            "MEDALLION_ARROW_WRITE_MAX_ROWS."
        ),
    )
    arrow_merge_max_table_mb: int = Field(
        default=ARROW_MERGE_MAX_TABLE_BYTES // (1024 * 1024),
        ge=0,
        description=(
            "A small MERGE (see arrow_write_max_rows) is run by deltalake only into a table whose current "
            "files total at most this many MiB: deltalake rewrites the files holding matched keys in the "
            "Python process, which grows with them. A larger table is "
            "merged by Spark. 0: always Spark. A deployment sets it with MEDALLION_ARROW_MERGE_MAX_TABLE_MB."
        ),
    )

    def _client(self) -> DeltaTableClient:
        return DeltaTableClient(
            self.spark.session_by_path,
            self.spark.delta_engine_in_use,
            writer_limits=WriterLimits(
                max_rows=self.arrow_write_max_rows,
                max_merge_table_bytes=self.arrow_merge_max_table_mb * 1024 * 1024,
            ),
        )

    def _path(self, key: AssetKey) -> str:
        return self.lake.table_path(key.path)

    # ---- inputs --------------------------------------------------------
    def load_input(self, context: InputContext) -> Any:
        kind = getattr(context.dagster_type, "typing_type", None)
        if kind is TableRead:
            return self._load_table_read(context)
        if kind is ChangesWithTable:
            return self._load_changes_with_table(context)
        handler = handler_for_type(kind)
        if handler is not None:
            return self._load_without_spark(context, handler)
        return self._load_spark(context)

    def _load_spark(self, context: InputContext) -> DataFrame:
        client = self._client()
        key = context.asset_key
        path = self._path(key)
        metadata = dict(context.definition_metadata or {})
        version = metadata.get(VERSION)
        columns = metadata.get(COLUMNS)
        if not client.exists(path):
            raise _no_table_yet(key, path)
        latest = client.latest_version(path)
        assert latest is not None, "the table exists: checked above"
        if metadata.get(READ) == "changes":
            frame = self._read_changes(client, context, path, latest)
            return frame.select(*columns) if columns else frame
        context.add_input_metadata(
            {_READ_TABLE: _key_name(key), _READ_VERSION: int(version) if version is not None else latest}
        )
        frame = SparkDataFrameTypeHandler().load_input(client, path, version=version, columns=columns)
        partition_expr = _upstream_partition_expr(context)
        if partition_expr:
            frame = frame.where(_time_window_predicate(partition_expr, context.asset_partitions_time_window))
        return frame

    def _read_changes(self, client: DeltaTableClient, context: InputContext, path: str, latest: int) -> DataFrame:
        """The rows the input's table gained after this step's outputs last consumed it, up to ``latest``."""
        key = context.asset_key
        after = self._consumed_version(client, context, key)
        # Recorded on the step's LOADED_INPUT event: its outputs read it from there.
        context.add_input_metadata(
            {_READ_TABLE: _key_name(key), _READ_CHANGES_FROM: after + 1, _READ_VERSION: latest},
            description=f"versions {after + 1}..{latest} read as changes",
        )
        context.log.info(f"{key.to_user_string()}: reading versions {after + 1}..{latest}")
        return client.read_changes(path, after_version=after, to_version=latest)

    def _load_changes_with_table(self, context: InputContext) -> ChangesWithTable:
        """The input's changes since this step last consumed it, and its whole table at the same version."""
        client = self._client()
        key = context.asset_key
        path = self._path(key)
        if not client.exists(path):
            raise _no_table_yet(key, path)
        latest = client.latest_version(path)
        assert latest is not None, "the table exists: checked above"
        return ChangesWithTable(
            changes=self._read_changes(client, context, path, latest), table=client.read(path, version=latest)
        )

    def _load_table_read(self, context: InputContext) -> TableRead:
        """A :class:`TableRead` of the input's version.

        delta-rs' table (Arrow while small) when delta-rs reads it, else Spark.
        """
        key = context.asset_key
        path = self._path(key)
        metadata = dict(context.definition_metadata or {})
        if metadata.get(READ) == "changes" or _upstream_partition_expr(context):
            raise ValueError(
                f"input {key.to_user_string()} of {context.op_def.name}: a TableRead reads a whole version, "
                "not changes or a partition; annotate the input as a Spark DataFrame instead"
            )
        version = metadata.get(VERSION)
        arrow = ArrowDeltaClient()
        try:
            # Opened once: its log gives the rows, and DataFusion plans on it.
            opened = arrow.readable_table(path, version=int(version) if version is not None else None)
        except DELTA_RS_CANNOT_READ as error:
            # A location only the Spark server sees, or a table feature delta-rs does not read.
            context.log.debug(f"{key.to_user_string()}: delta-rs cannot read {path} ({error}); Spark reads it")
            frame = self._load_spark(context)
            return TableRead(
                path=path, version=None, rows=None, max_arrow_rows=self.arrow_read_max_rows, _spark_frame=lambda: frame
            )
        read = opened.version()
        context.add_input_metadata({_READ_TABLE: _key_name(key), _READ_VERSION: read})

        def spark_frame() -> DataFrame:
            return SparkDataFrameTypeHandler().load_input(
                self._client(), path, version=read, columns=metadata.get(COLUMNS)
            )

        return TableRead(
            path=path,
            version=read,
            rows=logged_rows(opened),
            max_arrow_rows=self.arrow_read_max_rows,
            _spark_frame=spark_frame,
            _delta_table=opened,
        )

    def _load_without_spark(self, context: InputContext, handler: Any) -> Any:
        """An input annotated as a pandas, polars or Arrow type, read by delta-rs (no SparkSession)."""
        key = context.asset_key
        path = self._path(key)
        metadata = dict(context.definition_metadata or {})
        kind = context.dagster_type.typing_type
        if metadata.get(READ) == "changes":
            raise ValueError(
                f"input {key.to_user_string()} of {context.op_def.name}: delta/read 'changes' needs Spark "
                f"(the change data feed); annotate the input as a Spark DataFrame, not {kind.__name__}, "
                "or read the whole table"
            )
        client = ArrowDeltaClient()
        if not client.exists(path):
            raise _no_table_yet(key, path)
        version = metadata.get(VERSION)
        window = None
        partition_expr = _upstream_partition_expr(context)
        if partition_expr:
            span = context.asset_partitions_time_window
            window = TimeWindowFilter(column=partition_expr, start=span.start, end=span.end)
        read = int(version) if version is not None else client.latest_version(path)
        context.add_input_metadata({_READ_TABLE: _key_name(key), _READ_VERSION: read, "delta/engine": ENGINE_NAME})
        try:
            dataset = client.dataset(path, version=read, columns=metadata.get(COLUMNS), window=window)
        except UnsupportedFeatureError as error:
            raise UnsupportedFeatureError(
                f"input {key.to_user_string()} of {context.op_def.name}: delta-rs cannot read it as "
                f"{kind.__name__} ({error.message}); annotate the input as a Spark DataFrame, which reads it "
                "through Spark",
                table=path,
            ) from error
        return handler.from_dataset(dataset, kind)

    def _consumed_version(self, client: DeltaTableClient, context: InputContext, upstream: AssetKey) -> int:
        """The newest upstream version every one of this step's tables has taken in (-1: none).

        Read from the tables' own Delta logs: each write of such a step records
        ``consumed.<upstream>`` in its commit (an empty commit when it had no
        rows), so the answer survives a wiped Dagster instance and a change of
        engine. The oldest over the step's outputs: when a blocking check stops
        a step after its quarantine was written but before its tables were, the
        tables have not consumed the increment, and the next run must read it
        again.
        """
        key = _CONSUMED_COMMIT_PREFIX + _key_name(upstream)
        versions = []
        for output in context.step_context.get_output_asset_keys():
            path = self._path(output)
            value = client.engine.newest_commit_value(client.spark, path, key) if client.exists(path) else None
            versions.append(-1 if value is None else int(value))
        return min(versions, default=-1)

    # ---- outputs -------------------------------------------------------
    def handle_output(self, context: OutputContext, obj: Any) -> None:
        key = context.asset_key
        path = self._path(key)
        spec = write_spec_from_metadata(context.definition_metadata or {})
        output = self._output_write(context, spec)
        handler = handler_for_object(obj)
        if handler is not None:
            context.log.info(
                f"{key.to_user_string()}: Delta engine {ENGINE_NAME} (a {type(obj).__name__} output, no Spark)"
            )
            self._store_without_spark(context, handler.to_arrow(obj), path, spec, output)
            return
        client = self._client()
        if self._unchanged(
            output, spec, exists=lambda: client.exists(path), computed_from=lambda: _computed_from(client, path)
        ):
            metadata = table_metadata(
                client,
                path,
                column_descriptions=output.descriptions,
                key_columns=spec.key_columns,
                newest_first=spec.newest_first,
                earlier=latest_materialization_metadata(context.step_context.instance, key),
            )
            metadata["delta/skipped"] = "inputs unchanged since the last materialization"
            self._register(client, key, path)
            context.add_output_metadata({**metadata, **output.step_metadata})
            return
        if spec.append_keys and output.reads.consumed and isinstance(obj, DataFrame):
            obj = _rows_not_held(client, obj, path, spec.append_keys, output.reads)
        if output.descriptions and isinstance(obj, DataFrame):
            _check_descriptions_before_writing(client, obj, path, output.descriptions, asset=key.to_user_string())
        context.log.info(f"{key.to_user_string()}: Delta engine {client.engine.describe()}")
        result, metadata = SparkDataFrameTypeHandler().handle_output(
            client,
            obj,
            path,
            spec,
            replace_where=output.replace_where,
            commit_metadata=output.commit_metadata,
            transaction=output.transaction if spec.mode == "append" else None,
            empty_commit=output.empty_commit,
            column_descriptions=output.descriptions,
            earlier=latest_materialization_metadata(context.step_context.instance, key),
        )
        if result.by_deltalake:
            context.log.info(
                f"{key.to_user_string()}: committed by deltalake, without Spark's jobs (writes of at most "
                f"arrow_write_max_rows={self.arrow_write_max_rows} rows)"
            )
        if result.skipped_reason:
            metadata["delta/skipped"] = result.skipped_reason
        self._register(client, key, path)
        context.add_output_metadata({**metadata, **output.step_metadata})

    def _output_write(self, context: OutputContext, spec: WriteSpec) -> _OutputWrite:
        """What a write of this output records and replaces, whoever writes it."""
        key = context.asset_key
        reads = step_reads(context.step_context.instance, context.run_id, context.step_context.step.key)
        replace_where = None
        fingerprint: dict[str, Any] = {"inputs": dict(sorted(reads.inputs.items()))}
        source = (context.output_metadata or {}).get(SOURCE)
        if source is not None:
            fingerprint["source"] = str(getattr(source, "value", source))
        if context.has_asset_partitions:
            if not spec.partition_expr:
                raise ValueError(f"{key.to_user_string()} is partitioned but declares no partition_expr")
            window = context.asset_partitions_time_window
            replace_where = _time_window_predicate(spec.partition_expr, window)
            fingerprint["partition"] = [window.start.isoformat(), window.end.isoformat()]
        fingerprint_json = json.dumps(fingerprint, sort_keys=True)

        step_metadata: dict[str, Any] = {_CONSUMED_PREFIX + k: version_metadata(v) for k, v in reads.consumed.items()}
        read = reads.described()
        if read:
            step_metadata[_INPUTS] = MetadataValue.json(read)
        catalog = self.spark.catalog
        step_metadata["dagster/table_name"] = (
            catalog.qualified_name(key.path) if catalog.enabled else ".".join(key.path)
        )
        path = self._path(key)
        if spec.delete_column:
            # The deleted keys live in a Delta table of their own next to this one (maintained with it).
            step_metadata["delta/tombstones"] = MetadataValue.path(DeltaTableClient.tombstone_path(path))
        # Spark lowercases writer option keys: snake_case keeps them readable in the commit.
        commit_metadata = {"dagster_run_id": context.run_id, "dagster_asset_key": _key_name(key)}
        commit_metadata.update({_CONSUMED_COMMIT_PREFIX + k: str(v) for k, v in reads.consumed.items()})
        if spec.mode == "overwrite":
            commit_metadata[_COMPUTED_FROM] = fingerprint_json

        # A step retried after its append committed (a retry policy, a lost executor)
        # must not append again: one Delta transaction per run, output and partition.
        window_start = fingerprint.get("partition")
        run_output = f"dagster:{_key_name(key)}:{context.run_id}" + (f":{window_start[0]}" if window_start else "")
        # A write that took in new upstream commits records them even without rows (an
        # empty commit), so the next run starts after them. Its own transaction, versioned
        # by the sum of the consumed versions (it grows with any of them): a retry that
        # read further commits records again, one that read the same does not.
        empty_commit = (run_output + ":consumed", sum(reads.consumed.values())) if reads.advanced else None
        return _OutputWrite(
            replace_where=replace_where,
            fingerprint=fingerprint_json if (reads.inputs or source is not None) else None,
            descriptions=column_descriptions(context.definition_metadata or {}),
            commit_metadata=commit_metadata,
            step_metadata=step_metadata,
            transaction=(run_output, 0),
            empty_commit=empty_commit,
            reads=reads,
        )

    def _unchanged(
        self,
        output: _OutputWrite,
        spec: WriteSpec,
        *,
        exists: Callable[[], bool],
        computed_from: Callable[[], str | None],
    ) -> bool:
        """Whether the overwrite would write what the table already holds: its inputs are those it was computed from."""
        return (
            self.skip_unchanged
            and spec.mode == "overwrite"
            and output.fingerprint is not None
            and exists()
            and computed_from() == output.fingerprint
        )

    def _register(self, client: DeltaTableClient, key: AssetKey, path: str) -> None:
        # After the commit: the entry follows the table (first write, new columns, a re-created table),
        # and a merge's tombstones table gets its name in the run that creates it.
        if not self.spark.catalog.enabled:
            return
        if client.exists(path):
            self.spark.catalog.register_written(client.spark, client.engine, key.path, path)
        tombstones = DeltaTableClient.tombstone_path(path)
        # Most tables have none: a local lake is asked without a Spark call.
        has_tombstones = (
            os.path.isdir(os.path.join(tombstones, "_delta_log"))
            if "://" not in tombstones
            else client.exists(tombstones)
        )
        if len(key.path) == 2 and has_tombstones:
            self.spark.catalog.register_written(
                client.spark, client.engine, [key.path[0], f"{key.path[1]}__tombstones"], tombstones
            )

    def _store_without_spark(
        self, context: OutputContext, data: Any, path: str, spec: WriteSpec, output: _OutputWrite
    ) -> None:
        """Store a pandas, polars or Arrow output with deltalake (no SparkSession)."""
        key = context.asset_key
        asset = key.to_user_string()
        client = ArrowDeltaClient()
        descriptions = output.descriptions
        if self._unchanged(
            output, spec, exists=lambda: client.exists(path), computed_from=lambda: client.computed_from(path)
        ):
            metadata = arrow_table_metadata(
                client,
                path,
                column_descriptions=descriptions,
                key_columns=spec.key_columns,
                newest_first=spec.newest_first,
            )
            metadata["delta/skipped"] = "inputs unchanged since the last materialization"
            context.add_output_metadata({**metadata, **output.step_metadata})
            return
        if descriptions:
            columns = list(data.column_names)
            if set(descriptions) - set(columns) and client.exists(path):
                columns += [name for name in client.dataset(path).schema.names if name not in columns]
            check_column_descriptions(descriptions, columns, table=f"asset {asset} (Delta table {path})")
        skipped = client.write(
            data,
            path,
            spec,
            asset=asset,
            replace_where=output.replace_where,
            commit_metadata=output.commit_metadata,
            transaction=output.transaction if spec.mode == "append" else None,
        )
        if skipped and not client.exists(path):
            context.add_output_metadata({"dagster/row_count": 0, "delta/skipped": skipped, **output.step_metadata})
            return
        metadata = arrow_table_metadata(
            client, path, column_descriptions=descriptions, key_columns=spec.key_columns, newest_first=spec.newest_first
        )
        if skipped:
            metadata["delta/skipped"] = skipped
        context.add_output_metadata({**metadata, **output.step_metadata})


def _with_spark_column_types(
    metadata: dict[str, Any], frame: DataFrame, descriptions: Mapping[str, str] | None
) -> dict[str, Any]:
    """delta-rs' description of a version Spark's rows were committed to, its columns named by Spark's types.

    So ``dagster/column_schema`` reads the same whichever writer committed the
    table's versions. The frame may have more columns than the table (a
    merge's delete flag); it is kept as delta-rs read it when the table has a
    column the frame lacks.
    """
    stored = [column.name for column in metadata["dagster/column_schema"].columns]
    if set(stored) <= set(frame.columns):
        metadata["dagster/column_schema"] = spark_table_schema(frame.select(*stored), descriptions)
    return metadata


def _check_descriptions_before_writing(
    client: DeltaTableClient, frame: DataFrame, path: str, descriptions: Mapping[str, str], *, asset: str
) -> None:
    """Fail before anything is written if a described column is neither the frame's nor the table's.

    The table's columns count too: a merge's rows may lack some of them. The
    metadata built after the write checks again, against the version written.
    """
    columns = list(frame.columns)
    if set(descriptions) - set(columns) and client.exists(path):
        columns += [name for name in client.read(path).columns if name not in columns]
    check_column_descriptions(descriptions, columns, table=f"asset {asset} (Delta table {path})")


def _upstream_partition_expr(context: InputContext) -> str | None:
    """The upstream's ``partition_expr`` column when this input reads one time-window partition of it."""
    if not context.has_asset_partitions or context.upstream_output is None:
        return None
    return (context.upstream_output.definition_metadata or {}).get(PARTITION_EXPR)


def _rows_not_held(
    client: DeltaTableClient, frame: DataFrame, path: str, keys: Sequence[str], reads: _StepReads
) -> DataFrame:
    """``frame`` without the rows the table holds already, equal on ``keys`` (null equal to null).

    Read only when the table took in more of an upstream than the step read
    its changes after: the step's read starts after the oldest version its
    tables took in, so a table written by a run whose other tables were not
    (a quarantine, when a failed ``fail`` expectation kept silver unwritten)
    holds the rows computed again from the part it took in. Otherwise
    ``frame`` as it is, and the table is not read.
    """
    if not client.exists(path):
        return frame
    for upstream, after in reads.consumed_before.items():
        taken_in = client.engine.newest_commit_value(client.spark, path, _CONSUMED_COMMIT_PREFIX + upstream)
        if taken_in is not None and int(taken_in) > after:
            held = client.read(path).select(*keys)
            return frame.join(held, [frame[key].eqNullSafe(held[key]) for key in keys], "left_anti")
    return frame


def _computed_from(client: DeltaTableClient, path: str) -> str | None:
    """What the table's newest commit was computed from (its inputs' versions, partition, source).

    Read from the table's own log, like the consumed versions: a wiped Dagster
    instance still knows an unchanged input. Only the newest commit counts, so
    any later write (another writer, OPTIMIZE) makes the next run write again.
    A partition's fingerprint includes its window, so only the same partition matches.
    """
    return client.engine.latest_commit(client.spark, path).custom.get(_COMPUTED_FROM)


def _time_window_predicate(column: str, window: Any) -> str:
    """``start <= column < end`` with typed literals, for Spark and for replaceWhere.

    Windows on day boundaries (daily, weekly, monthly partitions) use ``DATE``
    literals, which compare right with both date and timestamp columns in
    Spark SQL and in DataFusion (the delta-rs engine's replaceWhere). Other
    windows use ``TIMESTAMP`` literals.
    """

    def literal(moment: Any) -> str:
        if (moment.hour, moment.minute, moment.second, moment.microsecond) == (0, 0, 0, 0):
            return f"DATE '{moment.strftime('%Y-%m-%d')}'"
        return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S')}'"

    return f"`{column}` >= {literal(window.start)} AND `{column}` < {literal(window.end)}"
