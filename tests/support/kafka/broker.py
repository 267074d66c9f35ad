"""Real Apache Kafka brokers for the tests, in KRaft mode on loopback.

The pinned release (``tools/kafka/pom.xml``) is fetched once by
``scripts/kafka-jars`` into ``.cache/kafka/<version>/libs``; each node is a JVM
started from those jars, combined broker and controller, its log directory
formatted with the storage tool first. :class:`KafkaCluster` starts one node
(most tests) or three (replication, leader changes, ``min.insync.replicas``).
Each node writes its log through log4j2 to ``<dir>/node-<id>/server.log``;
the pytest plugin prints the tail of it when a test that used the broker fails.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
JARS_SCRIPT = ROOT / "scripts" / "kafka-jars"
# Four JVMs (three brokers and a single one), Spark and the tests share 24 GiB.
HEAP = "-Xmx512m"
# Three JVMs starting at once on 2 busy cores (load 30 seen) take well over a minute.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
# librdkafka's complaints while a broker starts or stops are expected.
_QUIET = logging.getLogger("eddyline.tests.kafka")

# What a broker of a test needs beyond Kafka's defaults. The replication factors
# and min ISR of the internal topics are set to the cluster's size, else a single
# broker's transactional producers and groups wait forever for replicas.
_BROKER_SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    # Fewer partitions of the internal topics: created on first use, quicker on 2 cores.
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.num.partitions": "4",
    # eddyline creates every topic it uses; a topic created by a fetch would hide a bug.
    "auto.create.topics.enable": "false",
    # Transactions the broker times out are aborted within a second, not ten.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.partitions": "1",
    "log.flush.interval.messages": "9223372036854775807",
    # Tests write records with small timestamps (1970): time-based retention would
    # delete them at once, so nothing is deleted by age.
    "log.retention.ms": "-1",
    # A deleted topic's data goes at once, so recreating it gives an empty topic.
    "file.delete.delay.ms": "1000",
    # The log cleaner looks for work every second, not 15: a test that compacts a
    # changelog (segment.ms and min.cleanable.dirty.ratio set low on its topic) waits
    # for the cleaner to have run.
    "log.cleaner.backoff.ms": "1000",
}

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class KafkaSetupError(RuntimeError):
    """The brokers could not be fetched or started; the message says why and where to look."""


def kafka_libs() -> Path:
    """The pinned release's jars, fetched by ``scripts/kafka-jars`` when absent."""
    done = subprocess.run([str(JARS_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KafkaSetupError(done.stderr.strip() or f"{JARS_SCRIPT} failed")
    return Path(done.stdout.strip().splitlines()[-1])


def kafka_version(libs: Path) -> str:
    """The release of ``libs`` (the directory is named after it)."""
    return libs.parent.name


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _cluster_id() -> str:
    """A random cluster id as Kafka writes them (a base64url UUID). Like Kafka's own
    ``Uuid.randomUuid``, never one starting with "-": the storage tool would read it as an
    option ("--cluster-id: expected one argument"), about one start in 32."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


@dataclass
class KafkaNode:
    """One combined broker/controller JVM."""

    node_id: int
    directory: Path
    port: int
    controller_port: int
    # Where clients reach the broker: loopback, or a bridge address pods on real nodes reach.
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"(no log at {self.log_file})"
        return "\n".join(text[-lines:])


class KafkaCluster:
    """``size`` KRaft nodes, each broker and controller (static voters).

    Clients reach the brokers on ``host``: loopback by default; real nodes' pods live in their
    own network namespaces, so a cluster for them listens on and advertises an address of a
    bridge the run created (``tests.support.realnode.cluster.API_ADDRESS``). The controllers
    stay on loopback: only the brokers talk to them.
    """

    def __init__(
        self, directory: Path, size: int = 1, libs: Path | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.directory = directory
        self.libs = libs or kafka_libs()
        self.version = kafka_version(self.libs)
        self.nodes = [
            KafkaNode(node_id, directory / f"node-{node_id}", free_port(), free_port(), host)
            for node_id in range(1, size + 1)
        ]
        self._cluster_id = _cluster_id()
        self.start_seconds: float | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(node for node in self.nodes if node.node_id == node_id)

    # -- set-up ------------------------------------------------------------------------

    def _properties(self, node: KafkaNode) -> dict[str, str]:
        size = str(len(self.nodes))
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        return {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{node.address},CONTROLLER://127.0.0.1:"
            f"{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.address}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.directory / "data"),
            "offsets.topic.replication.factor": size,
            "transaction.state.log.replication.factor": size,
            "transaction.state.log.min.isr": "1" if len(self.nodes) == 1 else "2",
            "share.coordinator.state.topic.replication.factor": size,
            "share.coordinator.state.topic.min.isr": "1" if len(self.nodes) == 1 else "2",
            "default.replication.factor": size,
            "min.insync.replicas": "1",
            **_BROKER_SETTINGS,
        }

    def _java(self, node: KafkaNode, main: str, *args: str) -> list[str]:
        return [
            "java",
            HEAP,
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
            "-cp",
            str(self.libs / "*"),
            main,
            *args,
        ]

    def _format(self, node: KafkaNode) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        node.config_file.write_text(
            "".join(f"{key}={value}\n" for key, value in self._properties(node).items())
        )
        (node.directory / "log4j2.properties").write_text(_LOG4J2.format(log=node.log_file))
        done = subprocess.run(
            self._java(
                node,
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                self._cluster_id,
                "--config",
                str(node.config_file),
                "--ignore-formatted",
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise KafkaSetupError(
                f"formatting node {node.node_id}'s log directory failed:\n{done.stdout}"
                f"{done.stderr}\n(see {node.log_file})"
            )

    def start(self) -> KafkaCluster:
        started = time.monotonic()
        for node in self.nodes:
            self._format(node)
        for node in self.nodes:
            self.start_node(node.node_id, wait=False)
        self.wait_ready(self.nodes)
        self.start_seconds = time.monotonic() - started
        return self

    def start_node(self, node_id: int, *, wait: bool = True) -> None:
        node = self.node(node_id)
        if node.running:
            return
        with (node.directory / "stdout.log").open("ab") as out:
            node.process = subprocess.Popen(
                self._java(node, "kafka.Kafka", str(node.config_file)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if wait:
            self.wait_ready([node])

    def wait_ready(self, nodes: Sequence[KafkaNode], timeout: float = START_TIMEOUT_S) -> None:
        """Until every node of ``nodes`` is registered and the cluster answers metadata."""
        wanted = {node.node_id for node in nodes}
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        admin: AdminClient | None = None
        while time.monotonic() < deadline:
            for node in nodes:
                if not node.running:
                    code = node.process.returncode if node.process is not None else None
                    raise KafkaSetupError(
                        f"Kafka node {node.node_id} exited with {code} while starting; "
                        f"its log ({node.log_file}) ends:\n{node.log_tail()}"
                    )
            if admin is None:
                # Until the ports listen, librdkafka would log every refused connection.
                if not all(_listening(node.host, node.port) for node in nodes):
                    time.sleep(0.2)
                    continue
                admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _QUIET})
            try:
                metadata = admin.list_topics(timeout=2)
                brokers = set(metadata.brokers)
                if wanted <= brokers:
                    return
                last = f"brokers registered: {sorted(brokers)}"
            except Exception as exc:  # librdkafka's errors while the broker starts
                last = str(exc)
            time.sleep(0.2)
        raise KafkaSetupError(
            f"Kafka nodes {sorted(wanted)} not ready after {timeout:.0f} s ({last}); logs: "
            + ", ".join(str(node.log_file) for node in nodes)
        )

    # -- faults and tear-down ---------------------------------------------------------------

    def stop_node(self, node_id: int, *, kill: bool = False) -> None:
        """Stop one node: a clean shutdown (SIGTERM), or SIGKILL with ``kill``."""
        node = self.node(node_id)
        process = node.process
        if process is None or process.poll() is not None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self) -> None:
        for node in self.nodes:
            process = node.process
            if process is not None and process.poll() is None:
                process.terminate()
        for node in self.nodes:
            self.stop_node(node.node_id)

    def describe(self) -> str:
        """What a failing test prints: where each node listens and the tail of its log."""
        return "\n\n".join(
            f"Kafka node {node.node_id} ({node.address}, "
            f"{'running' if node.running else 'stopped'}), log {node.log_file}:\n" + node.log_tail()
            for node in self.nodes
        )

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def environment_bootstrap() -> str | None:
    """An outside broker to test against instead (``EDDYLINE_TEST_KAFKA_BOOTSTRAP``)."""
    return os.environ.get("EDDYLINE_TEST_KAFKA_BOOTSTRAP") or None
