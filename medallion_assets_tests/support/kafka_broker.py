"""Apache Kafka on 127.0.0.1 for the Kafka tests: one KRaft node (broker and controller), from Maven's artifacts.

The broker's jars are ``org.apache.kafka:kafka_2.13`` and its runtime
dependencies, resolved by Maven (``mvn -U dependency:copy-dependencies`` on a
generated POM, through the machine's own Maven settings) into the user's cache
folder, once per machine and Kafka version (:func:`broker_jars`). A
:class:`Broker` formats its log folder (``kafka.tools.StorageTool``), starts
``kafka.Kafka`` in a process group of its own and can be stopped, killed and
started again on the same folder and ports (:meth:`Broker.restart`). With
``sasl_ssl=True`` it also listens for SASL_SSL (SCRAM-SHA-256) with a
self-signed certificate for 127.0.0.1 made by ``keytool``; its PLAINTEXT
listener stays for the tests' own set-up (topics, SCRAM users).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from medallion_assets_tests.support.maven_artifacts import (
    CONSOLE_LOG4J2,
    cache_dir,
    resolve_dependencies,
    small_jvm_options,
)

#: The Apache Kafka release the tests run (Kafka 4 is KRaft only and runs on Java 17).
KAFKA_VERSION = "4.4.0"
#: log4j's SLF4J binding, at the log4j version Kafka's artifacts bring: without it the broker logs nothing.
LOG4J_VERSION = "2.25.5"
#: The SASL mechanism of the SASL_SSL listener.
SCRAM_MECHANISM = "SCRAM-SHA-256"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tests</groupId><artifactId>kafka-broker</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_JVM_OPTIONS = small_jvm_options("256m")


def broker_jars(version: str = KAFKA_VERSION) -> tuple[Path | None, str]:
    """The folder of the Kafka broker's jars, resolved by Maven on first use; or None and why not."""
    return resolve_dependencies(
        _POM.format(kafka=version, log4j=LOG4J_VERSION),
        cache_dir() / f"kafka_2.13-{version}",
        f"kafka_2.13-{version}.jar",
        f"org.apache.kafka:kafka_2.13:{version}",
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _quiet(config: dict) -> dict:
    """A librdkafka configuration that does not print each refused connection while a broker starts."""
    return {**config, "log_level": 0}


class Broker:
    """A running Apache Kafka node on 127.0.0.1; :meth:`stop` ends it.

    ``bootstrap`` is its PLAINTEXT listener; with ``sasl_ssl`` also
    ``sasl_bootstrap`` (SASL_SSL, SCRAM-SHA-256) and ``ca_file``, the PEM
    certificate a client trusts.
    """

    def __init__(self, jars: Path, folder: Path, *, sasl_ssl: bool = False) -> None:
        self.jars = jars
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port, controller = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        listeners = [f"PLAINTEXT://{self.bootstrap}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        extra: list[str] = []
        self.sasl_bootstrap = self.ca_file = None
        if sasl_ssl:
            self.sasl_bootstrap = f"127.0.0.1:{free_port()}"
            listeners.append(f"SASL_SSL://{self.sasl_bootstrap}")
            protocols.append("SASL_SSL:SASL_SSL")
            store_password = uuid.uuid4().hex
            self.ca_file = self._certificate(store_password)
            extra = [
                f"sasl.enabled.mechanisms={SCRAM_MECHANISM}",
                "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                f"ssl.keystore.location={folder / 'broker.p12'}",
                "ssl.keystore.type=PKCS12",
                f"ssl.keystore.password={store_password}",
                f"ssl.key.password={store_password}",
            ]
        (folder / "server.properties").write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{controller}",
                    f"listeners={','.join(listeners)},CONTROLLER://127.0.0.1:{controller}",
                    f"advertised.listeners={','.join(listeners)}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"listener.security.protocol.map={','.join(protocols)}",
                    f"log.dirs={folder / 'data'}",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                    *extra,
                ]
            )
            + "\n"
        )
        (folder / "log4j2.properties").write_text(CONSOLE_LOG4J2)
        self.log = folder / "broker.log"
        # Kafka's cluster id: a random UUID in URL-safe base64 without padding.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(folder / "server.properties")),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if formatted.returncode != 0:
            raise RuntimeError(f"formatting the Kafka log folder failed: {formatted.stdout}{formatted.stderr}")
        self.process: subprocess.Popen | None = None
        self.start()

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}",
            "-cp",
            str(self.jars / "*"),
            main,
            *args,
        ]

    def _certificate(self, store_password: str) -> Path:
        """A self-signed certificate for 127.0.0.1 in ``broker.p12``; returns its PEM export, what clients trust."""
        keytool = str(Path(shutil.which("java")).resolve().parent / "keytool")
        store = self.folder / "broker.p12"
        env = {**os.environ, "KAFKA_TEST_STORE_PASSWORD": store_password}
        secret = ["-storepass:env", "KAFKA_TEST_STORE_PASSWORD"]
        subprocess.run(
            [
                keytool,
                "-genkeypair",
                "-alias",
                "broker",
                "-keyalg",
                "RSA",
                "-keysize",
                "2048",
                "-validity",
                "7",
                "-dname",
                "CN=127.0.0.1",
                "-ext",
                "SAN=ip:127.0.0.1",
                "-storetype",
                "PKCS12",
                "-keystore",
                str(store),
                *secret,
                "-keypass:env",
                "KAFKA_TEST_STORE_PASSWORD",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        pem = self.folder / "ca.pem"
        subprocess.run(
            [keytool, "-exportcert", "-rfc", "-alias", "broker", "-keystore", str(store), *secret, "-file", str(pem)],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        return pem

    def start(self, timeout_seconds: float = 90.0) -> float:
        """Start the broker on its folder and ports; returns the seconds until it answered a metadata request."""
        from confluent_kafka.admin import AdminClient

        started = time.monotonic()
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(self.folder / "server.properties")),
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        admin = AdminClient(_quiet({"bootstrap.servers": self.bootstrap}))
        while time.monotonic() - started < timeout_seconds:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with {self.process.returncode}; see {self.log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                admin.list_topics(timeout=5)
                return time.monotonic() - started
            except Exception:  # not listening yet, or not serving metadata yet
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"the Kafka broker did not answer on {self.bootstrap} within {timeout_seconds:.0f}s; see {self.log}"
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """End the broker's process group with ``sig`` (SIGTERM: a controlled shutdown; SIGKILL: a crash)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def restart(self, sig: int = signal.SIGKILL) -> float:
        """Stop the broker with ``sig`` and start it again on the same log folder and ports."""
        self.stop(sig)
        return self.start()

    def admin(self):
        """An admin client on the PLAINTEXT listener."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept: the futures fail when their client is collected
        for future in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
            future.result(timeout=30)

    def add_partitions(self, topic: str, total: int) -> None:
        """Grow ``topic`` to ``total`` partitions with the admin API (CreatePartitions)."""
        from confluent_kafka.admin import NewPartitions

        admin = self.admin()
        for future in admin.create_partitions([NewPartitions(topic, total)]).values():
            future.result(timeout=30)
        deadline = time.monotonic() + 30
        while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic} did not show {total} partitions within 30 s")
            time.sleep(0.2)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's next offset as the broker's ListOffsets answers it (the admin API, not a consumer)."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        admin = self.admin()
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions})
        return {tp.partition: future.result(timeout=30).offset for tp, future in futures.items()}

    def add_scram_user(self, user: str, password: str) -> None:
        """Create a SCRAM-SHA-256 credential (AlterUserScramCredentials) and wait until it authenticates."""
        from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password.encode()
        )
        admin = self.admin()
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        client = AdminClient(
            _quiet(
                {
                    "bootstrap.servers": self.sasl_bootstrap,
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": SCRAM_MECHANISM,
                    "sasl.username": user,
                    "sasl.password": password,
                    "ssl.ca.location": str(self.ca_file),
                }
            )
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                client.list_topics(timeout=5)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def topic(self, *, partitions: int = 3, **settings):
        """A new topic of ``partitions`` partitions on the PLAINTEXT listener, as a KafkaResource."""
        from medallion_assets.kafka import KafkaResource

        kafka = KafkaResource(bootstrap_servers=self.bootstrap, topic=f"orders-{uuid.uuid4().hex[:8]}", **settings)
        self.create_topic(kafka.topic, partitions)
        return kafka


def produce(config: dict, topic: str, lines, *, partition: int | None = None) -> None:
    """Publish ``lines`` (bytes) with confluent-kafka's producer, to ``partition`` or the client's choice.

    The tests' own producer: what the project's code consumes is not produced by it.
    """
    from confluent_kafka import Producer

    producer = Producer(config)
    failures: list = []
    for line in lines:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=line, on_delivery=lambda error, _: error and failures.append(error), **kwargs)
        producer.poll(0)
    assert producer.flush(60) == 0 and not failures, failures
