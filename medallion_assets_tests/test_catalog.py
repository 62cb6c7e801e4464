"""Tables by name in the session's catalog, on the session's engine (and, marked both_engines, on the other).

The IO manager keeps each table's entry true through what it does to the table;
a session registers a lake written by another writer (delta-rs) when it attaches.
Every read by name is compared with delta-rs's read of the table's path.
"""

from __future__ import annotations

import shutil
import time
import uuid

import pytest
from dagster import asset, materialize
from pyspark.testing import assertDataFrameEqual

from medallion_assets.catalog import LakeCatalog
from medallion_assets.io_manager import DeltaIOManager, delta_table
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets_tests.support.readers import read_with_deltalake

pytestmark = pytest.mark.both_engines


def _prefix() -> str:
    # The session's catalog lives as long as the JVM: each test names its own databases.
    return f"t{uuid.uuid4().hex[:8]}_"


def _by_name(spark, name: str):
    return spark.sql(f"SELECT * FROM {name}")


def _same_as_path(spark, name: str, path) -> None:
    expected = spark.createDataFrame(read_with_deltalake(path).to_pandas())
    actual = _by_name(spark, name)
    assert sorted(actual.columns) == sorted(expected.columns), (actual.columns, expected.columns)
    assertDataFrameEqual(actual.select(*sorted(actual.columns)), expected.select(*sorted(expected.columns)))


def test_the_io_manager_keeps_each_entry_true_to_its_table(spark, delta_engine, tmp_path):
    prefix = _prefix()
    lake = LakeResource(root=str(tmp_path / "lake"))
    resource = SparkResource(master="local[2]", delta_spark_maven=False, catalog=LakeCatalog(database_prefix=prefix))
    resources = {"spark": resource, "lake": lake, "io_manager": DeltaIOManager(spark=resource, lake=lake)}
    state = {"frame": "id, id * 2 AS twice"}

    @asset(key=["gold", "things"], metadata=delta_table(write_mode="append", schema_mode="merge"))
    def things():
        return spark.range(3).selectExpr(*state["frame"].split(", "))

    @asset(
        key=["gold", "from_sql"], deps=[things], metadata=delta_table(write_mode="overwrite", schema_mode="overwrite")
    )
    def from_sql(spark: SparkResource):
        # Asset code that wants SQL names the upstream table.
        return spark.spark_session.sql(f"SELECT id, twice + 1 AS later FROM {prefix}gold.things WHERE id > 0")

    name, path = f"{prefix}gold.things", lake.table_path(["gold", "things"])
    # First write, and SQL by name downstream in the same run.
    result = materialize([things, from_sql], resources=resources)
    metadata = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert metadata["things"]["dagster/table_name"].value == f"spark_catalog.{name}"
    _same_as_path(spark, name, path)
    _same_as_path(spark, f"{prefix}gold.from_sql", lake.table_path(["gold", "from_sql"]))
    assert sorted(r.later for r in _by_name(spark, f"{prefix}gold.from_sql").collect()) == [3, 5]

    # Schema evolution: a new column is seen by name.
    state["frame"] = "id, id * 2 AS twice, 'new' AS label"
    assert materialize([things], resources=resources).success
    assert "label" in _by_name(spark, name).columns
    _same_as_path(spark, name, path)

    # The table deleted and written again with another schema (a full refresh).
    shutil.rmtree(path)
    state["frame"] = "id + 100 AS key, 'again' AS label"
    assert materialize([things], resources=resources).success
    assert sorted(_by_name(spark, name).columns) == ["key", "label"]
    _same_as_path(spark, name, path)

    # Another lake's table of the same name: the entry follows the table the IO manager wrote. On
    # delta-spark it is the same entry, re-pointed: its creation stays. (Its TBLPROPERTIES are the
    # Delta log's, so they follow the table; test_engine_switch.py checks a metastore's own.)
    created = _created(spark, name)
    time.sleep(1)  # Created Time counts seconds: an entry made again would differ
    other = LakeResource(root=str(tmp_path / "other"))
    state["frame"] = "id AS only"
    assert materialize(
        [things], resources={**resources, "lake": other, "io_manager": DeltaIOManager(spark=resource, lake=other)}
    ).success
    _same_as_path(spark, name, other.table_path(["gold", "things"]))
    if delta_engine == "delta-spark":
        assert _created(spark, name) == created

    # A merge with deletes: its tombstones table is named in the run that creates it.
    @asset(key=["gold", "keyed"], metadata=delta_table(write_mode="merge", merge_keys=["id"], delete_column="gone"))
    def keyed():
        return spark.range(4).selectExpr("id", "id = 3 AS gone")

    assert materialize([keyed], resources=resources).success
    _same_as_path(spark, f"{prefix}gold.keyed__tombstones", lake.table_path(["gold", "keyed__tombstones"]))
    assert [r.id for r in _by_name(spark, f"{prefix}gold.keyed__tombstones").collect()] == [3]


def _created(spark, name: str) -> str:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    return {row.col_name: row.data_type for row in rows}.get("Created Time", "")


def test_a_session_attaching_a_lake_names_every_table_and_for_name_opens_it(spark, delta_engine, tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    from medallion_assets.storage.engines import engine_for

    root = tmp_path / "lake"
    # Written by delta-rs, not by the engine under test; a folder without a Delta log is not a table.
    write_deltalake(str(root / "silver" / "orders"), pa.table({"o_orderkey": [1, 2, 3], "o_status": ["F", "O", "F"]}))
    write_deltalake(str(root / "gold" / "summary"), pa.table({"status": ["F", "O"], "orders": [2, 1]}))
    (root / "gold" / "not_a_table").mkdir()
    (root / "landing" / "orders").mkdir(parents=True)
    catalog = LakeCatalog(database_prefix=_prefix())
    tables = LakeResource(root=str(root)).delta_tables()

    registered = catalog.attach(spark, engine_for(spark), tables)
    assert sorted(registered) == [catalog.table_name(["gold", "summary"]), catalog.table_name(["silver", "orders"])]
    for key in (["silver", "orders"], ["gold", "summary"]):
        _same_as_path(spark, catalog.table_name(key), root / key[0] / key[1])
    assert catalog.attach(spark, engine_for(spark), tables) == []  # nothing new to register

    if delta_engine == "delta-spark":
        from delta.tables import DeltaTable
    else:
        from medallion_assets.delta import DeltaTable
    by_name = DeltaTable.forName(spark, catalog.table_name(["gold", "summary"])).toDF()
    assertDataFrameEqual(by_name, _by_name(spark, catalog.table_name(["gold", "summary"])))
    with pytest.raises(Exception, match="no_such_table|not found|cannot be found|NOT_FOUND|no table"):
        DeltaTable.forName(spark, f"{catalog.database('gold')}.no_such_table")


def test_a_run_working_by_path_names_nothing_and_asking_for_names_names_the_lake(spark, tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    root = tmp_path / "lake"
    # A lake written by delta-rs before this process's session looked at it.
    write_deltalake(str(root / "gold" / "summary"), pa.table({"status": ["F", "O"], "orders": [2, 1]}))
    write_deltalake(str(root / "silver" / "orders"), pa.table({"o_orderkey": [1, 2, 3], "o_status": ["F", "O", "F"]}))
    catalog = LakeCatalog(database_prefix=_prefix(), lake_root=str(root))
    resource = SparkResource(master="local[2]", delta_spark_maven=False, catalog=catalog)
    lake = LakeResource(root=str(root))
    resources = {"spark": resource, "lake": lake, "io_manager": DeltaIOManager(spark=resource, lake=lake)}

    @asset(key=["gold", "things"], metadata=delta_table())
    def things():
        return spark.range(3)

    # Written through the IO manager, by path: the run names nothing (a name nobody asks for costs a catalog
    # round trip per table), though its metadata says the name the table has once names are asked for.
    run = materialize([things], resources=resources)
    assert run.success
    [written] = run.get_asset_materialization_events()
    assert written.materialization.metadata["dagster/table_name"].value == catalog.qualified_name(["gold", "things"])
    assert not spark.catalog.tableExists(catalog.table_name(["gold", "things"]))
    assert not spark.catalog.tableExists(catalog.table_name(["gold", "summary"]))
    assert not spark.catalog.tableExists(catalog.table_name(["silver", "orders"]))

    summary = catalog.table_name(["gold", "summary"])

    @asset(key=["gold", "open_orders"], metadata=delta_table())
    def open_orders(spark: SparkResource):
        # Asset code asking for the session by name: the lake's tables are named by then.
        return spark.spark_session.sql(f"SELECT orders FROM {summary} WHERE status = 'O'")

    assert materialize([open_orders], resources=resources).success
    # The lake attached, the name of what is written next follows as it is written.
    for key in (["silver", "orders"], ["gold", "summary"], ["gold", "things"], ["gold", "open_orders"]):
        _same_as_path(spark, catalog.table_name(key), root / key[0] / key[1])
    assert read_with_deltalake(root / "gold" / "open_orders").to_pylist() == [{"orders": 1}]


def test_the_metastore_password_is_no_spark_setting_and_locations_compare_as_folders(tmp_path):
    from medallion_assets.catalog import same_location

    catalog = LakeCatalog(
        kind="hive",
        metastore_url="jdbc:postgresql://db:5432/metastore",
        metastore_user="hive",
        metastore_password="s3cret-value",
    )
    # Spark settings reach the driver's command line: the password goes to the JVM's Hadoop configuration.
    assert not [key for key, value in catalog.spark_config().items() if "s3cret-value" in value or "Password" in key]
    assert catalog.hadoop_secrets() == {"javax.jdo.option.ConnectionPassword": "s3cret-value"}
    assert LakeCatalog(kind="hive", metastore_uris="thrift://h:9083", metastore_password="x").hadoop_secrets() == {}

    folder = tmp_path / "gold" / "a b"
    for stored in (f"file:{folder}", f"file://{folder}/", f"file:{str(folder).replace(' ', '%20')}"):
        assert same_location(stored, str(folder)), stored
    assert not same_location(f"file:{folder}", str(tmp_path / "other" / "a b"))
    assert same_location("s3://bucket/lake/gold/x/", "s3://bucket/lake/gold/x")
