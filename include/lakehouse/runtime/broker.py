"""The lakehouse's local Apache Kafka broker: one node in KRaft mode, broker and controller in
one process, no ZooKeeper.

    lakehouse kafka start | stop | status

It runs ``kafka.Kafka`` from the jars ``make install`` copied from Maven Central
(``include/jvm/kafka/pom.xml``, :func:`lakehouse.runtime.jvm.broker_classpath`), with Java 17 or newer
(:func:`lakehouse.runtime.process.find_java`). Everything it keeps is under ``<home>/kafka/``:

* ``data/``: the log directory, holding the records and the cluster's metadata log. It is
  formatted once, on the first start (``kafka.tools.StorageTool format --standalone``, with a
  new cluster id); later starts keep it, records and cluster id included.
* ``server.properties`` and ``log4j2.properties``: the broker's settings, written at each start.
* ``server.log``: what the broker and the storage tool print.
* ``broker.json``: the running broker's pid, ports and bootstrap servers.

It listens on 127.0.0.1 only, without authentication: clients on ``LAKEHOUSE_KAFKA_PORT``
(default 19092, away from a system Kafka on 9092), the controller on a free port chosen at each
start. The platform finds it with :func:`bootstrap_servers`.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import socket
import struct
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import (
    BrokerUnavailableError,
    JavaNotFoundError,
    LakehouseError,
)
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import free_port, now, port_setting, tail
from lakehouse.runtime.service import Launch, LocalServer, Port

PORT_ENV = "LAKEHOUSE_KAFKA_PORT"
DEFAULT_PORT = 19092
LOOPBACK = "127.0.0.1"
NODE_ID = 1
HEAP = "512m"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
SERVER_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"

# Broker and controller in one process; each of Kafka's internal topics (consumer offsets,
# transactions, share groups) has the one replica a single node can give it, and one partition
# instead of 50. A consumer group starts at once instead of waiting for more members. Topics
# are not created by a client asking for them: a topic's partition count is its contract's
# (`lakehouse create-topic`), never the broker's default.
# Records are kept until deleted by hand: Kafka's default (7 days, judged by the records' own
# timestamps) would delete replayed or sample records dated years ago within minutes of start.
_SETTINGS = {
    "auto.create.topics.enable": "false",
    "log.retention.ms": "-1",
    "process.roles": "broker,controller",
    "node.id": str(NODE_ID),
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
}

# Kafka 4 logs with Log4j 2; everything goes to standard output, which start() sends to
# server.log (a JVM that dies before Log4j starts says why there too). Log4j's own shutdown
# hook is off, so that the broker's shutdown, which runs in a hook of its own, is logged to its
# end. Left out below INFO's warnings: every config's full listing of values (server.properties
# has ours) and each partition's state changes.
_LOG4J2 = """\
shutdownHook = disable
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class BrokerError(LakehouseError):
    """The Kafka broker could not be started, stopped or reached."""


class BrokerDown(BrokerError, BrokerUnavailableError):
    """No local Kafka broker runs: the message says how to start one."""


def port() -> int:
    """The client port (``LAKEHOUSE_KAFKA_PORT``, default 19092); anything but a port number
    is a ConfigError naming the variable."""
    return port_setting(PORT_ENV, DEFAULT_PORT)


@dataclass(frozen=True)
class Status:
    """What ``lakehouse kafka status`` reports."""

    running: bool
    data: Path
    bootstrap_servers: str | None = None
    pid: int | None = None
    cluster_id: str | None = None
    started_at: str | None = None
    log: Path | None = None

    def describe(self, *, already: bool = False) -> str:
        if not self.running:
            return (
                f"Kafka broker: not running (data: {self.data}); start it with "
                "`lakehouse kafka start`"
            )
        return (
            f"Kafka broker: {'already ' if already else ''}running, pid {self.pid}, "
            f"bootstrap servers {self.bootstrap_servers}, "
            f"cluster {self.cluster_id}, since {self.started_at} (data: {self.data}, "
            f"log: {self.log})"
        )


@dataclass(frozen=True)
class Metadata:
    """A broker's answer to a metadata request: its cluster and the brokers that serve."""

    cluster_id: str | None
    brokers: tuple[tuple[int, str, int], ...]  # (node id, host, port)


class Broker(LocalServer[Status]):
    """A single-node broker kept in ``root`` (``<home>/kafka`` for a lakehouse: :meth:`of`)."""

    NAME = "Kafka broker"
    COMMAND = "kafka"
    PORTS = (Port("port", PORT_ENV, DEFAULT_PORT),)
    RECORD = "broker.json"
    START_TIMEOUT_S = START_TIMEOUT_S
    STOP_TIMEOUT_S = STOP_TIMEOUT_S
    ERROR = BrokerError

    @classmethod
    def of(cls, settings: Settings) -> Broker:
        return cls(settings.home / "kafka")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def properties(self) -> Path:
        return self.root / "server.properties"

    def cluster_id(self) -> str | None:
        """The cluster id the data directory was formatted with; None before the first start."""
        try:
            lines = (self.data / "meta.properties").read_text(encoding="utf-8").splitlines()
        except OSError:
            return None
        for line in lines:
            key, sep, value = line.partition("=")
            if sep and key.strip() == "cluster.id":
                return value.strip()
        return None

    # -- the holder's questions --------------------------------------------------------------
    def ports(self) -> dict[str, int]:
        """The client port, and a free port for the controller, chosen at each start."""
        return {**super().ports(), "controller_port": free_port(LOOPBACK)}

    def prepare(self, ports: Mapping[str, int]) -> None:
        """Write the settings; on the first start, format the storage."""
        self._write_settings(ports["port"], ports["controller_port"])
        if self.cluster_id() is None:
            self._format()

    def launch(self, ports: Mapping[str, int]) -> Launch:
        return Launch(
            self._jvm(SERVER_CLASS, str(self.properties)),
            record={"bootstrap_servers": f"{LOOPBACK}:{ports['port']}"},
        )

    def answering(self, record: Mapping[str, object]) -> bool:
        """Whether it serves metadata with itself as a broker."""
        at = record.get("port")
        if not isinstance(at, int):
            return False
        with contextlib.suppress(OSError, ValueError, struct.error):
            return (NODE_ID, LOOPBACK, at) in metadata(LOOPBACK, at).brokers
        return False

    def make_status(self, record: Mapping[str, object] | None) -> Status:
        if record is None:
            return Status(False, self.data)
        return Status(
            True,
            self.data,
            bootstrap_servers=str(record.get("bootstrap_servers")),
            pid=int(str(record["pid"])),
            cluster_id=self.cluster_id(),
            started_at=str(record.get("started_at")),
            log=self.log,
        )

    # -- helpers -----------------------------------------------------------------------------
    def _write_settings(self, at: int, controller: int) -> None:
        conf = {
            **_SETTINGS,
            "listeners": f"PLAINTEXT://{LOOPBACK}:{at},CONTROLLER://{LOOPBACK}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{at}",
            "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{controller}",
            "log.dirs": str(self.data),
        }
        self.properties.write_text(
            "# Written by `lakehouse kafka start` at each start (lakehouse.runtime.broker).\n"
            + "".join(f"{key}={value}\n" for key, value in conf.items()),
            encoding="utf-8",
        )
        (self.root / "log4j2.properties").write_text(_LOG4J2, encoding="utf-8")

    def _jvm(self, main_class: str, *args: str) -> list[str]:
        return [
            _java(),
            f"-Xmx{HEAP}",
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp",
            _classpath(),
            main_class,
            *args,
        ]

    def _format(self) -> None:
        """Format the data directory as a new single-node cluster whose one controller is this
        node (``--standalone``)."""
        if self.data.exists():
            shutil.rmtree(self.data)  # a format left unfinished: no meta.properties
        command = self._jvm(
            STORAGE_TOOL_CLASS,
            "format",
            "--standalone",
            "--cluster-id",
            _new_cluster_id(),
            "--config",
            str(self.properties),
        )
        with self.log.open("ab") as log:
            log.write(f"\n--- formatting {self.data} at {now()}\n".encode())
            log.flush()
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                timeout=START_TIMEOUT_S,
                check=False,
            )
        if done.returncode != 0 or self.cluster_id() is None:
            raise BrokerError(
                f"Kafka's storage tool could not format {self.data} (exit code "
                f"{done.returncode}); its log ({self.log}) ends with:\n{tail(self.log)}"
            )


def bootstrap_servers(settings: Settings) -> str:
    """``127.0.0.1:<port>`` of this lakehouse's running broker; :class:`BrokerDown`, saying how
    to start it, when none runs."""
    current = Broker.of(settings).status()
    if not current.running or current.bootstrap_servers is None:
        raise BrokerDown(current.describe())
    return current.bootstrap_servers


def metadata(host: str, at: int, *, timeout: float = 2.0) -> Metadata:
    """Ask the broker at ``host:at`` for its cluster's metadata (Kafka's Metadata request,
    version 4, for no topic): the answer of a broker that serves clients. Raises OSError when
    nothing answers, ValueError or struct.error when what answers does not speak Kafka."""
    client_id = b"lakehouse-broker-check"
    # Request header v1: api key 3 (Metadata), version 4, correlation id, client id; then the
    # body: an empty topic array and allow_auto_topic_creation false.
    request = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id + struct.pack(">i?", 0, 0)
    with socket.create_connection((host, at), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _receive(sock, 4))
        answer = _receive(sock, size)
    (correlation,) = struct.unpack_from(">i", answer, 0)
    if correlation != 1:
        raise ValueError(f"answer to another request (correlation id {correlation})")
    offset = 8  # correlation id, throttle time
    (count,) = struct.unpack_from(">i", answer, offset)
    offset += 4
    brokers = []
    for _ in range(count):
        (node,) = struct.unpack_from(">i", answer, offset)
        node_host, offset = _string(answer, offset + 4)
        (node_port,) = struct.unpack_from(">i", answer, offset)
        _rack, offset = _string(answer, offset + 4)
        brokers.append((node, node_host or "", node_port))
    cluster, offset = _string(answer, offset)
    return Metadata(cluster, tuple(brokers))


def _receive(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def _string(data: bytes, offset: int) -> tuple[str | None, int]:
    """A Kafka nullable string at ``offset`` (int16 length, -1 for null) and the offset after."""
    (length,) = struct.unpack_from(">h", data, offset)
    offset += 2
    if length < 0:
        return None, offset
    return data[offset : offset + length].decode("utf-8"), offset + length


def _java() -> str:
    from lakehouse.runtime.process import find_java

    try:
        java, _major, _home = find_java()
    except JavaNotFoundError as exc:
        raise JavaNotFoundError(f"the Kafka broker runs on Java, as Spark does: {exc}") from None
    return java


def _classpath() -> str:
    from lakehouse.runtime.jvm import broker_classpath

    return broker_classpath()


def _new_cluster_id() -> str:
    """A cluster id as Kafka makes them (``Uuid.randomUuid``): 16 random bytes, URL-safe base64
    without padding, never starting with '-' (a command line would take it for an option)."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not made.startswith("-"):
            return made


def main(settings: Settings, action: str) -> int:
    """``lakehouse kafka start | stop | status`` (status: exit code 1 when it is down)."""
    return Broker.of(settings).main(action)
