"""Bronze ingest: both landing formats, re-delivery, offset gaps, bad segments, lag."""

from __future__ import annotations

import gzip
import io
import json
import shutil
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import ConfigError
from lakehouse.pipeline import reads
from lakehouse.runtime.config import Settings
from lakehouse.storage import read_arrow
from lakehouse.topics import bronze
from lakehouse.topics import produce as producing
from lakehouse.topics.bronze_table import BronzeResult
from lakes import lake_with, produce

pytestmark = pytest.mark.integration

CONTRACTS = {
    "t": """\
        topic: t
        partitions: 2
        landing: {format: envelope, max_record_bytes: 300}
        key: {format: string, name: k}
        value: {format: json, fields: [{name: v, type: long}]}
        stream: {name: t_stream}
        """,
    "c": """\
        topic: c
        partitions: 2
        landing: {format: connect_json}
        key: {format: string, name: k}
        value: {format: json, fields: [{name: v, type: long}]}
        stream: {name: c_stream}
        """,
}


BAD_UTF8 = b'{"offset": 2, "key": "\xff", "value": "x"}'
BAD_UTF8_AT = BAD_UTF8.index(b"\xff")


@pytest.fixture
def lake(tmp_path: Path) -> Settings:
    """A lakehouse with the contracts above."""
    return lake_with(tmp_path, *(dedent(text) for text in CONTRACTS.values()))


def _ingest(spark: Any, lake: Settings, topic: str) -> BronzeResult:
    return bronze.ingest(spark, lake, Catalog.load(lake.contracts_dir).topic(topic))


def _produce(lake: Settings, n: int, start: int = 0, partition: int = 0) -> None:
    """Records k<i>: {"v": i} (compact JSON) for i from ``start``, ``n`` of them."""
    compact = [
        (f"k{i}", json.dumps({"v": i}, separators=(",", ":")).encode())
        for i in range(start, start + n)
    ]
    produce(lake, "t", compact, partition=partition)


def _bronze(lake: Settings, topic: str = "t") -> list[dict[str, Any]]:
    return read_arrow(lake.bronze_path(topic)).to_pylist()


def _segment(lake: Settings, topic: str, partition: int, start: int, ext: str = "json") -> Path:
    folder = lake.topic_dir(topic) / f"partition={partition}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{topic}+{partition}+{start:010d}.{ext}"


def _envelopes(*offsets: int) -> bytes:
    return b"".join(
        json.dumps(
            {"offset": o, "timestamp": 1_700_000_000_000, "key": f"k{o}", "value": str(o)}
        ).encode()
        + b"\n"
        for o in offsets
    )


def test_envelope_records_land_with_the_kafka_schema(spark: Any, lake: Settings) -> None:
    _produce(lake, 3)
    result = _ingest(spark, lake, "t")
    assert result.committed and result.records == 3 and result.next_offsets == {0: 3}
    rows = sorted(_bronze(lake), key=lambda r: r["offset"])
    assert [(r["key"], r["value"], r["partition"], r["offset"]) for r in rows] == [
        (b"k0", b'{"v":0}', 0, 0),
        (b"k1", b'{"v":1}', 0, 1),
        (b"k2", b'{"v":2}', 0, 2),
    ]
    from deltalake import DeltaTable

    names = [f.name for f in DeltaTable(str(lake.bronze_path("t"))).schema().fields]
    assert names == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers",
        "_source_file", "_batch_id", "_ingested_at",
    ]  # fmt: skip
    assert _ingest(spark, lake, "t").batch_id is None  # nothing new: no batch at all


def test_connect_json_values_and_keys(spark: Any, lake: Settings) -> None:
    seg = _segment(lake, "c", 1, 10)
    seg.write_bytes(b'{"v":1}\nnull\n{"v":3}\n')
    seg.with_name("c+1+0000000010.keys.json").write_bytes(b'"a"\n"b"\n"c"\n')
    result = _ingest(spark, lake, "c")
    assert result.records == 3 and result.next_offsets == {1: 13}
    rows = sorted(_bronze(lake, "c"), key=lambda r: r["offset"])
    assert [(r["key"], r["value"], r["offset"]) for r in rows] == [
        (b"a", b'{"v":1}', 10), (b"b", None, 11), (b"c", b'{"v":3}', 12)
    ]  # fmt: skip


def test_redelivered_records_land_once(spark: Any, lake: Settings) -> None:
    _produce(lake, 5)
    original = _segment(lake, "t", 0, 0)
    # The same segment delivered again, compressed, in the same batch.
    _segment(lake, "t", 0, 0, "json.gz").write_bytes(gzip.compress(original.read_bytes()))
    first = _ingest(spark, lake, "t")
    assert first.records == 5 and first.duplicates == 5
    # Later, a file that overlaps what bronze has (3, 4) and brings new offsets (5, 6, 7).
    _segment(lake, "t", 0, 3).write_bytes(_envelopes(3, 4, 5, 6, 7))
    second = _ingest(spark, lake, "t")
    assert second.records == 3 and second.next_offsets[0] == 8
    offsets = sorted(r["offset"] for r in _bronze(lake))
    assert offsets == list(range(8))
    assert _ingest(spark, lake, "t").batch_id is None  # nothing is read twice


def test_offset_gaps_are_allowed_and_reported(spark: Any, lake: Settings) -> None:
    _segment(lake, "t", 1, 0).write_bytes(_envelopes(0, 1, 4))
    result = _ingest(spark, lake, "t")
    assert result.records == 3 and result.gaps == {1: 2} and result.next_offsets == {1: 5}
    assert "offset gaps: 2" in result.summary()


def test_bad_segments_are_quarantined_once_and_good_records_land(
    spark: Any, lake: Settings
) -> None:
    _segment(lake, "t", 0, 0).write_bytes(
        _envelopes(0) + b"not json\n" + BAD_UTF8 + b"\n"
        + json.dumps({"offset": 3, "key": "big", "value": "x" * 400}).encode() + b"\n"
        + _envelopes(4) + b'{"offset": 5, "key": "cut'
    )  # fmt: skip
    _segment(lake, "t", 1, 0).write_bytes(b"")  # zero bytes
    packed = gzip.compress(_envelopes(*range(100, 200)))
    _segment(lake, "t", 1, 100, "json.gz").write_bytes(packed[: len(packed) // 2])  # truncated
    result = _ingest(spark, lake, "t")
    bad = read_arrow(lake.quarantine_path("bronze", "t")).to_pylist()
    assert result.quarantined == len(bad)
    by_reason = sorted(
        (Path(r["source_file"]).name, r["line"] or 0, r["reason"].split(":")[0]) for r in bad
    )
    assert by_reason == sorted(
        [
            ("t+0+0000000000.json", 2, "not JSON"),
            ("t+0+0000000000.json", 3, f"invalid UTF-8 at byte {BAD_UTF8_AT} of the line"),
            ("t+0+0000000000.json", 4, "oversized record"),
            ("t+0+0000000000.json", 6, "truncated line (the file ends without a newline)"),
            ("t+1+0000000000.json", 0, "empty segment file (zero bytes)"),
            ("t+1+0000000100.json.gz", 0, "truncated gzip stream (no end marker)"),
            *[
                ("t+1+0000000100.json.gz", r["line"], "line cut off by the damaged gzip stream")
                for r in bad
                if r["reason"].startswith("line cut off")
            ],
        ]
    )
    assert all(r["byte_offset"] is not None for r in bad if r["line"] is not None)
    landed = sorted((r["partition"], r["offset"]) for r in _bronze(lake))
    salvaged = [o for p, o in landed if p == 1]
    assert [o for p, o in landed if p == 0] == [0, 4]
    assert salvaged == list(range(100, 100 + len(salvaged))) and salvaged
    # The next run neither re-reads nor re-counts those files.
    assert _ingest(spark, lake, "t").batch_id is None
    assert len(read_arrow(lake.quarantine_path("bronze", "t"))) == len(bad)


def test_lag_per_partition(spark: Any, lake: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    def lag() -> list[tuple[int, int, int, int]]:
        capsys.readouterr()
        catalog = Catalog.load(lake.contracts_dir)
        assert reads.lag(lake, catalog, ["t"], "json") == 0
        rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        return [(r["partition"], r["end_offset"], r["bronze_offset"], r["lag"]) for r in rows]

    _produce(lake, 5, partition=0)
    assert lag() == [(0, 5, 0, 5), (1, 0, 0, 0)]
    _ingest(spark, lake, "t")
    _produce(lake, 3, start=5, partition=1)
    assert lag() == [(0, 5, 5, 0), (1, 3, 0, 3)]


def test_producer_refuses_connect_topics(
    lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = Catalog.load(lake.contracts_dir)
    with pytest.raises(ConfigError, match="lands as connect_json files"):
        producing.produce(
            lake, catalog.topic("c"), io.StringIO('{"key": "a", "value": 1}\n'), io.StringIO()
        )
    assert not lake.topic_dir("c").exists() or not any(lake.topic_dir("c").rglob("*.json"))
    shutil.rmtree(lake.home, ignore_errors=True)


def test_files_that_are_not_segments_are_reported_by_the_run_and_by_lag(
    spark: Any, lake: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    _produce(lake, 3)
    stray = lake.topic_dir("t") / "partition=0" / "t+0+0000000003.avro"
    stray.write_bytes(b"Obj\x01")
    result = _ingest(spark, lake, "t")
    assert result.records == 3
    assert result.summary().endswith(
        "; 1 file(s) in the landing folder not read: partition=0/t+0+0000000003.avro "
        "(a format bronze does not read (.avro); segments are JSON lines)"
    )
    # Still reported when there is nothing new to read.
    assert "not read: partition=0/t+0+0000000003.avro" in _ingest(spark, lake, "t").summary()
    capsys.readouterr()
    assert reads.lag(lake, Catalog.load(lake.contracts_dir), ["t"], "json") == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["lag"] for line in out.splitlines()] == [0, 0]
    assert err.splitlines() == [
        "files in landing folders that are not segments (not read): 1 file(s)",
        "  t: partition=0/t+0+0000000003.avro (a format bronze does not read (.avro); segments "
        "are JSON lines)",
    ]
