"""Shared fixtures: one real SparkSession for the whole test session, on one Delta engine.

The engine of a test session is ``MEDALLION_TEST_ENGINE``: ``delta-rs`` (the
default, which every clone can run) or ``delta-spark``. delta-spark and Spark's
Kafka connector come from Maven the way users get them (``spark.jars.packages``),
decided once per test session and warmed into Ivy's cache before any test JVM
starts (:func:`use_maven_where_reachable`); ``DELTA_SPARK_JARS`` and
``KAFKA_SPARK_JARS``, where set, name local jars instead (air-gapped machines).
``test_engines.py`` runs the tests marked
``both_engines`` once more in a test session of the other engine, since one
Python process holds one SparkContext. Processes the tests start (Dagster
subprocesses, stream runners, ``dagster dev``) inherit ``MEDALLION_DELTA_ENGINE``
set to the same engine.

Every JVM the tests start reads Spark's defaults from ``support/spark_conf/`` (settings
for tiny tables, quiet logs), and gets a 2g driver heap unless a test says
otherwise: two test workers, the other engine's session and the Dagster runs
they start share 24 GB (``SPARK_DRIVER_MEMORY``, which the project's resource
honours; an embedded session's own default is a quarter of the machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["medallion_assets_tests.support.timing"]

ENGINES = ("delta-rs", "delta-spark")
SPARK_CONF_DIR = Path(__file__).parent / "support" / "spark_conf"
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
    # Spark binds to a non-loopback interface's address when the host name resolves to loopback, and
    # the multi-host test adds (then removes) a bridge that can be that interface: every session and
    # service the tests start stays on 127.0.0.1 (the test hosts set their own address).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if not hasattr(config, "workerinput"):  # the controlling process: its workers and subprocesses inherit
        use_maven_where_reachable()
    # No Maven probe (seconds on an offline machine) in the sessions tests and their processes build:
    # their engine comes from MEDALLION_DELTA_ENGINE, MEDALLION_DELTA_SPARK_MAVEN and DELTA_SPARK_JARS.
    # test_settings.py probes.
    os.environ.setdefault("MEDALLION_DELTA_SPARK_MAVEN", "false")


#: Set to ``false``: the tests take delta-spark and the Kafka connector from local jars only.
TEST_MAVEN_VARIABLE = "MEDALLION_TEST_MAVEN"
#: The jars Spark's Ivy delivered for the packages (its ``spark.jars``), once resolved: the one test of
#: ``DELTA_SPARK_JARS`` uses delta-spark's among them where no other jars are named.
MAVEN_JARS_VARIABLE = "MEDALLION_TEST_MAVEN_JARS"


def use_maven_where_reachable() -> None:
    """Route every test JVM to Maven for delta-spark and Kafka's connector, once the Ivy cache holds them.

    Where ``DELTA_SPARK_JARS`` (or ``KAFKA_SPARK_JARS``) names jars, those stay. For the rest, when
    the Maven probe finds the jar the installed delta-spark package asks for, this sets
    ``MEDALLION_DELTA_SPARK_MAVEN`` (and ``MEDALLION_KAFKA_MAVEN``) to ``true`` for the test
    session's workers and the processes they start, after one JVM has resolved both packages:
    a fresh machine downloads them once, before two workers would start JVMs that resolve them
    side by side into one Ivy cache. An explicit setting of either variable is kept.
    """
    from medallion_assets.kafka import kafka_connector_config
    from medallion_assets.storage.session import (
        DELTA_SPARK_MAVEN_PACKAGE,
        maven_reachable,
        maven_repositories,
        merged_session_config,
        plan_engine,
    )

    if os.environ.get(TEST_MAVEN_VARIABLE, "").lower() == "false":
        return
    if "MEDALLION_DELTA_SPARK_MAVEN" in os.environ or "MEDALLION_KAFKA_MAVEN" in os.environ:
        return  # chosen already: by the user, or by the test session that started this one
    delta, kafka = not os.environ.get("DELTA_SPARK_JARS"), not os.environ.get("KAFKA_SPARK_JARS")
    if not (delta or kafka):
        return
    from importlib.metadata import version

    artifact = DELTA_SPARK_MAVEN_PACKAGE.format(version=version("delta-spark"))
    probe = maven_reachable(maven_repositories({}), artifact=artifact)
    if not probe.reachable:
        print(f"\ndelta-spark and Kafka's connector not from Maven in these tests: {probe.detail}", file=sys.stderr)
        return
    config = merged_session_config(
        plan_engine("delta-spark", maven=True).spark_config if delta else {},
        kafka_connector_config(maven=True) if kafka else {},
    )
    done = subprocess.run(
        [sys.executable, "-c", _RESOLVE_PACKAGES, *[f"{k}={v}" for k, v in config.items()]],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, SPARK_CONF_DIR=str(SPARK_CONF_DIR)),
    )
    if done.returncode != 0:
        print(
            f"\nnot from Maven in these tests: resolving {config['spark.jars.packages']} failed:\n"
            f"{done.stderr[-3000:]}",
            file=sys.stderr,
        )
        return
    os.environ[MAVEN_JARS_VARIABLE] = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if delta:
        os.environ["MEDALLION_DELTA_SPARK_MAVEN"] = "true"
    if kafka:
        os.environ["MEDALLION_KAFKA_MAVEN"] = "true"


#: One JVM that resolves the packages into Ivy's cache (the session's settings as key=value arguments).
_RESOLVE_PACKAGES = """
import sys
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for pair in sys.argv[1:]:
    key, value = pair.split("=", 1)
    builder = builder.config(key, value)
session = builder.getOrCreate()
print(session.sparkContext.getConf().get("spark.jars", ""))
session.stop()
"""


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
    tasks are set in ``support/spark_conf/spark-defaults.conf``, as for every test JVM.
    The tests' databases get their folders in a temporary warehouse, not in the
    checkout's ``spark-warehouse``.
    """
    from pyspark.sql import SparkSession

    from medallion_assets.kafka import kafka_connector_config
    from medallion_assets.storage.session import merged_session_config, plan_engine, start_engine
    from medallion_assets_tests.support.delta_spark import delta_spark_plan

    engine = session_engine()
    plan = delta_spark_plan(engine) if engine == "delta-spark" else plan_engine(engine)  # type: ignore[arg-type]
    # Spark's Kafka connector, from KAFKA_SPARK_JARS or Maven (the Kafka tests skip without either).
    session_config = merged_session_config(
        plan.spark_config,
        kafka_connector_config(
            jars=os.environ.get("KAFKA_SPARK_JARS"), maven=os.environ.get("MEDALLION_KAFKA_MAVEN") == "true"
        ),
    )
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

    Skips, saying why, without the connector (from Maven, or ``KAFKA_SPARK_JARS``), without Java,
    or where Maven cannot resolve the broker's jars (see ``kafka_broker.broker_jars``).
    """
    from medallion_assets_tests.support.kafka_broker import Broker, broker_jars

    if not os.environ.get("KAFKA_SPARK_JARS") and os.environ.get("MEDALLION_KAFKA_MAVEN") != "true":
        pytest.skip(
            "Spark's Kafka connector is not on the session: Maven is unreachable and KAFKA_SPARK_JARS names no jars"
        )
    if shutil.which("java") is None:
        pytest.skip("no Kafka broker for tests: java is not on PATH")
    jars, why_not = broker_jars()
    if jars is None:
        pytest.skip(f"no Kafka broker for tests: {why_not}")
    broker = Broker(jars, tmp_path_factory.mktemp("kafka"))
    yield broker
    broker.stop()
