"""Bronze ingest from a Kafka broker: Kafka topic -> bronze Delta table.

    python bench/kafka_bronze.py [--records 10000000]

Input: ~300-byte check-in values over 12 partitions, produced to a local single-node broker
(``lakehouse.runtime.broker``, its own folder and port) with confluent-kafka. Each path runs in its own
process, on the same topic, into its own table:

* ours: ``bronze.ingest`` of a Kafka-sourced contract (one bounded batch read with Spark's Kafka
  source from bronze's position to the end offsets read at planning, appended with delta-spark
  in one Delta commit carrying the position, the consumer group updated after).
* peer: what Delta's and Spark's documentation teach: Structured Streaming from the Kafka source
  (``startingOffsets=earliest``) into a Delta sink with ``Trigger.AvailableNow`` and a
  checkpoint, the same columns selected.

Both sessions are started and warmed on a tiny topic first; the figure is the ingest itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, report, run_worker, tree_peak_rss_mib

TOPIC = "bench-kafka"
WARM = "bench-kafka-warmup"
PARTITIONS = 12
CONTRACT = """\
topic: {topic}
partitions: {partitions}
key: {{format: string, name: username}}
value: {{format: json, fields: [{{name: location, type: string}}, {{name: note, type: string}}]}}
stream: {{name: {stream}}}
kafka: {{bootstrap_servers: '{servers}'}}
"""
COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


def _settings(work: Path) -> object:
    from lakehouse.runtime.config import Settings

    return Settings.from_env(work / "home", work / "contracts")


def _servers(work: Path) -> str:
    return (work / "servers").read_text()


def produce(servers: str, topic: str, records: int) -> float:
    """Produce ``records`` check-ins to ``topic``; the seconds it took."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": servers,
            "partitioner": "murmur2_random",
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    note = "x" * 240
    cities = ["Paris", "Lima", "Oslo", "Rome", "Sydney", "Berlin", "Madrid"]
    started = time.perf_counter()
    for i in range(records):
        value = json.dumps({"location": cities[i % 7], "note": f"{i:012d}{note}"}).encode()
        while True:
            try:
                producer.produce(topic, value, f"user{i % 100_003}".encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} record(s) were not acknowledged")
    return time.perf_counter() - started


def prepare(work: Path, records: int) -> None:
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.topics import produce as producing

    contracts = work / "contracts"
    contracts.mkdir(parents=True)
    servers = _servers(work)
    for topic, stream in ((TOPIC, "bench_kafka"), (WARM, "bench_kafka_warmup")):
        text = CONTRACT.format(topic=topic, partitions=PARTITIONS, stream=stream, servers=servers)
        (contracts / f"{topic}.yaml").write_text(text)
    settings = _settings(work)
    catalog = Catalog.load(contracts)
    for topic in (TOPIC, WARM):
        producing.create_topic(settings, catalog.topic(topic), sys.stderr)  # type: ignore[arg-type]
    produce(servers, WARM, 1000)
    seconds = produce(servers, TOPIC, records)
    print(f"(produced {records} records to the broker in {seconds:.1f} s)")


def worker_ours(work: Path) -> dict[str, float]:
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.runtime.spark import get_session
    from lakehouse.topics import bronze

    settings = _settings(work)
    catalog = Catalog.load(settings.contracts_dir)  # type: ignore[attr-defined]
    spark = get_session("local[*]", app_name="bench-kafka-bronze")
    started = time.perf_counter()
    bronze.ingest(spark, settings, catalog.topic(WARM))  # type: ignore[arg-type]
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    result = bronze.ingest(spark, settings, catalog.topic(TOPIC))  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    peak = tree_peak_rss_mib()
    rows = spark.read.format("delta").load(str(settings.bronze_path(TOPIC))).count()  # type: ignore[attr-defined]
    spark.stop()
    assert rows == result.records, (rows, result.records)
    return {"seconds": elapsed, "records": rows, "warmup": warmup, "peak_mib": peak}


def worker_peer(work: Path) -> dict[str, float]:
    from lakehouse.runtime.spark import get_session

    spark = get_session("local[*]", app_name="bench-kafka-peer")
    servers = _servers(work)

    def ingest(topic: str) -> float:
        started = time.perf_counter()
        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", servers)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .load()
            .select(*COLUMNS)
            .writeStream.format("delta")
            .option("checkpointLocation", str(work / "peer" / topic / "_checkpoint"))
            .trigger(availableNow=True)
            .start(str(work / "peer" / topic / "table"))
        )
        query.awaitTermination()
        return time.perf_counter() - started

    warmup = ingest(WARM)
    elapsed = ingest(TOPIC)
    peak = tree_peak_rss_mib()
    rows = spark.read.format("delta").load(str(work / "peer" / TOPIC / "table")).count()
    spark.stop()
    return {"seconds": elapsed, "records": rows, "warmup": warmup, "peak_mib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, work = args.worker
        fn = {"ours": worker_ours, "peer": worker_peer}[kind]
        print(json.dumps(fn(Path(work))))
        return

    from lakehouse.runtime.broker import Broker
    from lakehouse.runtime.process import free_port

    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker = Broker(work / "kafka")
    try:
        status = broker.start(free_port())
        assert status.bootstrap_servers is not None
        (work / "servers").write_text(status.bootstrap_servers)
        prepare(work, args.records)
        ours = run_worker(Path(__file__), "--worker", "ours", str(work))
        peer = run_worker(Path(__file__), "--worker", "peer", str(work))
        assert ours["records"] == peer["records"] == args.records, (ours, peer)
        cores = os.cpu_count() or 1
        n = args.records
        peer_name = "Structured Streaming Kafka -> Delta, AvailableNow"
        figures = [
            Figure(
                "kafka_bronze.ingest.records_per_s_per_core",
                n / ours["seconds"] / cores,
                "records/s/core",
                peer_name,
                n / peer["seconds"] / cores,
            ),
            Figure(
                "kafka_bronze.ingest.peak_memory",
                ours["peak_mib"],
                "MiB",
                peer_name,
                peer["peak_mib"],
                higher_is_better=False,
            ),
        ]
        report(figures, "kafka_bronze", {"records": n, "cores": cores, "partitions": PARTITIONS})
        print(
            f"(warm-up ingests of 1000 records, not counted: ours {ours['warmup']:.1f} s, "
            f"peer {peer['warmup']:.1f} s; goal: ratio >= 1.0 and >= 200000 records/s/core)"
        )
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
