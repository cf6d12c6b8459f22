"""Landing: topic partitions as segment files, and a producer that appends to them.

The layout is the one Kafka Connect's S3/HDFS sinks write::

    <landing>/topics/<topic>/partition=<p>/<topic>+<p>+<startOffset>.json

Each segment is JSON lines, one record envelope per line::

    {"offset": 7, "timestamp": 1700000000000, "timestampType": "CreateTime",
     "key": "alice", "value": "{\\"location\\":\\"Paris\\"}", "headers": [{"key": "h", "value": "v"}]}

``key`` and ``value`` are the record's bytes as UTF-8 text, or base64 when ``keyEncoding`` /
``valueEncoding`` is ``"base64"``; either may be null. Segments are immutable once written: the
producer writes each to a temporary name and renames it into place, so a reader never sees half a
segment, and a lock file per topic keeps two producers from handing out the same offset.
"""

from __future__ import annotations

import base64
import fcntl
import functools
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.fields import parse_timestamp
from lakehouse.errors import BadRecordError
from lakehouse.runtime import objectstore
from lakehouse.runtime.config import Settings, validate_topic_name
from lakehouse.runtime.objectstore import Location, ObjectPath

if TYPE_CHECKING:
    from lakehouse.contracts.serde import Serializer

SEGMENT_SUFFIX = ".json"
_SEGMENT_NAME = re.compile(r"^(?P<topic>.+)\+(?P<partition>\d+)\+(?P<offset>\d+)\.json(?:\.gz)?$")
OFFSET_PAD = 10  # Connect's default `filename.offset.zero.pad.width`

_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: 32-bit MurmurHash2 with Kafka's seed, as a signed int."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & _MASK32
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & _MASK32
        k ^= k >> 24
        k = (k * m) & _MASK32
        h = (h * m) & _MASK32
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def default_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner for a keyed record: ``toPositive(murmur2(key)) % n``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class Record:
    """One record to produce: the bytes Kafka would carry."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    partition: int | None = None


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


def segment_name(topic: str, partition: int, start_offset: int) -> str:
    return f"{topic}+{partition}+{start_offset:0{OFFSET_PAD}d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, order=True)
class Segment:
    partition: int
    start_offset: int
    path: Location = field(compare=False)
    keys_path: Location | None = field(default=None, compare=False)  # Connect's <name>.keys.json
    mtime_ns: int = field(default=0, compare=False)  # when the file was listed


def parse_segment_name(
    path: Location, topic: str, siblings: set[str] | None = None, mtime_ns: int = 0
) -> Segment | None:
    """Return the segment a file name describes, or ``None`` for files that are not segments.
    ``siblings``: the names in its folder, when listed already (its keys file is among them)."""
    m = _SEGMENT_NAME.match(path.name)
    if not m or m.group("topic") != topic:
        return None
    keys = path.with_name(path.name.split(".json", 1)[0] + ".keys.json")
    there = keys.name in siblings if siblings is not None else objectstore.exists(keys)
    return Segment(
        int(m.group("partition")), int(m.group("offset")), path, keys if there else None, mtime_ns
    )


def start_offset_of(name: str) -> int:
    """The start offset a segment file name carries (``<topic>+<p>+<start>.json``)."""
    m = _SEGMENT_NAME.match(name)
    if not m:
        raise ValueError(f"not a segment file name: {name!r}")
    return int(m.group("offset"))


@dataclass(frozen=True)
class Ignored:
    """A file in a topic's landing folder that bronze does not read, and why."""

    path: Location
    reason: str

    def describe(self, root: Location) -> str:
        path, base = self.path, root
        inside = (
            path.relative_to(base)
            if isinstance(path, ObjectPath)
            else path.relative_to(base)
            if isinstance(base, Path)
            else path
        )
        return f"{inside} ({self.reason})"


# Formats Kafka Connect's storage sinks write that bronze does not read.
_OTHER_FORMATS = (".avro", ".parquet", ".bin", ".csv", ".txt", ".orc")
_LOCK_FILE = ".producer.lock"


def survey(settings: Settings, topic: str) -> tuple[list[Segment], list[Ignored]]:
    """Every segment of a topic, ordered by partition and start offset, and every other file of
    its landing folder with the reason it is not read."""
    root = settings.topic_dir(topic)
    found: list[Segment] = []
    ignored: list[Ignored] = []
    for entry in objectstore.listdir(root):
        if entry.name == _LOCK_FILE:
            continue  # the producer's own
        if not (entry.is_dir and re.fullmatch(r"partition=\d+", entry.name)):
            ignored.append(Ignored(entry.path, "not in a partition=<n> folder"))
            continue
        files = objectstore.listdir(entry.path)
        names = {f.name for f in files}
        keys = set()
        for f in files:
            seg = None if f.is_dir else parse_segment_name(f.path, topic, names, f.mtime_ns)
            if seg is not None and f"partition={seg.partition}" == entry.name:
                found.append(seg)
                if seg.keys_path is not None:
                    keys.add(seg.keys_path.name)
            elif not f.name.endswith(".keys.json"):
                ignored.append(Ignored(f.path, _why_not(f, topic, seg)))
        for f in files:
            if f.name.endswith(".keys.json") and f.name not in keys:
                ignored.append(Ignored(f.path, "a keys file without its segment"))
    return sorted(found), ignored


def _why_not(entry: objectstore.Entry, topic: str, seg: Segment | None) -> str:
    name, path = entry.name, entry.path
    if seg is not None:
        return f"named for partition {seg.partition}, in {path.parent.name}"
    if name.startswith(".") and name.endswith(".tmp"):
        return "a producer's temporary file (being written, or left by a crash)"
    if entry.is_dir:
        return "a folder"
    if name.endswith(_OTHER_FORMATS):
        return f"a format bronze does not read ({path.suffix}); segments are JSON lines"
    m = _SEGMENT_NAME.match(name)
    if m is not None:
        return f"named for topic {m.group('topic')!r}"
    return f"not a segment name ({topic}+<partition>+<start offset>.json[.gz])"


def list_segments(settings: Settings, topic: str) -> list[Segment]:
    """Every segment of a topic, ordered by partition and start offset."""
    return survey(settings, topic)[0]


def segment_end(seg: Segment, fmt: str = "envelope") -> int:
    """One past the last offset a segment holds (Kafka's log-end offset, as of this file).

    Envelope files carry offsets; value-only Connect files cover start + line count. A file
    whose end cannot be read (damaged) counts as ending where it starts.
    """
    import gzip

    try:
        if not seg.path.name.endswith(".gz"):
            if fmt == "envelope":
                return _last_offset(seg.path) + 1
            if isinstance(seg.path, Path):
                with seg.path.open("rb") as fh:
                    return seg.start_offset + sum(1 for _ in fh)
        data = objectstore.read_bytes(seg.path)
        if seg.path.name.endswith(".gz"):
            data = gzip.decompress(data)
        if fmt == "connect_json":
            return seg.start_offset + len(data.splitlines())
        lines = data.rstrip(b"\n").rsplit(b"\n", 1)
        return int(json.loads(lines[-1])["offset"]) + 1
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return seg.start_offset


def _last_offset(path: Location) -> int:
    """Offset of the last record in one of our own segments (it ends with a complete line),
    read from the file's end: a producer asks this of every partition's last segment."""
    with objectstore.open_input(path) as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        block = min(size, 1 << 16)
        while True:
            fh.seek(size - block)
            tail = fh.read(block).rstrip(b"\n")
            if b"\n" in tail or block == size:
                break
            block = min(size, block * 4)
    line = tail.rsplit(b"\n", 1)[-1]
    return int(json.loads(line)["offset"])


def end_offsets(
    settings: Settings, topic: str, partitions: int, fmt: str = "envelope"
) -> dict[int, int]:
    """The next offset to be written per partition (Kafka's log-end offset)."""
    ends = dict.fromkeys(range(partitions), 0)
    last: dict[int, Segment] = {}
    for seg in list_segments(settings, topic):
        last[seg.partition] = seg
    for p, seg in last.items():
        ends[p] = max(ends.get(p, 0), segment_end(seg, fmt))
    return ends


@contextmanager
def _topic_lock(settings: Settings, topic: str) -> Iterator[None]:
    """The producers' lock of a topic: a local file (in the topic's folder, or under the home's
    ``locks`` for a topic in a bucket), so producers of this machine take turns."""
    root = settings.topic_dir(topic)
    if isinstance(root, ObjectPath):
        lock = settings.lock_path(root / _LOCK_FILE)
    else:
        lock = root / _LOCK_FILE
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _text_or_b64(data: bytes | None) -> tuple[str | None, str]:
    if data is None:
        return None, "utf8"
    try:
        return data.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _envelope(offset: int, ts: int, rec: Record) -> dict[str, Any]:
    key, key_enc = _text_or_b64(rec.key)
    value, value_enc = _text_or_b64(rec.value)
    out: dict[str, Any] = {
        "offset": offset,
        "timestamp": ts,
        "timestampType": "CreateTime",
        "key": key,
        "value": value,
    }
    if key_enc != "utf8":
        out["keyEncoding"] = key_enc
    if value_enc != "utf8":
        out["valueEncoding"] = value_enc
    if rec.headers:
        headers = []
        for hk, hv in rec.headers:
            text, enc = _text_or_b64(hv)
            headers.append(
                {"key": hk, "value": text, **({"encoding": enc} if enc != "utf8" else {})}
            )
        out["headers"] = headers
    return out


class Producer:
    """Appends records to a topic's partitions with Kafka's default partitioner.

    Records given to one :meth:`send_batch` call become at most one new segment per partition,
    written under the topic's lock, so concurrent producers never reuse an offset.
    """

    def __init__(self, settings: Settings, topic: str, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("a topic needs at least one partition")
        self.settings = settings
        self.topic = validate_topic_name(topic)
        self.partitions = partitions
        # Null keys are spread round-robin, as the pre-2.4 Kafka default partitioner did.
        self._next_unkeyed = 0

    def partition_for(self, rec: Record) -> int:
        if rec.partition is not None:
            if not 0 <= rec.partition < self.partitions:
                raise BadRecordError(
                    f"topic {self.topic}",
                    f"partition {rec.partition} out of range: the topic has {self.partitions}",
                )
            return rec.partition
        if rec.key is None:
            p = self._next_unkeyed % self.partitions
            self._next_unkeyed += 1
            return p
        return default_partition(rec.key, self.partitions)

    def send_batch(self, records: Iterable[Record]) -> list[RecordMetadata]:
        """Write the records durably; return each record's partition and offset, in input order."""
        now = int(time.time() * 1000)
        by_partition: dict[int, list[tuple[int, Record]]] = {}
        for i, rec in enumerate(records):
            by_partition.setdefault(self.partition_for(rec), []).append((i, rec))
        if not by_partition:
            return []
        results: dict[int, RecordMetadata] = {}
        with _topic_lock(self.settings, self.topic):
            ends = end_offsets(self.settings, self.topic, self.partitions)
            for p, items in sorted(by_partition.items()):
                start = ends[p]
                lines = []
                for n, (i, rec) in enumerate(items):
                    ts = rec.timestamp_ms if rec.timestamp_ms is not None else now
                    lines.append(json.dumps(_envelope(start + n, ts, rec), separators=(",", ":")))
                    results[i] = RecordMetadata(self.topic, p, start + n, ts)
                self._write(p, start, ("\n".join(lines) + "\n").encode())
        return [results[i] for i in range(len(results))]

    def _write(self, partition: int, start: int, data: bytes) -> None:
        """One whole segment file, seen by readers complete or not at all: a synced temporary
        file renamed into place locally, a single PUT in a bucket."""
        part_dir = self.settings.topic_dir(self.topic) / f"partition={partition}"
        final = part_dir / segment_name(self.topic, partition, start)
        if isinstance(final, ObjectPath):
            objectstore.write_bytes(final, data)
            return
        assert isinstance(part_dir, Path)
        part_dir.mkdir(parents=True, exist_ok=True)
        tmp = part_dir / f".{final.name}.{os.getpid()}.tmp"
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, final)

    def write_segment(self, partition: int, render: Callable[[int], tuple[bytes, int]]) -> int:
        """Append one pre-rendered segment to ``partition``; ``render(start_offset)`` returns the
        file's bytes and its record count. Returns the start offset. Used by bulk generators."""
        with _topic_lock(self.settings, self.topic):
            start = end_offsets(self.settings, self.topic, self.partitions)[partition]
            data, count = render(start)
            if count:
                self._write(partition, start, data)
        return start


# -- sample data at scale ------------------------------------------------------------------------

CITIES = (
    "Paris", "Sydney", "Rome", "Lima", "Berlin", "Oslo", "Lagos", "Quito", "Hanoi", "Austin",
    "Dakar", "Porto", "Seoul", "Perth", "Cairo", "Delhi", "Tunis", "Minsk", "Riga", "Kyoto",
)  # fmt: skip


def generate_user_locations(
    settings: Settings,
    topic: str,
    partitions: int,
    records: int,
    *,
    users: int | None = None,
    value_bytes: int = 0,
    seed: int = 0,
    segment_records: int = 500_000,
) -> int:
    """Produce ``records`` random check-ins (key = username, value = {"location", "note"}).

    Keys are partitioned with Kafka's default partitioner like any produced record; segments are
    rendered with vectorised Arrow string functions, so tens of millions take seconds, not
    minutes. ``value_bytes`` pads each value to about that size. Returns the records written.
    """
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    pool = users or max(100, min(100_000, records // 20))
    names = [f"user-{i:06d}" for i in range(pool)]
    part_of_user = np.array([default_partition(n.encode(), partitions) for n in names])
    producer = Producer(settings, topic, partitions)
    base_ms = 1_700_000_000_000
    written = 0
    while written < records:
        n = min(segment_records * partitions, records - written)
        user_idx = rng.integers(0, pool, n)
        city_idx = rng.integers(0, len(CITIES), n)
        parts = part_of_user[user_idx]
        ts = base_ms + (written + np.arange(n)) * 10
        pad = max(0, value_bytes - 40)
        tail = '\\"}"}\n' if not pad else f'\\",\\"note\\":\\"{"x" * pad}\\"}}"}}\n'
        for p in range(partitions):
            sel = np.flatnonzero(parts == p)
            if len(sel):
                columns = (
                    pa.array(np.array(names, dtype=object)[user_idx[sel]], pa.string()),
                    pa.array(np.array(CITIES, dtype=object)[city_idx[sel]], pa.string()),
                    pa.array(ts[sel]).cast(pa.string()),
                )
                producer.write_segment(p, functools.partial(_render_check_ins, columns, tail))
        written += n
    return written


def _render_check_ins(columns: tuple[Any, Any, Any], tail: str, start: int) -> tuple[bytes, int]:
    """Envelope lines for generated check-ins, offsets from ``start`` (one segment's bytes)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    user, city, stamps = columns
    n = len(user)
    offsets = pa.array(np.arange(start, start + n)).cast(pa.string())
    lines = pc.binary_join_element_wise(
        '{"offset":', offsets, ',"timestamp":', stamps,
        ',"timestampType":"CreateTime","key":"', user,
        '","value":"{\\"location\\":\\"', city, tail, "",
    )  # fmt: skip
    return _concat_strings(lines), n


def _concat_strings(arr: Any) -> bytes:
    """The bytes of all strings of an Arrow string array, back to back (its data buffer)."""
    import numpy as np

    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[
        arr.offset : arr.offset + len(arr) + 1
    ]
    return arr.buffers()[2].to_pybytes()[int(offsets[0]) : int(offsets[-1])]


# -- the command-line producer's input format -------------------------------------------------


def _headers(raw: Any, origin: str) -> tuple[tuple[str, bytes | None], ...]:
    from lakehouse.contracts.serde import json_text

    if raw is None:
        return ()
    pairs: Sequence[Any]
    if isinstance(raw, Mapping):
        pairs = list(raw.items())
    elif isinstance(raw, list):
        pairs = [(h.get("key"), h.get("value")) if isinstance(h, Mapping) else h for h in raw]
    else:
        raise BadRecordError(origin, "headers must be an object or a list of {key, value}")
    out: list[tuple[str, bytes | None]] = []
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise BadRecordError(origin, f"bad header {pair!r}")
        hv = pair[1]
        if hv is not None and not isinstance(hv, str):
            hv = json_text(hv)
        out.append((pair[0], None if hv is None else hv.encode("utf-8")))
    return tuple(out)


_INPUT_KEYS = frozenset({"key", "value", "timestamp", "headers", "partition"})


def record_from_json_line(line: str, origin: str, serializer: Serializer | None = None) -> Record:
    """Parse one producer input line: ``{"key", "value", "timestamp"?, "headers"?, "partition"?}``.

    Numbers are read exactly (a fraction is never rounded through a float). With a
    ``serializer`` (from the topic's contract) key and value are checked against their types
    and encoded in the topic's format, and a partition must be one of the topic's; without one
    the key is text and the value any JSON (or null, a tombstone), carried as its compact JSON
    text.
    """
    from lakehouse.contracts.serde import JSON_NUMBERS, json_text

    try:
        obj = json.loads(line, **JSON_NUMBERS)
    except json.JSONDecodeError as exc:
        raise BadRecordError(origin, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # NaN or Infinity
        raise BadRecordError(origin, f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRecordError(origin, "each line must be a JSON object with 'key' and 'value'")
    unknown = set(obj) - _INPUT_KEYS
    if unknown:
        raise BadRecordError(
            origin, f"unknown field(s) {sorted(unknown)}; allowed: {sorted(_INPUT_KEYS)}"
        )
    if "value" not in obj:
        raise BadRecordError(origin, "missing 'value' (use null for a tombstone)")
    partition = obj.get("partition")
    if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)):
        raise BadRecordError(origin, "partition must be an integer")
    key, value = obj.get("key"), obj["value"]
    if serializer is not None:
        partitions = serializer.contract.partitions
        if partition is not None and not 0 <= partition < partitions:
            raise BadRecordError(
                origin, f"partition {partition} out of range: the topic has {partitions}"
            )
        key_bytes = serializer.key(key, origin)
        value_bytes = serializer.value(value, origin)
    else:
        if key is not None and not isinstance(key, str):
            raise BadRecordError(origin, "key must be a string or null")
        key_bytes = None if key is None else key.encode("utf-8")
        value_bytes = None if value is None else json_text(value).encode("utf-8")
    return Record(
        key=key_bytes,
        value=value_bytes,
        timestamp_ms=parse_timestamp(obj.get("timestamp"), origin),
        headers=_headers(obj.get("headers"), origin),
        partition=partition,
    )
