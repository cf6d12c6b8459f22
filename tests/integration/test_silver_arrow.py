"""Silver's Arrow decoder (lakehouse.streams_arrow) against Spark's, record by record.

The Arrow path may refuse any record (the batch then goes to Spark's decoder); what it must never
do is accept a record Spark's decoder quarantines, or decode one differently. A hand-picked corpus
of edge cases and a few hundred generated values are decoded both ways and compared.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_silver_decode import AVRO_VALUE, JSON_VALUE, V1, V2, _avro  # a sibling module

from lakehouse import streams, streams_arrow
from lakehouse.config import Settings
from lakehouse.contracts import Contract, parse_contract

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BRONZE = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
FIELDS = JSON_VALUE["fields"]  # every field type, one of them required

EDGE_VALUES: list[bytes | None] = [
    b'{"name":"a","age":3,"score":2,"active":true,"seen":"2026-01-02T03:04:05Z","visits":1}',
    b'{"name": "a", "age": -2147483648, "visits": 9223372036854775807}',
    b'{"name":"a","visits":-9223372036854775808,"score":-0.0}',
    b'{"name":"a","age":2147483648}',
    b'{"name":"a","visits":9223372036854775808}',
    b'{"name":"a","score":1e308}',
    b'{"name":"a","score":1e400}',
    b'{"name":"a","score":NaN}',
    b'{"name":"a","score":Infinity}',
    b'{"name":"a","score":"NaN"}',
    b'{"name":"a","score":2.0000000000000000001}',
    b'{"name":"a","score":5e-324}',
    b'{"name":"a","age":1.0}',
    b'{"name":"a","age":1e2}',
    b'{"name":"a","age":"1"}',
    b'{"name":"a","age":01}',
    b'{"name":"a","age":-0}',
    b'{"name":"a","active":1}',
    b'{"name":"a","active":"true"}',
    b'{"name":"a","active":null}',
    b'{"name":5}',
    b'{"name":true}',
    b'{"name":{"x":1}}',
    b'{"name":[1]}',
    b'{"name":"5"}',
    b'{"name":"{\\"x\\":1}"}',
    b'{"name":"true"}',
    b'{"name":"caf\\u00e9 \\ud83d\\ude00"}',
    b'{"name":"\\ud800"}',
    b'{"name":"\\u0000"}',
    b'{"name":"tab\there"}',
    b'{"name":"esc \\" \\\\ \\/ \\b \\f \\n \\r \\t"}',
    '{"name":"caf\u00e9 \u4e2d"}'.encode(),
    b'{"name":"\xff"}',
    b'{"name":"a","name":"b"}',
    b'{"Name":"a"}',
    b'{"name":"a","NAME":"b"}',
    b'{"name":"a","extra":{"deep":[1,{"x":null}]}}',
    b'{"name":"a",}',
    b"{'name':'a'}",
    b'{"name":"a"}{"name":"b"}',
    b'{"name":"a"} {"name":"b"}',
    b'{"name":"a"}null',
    b' {"name":"a"}',
    b'{"name":"a"} ',
    b'{"name":"a"}\n',
    b'{\n"name":"a"}',
    b'{"name":\r"a"}',
    b"{}",
    b'{"name":null}',
    b"null",
    b"[]",
    b'"a"',
    b"5",
    b"",
    b"   ",
    b'{"name":"a"',
    b'{"name":"a","seen":"2026-01-02T03:04:05.123456Z"}',
    b'{"name":"a","seen":"2026-01-02T03:04:05.1+02:00"}',
    b'{"name":"a","seen":"2026-01-02T03:04:05-07:30"}',
    b'{"name":"a","seen":"2026-01-02T03:04:05"}',
    b'{"name":"a","seen":"2026-01-02 03:04:05Z"}',
    b'{"name":"a","seen":"2026-01-02"}',
    b'{"name":"a","seen":"2026-02-30T00:00:00Z"}',
    b'{"name":"a","seen":"2026-01-02T25:00:00Z"}',
    b'{"name":"a","seen":"2026-01-02T03:04:05.1234567Z"}',
    b'{"name":"a","seen":1767225600}',
    b'{"name":"a","seen":"not a time"}',
    b'{"name":"a","seen":"0001-01-01T00:00:00Z"}',
    b'{"name":"a","seen":"9999-12-31T23:59:59.999999Z"}',
    None,
]
EDGE_KEYS: list[bytes | None] = [b"k", None, b"", b"\xff", "cl\u00e9".encode(), b"a b"]


def _random_value(rng: random.Random) -> bytes | None:
    """A value of the contract's shape; now and then a field is off, or the bytes are damaged."""
    fits: dict[str, list[Any]] = {
        "name": ["a", "", "x" * 40, "7", "true", "{}", "caf\u00e9", "\U0001f600"],
        "age": [0, 7, -3, 2**31 - 1, None],
        "score": [0, 1.5, -2.25, 1e300, 3, None],
        "active": [True, False, None],
        "seen": ["2026-03-04T05:06:07Z", "2026-03-04T05:06:07.5+01:00", None],
        "visits": [0, 1, -5, 2**62, None],
    }
    off: dict[str, list[Any]] = {
        "name": [5, None, True, {"a": 1}, [1]],
        "age": [2**31, 1.5, "3", True, 10**20],
        "score": ["x", False, "1.5"],
        "active": [0, "yes"],
        "seen": ["2026-03-04T05:06:07", "yesterday", 12],
        "visits": [2**63, 0.5, "9"],
    }
    if rng.random() < 0.03:
        return None
    doc = {
        k: rng.choice(off[k] if rng.random() < 0.04 else fits[k])
        for k in fits
        if k == "name" or rng.random() < 0.9
    }
    if rng.random() < 0.2:
        doc["other"] = rng.choice([1, "x", [1, 2], {"n": None}])
    text = json.dumps(doc, separators=rng.choice([(",", ":"), (", ", ": ")]), ensure_ascii=False)
    raw = text.encode()
    if rng.random() < 0.05:  # a damaged record: cut short, or a byte replaced
        cut = rng.randrange(len(raw))
        raw = (
            raw[:cut]
            if rng.random() < 0.5
            else raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1 :]
        )
    return raw


def _contract(event_time: str | None = None, fields: list[dict[str, Any]] = FIELDS) -> Contract:
    doc: dict[str, Any] = {
        "topic": "t",
        "key": {"format": "string", "name": "id"},
        "value": {"format": "json", "fields": fields},
        "stream": {"name": "t_stream"},
    }
    if event_time is not None:
        doc["event_time"] = event_time
    return parse_contract(doc, "t.yaml")


def _bronze_arrow(pairs: list[tuple[bytes | None, bytes | None]]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([k for k, _ in pairs], pa.binary()),
            "value": pa.array([v for _, v in pairs], pa.binary()),
            "partition": pa.array([0] * len(pairs), pa.int32()),
            "offset": pa.array(range(len(pairs)), pa.int64()),
            "timestamp": pa.array([T0] * len(pairs), pa.timestamp("us", tz="UTC")),
        }
    )


def _spark_rows(spark: Any, contract: Contract, pairs: list[Any]) -> list[dict[str, Any]]:
    rows = [(k, v, "t", 0, i, T0) for i, (k, v) in enumerate(pairs)]
    decoded = streams.decode(spark.createDataFrame(rows, BRONZE), contract)
    from pyspark.sql import functions as F

    good = F.col("_reason").isNull()
    # A quarantined record's columns may hold text that is not UTF-8: only its reason counts.
    columns = [
        F.when(good, F.col(f.name)).alias(f.name) for f in streams.stream_schema(contract).fields
    ]
    return decoded.orderBy("offset").select(*columns, "_reason").toArrow().to_pylist()


def _compare(spark: Any, contract: Contract, pairs: list[Any]) -> tuple[int, int]:
    """Each record decoded alone by Arrow and in one batch by Spark: Arrow refuses every record
    Spark quarantines and gives the very row Spark gives for every record it accepts. Returns
    (accepted, refused) by Arrow."""
    spec = streams_arrow.spec(contract)
    assert spec is not None
    expected = _spark_rows(spark, contract, pairs)
    accepted = refused = 0
    for i, want in enumerate(expected):
        reason = want.pop("_reason")
        try:
            (got,) = streams_arrow.decode(_bronze_arrow([pairs[i]]), spec).to_pylist()
        except streams_arrow.Unclean:
            refused += 1
            continue
        accepted += 1
        assert reason is None, f"Arrow accepted {pairs[i]!r}, which Spark quarantines: {reason}"
        got["offset"] = i
        assert got == want, f"{pairs[i]!r}: Arrow {got} != Spark {want}"
    return accepted, refused


@pytest.mark.parametrize("event_time", [None, "seen", "visits"])
def test_edge_cases_decode_as_spark_does_or_not_at_all(spark: Any, event_time: str | None) -> None:
    contract = _contract(event_time)
    pairs = [(b"k", v) for v in EDGE_VALUES] + [(k, b'{"name":"a"}') for k in EDGE_KEYS]
    accepted, refused = _compare(spark, contract, pairs)
    # Not vacuous: most clean records take the fast path, and the damaged ones are refused.
    assert accepted >= 25 and refused >= 30


def test_generated_values_decode_as_spark_does_or_not_at_all(spark: Any) -> None:
    rng = random.Random(20261123)
    pairs = [(b"k%d" % i, _random_value(rng)) for i in range(400)]
    accepted, refused = _compare(spark, _contract("seen"), pairs)
    assert accepted >= 150 and refused >= 40


def test_string_values_decode_as_spark_does(spark: Any) -> None:
    contract = parse_contract(
        {
            "topic": "t",
            "key": {"format": "string", "name": "id"},
            "value": {"format": "string", "name": "line"},
            "stream": {"name": "t_stream"},
        },
        "t.yaml",
    )
    pairs = [(b"k", b"hello {world}"), (b"k", b""), (b"k", None), (None, "\u00e9".encode())]
    assert _compare(spark, contract, pairs) == (4, 0)
    assert _compare(spark, contract, [(b"k", b"\xc3\x28")]) == (0, 1)


def test_one_unclean_record_refuses_the_whole_batch() -> None:
    spec = streams_arrow.spec(_contract())
    assert spec is not None
    good = [(b"k", b'{"name":"a%d"}' % i) for i in range(100)]
    assert streams_arrow.decode(_bronze_arrow(good), spec).num_rows == 100
    for bad in (b'{"name":5}', b'{"age":1}', b'{"name":"a"} ', b"{"):
        with pytest.raises(streams_arrow.Unclean):
            streams_arrow.decode(_bronze_arrow([*good, (b"k", bad)]), spec)


def test_formats_it_does_not_decode_are_left_to_spark() -> None:
    json_key = parse_contract(
        {
            "topic": "t",
            "key": {"format": "json", "name": "id", "type": "long"},
            "value": {"format": "json", "fields": FIELDS},
            "stream": {"name": "t_stream"},
        },
        "t.yaml",
    )
    assert streams_arrow.spec(json_key) is None  # JSON keys
    assert streams_arrow.spec(_contract()) is not None


# -- through the silver job ----------------------------------------------------------------------


def _lake(tmp_path: Path, contract_yaml: str) -> Settings:
    contracts = tmp_path / "contracts"
    contracts.mkdir(parents=True)
    (contracts / "t.yaml").write_text(contract_yaml)
    return Settings.from_env(tmp_path / "home", contracts)


CONTRACT = """
topic: t
partitions: 2
key: {format: string, name: id}
value:
  format: json
  fields:
    - {name: name, type: string, nullable: false}
    - {name: visits, type: long}
stream: {name: t_stream}
"""


def _bronze_batch(spark: Any, lake: Settings, values: list[bytes | None]) -> None:
    from lakehouse.storage import DeltaStore

    rows = [(b"k%d" % (i % 7), v, "t", i % 2, i, T0) for i, v in enumerate(values)]
    df = spark.createDataFrame(rows, BRONZE)
    DeltaStore(spark).append(df, lake.bronze_path("t"))


def _silver(lake: Settings) -> list[dict[str, Any]]:
    from lakehouse.storage.store import read_arrow

    return read_arrow(lake.silver_path("t_stream")).sort_by("offset").to_pylist()


def _data_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("*.parquet")}


@pytest.mark.parametrize("in_tasks", [False, True])
def test_a_clean_batch_is_written_by_arrow_as_spark_would_write_it(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_tasks: bool
) -> None:
    from lakehouse.contracts import load_contract

    if in_tasks:  # the driver's threshold at zero: the batch goes to Spark's Python tasks
        monkeypatch.setenv("LAKEHOUSE_SILVER_DRIVER_MB", "0")
    values = [b'{"name":"n%d","visits":%d}' % (i, i) for i in range(50)] + [None]
    arrow_lake = _lake(tmp_path / "arrow", CONTRACT)
    _bronze_batch(spark, arrow_lake, values)
    contract = load_contract(arrow_lake.contracts_dir / "t.yaml")
    result = streams.build(spark, arrow_lake, contract)
    assert (result.decoder, result.records, result.committed) == ("arrow", 51, True)
    again = streams.build(spark, arrow_lake, contract)
    assert again.source_versions is None  # consumed position committed with the rows

    # The same batch through Spark's decoder (a contract this path refuses: a quarantine rule).
    spark_lake = _lake(tmp_path / "spark", CONTRACT)
    _bronze_batch(spark, spark_lake, values)
    monkeypatch.setattr(streams_arrow, "spec", lambda c: None)
    other = streams.build(spark, spark_lake, contract)
    assert other.decoder == "spark"
    assert _silver(arrow_lake) == _silver(spark_lake)


def test_a_batch_with_a_bad_record_goes_to_spark_and_leaves_no_staged_file(
    spark: Any, tmp_path: Path
) -> None:
    from lakehouse.contracts import load_contract
    from lakehouse.storage.store import read_arrow

    lake = _lake(tmp_path, CONTRACT)
    values = [b'{"name":"n%d","visits":%d}' % (i, i) for i in range(50)] + [b'{"visits":"x"}']
    _bronze_batch(spark, lake, values)
    contract = load_contract(lake.contracts_dir / "t.yaml")
    result = streams.build(spark, lake, contract)
    assert (result.decoder, result.records, result.quarantined) == ("spark", 50, 1)
    assert result.why_not_arrow is not None and "visits" in result.why_not_arrow
    assert "decoded by Spark" in result.summary()
    silver = lake.silver_path("t_stream")
    committed = {Path(u).name for u in _delta_files(silver)}
    assert _data_files(silver) == committed  # the Arrow attempt's files are gone
    reasons = read_arrow(lake.quarantine_path("silver", "t_stream")).column("reason")
    assert reasons.to_pylist() == ["field 'visits' should be a long, found a JSON string"]


def _delta_files(path: Path) -> list[str]:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).file_uris()


@pytest.mark.parametrize("key_format", ["string", "avro"])
def test_avro_decodes_as_spark_does_or_not_at_all(spark: Any, key_format: str) -> None:
    key: dict[str, Any] = {"format": "string", "name": "id"}
    if key_format == "avro":
        key = {"format": "avro", "name": "id", "schemas": [{"id": 3, "schema": "long"}]}
    doc = {"topic": "t", "key": key, "value": AVRO_VALUE, "stream": {"name": "t_stream"}}
    if key_format == "avro":  # and the event time from an Avro timestamp field
        doc["event_time"] = "at"
    contract = parse_contract(doc, "t.yaml")
    at = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    v1 = _avro(7, V1, {"name": "Al", "age": 3, "at": at})
    v2 = _avro(8, V2, {"name": "Bo", "age": None, "at": at, "email": "bo@example.com"})
    k = _avro(3, "long", 12) if key_format == "avro" else b"k"
    clean = [(k, v1), (k, v2), (None, v2), (k, None)]
    assert _compare(spark, contract, clean) == (4, 0)
    bad_key = (b"\x00\x00\x00\x00\x04\x02", v1) if key_format == "avro" else (b"\xff", v1)
    unclean = [
        (k, b"\x00\x00\x00\x00\x09" + v1[5:]),  # unknown schema id
        (k, v2[:-3]),  # truncated
        (k, v1 + b"\x00"),  # bytes after the record
        (k, b"\x01" + v1[1:]),  # not the magic byte
        bad_key,
    ]
    assert _compare(spark, contract, unclean) == (0, 5)
    spec = streams_arrow.spec(contract)
    assert spec is not None
    with pytest.raises(streams_arrow.Unclean, match="unknown Avro schema id 9"):
        streams_arrow.decode(_bronze_arrow([*clean, unclean[0]]), spec)


def test_the_driver_threshold_is_a_whole_number_of_mb(monkeypatch: pytest.MonkeyPatch) -> None:
    from lakehouse.errors import ConfigError

    assert streams.driver_decode_bytes() == 16 << 20
    monkeypatch.setenv("LAKEHOUSE_SILVER_DRIVER_MB", "0")
    assert streams.driver_decode_bytes() == 0
    monkeypatch.setenv("LAKEHOUSE_SILVER_DRIVER_MB", "lots")
    with pytest.raises(ConfigError, match="LAKEHOUSE_SILVER_DRIVER_MB must be a whole number"):
        streams.driver_decode_bytes()
