"""The lakehouse's local Kafka broker (`lakehouse kafka start | stop | status`): a real KRaft node
in a temporary lakehouse root, driven through the command line as a user would."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from lakehouse.runtime.broker import Broker, BrokerDown, Metadata, bootstrap_servers, metadata
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.process import alive, free_port
from lakes import lakehouse, processes_with

pytestmark = pytest.mark.integration


def _lakehouse(home: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return lakehouse(home, *args, env={"LAKEHOUSE_KAFKA_PORT": str(port)})


def _listening(ports: set[int]) -> set[str]:
    """The local addresses of the TCP sockets listening on any of ``ports`` (from /proc)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            address, port = line.split()[1].split(":")
            if line.split()[3] == "0A" and int(port, 16) in ports:  # LISTEN
                # IPv4 (or IPv4-mapped IPv6) in /proc's little-endian hex
                found.add(socket.inet_ntoa(bytes.fromhex(address[-8:])[::-1]))
    return found


def _round_trip(servers: str, topic: str, values: list[bytes]) -> list[bytes]:
    """Create ``topic`` unless it exists, produce ``values`` (if any), and read the topic
    from its start with a consumer group: what a client sees."""
    admin = AdminClient({"bootstrap.servers": servers})
    if topic not in admin.list_topics(timeout=30).topics:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[
            topic
        ].result(timeout=30)
    producer = Producer({"bootstrap.servers": servers})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    read: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                if read:
                    break
                continue
            assert message.error() is None, message.error()
            read.append(message.value())
    finally:
        consumer.close()
    return read


def test_start_serve_stop_and_restart_on_the_same_storage(tmp_path: Path) -> None:
    home = tmp_path / "lakehouse"
    settings = Settings.from_env(home, REPO_ROOT / "contracts")
    broker = Broker.of(settings)
    port = free_port()
    try:
        down = _lakehouse(home, port, "kafka", "status")
        assert down.returncode == 1
        assert "Kafka broker: not running" in down.stdout
        assert "lakehouse kafka start" in down.stdout
        with pytest.raises(BrokerDown, match="lakehouse kafka start"):
            bootstrap_servers(settings)

        started = _lakehouse(home, port, "kafka", "start")
        assert started.returncode == 0, started.stderr
        address = f"127.0.0.1:{port}"
        assert "running, pid " in started.stdout and address in started.stdout
        up = _lakehouse(home, port, "kafka", "status")
        assert up.returncode == 0
        assert f"bootstrap servers {address}" in up.stdout
        assert str(home / "kafka" / "data") in up.stdout
        assert bootstrap_servers(settings) == address
        state = json.loads((home / "kafka" / "broker.json").read_text())
        pid = state["pid"]
        assert processes_with("kafka.Kafka", str(broker.root / "server.properties")) == [pid]

        # It serves Kafka's protocol on the loopback address only, as a cluster of its own.
        cluster = broker.cluster_id()
        assert cluster and f"cluster {cluster}" in up.stdout
        assert metadata("127.0.0.1", port) == Metadata(cluster, ((1, "127.0.0.1", port),))
        assert _listening({port, state["controller_port"]}) == {"127.0.0.1"}
        assert _round_trip(address, "checkins", [b"first", b"second"]) == [b"first", b"second"]

        # A second start finds it running and starts nothing.
        again = _lakehouse(home, port, "kafka", "start")
        assert again.returncode == 0
        assert f"already running, pid {pid}" in again.stdout
        assert processes_with("kafka.Kafka", str(broker.root / "server.properties")) == [pid]

        stopped = _lakehouse(home, port, "kafka", "stop")
        assert stopped.returncode == 0 and "Kafka broker: stopped" in stopped.stdout
        assert (
            not alive(pid)
            and processes_with("kafka.Kafka", str(broker.root / "server.properties")) == []
        )
        assert not (home / "kafka" / "broker.json").exists()
        after = _lakehouse(home, port, "kafka", "status")
        assert after.returncode == 1 and "not running" in after.stdout
        not_again = _lakehouse(home, port, "kafka", "stop")
        assert not_again.returncode == 0 and "was not running" in not_again.stdout

        # Started again, on another port: the storage formatted once, its records kept.
        other = free_port()
        restarted = _lakehouse(home, other, "kafka", "start")
        assert restarted.returncode == 0, restarted.stderr
        assert broker.cluster_id() == cluster
        assert bootstrap_servers(settings) == f"127.0.0.1:{other}"
        assert metadata("127.0.0.1", other).cluster_id == cluster
        assert _round_trip(f"127.0.0.1:{other}", "checkins", []) == [b"first", b"second"]
    finally:
        broker.stop()
    assert processes_with("kafka.Kafka", str(broker.root / "server.properties")) == []


def test_a_taken_port_is_refused(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _lakehouse(tmp_path / "lakehouse", port, "kafka", "start")
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is taken" in proc.stderr
    assert "LAKEHOUSE_KAFKA_PORT" in proc.stderr


def test_the_sessions_broker_serves_clients(kafka_broker: Any) -> None:
    """The ``kafka_broker`` fixture (tests/conftest.py) other tests share."""
    topic = f"fixture-{uuid.uuid4().hex}"
    assert _round_trip(kafka_broker.bootstrap_servers, topic, [b"hello"]) == [b"hello"]
