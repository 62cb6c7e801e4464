"""Settings checked when the definitions load, by name; the lake root before Spark; the Maven probe.

Cheap: no Spark. Each wrong setting stops ``defs()`` with a first line that
names the variable, the value and the fix, and no SparkContext starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, EnvVar, asset, materialize

from medallion_assets.catalog import LakeCatalog
from medallion_assets.definitions import defs, resources_for
from medallion_assets.io_manager import DeltaIOManager
from medallion_assets.kafka import KafkaResource
from medallion_assets.resources import LakeResource, SparkResource, engine_settings, lake_resource
from medallion_assets.settings import VARIABLES, Settings, SettingsError, read_settings
from medallion_assets.storage.session import MAVEN_CENTRAL, maven_reachable, plan_engine

REPO = Path(__file__).resolve().parent.parent
SETTING_NAMES = [v.name for v in VARIABLES]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """Only what a test sets: none of the runner's own settings (its jars, its engine)."""
    for name in SETTING_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _no_spark_started():
    """A settings error stops the load before any SparkContext exists."""
    from pyspark import SparkContext

    before = SparkContext._active_spark_context
    yield
    if before is None:
        assert SparkContext._active_spark_context is None, "a SparkContext started"


def _load_error(monkeypatch, **env: str) -> str:
    """The first line of the error ``defs()`` stops with, under ``env``."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        defs()
    return str(caught.value).splitlines()[0]


def test_an_unknown_engine_is_named_with_its_choices(monkeypatch):
    line = _load_error(monkeypatch, MEDALLION_DELTA_ENGINE="bogus")
    assert line == (
        "MEDALLION_DELTA_ENGINE='bogus' is not a Delta engine: use auto, delta-spark or delta-rs (or unset it for auto)"
    )


def test_a_misspelled_switch_is_refused_not_read_as_false(monkeypatch):
    line = _load_error(monkeypatch, MEDALLION_DELTA_SPARK_MAVEN="ture")
    assert line.startswith("MEDALLION_DELTA_SPARK_MAVEN='ture' is not a switch: use true")
    assert "or unset it to probe Maven under auto" in line
    # The resources' reader says the same (it used to read 'ture' as false).
    with pytest.raises(SettingsError, match="MEDALLION_DELTA_SPARK_MAVEN='ture'"):
        engine_settings()
    monkeypatch.setenv("MEDALLION_DELTA_SPARK_MAVEN", " Off ")
    assert engine_settings()["delta_spark_maven"] is False


def test_kafkas_connector_is_put_on_the_session_only_where_kafka_feeds_are(monkeypatch):
    from medallion_assets.definitions import resources_for

    monkeypatch.setenv("MEDALLION_KAFKA_MAVEN", "true")
    monkeypatch.delenv("MEDALLION_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    assert "kafka_connector_maven" not in engine_settings()
    assert resources_for("local")["spark"].kafka_connector_maven is False
    monkeypatch.setenv("MEDALLION_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    assert engine_settings()["kafka_connector_maven"] is True
    assert resources_for("local")["spark"].kafka_connector_maven is True


def test_a_jar_folder_without_jars_is_named(monkeypatch, tmp_path):
    line = _load_error(monkeypatch, DELTA_SPARK_JARS=str(tmp_path))
    assert line.startswith(f"DELTA_SPARK_JARS={str(tmp_path)!r} is a folder that holds no .jar file: put the jars")
    assert line.endswith("or unset DELTA_SPARK_JARS")
    monkeypatch.delenv("DELTA_SPARK_JARS")
    missing = str(tmp_path / "kafka-clients.jar")
    line = _load_error(monkeypatch, KAFKA_SPARK_JARS=missing)
    assert line.startswith(f"KAFKA_SPARK_JARS={missing!r} names what is neither a folder of jars nor a jar file")


def test_endpoints_are_checked_for_the_deployment_that_needs_them(monkeypatch):
    line = _load_error(monkeypatch, MEDALLION_DEPLOYMENT="connect", SPARK_REMOTE="http://spark:15002")
    assert line == "SPARK_REMOTE='http://spark:15002' is not a Spark Connect endpoint: use sc://host:15002"
    line = _load_error(monkeypatch, MEDALLION_DEPLOYMENT="cluster", SPARK_REMOTE="")
    assert line.startswith("SPARK_MASTER_URL is not set, and MEDALLION_DEPLOYMENT=cluster needs it: set it to")
    line = _load_error(monkeypatch, MEDALLION_DEPLOYMENT="local", MEDALLION_KAFKA_BOOTSTRAP_SERVERS="broker")
    assert line.startswith("MEDALLION_KAFKA_BOOTSTRAP_SERVERS='broker' is not a list of brokers: use host:port")


def test_a_kafka_ca_file_that_holds_no_certificate_is_named(tmp_path):
    key_only = tmp_path / "key.pem"
    key_only.write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    for value in (str(tmp_path / "missing.pem"), str(key_only)):
        with pytest.raises(SettingsError) as caught:
            read_settings({"MEDALLION_KAFKA_SSL_CA_LOCATION": value})
        assert str(caught.value) == (
            f"MEDALLION_KAFKA_SSL_CA_LOCATION={value!r} is not a readable PEM file of certificates: point it at the "
            "CA certificate(s) of the broker's TLS listener (-----BEGIN CERTIFICATE-----), or unset it for the "
            "default trust"
        )
    certificate = tmp_path / "ca.pem"
    certificate.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert read_settings({"MEDALLION_KAFKA_SSL_CA_LOCATION": str(certificate)}).kafka is False


def test_a_pipelines_package_that_cannot_be_imported_is_named(monkeypatch):
    value = "medallion_assets.pipelines,no_such_pipelines_here"
    line = _load_error(monkeypatch, MEDALLION_PIPELINES=value)
    assert line == (
        f"MEDALLION_PIPELINES={value!r} names 'no_such_pipelines_here', which cannot be imported: "
        "install it or put its folder on PYTHONPATH"
    )


def test_every_wrong_setting_is_reported_in_one_error():
    with pytest.raises(SettingsError) as caught:
        read_settings(
            {
                "MEDALLION_DEPLOYMENT": "mainframe",
                "MEDALLION_SIMULATOR": "maybe",
                "MEDALLION_KAFKA_SECURITY_PROTOCOL": "plaintext",
                "MEDALLION_KAFKA_STARTING_OFFSETS": "oldest",
            }
        )
    lines = str(caught.value).splitlines()
    assert [line.split("=")[0] for line in lines] == [
        "MEDALLION_DEPLOYMENT",
        "MEDALLION_SIMULATOR",
        "MEDALLION_KAFKA_SECURITY_PROTOCOL",
        "MEDALLION_KAFKA_STARTING_OFFSETS",
    ]
    assert (
        lines[1] == "MEDALLION_SIMULATOR='maybe' is not a switch: use on or off (also true/false, yes/no, 1/0), "
        "or unset it for on"
    )


def test_a_misspelt_setting_is_named_with_the_one_it_resembles():
    with pytest.raises(SettingsError) as caught:
        read_settings({"MEDALLION_DELTA_ENGIN": "delta-spark", "MEDALLION_TEST_ENGINE": "delta-rs"})
    assert str(caught.value) == (
        "MEDALLION_DELTA_ENGIN is not a setting of this project: did you mean MEDALLION_DELTA_ENGINE? "
        "rename or unset it (docs/settings.md lists the settings)"
    )


def test_correct_settings_read_back():
    settings = read_settings(
        {
            "MEDALLION_DEPLOYMENT": "cluster",
            "SPARK_MASTER_URL": "spark://a:7077,b:7077",
            "MEDALLION_SIMULATOR": "off",
            "MEDALLION_DELTA_SPARK_MAVEN": "0",
            "MEDALLION_KAFKA_BOOTSTRAP_SERVERS": "[::1]:9092,kafka:9093",
            "MEDALLION_KAFKA_STARTING_OFFSETS": '{"orders": {"0": 5}}',
        }
    )
    assert (settings.deployment, settings.simulator, settings.delta_spark_maven, settings.kafka) == (
        "cluster",
        False,
        False,
        True,
    )
    assert read_settings({}).delta_spark_maven is None


def test_a_size_limit_that_is_not_a_whole_number_is_named_with_its_unit_and_default(monkeypatch):
    line = _load_error(monkeypatch, MEDALLION_ARROW_MERGE_MAX_TABLE_MB="1GB")
    assert line == (
        "MEDALLION_ARROW_MERGE_MAX_TABLE_MB='1GB' is not a whole number of MiB: use 0 or more "
        "(0: always Spark), or unset it for 1024"
    )
    with pytest.raises(SettingsError) as caught:
        read_settings({"MEDALLION_ARROW_WRITE_MAX_ROWS": "-1", "MEDALLION_ARROW_READ_MAX_ROWS": " 5000 "})
    assert str(caught.value).startswith("MEDALLION_ARROW_WRITE_MAX_ROWS='-1' is not a whole number of rows")


def test_the_size_limits_reach_the_io_manager_with_the_defaults_the_page_states(monkeypatch):
    from medallion_assets.definitions import resources_for
    from medallion_assets.resources import IO_MANAGER_VARIABLES

    documented = {variable.name: variable.default for variable in VARIABLES}
    fields = DeltaIOManager.model_fields
    assert {name: str(fields[field].default) for name, field in IO_MANAGER_VARIABLES.items()} == {
        name: documented[name] for name in IO_MANAGER_VARIABLES
    }
    assert resources_for("local")["io_manager"].arrow_write_max_rows == fields["arrow_write_max_rows"].default
    monkeypatch.setenv("MEDALLION_ARROW_WRITE_MAX_ROWS", "0")
    assert resources_for("local")["io_manager"].arrow_write_max_rows == 0


def test_the_settings_page_lists_every_variable():
    page = (REPO / "docs" / "settings.md").read_text()
    assert [name for name in SETTING_NAMES if f"`{name}`" not in page] == []


def test_the_settings_page_shows_where_each_variable_goes():
    rows = [
        f"| `{v.name}` | {f'`{v.setting}`' if v.setting else '(credential: whether it is set)'} | "
        f"{f'`{v.feeds}`' if v.feeds else 'the definitions'} |"
        for v in VARIABLES
    ]
    page = (REPO / "docs" / "settings.md").read_text()
    assert "\n".join(["| Variable | `Settings` field | Configures |", "|---|---|---|", *rows]) in page


def test_every_variable_has_one_holder_and_feeds_a_real_field():
    from medallion_assets.io_manager import DeltaIOManager

    resources = {cls.__name__: cls for cls in (SparkResource, LakeResource, LakeCatalog, DeltaIOManager, KafkaResource)}
    held = [field.name for field in dataclasses.fields(Settings) if field.name != "credentials"]
    # Each value-holding field of Settings is one variable's, and a credential has none.
    assert sorted(v.setting for v in VARIABLES if v.setting) == sorted(held)
    assert [v.name for v in VARIABLES if v.credential and v.setting] == []
    for variable in VARIABLES:
        if variable.feeds:
            resource, field = variable.feeds.split(".")
            assert field in resources[resource].model_fields, variable


def test_credentials_reach_the_resources_by_name_only(monkeypatch):
    for name, value in {
        "MEDALLION_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "MEDALLION_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "MEDALLION_KAFKA_SASL_MECHANISM": "PLAIN",
        "MEDALLION_KAFKA_SASL_USERNAME": "reader",
        "MEDALLION_KAFKA_SASL_PASSWORD": "s3cret-kafka",
        "MEDALLION_CATALOG": "hive",
        "MEDALLION_METASTORE_URL": "jdbc:postgresql://db:5432/metastore",
        "MEDALLION_METASTORE_PASSWORD": "s3cret-db",
    }.items():
        monkeypatch.setenv(name, value)
    settings = read_settings()
    assert "s3cret" not in repr(settings)
    resources = resources_for(settings=settings)
    kafka, catalog = resources["kafka"], resources["spark"].catalog
    assert kafka.bootstrap_servers == "127.0.0.1:9092"
    assert kafka.sasl_password == EnvVar("MEDALLION_KAFKA_SASL_PASSWORD")
    assert kafka.sasl_username == EnvVar("MEDALLION_KAFKA_SASL_USERNAME")
    assert catalog.metastore_password == EnvVar("MEDALLION_METASTORE_PASSWORD")
    assert "s3cret" not in repr(kafka) + repr(catalog)


def test_no_module_but_settings_reads_a_projects_variable():
    names = "|".join(SETTING_NAMES)
    reads = re.compile(rf"(os\.environ|getenv)[^\n]*\b({names})\b")
    package = REPO / "medallion_assets"
    found = [
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for path in sorted(package.rglob("*.py"))
        if path != package / "settings.py"
        for match in reads.finditer(path.read_text())
    ]
    assert found == []


# ---------------------------------------------------------------- the lake root


def test_a_lake_root_under_a_file_is_refused_at_load_and_at_run_start(monkeypatch, tmp_path):
    # Works as root too: no permission lets a folder exist under a regular file.
    blocker = tmp_path / "lake.txt"
    blocker.write_text("not a folder")
    root = str(blocker / "lake")
    line = _load_error(monkeypatch, MEDALLION_LAKE_ROOT=root)
    assert line == (
        f"MEDALLION_LAKE_ROOT={root!r} cannot be created ({root}): {blocker} is a file, not a folder: "
        "set MEDALLION_LAKE_ROOT to a folder this user can write"
    )
    _assert_run_stops_before_spark(
        monkeypatch,
        LakeResource(root=root, root_variable="MEDALLION_LAKE_ROOT"),
        f"MEDALLION_LAKE_ROOT={root!r} cannot be created",
    )


def test_a_lake_root_that_cannot_be_created_stops_the_run_before_spark_whatever_the_mode_bits_say(monkeypatch):
    # /proc's mode bits let root (and os.access) write, and the definitions load; no folder can be made there.
    root = f"/proc/medallion-lake-{os.getpid()}/lake"
    settings = read_settings({"MEDALLION_LAKE_ROOT": root})  # the look-only check at load passes
    _assert_run_stops_before_spark(
        monkeypatch,
        lake_resource(settings),
        f"MEDALLION_LAKE_ROOT={root!r} cannot be created ({root}: No such file or directory): "
        "point MEDALLION_LAKE_ROOT at a folder this user can write, or create it",
    )


def test_an_existing_root_no_one_can_write_is_refused_whatever_the_mode_bits_say():
    # /proc exists and its mode bits let root write; no file can be made in it, by root either.
    assert LakeResource(root="/proc").write_problem() == (
        "the lake root '/proc' is not writable (/proc: No such file or directory): "
        "point MEDALLION_LAKE_ROOT at a folder this user can write, or make it writable"
    )


def test_dg_launch_with_a_lake_root_that_cannot_be_created_fails_the_run_before_spark(tmp_path):
    # The README's command-line run, as the user types it: the run is failed (not a successful empty run),
    # the error names the setting, and no Spark session started (the session's first log line is absent).
    root = f"/proc/medallion-lake-{os.getpid()}/lake"
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k not in SETTING_NAMES},
        "DAGSTER_HOME": str(home),
        "MEDALLION_LAKE_ROOT": root,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("dg")), "launch", "--assets", "bronze/nation"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    message = (
        f"MEDALLION_LAKE_ROOT={root!r} cannot be created ({root}: No such file or directory): "
        "point MEDALLION_LAKE_ROOT at a folder this user can write, or create it"
    )
    assert done.returncode != 0 and message in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    from dagster import DagsterEventType, DagsterRunStatus

    with DagsterInstance.from_config(str(home)) as instance:
        [run] = instance.get_runs()
        assert run.status == DagsterRunStatus.FAILURE
        records = instance.all_logs(run.run_id)
    failures = [
        r for r in records if r.dagster_event and r.dagster_event.event_type == DagsterEventType.RESOURCE_INIT_FAILURE
    ]
    assert failures and message in failures[0].dagster_event.engine_event_data.error.to_string()
    assert not [
        r for r in records if r.dagster_event and r.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION
    ]
    assert not [r for r in records if "Spark session starting" in (r.user_message or "")]
    assert not Path("/proc", f"medallion-lake-{os.getpid()}").exists()


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="running as root: chmod does not stop root from writing (the file case covers root)",
)
def test_a_read_only_lake_root_is_refused_at_load_and_at_run_start(monkeypatch, tmp_path):
    root = tmp_path / "lake"
    root.mkdir()
    root.chmod(0o555)
    try:
        line = _load_error(monkeypatch, MEDALLION_LAKE_ROOT=str(root))
        assert line.startswith(f"MEDALLION_LAKE_ROOT={str(root)!r} is not writable ({root}: permission denied)")
        _assert_run_stops_before_spark(
            monkeypatch,
            LakeResource(root=str(root), root_variable="MEDALLION_LAKE_ROOT"),
            f"MEDALLION_LAKE_ROOT={str(root)!r} is not writable",
        )
    finally:
        root.chmod(0o755)


def _assert_run_stops_before_spark(monkeypatch, lake: LakeResource, expected: str) -> None:
    from pyspark import SparkContext

    @asset
    def touches_spark(spark: SparkResource, lake: LakeResource) -> None:
        spark.spark_session.range(1).count()

    had_spark = SparkContext._active_spark_context is not None
    result = materialize(
        [touches_spark],
        resources={"spark": SparkResource(delta_engine="delta-rs"), "lake": lake},
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    failures = [e for e in result.all_events if e.is_failure]
    assert any(expected in str(e.event_specific_data.error) for e in failures if e.event_specific_data), failures
    if not had_spark:
        assert SparkContext._active_spark_context is None


def test_a_writable_lake_root_passes(tmp_path):
    lake = LakeResource(root=str(tmp_path / "new" / "lake"))
    assert lake.write_problem() is None
    assert (tmp_path / "new" / "lake").is_dir()  # a missing root is created, then written to
    assert lake.write_problem() is None
    assert list((tmp_path / "new" / "lake").iterdir()) == []  # the probe leaves nothing behind
    assert LakeResource(root="s3://bucket/lake").write_problem() is None  # object stores are not probed


# ---------------------------------------------------------------- the Maven probe


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_maven_probe_of_a_closed_port_says_unreachable_at_once():
    repository = f"http://127.0.0.1:{_closed_port()}/maven2/"
    started = time.monotonic()
    probe = maven_reachable([repository], artifact="io.delta:delta-spark_2.13:4.4.1", timeout=3.0)
    assert not probe.reachable
    assert time.monotonic() - started < 2.0
    assert repository in probe.detail and "refused" in probe.detail.lower()


def test_offline_auto_falls_back_to_delta_rs_within_the_probe(monkeypatch):
    # This machine's real network, Maven Central as Spark would use it.
    monkeypatch.delenv("DEFAULT_ARTIFACT_REPOSITORY", raising=False)
    started = time.monotonic()
    plan = plan_engine("auto", maven=None)  # the installed delta-spark's jar
    elapsed = time.monotonic() - started
    assert elapsed < 3.0 + 1.0, f"the probe took {elapsed:.1f} s"
    if plan.source == "maven":
        pytest.skip("this machine reaches Maven Central: the offline path is covered by the closed-port test")
    assert plan.source is None and plan.spark_config == {}
    assert plan.reason.startswith(f"Maven not reachable ({MAVEN_CENTRAL}")
    assert "using delta-rs" in plan.reason and "DELTA_SPARK_JARS" in plan.reason


@contextlib.contextmanager
def _maven_repository(serves: str | None):
    """A Maven repository on 127.0.0.1 answering HEAD with 200 for the path ending in ``serves``, else 404.

    Yields its root URL and the list of paths asked, in order.
    """
    served: list[str] = []

    class Repository(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - http.server's name
            served.append(self.path)
            self.send_response(200 if serves and self.path.endswith(serves) else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Repository)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/maven2/", served
    finally:
        server.shutdown()


def test_auto_takes_delta_spark_from_a_repository_that_answers(tmp_path):
    with _maven_repository("delta-spark_2.13-9.9.9.pom") as (repository, served):
        plan = plan_engine(
            "auto",
            maven=None,
            delta_version="9.9.9",
            spark_config={"spark.jars.ivySettings": str(_ivy_settings(tmp_path, repository))},
        )
    assert served == ["/maven2/io/delta/delta-spark_2.13/9.9.9/delta-spark_2.13-9.9.9.pom"]
    assert plan.source == "maven"
    assert plan.spark_config["spark.jars.packages"] == "io.delta:delta-spark_2.13:9.9.9"
    assert repository in plan.reason
    # false: never asked; true: fetched without asking.
    # The user's Ivy settings are Spark's to read: the plan adds none of its own.
    assert "spark.jars.ivySettings" not in plan.spark_config
    # false: never asked; true: fetched without asking.
    assert plan_engine("auto", maven=False, delta_version="9.9.9").source is None
    assert plan_engine("auto", maven=True, delta_version="9.9.9").source == "maven"


def test_a_delta_spark_version_maven_does_not_serve_is_named_with_the_fix(tmp_path):
    with _maven_repository(None) as (repository, served):
        config = {"spark.jars.ivySettings": str(_ivy_settings(tmp_path, repository))}
        auto = plan_engine("auto", maven=None, delta_version="9.9.8", spark_config=config)
        explicit = plan_engine("delta-spark", maven=None, delta_version="9.9.8", spark_config=config)
    assert served == ["/maven2/io/delta/delta-spark_2.13/9.9.8/delta-spark_2.13-9.9.8.pom"]
    # Not "Maven not reachable": the repository answered, the version is what is wrong, and the plan says so.
    assert auto.source is None and auto.warning
    assert auto.reason.startswith(f"Maven has no io.delta:delta-spark_2.13:9.9.8 ({repository} answered 404")
    assert "installed delta-spark Python package 9.9.8" in auto.reason and "`pip install -e .`" in auto.reason
    assert "DELTA_SPARK_JARS" in auto.reason and auto.reason.endswith("using delta-rs meanwhile")
    assert explicit.warning and "Maven has no io.delta:delta-spark_2.13:9.9.8" in explicit.reason


def test_the_projects_ivy_settings_resolve_from_maven_central_alone(monkeypatch):
    import xml.etree.ElementTree as ElementTree

    from medallion_assets.storage.session import maven_repositories, maven_resolution_config

    monkeypatch.delenv("DEFAULT_ARTIFACT_REPOSITORY", raising=False)
    path = plan_engine("auto", maven=True, delta_version="9.9.9").spark_config["spark.jars.ivySettings"]
    assert Path(path).is_file()
    resolvers = ElementTree.parse(path).getroot().find("resolvers")
    assert [(r.tag, r.get("root")) for r in resolvers] == [("ibiblio", MAVEN_CENTRAL)]
    # What the probe asks is what Spark will read: the file's one repository.
    assert maven_repositories({"spark.jars.ivySettings": path}) == [MAVEN_CENTRAL]
    # A repository the user set for Spark is Spark's to use, with Spark's own resolvers.
    monkeypatch.setenv("DEFAULT_ARTIFACT_REPOSITORY", "https://maven.example.org/maven2/")
    assert maven_resolution_config({}) == {}


_IVY_SETTINGS = """<ivysettings><settings defaultResolver="mirror"/>
<resolvers><ibiblio name="mirror" m2compatible="true" root="{root}"/></resolvers></ivysettings>"""


def _ivy_settings(folder: Path, root: str) -> Path:
    path = folder / "ivysettings.xml"
    path.write_text(_IVY_SETTINGS.format(root=root))
    return path


# ---------------------------------------------------------------- the CLI


def test_dagster_definitions_validate_prints_the_setting(tmp_path):
    env = {
        "PATH": str(Path(sys.executable).parent),
        "DAGSTER_HOME": str(tmp_path),
        "HOME": str(tmp_path),
        "MEDALLION_DELTA_ENGINE": "bogus",
        "MEDALLION_SIMULATOR": "of",
    }
    result = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "SettingsError: MEDALLION_DELTA_ENGINE='bogus' is not a Delta engine: use auto, delta-spark or delta-rs "
        "(or unset it for auto)\nMEDALLION_SIMULATOR='of' is not a switch"
    ) in output
    assert "ValidationError" not in output and "pydantic" not in output


# ---------------------------------------------------------------- the demo


def test_the_demo_is_on_unless_switched_off_and_then_needs_the_teams_pipelines():
    assert read_settings({}).pipeline_packages == ("medallion_assets.pipelines",)
    assert read_settings({"MEDALLION_PIPELINES": "medallion_assets_tests"}).pipeline_packages == (
        "medallion_assets.pipelines",
        "medallion_assets_tests",
    )
    own = read_settings({"MEDALLION_DEMO": "off", "MEDALLION_PIPELINES": "medallion_assets_tests"})
    assert (own.demo, own.simulator, own.pipeline_packages) == (False, False, ("medallion_assets_tests",))
    with pytest.raises(SettingsError) as caught:
        read_settings({"MEDALLION_DEMO": "off"})
    assert str(caught.value) == (
        "MEDALLION_DEMO='off' leaves out the project's own pipelines, and MEDALLION_PIPELINES "
        "names none of yours: set MEDALLION_PIPELINES to your pipeline packages (e.g. "
        "my_feeds), or unset MEDALLION_DEMO"
    )
    with pytest.raises(SettingsError) as caught:
        read_settings(
            {"MEDALLION_DEMO": "no", "MEDALLION_PIPELINES": "medallion_assets_tests", "MEDALLION_SIMULATOR": "on"}
        )
    assert str(caught.value).startswith(
        "MEDALLION_SIMULATOR='on' lands TPC-H's demo files, and MEDALLION_DEMO=off "
        "leaves out the feeds that read them: unset MEDALLION_SIMULATOR"
    )
    with pytest.raises(SettingsError, match="MEDALLION_DEMO='of' is not a switch"):
        read_settings({"MEDALLION_DEMO": "of"})


# ---------------------------------------------------------------- the catalog


def test_metastore_uris_are_thrift_host_and_port_and_name_the_variable():
    hive = {"MEDALLION_CATALOG": "hive"}
    assert read_settings({**hive, "MEDALLION_METASTORE_URIS": "thrift://a:9083, thrift://b.internal:9083"}) is not None
    for wrong in ("http://metastore:9083", "thrift://metastore", "thrift://metastore:9083/db", "metastore:9083"):
        with pytest.raises(SettingsError) as caught:
            read_settings({**hive, "MEDALLION_METASTORE_URIS": wrong})
        assert str(caught.value).splitlines()[0] == (
            f"MEDALLION_METASTORE_URIS={wrong!r} is not a list of metastore services: use "
            "thrift://host:9083[,thrift://host:9083]"
        ), wrong
