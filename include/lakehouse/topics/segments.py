"""Reading landing segment files into bronze records, with every bad line accounted for.

Runs inside Spark's Python tasks (pyarrow only, no deltalake). Two formats:

* ``envelope``: JSON lines with a record envelope (see :mod:`lakehouse.topics.landing`); offsets are in
  the records. Optionally gzip-compressed (``.json.gz``).
* ``connect_json``: value-only JSON lines as Kafka Connect's JsonFormat writes them; offset =
  the file's start offset + line index; keys, where present, in a companion
  ``<name>.keys.json`` file, one per line.

The common case (a clean envelope file) is parsed in one call to polars' NDJSON reader; a file
with any problem is parsed line by line so that each bad line is reported with its line number,
byte offset and reason, and the good lines of the same file still land.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SegmentFormat = Literal["envelope", "connect_json"]
DEFAULT_MAX_RECORD_BYTES = 1_048_576  # Kafka's default message.max.bytes is about 1 MiB
RAW_SAMPLE_BYTES = 4096
NO_TIMESTAMP_TYPE = -1  # Kafka's TimestampType.NO_TIMESTAMP_TYPE

HEADER = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(HEADER)),
        pa.field("_source_file", pa.string()),
    ]
)


def _polars_envelope() -> dict[str, Any]:
    import polars as pl

    return {
        "offset": pl.Int64,
        "timestamp": pl.Int64,
        "timestampType": pl.Utf8,
        "key": pl.Utf8,
        "keyEncoding": pl.Utf8,
        "value": pl.Utf8,
        "valueEncoding": pl.Utf8,
        "headers": pl.List(pl.Struct({"key": pl.Utf8, "value": pl.Utf8, "encoding": pl.Utf8})),
    }


@dataclass(frozen=True)
class SegmentFile:
    path: str
    partition: int
    start_offset: int
    format: SegmentFormat = "envelope"
    keys_path: str | None = None


@dataclass
class BadLine:
    source_file: str
    partition: int
    line: int | None  # 1-based; None for a problem of the whole file
    byte_offset: int | None  # in the (decompressed) file
    reason: str
    raw: bytes | None = None


@dataclass
class SegmentRead:
    records: pa.Table
    bad: list[BadLine] = field(default_factory=list)
    lines: int = 0
    end_offset: int | None = None  # one past the last offset the file covers, when known


class _Bad(Exception):
    pass


def _in_bucket(path: str) -> bool:
    return path.startswith(("s3://", "s3a://"))


def _file_bytes(path: str) -> bytes:
    """A local file's or an object's bytes (a segment in a bucket, where Kafka Connect's S3
    sink writes them)."""
    if _in_bucket(path):
        from lakehouse.runtime import objectstore

        return objectstore.read_bytes(objectstore.ObjectPath.parse(path, setting="segment"))
    with open(path, "rb") as fh:
        return fh.read()


def _read_bytes(seg: SegmentFile, bad: list[BadLine]) -> bytes:
    data = _file_bytes(seg.path)
    if not seg.path.endswith(".gz"):
        return data
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data) + d.flush()
    except zlib.error as exc:
        # Damaged deflate data can decompress into plausible but wrong lines before zlib notices
        # (back-references copy earlier text), so nothing of such a file can be trusted: the
        # whole file is reported. (A merely truncated stream, below, keeps its exact prefix.)
        bad.append(
            BadLine(
                seg.path,
                seg.partition,
                None,
                None,
                f"corrupt gzip stream ({exc}): no record of this file can be trusted",
                data[:RAW_SAMPLE_BYTES],
            )
        )
        return b""
    if not d.eof:
        bad.append(
            BadLine(
                seg.path, seg.partition, None, len(out), "truncated gzip stream (no end marker)"
            )
        )
        return _cut_to_last_line(out, seg, bad)
    return out


def _cut_to_last_line(data: bytes, seg: SegmentFile, bad: list[BadLine]) -> bytes:
    """Of a damaged stream, keep the complete lines; report the cut-off tail."""
    end = data.rfind(b"\n") + 1
    if end < len(data):
        bad.append(
            BadLine(
                seg.path,
                seg.partition,
                data.count(b"\n", 0, end) + 1,
                end,
                "line cut off by the damaged gzip stream",
                data[end : end + RAW_SAMPLE_BYTES],
            )
        )
    return data[:end]


def _line_spans(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) of every line."""
    nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(data)]))
    if starts[-1] == len(data):  # the file ends with a newline: no empty last line
        starts, ends = starts[:-1], ends[:-1]
    return starts, ends


def read_segment(
    seg: SegmentFile, topic: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> SegmentRead:
    """Every good record of one segment file, and every bad line with its reason."""
    if seg.format == "envelope" and not seg.path.endswith(".gz") and not _in_bucket(seg.path):
        fast = _envelope_fast(seg, topic, max_record_bytes)
        if fast is not None:
            end = pc.max(fast.column("offset")).as_py()
            return SegmentRead(fast, [], fast.num_rows, end + 1)
    bad: list[BadLine] = []
    data = _read_bytes(seg, bad)
    if not data:
        if not bad:
            bad.append(BadLine(seg.path, seg.partition, None, 0, "empty segment file (zero bytes)"))
        return SegmentRead(_empty(), bad, 0, None)
    if seg.format == "envelope":
        if not bad and (seg.path.endswith(".gz") or _in_bucket(seg.path)):
            fast = _envelope_fast(seg, topic, max_record_bytes, data)
            if fast is not None:
                end = pc.max(fast.column("offset")).as_py()
                return SegmentRead(fast, bad, fast.num_rows, end + 1)
        starts, ends = _line_spans(data)
        return _lines(data, starts, ends, seg, topic, max_record_bytes, bad, _envelope_row)
    starts, ends = _line_spans(data)
    keys = _companion_keys(seg, bad)
    parser = _connect_row(keys, seg)
    result = _lines(data, starts, ends, seg, topic, max_record_bytes, bad, parser)
    result.end_offset = seg.start_offset + len(starts)
    return result


def constant(value: Any, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of one value (``pa.repeat`` would import pandas into every worker)."""
    return pa.array([value], type_).take(pa.array(np.zeros(n, dtype=np.int32)))


def _empty() -> pa.Table:
    return RECORD_SCHEMA.empty_table()


def _newlines(data: Any) -> tuple[int, bool]:
    """How many newlines a buffer holds, and whether it ends with one."""
    view = np.frombuffer(data, dtype=np.uint8)
    try:
        return int(np.count_nonzero(view == 10)), bool(len(view)) and int(view[-1]) == 10
    finally:
        del view  # release the buffer (a memory map cannot close while it is exported)


def _envelope_fast(
    seg: SegmentFile, topic: str, max_record_bytes: int, data: bytes | None = None
) -> pa.Table | None:
    """Parse a clean envelope file in one call to polars' NDJSON reader (about twice pyarrow's
    speed here), check it and shape its records in polars; ``None`` sends the file down the
    line-by-line path, which finds the problem. Without ``data``, the file is mapped, not read
    into Python: polars parses it from the path."""
    import mmap

    import polars as pl

    readable: Any = io.BytesIO(data) if data is not None else seg.path
    try:
        if data is None:
            with open(seg.path, "rb") as fh:
                if not os.fstat(fh.fileno()).st_size:
                    return None
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    lines, ends_clean = _newlines(mapped)
        else:
            lines, ends_clean = _newlines(data)
        if not ends_clean:
            return None
        parsed = pl.read_ndjson(readable, schema=_polars_envelope())
    except (OSError, pl.exceptions.PolarsError, pa.ArrowException, ValueError):
        return None
    n = parsed.height
    # Every line a record (polars skips blank lines silently), every offset present, no base64
    # fields or headers (decoded one by one on the careful path), sizes and types in bounds.
    if n == 0 or n != lines:
        return None
    size = pl.col("key").str.len_bytes().fill_null(0) + pl.col("value").str.len_bytes().fill_null(0)
    ttype = pl.col("timestampType")
    clean = parsed.select(
        (pl.col("offset").null_count() == 0)
        & pl.col("keyEncoding").is_null().all()
        & pl.col("valueEncoding").is_null().all()
        & pl.col("headers").is_null().all()
        & (size.max() <= max_record_bytes)
        & (ttype.is_null() | ttype.is_in(["CreateTime", "LogAppendTime"])).all()
    ).item()
    if not clean:
        return None
    shaped = parsed.select(
        pl.col("key").cast(pl.Binary),
        pl.col("value").cast(pl.Binary),
        pl.col("offset"),
        (pl.col("timestamp") * 1000).cast(pl.Datetime("us", "UTC")).alias("timestamp"),
        (ttype == "LogAppendTime").fill_null(False).cast(pl.Int32).alias("timestampType"),
    ).to_arrow()
    return pa.table(
        {
            "key": shaped.column("key").cast(pa.binary()),
            "value": shaped.column("value").cast(pa.binary()),
            "topic": constant(topic, pa.string(), n),
            "partition": constant(seg.partition, pa.int32(), n),
            "offset": shaped.column("offset"),
            "timestamp": shaped.column("timestamp"),
            "timestampType": shaped.column("timestampType"),
            "headers": pa.array([[]], pa.list_(HEADER)).take(pa.array(np.zeros(n, np.int32))),
            "_source_file": constant(seg.path, pa.string(), n),
        },
        schema=RECORD_SCHEMA,
    )


# -- the careful path: line by line --------------------------------------------------------


def _decode(text: Any, encoding: Any, what: str) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise _Bad(f"{what} must be a string or null")
    if encoding in (None, "utf8"):
        return text.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise _Bad(f"{what} is not valid base64") from None
    raise _Bad(f"unknown {what} encoding {encoding!r} (utf8 or base64)")


def _envelope_row(obj: Any, line_no: int, raw: bytes) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _Bad("line is JSON but not a record envelope object")
    offset = obj.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise _Bad("missing or invalid 'offset' (a non-negative integer)")
    ts = obj.get("timestamp")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)):
        raise _Bad("'timestamp' must be epoch milliseconds")
    ttype = obj.get("timestampType") or "CreateTime"
    if ttype not in ("CreateTime", "LogAppendTime"):
        raise _Bad(f"unknown timestampType {ttype!r}")
    headers = []
    for h in obj.get("headers") or []:
        if not isinstance(h, dict) or not isinstance(h.get("key"), str):
            raise _Bad("headers must be a list of {key, value[, encoding]}")
        headers.append(
            {"key": h["key"], "value": _decode(h.get("value"), h.get("encoding"), "header value")}
        )
    return {
        "key": _decode(obj.get("key"), obj.get("keyEncoding"), "key"),
        "value": _decode(obj.get("value"), obj.get("valueEncoding"), "value"),
        "offset": offset,
        "timestamp": None if ts is None else ts * 1000,
        "timestampType": 1 if ttype == "LogAppendTime" else 0,
        "headers": headers,
    }


def _companion_keys(seg: SegmentFile, bad: list[BadLine]) -> list[bytes | None] | None:
    if not seg.keys_path:
        return None
    try:
        lines = _file_bytes(seg.keys_path).splitlines()
    except OSError as exc:
        bad.append(BadLine(seg.path, seg.partition, None, None, f"keys file unreadable: {exc}"))
        return None
    keys: list[bytes | None] = []
    for line in lines:
        try:
            k = json.loads(line)
        except ValueError:
            keys.append(line)  # not JSON: the key's bytes as written
            continue
        keys.append(None if k is None else (k.encode("utf-8") if isinstance(k, str) else line))
    return keys


def _connect_row(keys: list[bytes | None] | None, seg: SegmentFile) -> Any:
    def parse(obj: Any, line_no: int, raw: bytes) -> dict[str, Any]:
        if keys is not None and line_no > len(keys):
            raise _Bad(f"no key for this line in {seg.keys_path} ({len(keys)} keys)")
        return {
            "key": None if keys is None else keys[line_no - 1],
            "value": None if obj is None else raw,
            "offset": seg.start_offset + line_no - 1,
            "timestamp": None,
            "timestampType": NO_TIMESTAMP_TYPE,
            "headers": [],
        }

    return parse


def _record_bytes(row: dict[str, Any]) -> int:
    """A record's size as Kafka counts it against its limit: the bytes of key, value and
    headers. Not the envelope line's: its JSON escapes and base64 make a record look larger
    (and the fast path, which sees no headers, measures key and value alike)."""
    size = len(row["key"] or b"") + len(row["value"] or b"")
    for h in row["headers"]:
        size += len(h["key"].encode("utf-8")) + len(h["value"] or b"")
    return size


def _lines(
    data: bytes,
    starts: np.ndarray,
    ends: np.ndarray,
    seg: SegmentFile,
    topic: str,
    max_record_bytes: int,
    bad: list[BadLine],
    parse: Any,
) -> SegmentRead:
    rows: list[dict[str, Any]] = []
    last = len(starts) - 1
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        raw = data[a:b]
        line_no = i + 1

        def fail(reason: str, raw: bytes = raw, line_no: int = line_no, a: int = a) -> None:
            bad.append(BadLine(seg.path, seg.partition, line_no, a, reason, raw[:RAW_SAMPLE_BYTES]))

        if not raw.strip():
            fail("empty line")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail(f"invalid UTF-8 at byte {exc.start} of the line")
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:
            cut = i == last and not data.endswith(b"\n")
            fail(
                ("truncated line (the file ends without a newline): " if cut else "not JSON: ")
                + str(exc)
            )
            continue
        try:
            row = parse(obj, line_no, raw)
        except _Bad as exc:
            fail(str(exc))
            continue
        size = _record_bytes(row)
        if size > max_record_bytes:
            fail(
                f"oversized record: {size} bytes of key, value and headers, "
                f"the limit is {max_record_bytes}"
            )
            continue
        rows.append(row)
    n = len(rows)
    records = pa.table(
        {
            "key": pa.array([r["key"] for r in rows], pa.binary()),
            "value": pa.array([r["value"] for r in rows], pa.binary()),
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([seg.partition] * n, pa.int32()),
            "offset": pa.array([r["offset"] for r in rows], pa.int64()),
            "timestamp": pa.array([r["timestamp"] for r in rows], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "timestampType": pa.array([r["timestampType"] for r in rows], pa.int32()),
            "headers": pa.array([r["headers"] for r in rows], pa.list_(HEADER)),
            "_source_file": pa.array([seg.path] * n, pa.string()),
        },
        schema=RECORD_SCHEMA,
    )
    offsets = records.column("offset")
    end = pc.max(offsets).as_py() if n else None
    return SegmentRead(records, bad, len(starts), None if end is None else end + 1)
