from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from lakehouse.contracts.fields import parse_timestamp
from lakehouse.errors import BadRecordError
from lakehouse.runtime.config import Settings
from lakehouse.topics.landing import (
    Producer,
    Record,
    default_partition,
    end_offsets,
    list_segments,
    murmur2,
    record_from_json_line,
    segment_name,
    survey,
)

# Kafka's own vectors (org.apache.kafka.common.utils.UtilsTest#testMurmur2).
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_default_partition_is_positive_hash_modulo_count() -> None:
    # toPositive(-790332482) = 1357151166; 1357151166 % 10 == 6
    assert default_partition(b"foobar", 10) == 6
    assert all(0 <= default_partition(bytes([i]), 3) < 3 for i in range(256))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_producer_assigns_consecutive_offsets_per_partition(settings: Settings) -> None:
    producer = Producer(settings, "t", 3)
    first = producer.send_batch([Record(b"k1", b"1"), Record(b"k1", b"2")])
    second = producer.send_batch([Record(b"k1", b"3")])
    p = default_partition(b"k1", 3)
    assert [(m.partition, m.offset) for m in first + second] == [(p, 0), (p, 1), (p, 2)]
    segments = list_segments(settings, "t")
    assert [s.start_offset for s in segments] == [0, 2]
    assert segments[0].path.name == segment_name("t", p, 0) == f"t+{p}+0000000000.json"
    assert [r["value"] for r in _read(segments[0].path)] == ["1", "2"]
    assert end_offsets(settings, "t", 3) == {0: 0, 1: 0, 2: 0} | {p: 3}


def test_null_keys_spread_round_robin_and_explicit_partition_wins(settings: Settings) -> None:
    producer = Producer(settings, "t", 3)
    metas = producer.send_batch([Record(None, b"v")] * 3 + [Record(b"k", b"v", partition=2)])
    assert sorted(m.partition for m in metas[:3]) == [0, 1, 2]
    assert metas[3].partition == 2


def test_partition_out_of_range_is_refused(settings: Settings) -> None:
    with pytest.raises(BadRecordError, match="partition 5 out of range"):
        Producer(settings, "t", 3).send_batch([Record(b"k", b"v", partition=5)])


def test_binary_keys_and_values_are_stored_as_base64(settings: Settings) -> None:
    Producer(settings, "t", 1).send_batch([Record(b"\xff\x00", b"\xfe", headers=(("h", b"\x80"),))])
    (env,) = _read(list_segments(settings, "t")[0].path)
    assert env["keyEncoding"] == env["valueEncoding"] == "base64"
    assert env["key"] == "/wA=" and env["value"] == "/g=="
    assert env["headers"] == [{"key": "h", "value": "gA==", "encoding": "base64"}]


def _produce_many(home: str, contracts: str, worker: int, n: int) -> None:
    settings = Settings.from_env(home, contracts)
    producer = Producer(settings, "t", 2)
    for i in range(n):
        producer.send_batch([Record(f"w{worker}-{i}".encode(), b"x")])


def test_concurrent_producers_never_reuse_an_offset(settings: Settings) -> None:
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=_produce_many, args=(str(settings.home), str(settings.contracts_dir), w, 40)
        )
        for w in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    by_partition: dict[int, list[int]] = {}
    keys = []
    for seg in list_segments(settings, "t"):
        for env in _read(seg.path):
            by_partition.setdefault(seg.partition, []).append(env["offset"])
            keys.append(env["key"])
    assert len(keys) == len(set(keys)) == 160
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))


def test_input_line_parsing() -> None:
    rec = record_from_json_line(
        '{"key": "alice", "value": {"location": "Paris"}, "timestamp": 1700000000000, '
        '"headers": {"src": "cli"}, "partition": 1}',
        "line 1",
    )
    assert rec.key == b"alice"
    assert json.loads(rec.value or b"") == {"location": "Paris"}
    assert rec.timestamp_ms == 1700000000000
    assert rec.headers == (("src", b"cli"),)
    assert rec.partition == 1
    tombstone = record_from_json_line('{"key": "bob", "value": null}', "line 2")
    assert tombstone.value is None and tombstone.timestamp_ms is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 7: not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"key": "a"}', "missing 'value'"),
        ('{"key": 5, "value": 1}', "key must be a string or null"),
        ('{"key": "a", "value": 1, "colour": "red"}', "unknown field"),
        ('{"key": "a", "value": 1, "timestamp": "yesterday"}', "not ISO-8601"),
        ('{"key": "a", "value": 1, "partition": "0"}', "partition must be an integer"),
    ],
)
def test_bad_input_lines_say_what_and_where(line: str, message: str) -> None:
    with pytest.raises(BadRecordError, match=message):
        record_from_json_line(line, "line 7")


def test_iso_timestamps_default_to_utc() -> None:
    assert parse_timestamp("2023-11-14T22:13:20Z", "x") == 1700000000000
    assert parse_timestamp("2023-11-14T22:13:20", "x") == 1700000000000
    assert parse_timestamp("2023-11-15T00:13:20+02:00", "x") == 1700000000000


def test_start_offset_from_segment_names() -> None:
    from lakehouse.topics.landing import start_offset_of

    assert start_offset_of("user-locations+2+0000000042.json") == 42
    assert start_offset_of("t+0+0000000007.json.gz") == 7
    with pytest.raises(ValueError, match="not a segment file name"):
        start_offset_of("t+0+0000000007.keys.json")


def test_files_that_are_not_segments_are_named_with_the_reason(settings: Settings) -> None:
    Producer(settings, "t", 2).send_batch([Record(b"k", b"v", partition=0)])
    root = settings.topic_dir("t")
    p0, p1 = root / "partition=0", root / "partition=1"
    p1.mkdir()
    segment = next(p0.glob("*.json"))
    (p0 / "t+0+0000000100.avro").write_bytes(b"Obj")  # Connect's Avro format
    (p0 / "t+1+0000000000.json").write_text("")  # named for another partition
    (p0 / "other+0+0000000000.json").write_text("")  # another topic's
    (p0 / ".t+0+0000000007.json.123.tmp").write_text("")  # a crashed producer's
    (p0 / "t+0+0000000050.keys.json").write_text("")  # keys without their segment
    (p1 / "notes.txt").write_text("")
    (root / "t+0+0000000000.json").write_text("")  # outside any partition folder

    segments, ignored = survey(settings, "t")
    assert [s.path for s in segments] == [segment]
    assert {i.describe(root) for i in ignored} == {
        "partition=0/t+0+0000000100.avro (a format bronze does not read (.avro); segments are JSON lines)",
        "partition=0/t+1+0000000000.json (named for partition 1, in partition=0)",
        "partition=0/other+0+0000000000.json (named for topic 'other')",
        "partition=0/.t+0+0000000007.json.123.tmp (a producer's temporary file (being written, or left by a crash))",
        "partition=0/t+0+0000000050.keys.json (a keys file without its segment)",
        "partition=1/notes.txt (a format bronze does not read (.txt); segments are JSON lines)",
        "t+0+0000000000.json (not in a partition=<n> folder)",
    }
