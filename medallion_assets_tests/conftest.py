"""Shared fixtures: one real SparkSession for the whole test session, on one Delta engine.

The engine of a test session is ``MEDALLION_TEST_ENGINE``: ``delta-rs`` (the
default, which every clone can run) or ``delta-spark`` (needs the jars named by
``DELTA_SPARK_JARS``). ``test_engines.py`` runs the tests marked
``both_engines`` once more in a test session of the other engine, since one
Python process holds one SparkContext. Processes the tests start (Dagster
subprocesses, stream runners, ``dagster dev``) inherit ``MEDALLION_DELTA_ENGINE``
set to the same engine.

Every JVM the tests start reads Spark's defaults from ``spark_conf/`` (settings
for tiny tables, quiet logs), and gets a 2g driver heap unless a test says
otherwise: two test workers, the other engine's session and the Dagster runs
they start share 24 GB (``SPARK_DRIVER_MEMORY``, which the project's resource
honours; an embedded session's own default is a quarter of the machine).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

pytest_plugins = ["medallion_assets_tests.timing"]

ENGINES = ("delta-rs", "delta-spark")
SPARK_CONF_DIR = Path(__file__).parent / "spark_conf"
#: The driver heap of every JVM the tests start, theirs and their subprocesses'.
TEST_DRIVER_MEMORY = "2g"

def session_engine() -> str:
    """The Delta engine this test session runs."""
    engine = os.environ.get("MEDALLION_TEST_ENGINE", "delta-rs")
    if engine not in ENGINES:
        raise pytest.UsageError(f"MEDALLION_TEST_ENGINE must be one of {ENGINES}, got {engine!r}")
    return engine


def pytest_configure(config):
    # Subprocesses of the tests build their sessions through the project's resource.
    os.environ["MEDALLION_DELTA_ENGINE"] = session_engine()
    os.environ["SPARK_CONF_DIR"] = str(SPARK_CONF_DIR)
    os.environ.setdefault("SPARK_DRIVER_MEMORY", TEST_DRIVER_MEMORY)
    # No Maven probe (seconds on an offline machine) in the sessions tests and their processes build:
    # their engine comes from MEDALLION_DELTA_ENGINE and DELTA_SPARK_JARS. test_settings.py probes.
    os.environ.setdefault("MEDALLION_DELTA_SPARK_MAVEN", "false")


def pytest_collection_modifyitems(config, items):
    if session_engine() == "delta-rs":
        return
    package_tests = Path(__file__).parent / "delta"
    skip = pytest.mark.skip(reason="tests of medallion_assets.delta (the delta-rs engine) run in a delta-rs session")
    for item in items:
        if package_tests in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def delta_engine() -> str:
    """The name of the Delta engine of this test session."""
    return session_engine()


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A local SparkSession on the session's Delta engine, shared by every test.

    Starting a JVM costs seconds, so the whole suite shares one; Dagster runs
    made in-process pick it up through ``getOrCreate``. The UI and Delta's snapshot
    tasks are set in ``spark_conf/spark-defaults.conf``, as for every test JVM.
    The tests' databases get their folders in a temporary warehouse, not in the
    checkout's ``spark-warehouse``.
    """
    from pyspark.sql import SparkSession

    from medallion_assets.engine import merged_session_config, plan_engine, start_engine
    from medallion_assets.kafka import kafka_connector_config

    engine = session_engine()
    plan = plan_engine(engine, jars=os.environ.get("DELTA_SPARK_JARS") if engine == "delta-spark" else None)  # type: ignore[arg-type]
    # Spark's Kafka connector, when KAFKA_SPARK_JARS names it (the Kafka tests skip without it).
    session_config = merged_session_config(plan.spark_config, kafka_connector_config(jars=os.environ.get("KAFKA_SPARK_JARS")))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"medallion-assets-tests-{engine}")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", TEST_DRIVER_MEMORY)
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
    )
    for key, value in session_config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    assert start_engine(session, plan).name == engine
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _release_cached_frames(request):
    """Unpersist what a test cached, so the shared session's memory does not fill over the suite.

    Assets cache intermediate frames (silver's changes) for the length of a step;
    in one long test session those blocks would otherwise pile up across tests.
    """
    yield
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        status = _jvm_exit_status(session)
        if status is not None:
            # Every later test would only say "Connection refused": name where it happened.
            pid = session.sparkContext._gateway.proc.pid
            crash_log = Path(f"hs_err_pid{pid}.log")  # where HotSpot writes a crash report: the working directory
            pytest.fail(
                f"the test session's Spark JVM (pid {pid}) ended during {request.node.nodeid} with exit status "
                f"{status}: a negative status is the signal that ended it (-9 also the kernel's OOM killer: "
                "see .ci/run's last lines), 52 Spark's exit on an OutOfMemoryError, 50 an uncaught exception, "
                "0 an exit after its Python side closed stdin"
                + (f"; HotSpot's crash report: {crash_log.resolve()}" if crash_log.exists() else ""),
                pytrace=False,
            )
        session.catalog.clearCache()


def _jvm_exit_status(session) -> int | None:
    """The exit status of the JVM behind ``session`` once it has ended, else ``None``."""
    process = getattr(session.sparkContext._gateway, "proc", None)
    return None if process is None else process.poll()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """Apache Kafka on 127.0.0.1 (one KRaft node), for tests whose session has Spark's Kafka connector.

    Skips, saying why, without the connector jars (``KAFKA_SPARK_JARS``), without Java, or where
    Maven cannot resolve the broker's jars (see ``kafka_broker.broker_jars``).
    """
    from medallion_assets_tests.kafka_broker import Broker, broker_jars

    if not os.environ.get("KAFKA_SPARK_JARS"):
        pytest.skip("Spark's Kafka connector is not on the session: set KAFKA_SPARK_JARS to its jars' folder")
    if shutil.which("java") is None:
        pytest.skip("no Kafka broker for tests: java is not on PATH")
    jars, why_not = broker_jars()
    if jars is None:
        pytest.skip(f"no Kafka broker for tests: {why_not}")
    broker = Broker(jars, tmp_path_factory.mktemp("kafka"))
    yield broker
    broker.stop()
