"""Bronze from a Kafka broker: Spark's Kafka source, exactly once, against the real broker.

The broker is the test session's (``kafka_broker``): every test uses topics of its own.
"""

from __future__ import annotations

import io
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.errors import BrokerUnavailableError, ConfigError, DataLossError
from lakehouse.pipeline import reads, runner
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import free_port
from lakehouse.storage import read_arrow
from lakehouse.topics import bronze, kafka
from lakehouse.topics import produce as producing
from lakehouse.topics.landing import Producer, Record, default_partition
from lakes import lake_with, shipped_topic

pytestmark = pytest.mark.integration

INGEST_COLUMNS = ("_source_file", "_batch_id", "_ingested_at")


def _contract_text(kafka_topic: str, servers: str, partitions: int = 3, extra: str = "") -> str:
    return (
        "topic: payments\n"
        f"partitions: {partitions}\n"
        "key: {format: string, name: id}\n"
        "value: {format: json, fields: [{name: amount, type: long}]}\n"
        "stream: {name: payments_stream}\n"
        "tables: [{name: payment_totals, kind: aggregate, aggregations: "
        "[{name: total, fn: sum, field: amount}]}]\n"
        f"kafka: {{topic: {kafka_topic}, bootstrap_servers: '{servers}'{extra}}}\n"
    )


def _contract(lake: Settings) -> Contract:
    return Catalog.load(lake.contracts_dir).topic("payments")


def _bronze(lake: Settings, topic: str = "payments") -> list[dict[str, Any]]:
    rows = read_arrow(lake.bronze_path(topic)).to_pylist()
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def _records(start: int, n: int) -> list[Record]:
    return [
        Record(f"user-{i % 7}".encode(), json.dumps({"amount": i}).encode(), 1_700_000_000_000 + i)
        for i in range(start, start + n)
    ]


@pytest.fixture
def topic_name() -> str:
    return f"payments-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def lake(tmp_path: Path, kafka_broker: Any, topic_name: str) -> Settings:
    lake = lake_with(tmp_path, _contract_text(topic_name, kafka_broker.bootstrap_servers))
    err = io.StringIO()
    assert producing.create_topic(lake, _contract(lake), err) == 0
    assert "created, 3 partition(s)" in err.getvalue()
    return lake


def test_bronze_ingests_the_broker_exactly_once_with_the_sources_schema(
    spark: Any, lake: Settings, topic_name: str
) -> None:
    contract = _contract(lake)
    client = kafka.client(lake, contract)
    sent = kafka.Producer(client, 3).send_batch(_records(0, 30))
    # Keys land where a Java producer puts them (murmur2 of the key).
    for rec, meta in zip(_records(0, 30), sent, strict=True):
        assert rec.key is not None
        assert meta.partition == default_partition(rec.key, 3)

    first = bronze.ingest(spark, lake, contract)
    assert (first.batch_id, first.records, first.committed) == (0, 30, True)
    ends = {p: n for p, (_, n) in kafka.offsets(client, 3).items()}
    assert first.next_offsets == ends
    rows = _bronze(lake)
    assert [(r["partition"], r["offset"]) for r in rows] == sorted(
        (m.partition, m.offset) for m in sent
    )
    by_offset = {(m.partition, m.offset): rec for m, rec in zip(sent, _records(0, 30), strict=True)}
    for r in rows:
        rec = by_offset[(r["partition"], r["offset"])]
        assert (r["key"], r["value"], r["topic"]) == (rec.key, rec.value, topic_name)
        assert int(r["timestamp"].timestamp() * 1000) == rec.timestamp_ms
        assert (r["timestampType"], r["headers"], r["_source_file"]) == (0, [], None)
    # The consumer group mirrors bronze's position, for Kafka's own tools.
    assert kafka.group_offsets(client) == ends

    again = bronze.ingest(spark, lake, contract)
    assert again.batch_id is None
    assert "no new records on the broker" in again.summary()

    kafka.Producer(client, 3).send_batch(_records(30, 12))
    second = bronze.ingest(spark, lake, contract)
    assert (second.batch_id, second.records) == (1, 12)
    rows = _bronze(lake)
    assert len(rows) == 42
    assert len({(r["partition"], r["offset"]) for r in rows}) == 42
    assert sorted(json.loads(r["value"])["amount"] for r in rows) == list(range(42))

    out = io.StringIO()
    cli_rows = _lag(lake, out)
    assert {r["partition"]: r["lag"] for r in cli_rows} == {0: 0, 1: 0, 2: 0}


def _lag(lake: Settings, out: io.StringIO) -> list[dict[str, Any]]:
    import contextlib

    with contextlib.redirect_stdout(out):
        assert reads.lag(lake, Catalog.load(lake.contracts_dir), ["payments"], "json") == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    return [r for r in rows if r["topic"] == "payments"]


def test_a_partition_count_the_broker_disagrees_with_is_refused_before_any_data_moves(
    spark: Any, tmp_path: Path, kafka_broker: Any, lake: Settings, topic_name: str
) -> None:
    kafka.Producer(kafka.client(lake, _contract(lake)), 3).send_batch(_records(0, 5))
    wrong = lake_with(
        tmp_path / "wrong", _contract_text(topic_name, kafka_broker.bootstrap_servers, 2)
    )
    with pytest.raises(ConfigError, match=r"partitions is 2, but Kafka topic .* has 3"):
        bronze.ingest(spark, wrong, _contract(wrong))
    assert not wrong.bronze_path("payments").exists()

    missing = lake_with(
        tmp_path / "missing",
        _contract_text("nowhere-" + topic_name, kafka_broker.bootstrap_servers),
    )
    with pytest.raises(ConfigError, match=r"does not exist .*lakehouse create-topic payments"):
        bronze.ingest(spark, missing, _contract(missing))


def test_records_lost_to_retention_fail_the_run_unless_the_contract_accepts_the_loss(
    spark: Any, tmp_path: Path, kafka_broker: Any, lake: Settings, topic_name: str
) -> None:
    contract = _contract(lake)
    client = kafka.client(lake, contract)
    sent = kafka.Producer(client, 3).send_batch(
        [Record(b"k", json.dumps({"amount": i}).encode(), partition=0) for i in range(10)]
        + [Record(b"k", json.dumps({"amount": 100}).encode(), partition=1)]
    )
    assert [m.offset for m in sent] == [*range(10), 0]
    _delete_records(client, partition=0, before=6)  # what retention does to old segments

    with pytest.raises(
        DataLossError, match=r"\(partition 0: offsets 0\.\.5\); nothing was committed"
    ):
        bronze.ingest(spark, lake, contract)
    assert _bronze(lake) == []

    accepting = tmp_path / "accepting"
    shutil.copytree(lake.contracts_dir, accepting / "contracts")
    (accepting / "contracts" / "payments.yaml").write_text(
        _contract_text(topic_name, kafka_broker.bootstrap_servers, extra=", on_data_loss: record")
    )
    lake2 = Settings.from_env(lake.home, accepting / "contracts")
    result = bronze.ingest(spark, lake2, _contract(lake2))
    assert (result.records, result.lost) == (5, {0: (0, 6)})
    assert "offsets 0..5 of partition 0 lost to retention (recorded)" in result.summary()
    assert [(r["partition"], r["offset"]) for r in _bronze(lake2)] == [
        *((0, o) for o in range(6, 10)),
        (1, 0),
    ]
    gaps = read_arrow(lake2.gaps_path("payments")).to_pylist()
    assert [(g["topic"], g["partition"], g["first_offset"], g["last_offset"], g["records"])
            for g in gaps] == [("payments", 0, 0, 5, 6)]  # fmt: skip
    assert result.next_offsets == {0: 10, 1: 1, 2: 0}


def _delete_records(client: kafka.Client, partition: int, before: int) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": client.bootstrap_servers})
    futures = admin.delete_records([TopicPartition(client.topic, partition, before)])
    for f in futures.values():
        f.result(timeout=15)


# One shipped gold table of each kind: what the source could change in gold is the stream's
# rows, which every kind reads in its own way (by key, by window, by session, beside the other
# topic). The Airflow bucket test builds every shipped table (tests/e2e/test_airflow.py).
ONE_OF_EACH_KIND = (
    "user_latest_location",
    "user_location_counts",
    "checkins_5m",
    "user_sessions",
    "checkins_with_profile",
)


def test_the_shipped_pipeline_on_a_kafka_topic_builds_the_same_tables_as_on_landing_files(
    spark: Any, tmp_path: Path, kafka_broker: Any, topic_name: str
) -> None:
    """user-locations from the broker, user-profiles from landing files (its joins read both):
    every table equals the one built from landing files alone."""
    import yaml

    from lakehouse.topics import samples

    shipped = shipped_topic(tmp_path / "contracts", "user-locations", ONE_OF_EACH_KIND)
    shipped_topic(shipped, "user-profiles", ("user_profiles",))
    landing = Settings.from_env(tmp_path / "landing", shipped)
    contracts = tmp_path / "kafka-contracts"
    shutil.copytree(shipped, contracts)
    document = yaml.safe_load((contracts / "user-locations.yaml").read_text())
    del document["landing"]
    document["kafka"] = {
        "topic": topic_name,
        "bootstrap_servers": kafka_broker.bootstrap_servers,
    }
    (contracts / "user-locations.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    broker = Settings.from_env(tmp_path / "broker", contracts)
    catalog = {s: Catalog.load(s.contracts_dir) for s in (landing, broker)}
    locations = catalog[broker].topic("user-locations")
    producing.create_topic(broker, locations, io.StringIO())

    records = samples.seed_records(locations) + _check_ins(200)
    Producer(landing, "user-locations", 3).send_batch(records)
    kafka.Producer(kafka.client(broker, locations), 3).send_batch(records)
    for lake in (landing, broker):
        samples.produce_seed(lake, catalog[lake].topic("user-profiles"))
        runner.run(spark, lake, catalog[lake], echo=lambda _: None)

    def tables_of(lake: Settings) -> list[Path]:
        return sorted(
            p.parent.relative_to(lake.tables_root) for p in lake.tables_root.rglob("_delta_log")
        )

    tables = tables_of(landing)
    assert tables_of(broker) == tables
    assert {str(t) for t in tables} >= {
        "bronze/user-locations",
        "silver/user_locations",
        *(f"gold/{name}" for name in ONE_OF_EACH_KIND),
    }
    for table in tables:
        ours = _rows(broker.tables_root / table)
        theirs = _rows(landing.tables_root / table)
        if str(table) == "bronze/user-locations":
            assert {r["topic"] for r in ours} == {topic_name}
            ours = [{**r, "topic": "user-locations"} for r in ours]
        assert ours == theirs, table


def _check_ins(n: int) -> list[Record]:
    cities = ["Paris", "Lima", "Oslo", "Rome", None]
    return [
        Record(
            f"user{i % 11}".encode(),
            None if i % 29 == 0 else json.dumps({"location": cities[i % 5]}).encode(),
            1_700_000_600_000 + 1000 * i,
        )
        for i in range(n)
    ]


def _rows(path: Path) -> list[dict[str, Any]]:
    """A table's rows without what differs between two runs (ingest time, lineage)."""
    table = read_arrow(path)
    keep = [c for c in table.column_names if c not in INGEST_COLUMNS and not c.startswith("_")]
    rows = table.select(keep).to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_produce_writes_json_lines_to_the_broker_and_nothing_when_a_line_is_bad(
    lake: Settings, topic_name: str
) -> None:
    from lakehouse.errors import BadRecordError

    contract = _contract(lake)
    lines = [json.dumps({"key": f"u{i}", "value": {"amount": i}}) for i in range(6)]
    err = io.StringIO()
    assert producing.produce(lake, contract, io.StringIO("\n".join(lines) + "\n"), err) == 0
    assert err.getvalue().startswith("produced 6 record(s) to payments (")
    client = kafka.client(lake, contract)
    ends = kafka.offsets(client, 3)
    assert sum(end for _, end in ends.values()) == 6
    expected: dict[int, int] = {}
    for i in range(6):
        p = default_partition(f"u{i}".encode(), 3)
        expected[p] = expected.get(p, 0) + 1
    assert {p: end for p, (_, end) in ends.items() if end} == expected

    # A bad line is named, and nothing of the input reaches the broker.
    bad = io.StringIO(lines[0] + "\n" + '{"key": "u9", "value": ' + "\n")
    err = io.StringIO()
    with pytest.raises(BadRecordError, match="stdin line 2"):
        producing.produce(lake, contract, bad, err)
    assert err.getvalue().startswith("nothing produced to payments")
    assert sum(end for _, end in kafka.offsets(client, 3).values()) == 6


def test_only_committed_transactions_land_and_their_markers_count_as_offset_gaps(
    spark: Any, lake: Settings
) -> None:
    from confluent_kafka import Producer as Transactional

    contract = _contract(lake)
    client = kafka.client(lake, contract)
    producer = Transactional(
        {"bootstrap.servers": client.bootstrap_servers, "transactional.id": "test-" + client.topic}
    )
    producer.init_transactions(15)
    for amounts, commit in (([1, 2, 3, 4, 5], True), ([66, 77, 88], False), ([9, 10], True)):
        producer.begin_transaction()
        for a in amounts:
            producer.produce(client.topic, json.dumps({"amount": a}).encode(), b"k", partition=0)
        if commit:
            producer.commit_transaction(15)
        else:
            producer.flush(15)  # on the broker before the abort (an abort drops unsent records)
            producer.abort_transaction(15)
    producer.flush(15)
    del producer
    # offsets: 0-4, commit marker 5, 6-8 aborted, abort marker 9, 10-11, commit marker 12. The
    # broker writes a commit's marker after answering the commit: until then the last stable
    # offset (the end a committed-only read stops at) is still before the transaction.
    deadline = time.monotonic() + 15
    while kafka.offsets(client, 3)[0] != (0, 13):
        assert time.monotonic() < deadline, kafka.offsets(client, 3)
        time.sleep(0.1)

    result = bronze.ingest(spark, lake, contract)
    assert [json.loads(r["value"])["amount"] for r in _bronze(lake)] == [1, 2, 3, 4, 5, 9, 10]
    assert [r["offset"] for r in _bronze(lake)] == [0, 1, 2, 3, 4, 10, 11]
    assert (result.records, result.gaps, result.next_offsets[0]) == (7, {0: 6}, 13)
    assert "offset gaps: 6 ({0: 6})" in result.summary()


def test_a_dry_run_names_the_offsets_it_would_read_and_changes_nothing(lake: Settings) -> None:
    contract = _contract(lake)
    kafka.Producer(kafka.client(lake, contract), 3).send_batch(
        [Record(b"k", b'{"amount": 1}', partition=1)] * 4
    )
    line = bronze.plan(lake, contract)
    assert line.startswith("bronze payments (dry run): would read Kafka topic payments-")
    assert line.endswith("into bronze.payments as one batch: partition 1: offsets 0..3")
    assert not lake.bronze_path("payments").exists()


def test_an_unreachable_broker_fails_the_ingest_in_bounded_time_and_commits_nothing(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens at the contract's servers: the ingest fails within the client's timeout,
    naming the servers and saying how to start the local broker, before the table exists. With
    no servers in the contract, the lakehouse's own broker not running fails it at once."""
    servers = f"127.0.0.1:{free_port()}"
    lake = lake_with(tmp_path / "servers", _contract_text("payments", servers))
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError) as info:
        bronze.ingest(spark, lake, _contract(lake))
    took = time.monotonic() - started
    print(f"unreachable broker: {type(info.value).__name__} after {took:.1f} s")
    assert took < kafka.TIMEOUT_S + 5
    assert f"the broker at {servers} did not answer" in str(info.value)
    assert "nothing was read or committed" in str(info.value)
    assert "lakehouse kafka start" in str(info.value)
    assert not lake.bronze_path("payments").exists()

    monkeypatch.delenv(kafka.BOOTSTRAP_ENV, raising=False)
    text = _contract_text("payments", servers).replace(f", bootstrap_servers: '{servers}'", "")
    local = lake_with(tmp_path / "local", text)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="start it with `lakehouse kafka start`"):
        bronze.ingest(spark, local, _contract(local))
    assert time.monotonic() - started < 2
    assert not local.bronze_path("payments").exists()
