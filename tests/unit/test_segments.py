"""Reading landing segments: both formats, gzip, and every kind of bad line, without Spark."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lakehouse.topics.segments import SegmentFile, read_segment


def _env(offset: int, key: str | None = "k", value: str | None = "v", **extra: object) -> str:
    return json.dumps(
        {
            "offset": offset,
            "timestamp": 1_700_000_000_000 + offset,
            "key": key,
            "value": value,
            **extra,
        }
    )


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_clean_envelope_file(tmp_path: Path) -> None:
    lines = [
        _env(7, "alice", '{"location":"Paris"}'),
        _env(8, None, None, timestampType="LogAppendTime"),
    ]
    path = _write(tmp_path, "t+0+0000000007.json", ("\n".join(lines) + "\n").encode())
    got = read_segment(SegmentFile(path, 0, 7), "t")
    assert got.bad == [] and got.lines == 2 and got.end_offset == 9
    rows = got.records.to_pylist()
    assert [(r["key"], r["value"], r["offset"], r["timestampType"]) for r in rows] == [
        (b"alice", b'{"location":"Paris"}', 7, 0),
        (None, None, 8, 1),
    ]
    assert rows[0]["timestamp"].timestamp() == 1_700_000_000.007
    assert rows[0]["topic"] == "t" and rows[0]["partition"] == 0 and rows[0]["_source_file"] == path


def test_every_bad_line_is_reported_and_good_lines_land(tmp_path: Path) -> None:
    lines = [
        _env(0).encode(),
        b"not json at all",
        _env(2, key="\u00e9").encode().replace(b"\\u00e9", b"\xff"),  # invalid UTF-8
        b"",
        json.dumps({"key": "k", "value": "v"}).encode(),  # no offset
        _env(5, key="@@@", keyEncoding="base64").encode(),
        _env(6, value="x" * 200).encode(),  # oversized with a 150-byte limit
        _env(7, headers=[{"key": "h", "value": "AQ==", "encoding": "base64"}]).encode(),
        b'{"offset": 8, "key": "k", "val',  # truncated: the file ends mid-line
    ]
    data = b"\n".join(lines)
    path = _write(tmp_path, "t+0+0000000000.json", data)
    got = read_segment(SegmentFile(path, 0, 0), "t", max_record_bytes=150)
    assert [r["offset"] for r in got.records.to_pylist()] == [0, 7]
    assert got.records.to_pylist()[1]["headers"] == [{"key": "h", "value": b"\x01"}]
    reasons = {b.line: b.reason for b in got.bad}
    assert reasons[2].startswith("not JSON")
    bad_byte = lines[2].index(b"\xff")
    assert reasons[3] == f"invalid UTF-8 at byte {bad_byte} of the line"
    assert reasons[4] == "empty line"
    assert reasons[5].startswith("missing or invalid 'offset'")
    assert reasons[6] == "key is not valid base64"
    assert reasons[7].startswith("oversized record: ") and "the limit is 150" in reasons[7]
    assert reasons[9].startswith("truncated line (the file ends without a newline)")
    assert len(got.bad) == 7
    # byte offsets point at each bad line's first byte
    for b in got.bad:
        assert b.line is not None and b.byte_offset == sum(len(x) + 1 for x in lines[: b.line - 1])
        assert b.source_file == path and b.partition == 0


def test_zero_byte_file_is_reported(tmp_path: Path) -> None:
    got = read_segment(SegmentFile(_write(tmp_path, "t+1+0000000000.json", b""), 1, 0), "t")
    assert got.records.num_rows == 0
    assert [(b.line, b.reason) for b in got.bad] == [(None, "empty segment file (zero bytes)")]


def test_gzip_segments_and_damaged_gzip(tmp_path: Path) -> None:
    lines = [_env(i, value="v" * 50) for i in range(2000)]
    packed = gzip.compress(("\n".join(lines) + "\n").encode())
    ok = read_segment(SegmentFile(_write(tmp_path, "t+0+0000000000.json.gz", packed), 0, 0), "t")
    assert ok.records.num_rows == 2000 and ok.bad == [] and ok.end_offset == 2000
    cut = read_segment(
        SegmentFile(_write(tmp_path, "t+0+0000002000.json.gz", packed[: len(packed) // 2]), 0, 0),
        "t",
    )
    landed = cut.records.num_rows
    assert 0 < landed < 2000
    assert [r["offset"] for r in cut.records.to_pylist()] == list(range(landed))
    reasons = [b.reason for b in cut.bad]
    assert "truncated gzip stream (no end marker)" in reasons
    assert "line cut off by the damaged gzip stream" in reasons


def test_connect_json_values_with_companion_keys(tmp_path: Path) -> None:
    values = b'{"location":"Paris"}\nnull\n{"location":"Rome"}\n{broken\n{"location":"Oslo"}\n'
    keys = b'"alice"\n"bob"\nnull\n"dave"\n'
    path = _write(tmp_path, "t+2+0000000040.json", values)
    keys_path = _write(tmp_path, "t+2+0000000040.keys.json", keys)
    got = read_segment(SegmentFile(path, 2, 40, "connect_json", keys_path), "t")
    rows = got.records.to_pylist()
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
        (40, b"alice", b'{"location":"Paris"}'),
        (41, b"bob", None),
        (42, None, b'{"location":"Rome"}'),
    ]
    assert all(r["timestampType"] == -1 and r["timestamp"] is None for r in rows)
    assert [(b.line, b.reason) for b in got.bad] == [
        (
            4,
            "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (5, f"no key for this line in {keys_path} (4 keys)"),
    ]
    assert got.end_offset == 45  # five lines: offsets 40..44 are covered


@pytest.mark.parametrize("name", ["t+0+0000000000.json"])
def test_value_only_without_keys_has_null_keys(tmp_path: Path, name: str) -> None:
    got = read_segment(SegmentFile(_write(tmp_path, name, b'{"a":1}\n'), 0, 0, "connect_json"), "t")
    assert got.records.to_pylist()[0]["key"] is None and got.bad == []


def test_corrupt_gzip_is_reported_whole(tmp_path: Path) -> None:
    """Damaged deflate data can decode into plausible wrong lines: nothing of it may land."""
    lines = [_env(i, value=f"value-{i}-" + "abcdefgh" * (i % 7)) for i in range(5000)]
    packed = bytearray(gzip.compress(("\n".join(lines) + "\n").encode()))
    middle = len(packed) // 2
    packed[middle : middle + 64] = b"\x00" * 64
    got = read_segment(
        SegmentFile(_write(tmp_path, "t+0+0000000000.json.gz", bytes(packed)), 0, 0), "t"
    )
    assert got.records.num_rows == 0
    assert [b.line for b in got.bad] == [None]
    assert got.bad[0].reason.startswith("corrupt gzip stream")
    assert got.bad[0].reason.endswith("no record of this file can be trusted")


CLEAN = [
    _env(0, "alice", '{"location":"Paris"}'),
    _env(1, None, None, timestampType="LogAppendTime"),
    _env(2, "bob", "x" * 100, timestampType="CreateTime"),
    _env(3, "\u00e9l\u00e8ve", "caf\u00e9"),  # multi-byte UTF-8 in key and value
]


@pytest.mark.parametrize("gz", [False, True])
def test_fast_and_careful_paths_read_a_clean_file_alike(tmp_path: Path, gz: bool) -> None:
    """The fast path (polars, whole file) must produce exactly what the line-by-line path
    does: the same table, types included."""
    from lakehouse.topics.segments import _envelope_fast, _envelope_row, _line_spans, _lines

    data = ("\n".join(CLEAN) + "\n").encode()
    name = "t+0+0000000000.json" + (".gz" if gz else "")
    path = _write(tmp_path, name, gzip.compress(data) if gz else data)
    seg = SegmentFile(path, 3, 0)
    fast = _envelope_fast(seg, "t", 150, data if gz else None)
    assert fast is not None
    starts, ends = _line_spans(data)
    careful = _lines(data, starts, ends, seg, "t", 150, [], _envelope_row)
    assert careful.bad == []
    assert fast.schema == careful.records.schema
    assert fast.to_pylist() == careful.records.to_pylist()
    got = read_segment(seg, "t", max_record_bytes=150)
    assert got.records.equals(careful.records) and got.end_offset == 4 and got.lines == 4


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("   ", ("bad", "empty line")),
        ("", ("bad", "empty line")),
        (_env(4, value="y" * 151), ("bad", "oversized record")),
        (_env(4, key="\u00e9" * 76), ("bad", "oversized record")),  # 152 bytes, 76 characters
        (_env(4, timestampType="BrokerTime"), ("bad", "unknown timestampType")),
        (json.dumps({"key": "k", "value": "v"}), ("bad", "missing or invalid 'offset'")),
        (json.dumps({"offset": "4", "key": "k"}), ("bad", "missing or invalid 'offset'")),
        (_env(4, key="AQI=", keyEncoding="base64"), ("key", b"\x01\x02")),
        (_env(4, value="AQI=", valueEncoding="base64"), ("value", b"\x01\x02")),
        (_env(4, headers=[{"key": "h", "value": "v"}]), ("headers", [{"key": "h", "value": b"v"}])),
    ],
)
def test_any_single_problem_sends_a_file_down_the_careful_path(
    tmp_path: Path, line: str, expect: tuple[str, object]
) -> None:
    """Each check of the fast path alone: a file that is clean but for one line is read line
    by line, so the line is reported with its reason (or decoded), and the others land."""
    from lakehouse.topics.segments import _envelope_fast

    data = ("\n".join([*CLEAN, line]) + "\n").encode()
    seg = SegmentFile(_write(tmp_path, "t+0+0000000000.json", data), 0, 0)
    assert _envelope_fast(seg, "t", 150) is None
    got = read_segment(seg, "t", max_record_bytes=150)
    kind, detail = expect
    if kind == "bad":
        assert [(b.line, b.reason.startswith(str(detail))) for b in got.bad] == [(5, True)]
        assert [r["offset"] for r in got.records.to_pylist()] == [0, 1, 2, 3]
    else:
        assert got.bad == []
        assert got.records.to_pylist()[-1][kind] == detail


def test_a_file_without_its_last_newline_is_read_line_by_line(tmp_path: Path) -> None:
    from lakehouse.topics.segments import _envelope_fast

    seg = SegmentFile(_write(tmp_path, "t+0+0000000000.json", "\n".join(CLEAN).encode()), 0, 0)
    assert _envelope_fast(seg, "t", 150) is None
    got = read_segment(seg, "t", max_record_bytes=150)
    assert got.records.num_rows == 4 and got.bad == []
