"""Kafka as a source of a feed's events: the connection, the broker's offsets, a producer.

:class:`KafkaResource` holds what a deployment says about its broker (servers,
topic, security) and how the bronze stream reads it (starting offsets, batch
size, data loss). The same settings give Spark's Kafka source its options
(:meth:`KafkaResource.spark_source_options`) and the Python client its
configuration (:meth:`KafkaResource.client_config`), which this module uses
for what Spark does not offer outside a running query: the partitions' latest
offsets (for the consumer-lag check) and publishing (the simulator's demo
producer). Secrets come from environment variables (``EnvVar``) and are never
logged: :meth:`KafkaResource.describe` names the connection without them.

Nothing here connects at import or construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource
from pydantic import Field, field_validator

from medallion_assets.settings import SASL_MECHANISMS as _SASL_MECHANISMS
from medallion_assets.settings import SECURITY_PROTOCOLS as _SECURITY_PROTOCOLS
from medallion_assets.settings import refuse_unknown
from medallion_assets.storage.session import jar_files, maven_resolution_config

#: Maven coordinates of Spark's Kafka connector, for sessions that can reach Maven.
KAFKA_MAVEN_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def kafka_connector_config(
    *, jars: str | None = None, maven: bool = False, spark_config: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Session settings that put Spark's Kafka connector on a session (none if neither is given).

    Args:
        jars: ``KAFKA_SPARK_JARS``: a folder of the connector's jars or a comma list of them
            (spark-sql-kafka, spark-token-provider-kafka, kafka-clients, commons-pool2).
        maven: fetch the connector matching the installed pyspark from Maven instead, resolved
            as :func:`medallion_assets.storage.session.maven_resolution_config` says.
        spark_config: the session's settings, for the Ivy settings the user configured.
    """
    if jars:
        files = jar_files(
            jars,
            variable="KAFKA_SPARK_JARS",
            holds="spark-sql-kafka-0-10, spark-token-provider-kafka-0-10, kafka-clients, commons-pool2",
        )
        return {"spark.jars": ",".join(files)}
    if maven:
        return {
            "spark.jars.packages": KAFKA_MAVEN_PACKAGE.format(version=version("pyspark")),
            **maven_resolution_config(spark_config or {}),
        }
    return {}


def kafka_connector_missing(*, over_connect: bool) -> str:
    """What to set when a session has no Kafka source: the client's settings, or the Connect server's start."""
    package = KAFKA_MAVEN_PACKAGE.format(version=version("pyspark"))
    if over_connect:
        return (
            "the Spark Connect server has no Kafka connector (Spark's 'kafka' source): start the server with "
            f"--packages {package} (or --jars with the connector's jars), as docs/kafka.md shows; "
            "KAFKA_SPARK_JARS and MEDALLION_KAFKA_MAVEN configure a session this process starts, not a Connect server"
        )
    return (
        "the Spark session has no Kafka connector (Spark's 'kafka' source): set MEDALLION_KAFKA_MAVEN=true to fetch "
        f"{package} from Maven, or KAFKA_SPARK_JARS to its jars, before the session starts"
    )


def is_connect_session(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client's session (whose jars are its server's)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


class KafkaError(RuntimeError):
    """The broker cannot be reached or does not have what the stream needs."""


class KafkaResource(ConfigurableResource):
    """Where the Kafka feed's topic is, and how its bronze stream reads it.

    Unconfigured (no ``bootstrap_servers``) is a valid state: the deployment
    lands its events as files only, and the Kafka bronze table stays empty.
    The topic is the one the feed declares (``KafkaTopic(topic=...)``) unless
    ``topic`` names another (:meth:`for_feed`).

    Example:
        >>> kafka = KafkaResource(bootstrap_servers="127.0.0.1:9092", topic="orders")
        >>> kafka.spark_source_options()["subscribe"]
        'orders'
    """

    bootstrap_servers: str = Field(
        default="",
        description="Kafka bootstrap servers, host:port[,host:port]. Empty: no Kafka source in this deployment.",
    )
    topic: str = Field(
        default="",
        description="Topic to read, one NDJSON line per message. Empty: the topic the Kafka feed declares "
        "(KafkaTopic(topic=...)).",
    )
    security_protocol: str = Field(
        default="PLAINTEXT", description="Kafka security.protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl_mechanism: str | None = Field(
        default=None,
        description="SASL mechanism with SASL_PLAINTEXT or SASL_SSL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.",
    )
    sasl_username: str | None = Field(default=None, description="SASL user name; set it through an EnvVar.")
    sasl_password: str | None = Field(
        default=None, description="SASL password; set it through an EnvVar, never in code. It is not logged."
    )
    ssl_ca_location: str | None = Field(
        default=None,
        description="PEM file of the certificates that signed the broker's (SSL, SASL_SSL). Spark's client trusts "
        "it as a PEM truststore, the Python client as ssl.ca.location. None: the default trust.",
    )
    starting_offsets: str = Field(
        default="earliest",
        description=(
            "Where a new checkpoint starts: 'earliest' (every message the topic still holds), 'latest' "
            "(only what arrives after the first run) or Spark's per-partition JSON. Ignored once the "
            "checkpoint exists: the stream resumes from its committed offsets."
        ),
    )
    max_offsets_per_trigger: int | None = Field(
        default=100_000,
        description="At most this many messages per micro-batch, spread over the partitions (None: no limit). "
        "An availableNow run takes the backlog in batches of this size.",
    )
    fail_on_data_loss: bool = Field(
        default=True,
        description="Stop the stream when messages it has not read are gone (retention, a recreated topic) "
        "instead of skipping them silently.",
    )
    max_lag_messages: int = Field(
        default=10_000, description="The consumer-lag check fails when the messages not yet ingested exceed this."
    )
    stall_after_seconds: float = Field(
        default=5400.0,
        description="The consumer-lag check fails when messages wait and no batch has committed for this long "
        "(longer than the interval of the runs that ingest: the hourly schedule, or the continuous trigger).",
    )
    extra_options: dict[str, str] = Field(
        default_factory=dict,
        description="More Kafka client settings that Java's client and librdkafka share, e.g. {'client.id': ...}; "
        "passed to Spark as kafka.<name> and to the Python client as is.",
    )
    producer_options: dict[str, str] = Field(
        default_factory=dict,
        description="Settings of the simulator's producer only (librdkafka names), e.g. {'linger.ms': '5'}.",
    )

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _known_choice(cls, value: str | None, info) -> str | None:
        return refuse_unknown(
            value,
            _SECURITY_PROTOCOLS if info.field_name == "security_protocol" else _SASL_MECHANISMS,
            field=f"KafkaResource.{info.field_name}",
            what="one Kafka knows",
            variable=f"MEDALLION_KAFKA_{info.field_name.upper()}",
        )

    @field_validator("max_offsets_per_trigger", "max_lag_messages")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(f"must be positive, got {value}")
        return value

    @property
    def configured(self) -> bool:
        """Whether this deployment has a Kafka source."""
        return bool(self.bootstrap_servers.strip())

    def for_feed(self, feed) -> KafkaResource:
        """This resource with the feed's declared topic, unless a topic is set here."""
        declared = getattr(feed.source, "topic", "")
        return self if self.topic or not declared else self.model_copy(update={"topic": declared})

    def describe(self) -> str:
        """The connection in words, without credentials (for logs and errors)."""
        return f"topic {self.topic!r} on {self.bootstrap_servers or '(no servers)'} ({self.security_protocol})"

    def _security(self) -> dict[str, str]:
        settings = {"security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            settings["sasl.mechanism"] = self.sasl_mechanism
        return settings

    def _trust(self, *, java: bool) -> dict[str, str]:
        # One PEM file for both clients: the Java client reads it as a truststore of type PEM,
        # librdkafka as its CA file; neither knows the other's setting.
        if not self.ssl_ca_location:
            return {}
        if java:
            return {"ssl.truststore.type": "PEM", "ssl.truststore.location": self.ssl_ca_location}
        return {"ssl.ca.location": self.ssl_ca_location}

    def spark_source_options(self) -> dict[str, str]:
        """Options of ``spark.readStream.format("kafka")`` for the topic."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "subscribe": self.topic,
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            **{f"kafka.{k}": v for k, v in self._security().items()},
            **{f"kafka.{k}": v for k, v in self._trust(java=True).items()},
            **{f"kafka.{k}": v for k, v in self.extra_options.items()},
        }
        if self.max_offsets_per_trigger:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.sasl_mechanism and self.sasl_username is not None:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if self.sasl_mechanism == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            options["kafka.sasl.jaas.config"] = (
                f'{module} required username="{self.sasl_username}" password="{self.sasl_password or ""}";'
            )
        return options

    def client_config(self) -> dict[str, str]:
        """The Python client's (librdkafka's) configuration for the same broker."""
        config = {
            "bootstrap.servers": self.bootstrap_servers,
            **self._security(),
            **self._trust(java=False),
            **self.extra_options,
        }
        if self.sasl_username is not None:
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password or ""
        return config


def _require(kafka: KafkaResource) -> None:
    if not kafka.configured:
        raise KafkaError(
            "no Kafka broker is configured: set MEDALLION_KAFKA_BOOTSTRAP_SERVERS (and MEDALLION_KAFKA_TOPIC) "
            "to use the Kafka source"
        )


def watermark_offsets(kafka: KafkaResource, *, timeout_seconds: float = 10.0) -> dict[int, tuple[int, int]]:
    """Each partition's oldest offset the broker still holds and the next offset it will write.

    Raises:
        KafkaError: the broker does not answer or does not know the topic.
    """
    # deferred: confluent_kafka loads librdkafka, needed only where a broker is used, not with the definitions
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    _require(kafka)
    # Watermark queries join no group and commit nothing; the group id is only required by the client.
    consumer = Consumer({**kafka.client_config(), "group.id": "medallion-assets-lag", "enable.auto.commit": "false"})
    try:
        try:
            metadata = consumer.list_topics(kafka.topic, timeout=timeout_seconds)
            topic = metadata.topics.get(kafka.topic)
            if topic is None or topic.error is not None:
                raise KafkaError(
                    f"the Kafka topic {kafka.topic!r} does not exist on {kafka.bootstrap_servers} "
                    f"({topic.error.str() if topic else 'not listed'}): create it, or set MEDALLION_KAFKA_TOPIC "
                    "to an existing topic"
                )
            return {
                partition: tuple(  # type: ignore[misc]  # (low, high): the client returns two offsets
                    int(o)
                    for o in consumer.get_watermark_offsets(
                        TopicPartition(kafka.topic, partition), timeout=timeout_seconds
                    )
                )
                for partition in sorted(topic.partitions)
            }
        except KafkaException as error:
            raise KafkaError(
                f"the Kafka broker of {kafka.describe()} did not answer: {error}; the stream's checkpoint "
                "is untouched, and the next run resumes from it once the broker is back"
            ) from error
    finally:
        consumer.close()


def latest_offsets(kafka: KafkaResource, *, timeout_seconds: float = 10.0) -> dict[int, int]:
    """The next offset each partition of the topic will write (its high watermark); see :func:`watermark_offsets`."""
    return {p: high for p, (_, high) in watermark_offsets(kafka, timeout_seconds=timeout_seconds).items()}


def create_topic(kafka: KafkaResource, *, partitions: int = 3, timeout_seconds: float = 10.0) -> None:
    """Create the topic with ``partitions`` partitions (nothing if it exists)."""
    # deferred: confluent_kafka loads librdkafka, needed only where a broker is used, not with the definitions
    from confluent_kafka import KafkaError as ClientError
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    _require(kafka)
    config: dict[str, str | int | float | bool] = {**kafka.client_config()}
    admin = AdminClient(config)
    futures = admin.create_topics([NewTopic(kafka.topic, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        try:
            future.result(timeout=timeout_seconds)
        except KafkaException as error:
            if error.args[0].code() != ClientError.TOPIC_ALREADY_EXISTS:
                raise KafkaError(f"could not create {kafka.describe()}: {error}") from error


@dataclass(frozen=True)
class Published:
    """What a publish call delivered."""

    messages: int
    partitions: dict[int, int]
    """Messages per partition."""


def publish_lines(kafka: KafkaResource, lines: Iterable[bytes], *, timeout_seconds: float = 60.0) -> Published:
    """Publish each line as one message (no key: silver orders events by time and id, not by offset).

    Lines go as bytes, as delivered, so a line that is not valid UTF-8 reaches
    bronze as it would from a file. Waits until every message is acknowledged.

    Raises:
        KafkaError: a message was not delivered (too big, unknown topic, broker down).
    """
    # deferred: confluent_kafka loads librdkafka, needed only where a broker is used, not with the definitions
    from confluent_kafka import KafkaException, Producer

    _require(kafka)
    producer = Producer({**kafka.client_config(), **kafka.producer_options})
    per_partition: dict[int, int] = {}
    failures: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            failures.append(str(error))
        else:
            per_partition[message.partition()] = per_partition.get(message.partition(), 0) + 1

    count = 0
    for line in lines:
        while True:
            try:
                producer.produce(kafka.topic, value=line, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.5)
            except KafkaException as error:
                # Refused before sending (a message too big): deliver what was accepted, then say which one.
                producer.flush(timeout_seconds)
                limit = kafka.producer_options.get("message.max.bytes", "1000000")
                raise KafkaError(
                    f"message {count + 1} ({len(line):,} bytes) to {kafka.describe()} was refused: "
                    f"{error.args[0].str() if error.args else error}; the {count} before it were delivered. "
                    f"The producer's message.max.bytes is {limit}: raise it (producer_options) together with "
                    "the topic's max.message.bytes, or split the event"
                ) from error
        producer.poll(0)
        count += 1
    remaining = producer.flush(timeout_seconds)
    if remaining or failures:
        raise KafkaError(
            f"{len(failures) + remaining} of {count} messages to {kafka.describe()} were not delivered"
            + (f": {failures[0]}" if failures else f" within {timeout_seconds:.0f}s")
        )
    return Published(count, dict(sorted(per_partition.items())))


def publish_files(kafka: KafkaResource, files: Iterable[Path | str], **options: Any) -> Published:
    """Publish every line of NDJSON files (the line ending dropped), file by file."""

    def lines() -> Iterable[bytes]:
        for path in files:
            with open(path, "rb") as handle:
                for line in handle:
                    line = line.rstrip(b"\r\n")
                    if line:
                        yield line

    return publish_lines(kafka, lines(), **options)
