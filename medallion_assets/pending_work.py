"""Whether a run has anything to do, read without Spark.

A run of the ingest or of the whole graph mostly finds nothing new. What it
would do is known before any JVM starts: the landed files a stream's
checkpoint has not taken (the file listing and the checkpoint), and, for
each table downstream, whether it took in its inputs' newest versions (the
``consumed.<input>`` and ``computed_from`` marks the IO manager writes in
every commit, read from the Delta logs with deltalake).

The answer is for a whole run, never for one step: Dagster skips a step
whose upstream output was not produced, so a step may stand down only when
nothing in the run has work (a gold table joining two feeds must run when
either feed had news). Where a source cannot be read cheaply (a snapshot feed
applying changes, a broker that does not answer), it counts as work: the
answer errs towards running. A Kafka feed's topic is read for its
partitions' end offsets (the Python client, no JVM), compared with the
offsets the stream's checkpoint committed. A lake on an object store is read
the same way, through the lake's filesystem and deltalake's storage options.

Nothing here starts Spark or writes anything.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass

from dagster import AssetKey
from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from pyarrow import fs

from medallion_assets.checkpoints import read_checkpoint
from medallion_assets.feeds import Feed, KafkaTopic, LandingSnapshots
from medallion_assets.kafka import KafkaResource
from medallion_assets.resources import LakeResource
from medallion_assets.storage.engines import user_metadata
from medallion_assets.stream_monitoring import kafka_lag, unseen_landed_files
from medallion_assets.transforms.bronze import latest_snapshot

#: Commit metadata the IO manager writes (``medallion_assets.io_manager.manager``): the newest input
#: version a step's table took in, and the inputs an overwrite was computed from.
CONSUMED_PREFIX = "consumed."
COMPUTED_FROM = "computed_from"
#: How many of a table's newest commits are searched for its consumed marks.
_RECENT_COMMITS = 20


@dataclass(frozen=True)
class RunWork:
    """What a run would do: one line per reason (none: nothing new anywhere in the run)."""

    reasons: tuple[str, ...]

    @property
    def nothing_new(self) -> bool:
        return not self.reasons

    def describe(self, limit: int = 5) -> str:
        if self.nothing_new:
            return "nothing new: no landed file its stream has not taken, and every table took in its inputs"
        more = f" (and {len(self.reasons) - limit} more)" if len(self.reasons) > limit else ""
        return "; ".join(self.reasons[:limit]) + more


def _open(lake: LakeResource, path: str) -> DeltaTable | None:
    try:
        return DeltaTable(path, storage_options=lake.delta_storage_options())
    except (TableNotFoundError, DeltaError, OSError, ValueError):
        return None


def _key_name(key: AssetKey) -> str:
    return "/".join(key.path)


def kafka_work(lake: LakeResource, feed: Feed, kafka: KafkaResource | None) -> str | None:
    """Why the Kafka feed's bronze step has work, or ``None`` when the topic holds nothing past its checkpoint.

    ``kafka``: the run's resource; unconfigured (or ``None``), the step has work only where its stream
    has a checkpoint (as before the broker was asked). Configured, the step has work when its stream
    has not run yet, when a batch was planned and not committed, when a partition's end offset is past
    the checkpoint's next offset (a partition the checkpoint has not read starts at the oldest offset
    the broker keeps, as Spark's source does), and when the broker does not answer (the run then
    fails as it would have, saying so, instead of standing down on a guess).
    """
    name = feed.bronze_key.to_user_string()
    checkpoint_dir = lake.checkpoint_dir(feed.name)
    if kafka is None or not kafka.configured:
        return f"{name}: its stream has a checkpoint" if _is_folder(lake, checkpoint_dir) else None
    checkpoint = read_checkpoint(checkpoint_dir, lake.filesystem)
    if checkpoint.query_id is None:
        return f"{name}: its stream has not run yet"
    if pending := checkpoint.pending():
        return f"{name}: batch {pending[0]} was planned and not committed"
    lag = kafka_lag(lake, kafka, feed, checkpoint=checkpoint)
    if not lag.latest:
        return f"{name}: the broker's end offsets could not be read ({'; '.join(lag.problems) or 'no partition'})"
    behind = sum(lag.lag.values())
    return f"{name}: {behind} message(s) past its checkpoint on {kafka.for_feed(feed).topic!r}" if behind else None


def feed_work(lake: LakeResource, feed: Feed, *, kafka: KafkaResource | None) -> str | None:
    """Why the feed's bronze step has work, or ``None`` when it has none.

    Nothing landed is nothing to do, whether or not its table exists yet. A
    Kafka feed is answered by :func:`kafka_work`; a snapshot feed whose
    changes are applied (``ApplyChanges``) has work whenever it has a landed snapshot.
    """
    name = feed.bronze_key.to_user_string()
    newest = None
    if isinstance(feed.source, LandingSnapshots):
        newest = latest_snapshot(lake.files(lake.landing_folder(feed), feed.source.file_suffix))
        if newest is None:  # nothing landed: the step writes nothing
            return None
    if isinstance(feed.source, KafkaTopic):
        return kafka_work(lake, feed, kafka)
    table = _open(lake, lake.table_path(feed.bronze_key.path))
    if newest is not None:
        if table is None:
            return f"{name}: snapshot {newest.rsplit('/', 1)[-1]} not loaded yet"
        if feed.applies_snapshots:
            return f"{name}: applies landed snapshots"
        loaded = json.loads(_newest_custom(table).get(COMPUTED_FROM) or "{}").get("source")
        return None if loaded == newest else f"{name}: snapshot {newest.rsplit('/', 1)[-1]} not loaded yet"
    unseen = unseen_landed_files(lake, feed)
    return f"{name}: {len(unseen)} landed file(s) not taken yet" if unseen else None


def _is_folder(lake: LakeResource, location: str) -> bool:
    """``location`` holds something (a folder on a file system; on an object store, a prefix with objects)."""
    filesystem, path = lake.filesystem(location)
    return filesystem.get_file_info(path).type == fs.FileType.Directory


def _custom(info: dict) -> dict[str, str]:
    """A commit's custom metadata as delta-rs's ``history()`` gives it: keys of its own, then ``userMetadata``."""
    return {**{str(k): str(v) for k, v in info.items()}, **user_metadata(info.get("userMetadata"))}


def _newest_custom(table: DeltaTable) -> dict[str, str]:
    history = table.history(1)
    return _custom(history[0]) if history else {}


def _recorded_version(table: DeltaTable, upstream: AssetKey) -> int | None:
    """The version of ``upstream`` the table's commits say it took in (``None``: no mark)."""
    key = CONSUMED_PREFIX + _key_name(upstream)
    history = table.history(_RECENT_COMMITS)
    for info in history:
        custom = _custom(info)
        if key in custom:
            return int(custom[key])
        computed = custom.get(COMPUTED_FROM)
        if computed is not None:
            version = json.loads(computed).get("inputs", {}).get(_key_name(upstream))
            return None if version is None else int(version)
    return None


def table_work(lake: LakeResource, key: AssetKey, parents: Iterable[AssetKey]) -> str | None:
    """Why the table of ``key`` has work, or ``None`` when it took in each parent table's newest version.

    A parent that is no table of the lake (a landing simulator, or none written yet) is not compared, and a
    table none of whose inputs has a table yet has nothing to be computed from. A parent the table's commits
    do not name is not compared either when they name another one: the step reads it whole beside the
    changes it takes in (silver's history reads silver beside bronze's changes), so it changes only with them.
    A table whose commits name none of its parents (written by other code) always has work.
    """
    name = key.to_user_string()
    if len(key.path) != 2:
        return f"{name}: not a table of the lake"
    table = _open(lake, lake.table_path(key.path))
    upstreams = {p: t for p in parents if len(p.path) == 2 and (t := _open(lake, lake.table_path(p.path))) is not None}
    if table is None:
        return f"{name}: no table yet, {len(upstreams)} of its inputs have one" if upstreams else None
    taken = {parent: _recorded_version(table, parent) for parent in upstreams}
    if upstreams and all(version is None for version in taken.values()):
        return f"{name}: its commits name none of its inputs' versions"
    for parent, upstream in upstreams.items():
        newest, version = upstream.version(), taken[parent]
        if version is not None and version < newest:
            return f"{name}: {parent.to_user_string()} has version {newest}, taken in: {version}"
    return None


def run_work(
    lake: LakeResource,
    feeds: Iterable[Feed],
    tables: Iterable[tuple[AssetKey, Iterable[AssetKey]]],
    *,
    kafka: KafkaResource | None,
) -> RunWork:
    """What a run of the bronze steps of ``feeds`` and of ``tables`` (each with its parents) would do.

    ``kafka``: the run's Kafka resource (``None``: the run has none, as where no feed reads Kafka).
    """
    reasons = [r for feed in feeds if (r := feed_work(lake, feed, kafka=kafka))]
    reasons += [r for key, parents in tables if (r := table_work(lake, key, parents))]
    return RunWork(tuple(reasons))


def work_of_selection(
    lake: LakeResource,
    feeds: Iterable[Feed],
    graph: BaseAssetGraph,
    keys: Iterable[AssetKey],
    *,
    kafka: KafkaResource | None,
) -> RunWork:
    """What a run of the assets ``keys`` of ``graph`` would do: a feed's bronze step by its feed, any other
    asset by its table's marks against its parents' tables."""
    by_bronze = {feed.bronze_key: feed for feed in feeds}
    selected = sorted(set(keys), key=lambda k: k.to_user_string())
    return run_work(
        lake,
        [by_bronze[k] for k in selected if k in by_bronze],
        [(k, graph.get(k).parent_keys) for k in selected if k not in by_bronze],
        kafka=kafka,
    )
