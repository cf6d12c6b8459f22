"""Bronze: topics as Delta tables, ingested exactly once from landing segments.

The bronze table has the schema of Spark's Kafka source (``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, ``headers``) plus ingest metadata
(``_source_file``, ``_batch_id``, ``_ingested_at``).

One micro-batch: list the segments not yet ingested, parse them in Spark tasks (a partition's
files in one task, in offset order, so records re-delivered in several files are recognised by
their offset and land once), and append the good records with delta-spark in one Delta commit
that also records the new position: the next offset per partition (app transaction ``landing``
with the batch id as version, and the position in the commit's metadata). Bad lines go to the
bronze quarantine table with file, line, byte offset and reason, and the good records of the
same file still land. A crash anywhere is repaired by the next run: nothing lost, nothing doubled.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse.contracts.model import BRONZE_COLUMNS, Contract
from lakehouse.errors import BrokerUnavailableError, DataLossError
from lakehouse.quality.gate import Gate
from lakehouse.quality.ledger import PUBLISHED, BatchOutcome, count_reasons
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location, ObjectPath
from lakehouse.storage import DeltaStore, Txn, delta_spark
from lakehouse.storage.tasks import rows_from_tasks
from lakehouse.topics.landing import Segment, end_offsets, list_segments, start_offset_of, survey
from lakehouse.topics.segments import RECORD_SCHEMA, BadLine, SegmentFile, constant, read_segment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakehouse.topics import kafka

log = logging.getLogger(__name__)

BRONZE_APP = "landing"
POSITION_KEY = "lakehouse.position"
BATCH_KEY = "lakehouse.batch"

BRONZE_SCHEMA = pa.schema(
    [
        *RECORD_SCHEMA,
        pa.field("_batch_id", pa.int64()),
        pa.field("_ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("source_file", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("byte_offset", pa.int64()),
        pa.field("reason", pa.string()),
        pa.field("raw", pa.binary()),
        pa.field("_batch_id", pa.int64()),
        pa.field("_ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass
class Position:
    """Where bronze stands in each partition of a topic."""

    next: dict[int, int] = field(default_factory=dict)
    # Files at or past `next` that were read and yielded nothing to advance it (empty or wholly
    # bad files): remembered so that they are not read and counted again.
    skip: dict[int, list[str]] = field(default_factory=dict)
    listed_at_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "next": {str(p): n for p, n in sorted(self.next.items())},
            "skip": {str(p): names for p, names in sorted(self.skip.items()) if names},
            "listed_at_ms": self.listed_at_ms,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> Position:
        if not raw:
            return cls()
        return cls(
            next={int(p): int(n) for p, n in raw.get("next", {}).items()},
            skip={int(p): list(v) for p, v in raw.get("skip", {}).items()},
            listed_at_ms=int(raw.get("listed_at_ms", 0)),
        )


@dataclass
class BronzeResult:
    topic: str
    batch_id: int | None
    records: int = 0
    quarantined: int = 0
    duplicates: int = 0
    gaps: dict[int, int] = field(default_factory=dict)
    next_offsets: dict[int, int] = field(default_factory=dict)
    files: int = 0
    committed: bool = False
    kafka_topic: str | None = None  # read from this broker topic, not from landing files
    lost: dict[int, tuple[int, int]] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # landing files that are not segments
    table_version: int | None = None  # the version the batch committed
    reasons: dict[str, int] = field(default_factory=dict)  # quarantined, by reason kind

    def batch(self) -> BatchOutcome | None:
        """The batch's outcome for the ledger (None: no batch, or one committed before)."""
        if not self.committed:
            return None
        missing = sum(self.gaps.values()) + sum(b - a for a, b in self.lost.values())
        return BatchOutcome(
            "bronze",
            self.topic,
            PUBLISHED,
            self.records,
            self.table_version,
            reasons=self.reasons,
            gaps=missing,
        )

    def summary(self) -> str:
        ignored = ""
        if self.ignored:
            shown = "; ".join(self.ignored[:10])
            more = f"; and {len(self.ignored) - 10} more" if len(self.ignored) > 10 else ""
            ignored = f"; {len(self.ignored)} file(s) in the landing folder not read: {shown}{more}"
        return self._summary() + ignored

    def _summary(self) -> str:
        if self.batch_id is None:
            new = "records on the broker" if self.kafka_topic else "segments"
            return f"bronze {self.topic}: no new {new}"
        state = "committed" if self.committed else "already applied (skipped)"
        gaps = sum(self.gaps.values())
        gap_text = f", offset gaps: {gaps} ({self.gaps})" if gaps else ""
        if self.kafka_topic is not None:
            lost = "".join(
                f", offsets {a}..{b - 1} of partition {p} lost to retention (recorded)"
                for p, (a, b) in sorted(self.lost.items())
            )
            return (
                f"bronze {self.topic}: batch {self.batch_id} {state}: {self.records} records "
                f"from Kafka topic {self.kafka_topic}{gap_text}{lost}, next offsets "
                f"{self.next_offsets}"
            )
        return (
            f"bronze {self.topic}: batch {self.batch_id} {state}: {self.records} records from "
            f"{self.files} segment(s), {self.quarantined} quarantined, {self.duplicates} "
            f"re-delivered skipped{gap_text}, next offsets {self.next_offsets}"
        )


def position(store: DeltaStore, settings: Settings, topic: str) -> Position:
    return Position.from_json(store.latest_metadata(settings.bronze_path(topic), POSITION_KEY))


def _mtime_resolution_ms(seg: Segment) -> int:
    """How coarse a segment's modification time is: S3 dates objects to the second, so a file
    written in the second of the last listing may carry a time before it (read again: its
    records up to the position are skipped by offset)."""
    return 1000 if isinstance(seg.path, ObjectPath) else 0


def select_segments(segments: list[Segment], pos: Position) -> list[Segment]:
    """Segments to read: those at or past the position (unless already read), plus any file
    that appeared since the last listing below the position (a re-delivered or overlapping
    segment: its records past the position are new, the rest are skipped by offset)."""
    chosen = []
    for s in segments:
        nxt = pos.next.get(s.partition, 0)
        if s.start_offset >= nxt:
            if s.path.name not in pos.skip.get(s.partition, []):
                chosen.append(s)
        elif s.mtime_ns // 1_000_000 >= pos.listed_at_ms - _mtime_resolution_ms(s):
            chosen.append(s)
    return chosen


def plan(settings: Settings, contract: Contract) -> str:
    """A dry run of :func:`ingest`: the segments it would read per partition, from the offsets
    bronze has reached to the landing's end offsets. Reads the logs only; changes nothing."""
    from lakehouse.storage.store import latest_metadata

    topic = contract.topic
    pos = Position.from_json(latest_metadata(settings.bronze_path(topic), POSITION_KEY))
    if contract.kafka is not None:
        return _kafka_dry_run(settings, contract, pos)
    segments = select_segments(list_segments(settings, topic), pos)
    if not segments:
        return f"bronze {topic} (dry run): no new segments"
    ends = end_offsets(settings, topic, contract.partitions, contract.landing_format)
    parts = []
    for p in sorted({s.partition for s in segments}):
        files = sum(1 for s in segments if s.partition == p)
        parts.append(
            f"partition {p}: {files} file(s), offsets {pos.next.get(p, 0)}..{ends.get(p, 0) - 1}"
        )
    return (
        f"bronze {topic} (dry run): would read {len(segments)} segment(s) into bronze.{topic} "
        f"as one batch: " + "; ".join(parts)
    )


def _kafka_dry_run(settings: Settings, contract: Contract, pos: Position) -> str:
    from lakehouse.topics import kafka

    c = kafka.client(settings, contract)
    kafka.check_topic(c, contract)
    read, lost, _ = kafka_plan(pos, kafka.offsets(c, contract.partitions))
    topic = contract.topic
    if not read and not lost:
        return f"bronze {topic} (dry run): no new records on Kafka topic {c.topic}"
    parts = [f"partition {p}: offsets {a}..{b - 1}" for p, (a, b) in sorted(read.items())]
    parts += [
        f"partition {p}: offsets {a}..{b - 1} LOST to retention"
        for p, (a, b) in sorted(lost.items())
    ]
    assert contract.kafka is not None
    verdict = ""
    if lost:
        verdict = (
            " (the run would fail: the contract does not accept data loss)"
            if contract.kafka.on_data_loss == "fail"
            else " (the loss would be recorded in the gaps table)"
        )
    return (
        f"bronze {topic} (dry run): would read Kafka topic {c.topic} at {c.bootstrap_servers} "
        f"into bronze.{topic} as one batch: " + "; ".join(parts) + verdict
    )


def _partition_task(
    item: dict[str, Any], emit: Callable[[dict[str, Any]], None]
) -> Iterator[pa.Table]:
    """Read one partition's segments (in offset order), skip what bronze already has, yield the
    new records; emit a summary per file and every bad line. Runs in a Spark task."""
    import numpy as np

    committed = int(item["committed"])
    seen: list[np.ndarray] = []  # offsets kept so far in this batch, per file
    seen_max = -1
    ingested_at = pa.timestamp("us", tz="UTC")
    for raw in item["files"]:
        seg = SegmentFile(**raw)
        got = read_segment(seg, item["topic"], item["max_record_bytes"])
        for b in got.bad:
            emit({"bad_line": _bad_row(b)})
        offsets = got.records.column("offset").to_numpy()
        new = offsets >= committed
        increasing = len(offsets) < 2 or bool(np.all(offsets[1:] > offsets[:-1]))
        if increasing and (len(offsets) == 0 or offsets[0] > seen_max):
            keep = new  # the usual case: no offset can repeat, nothing to look up
        else:
            # Keep a record once: not seen in an earlier file of the batch, first in this one.
            _, first = np.unique(offsets, return_index=True)
            once = np.zeros(len(offsets), dtype=bool)
            once[first] = True
            earlier = np.concatenate(seen) if seen else np.empty(0, dtype=np.int64)
            keep = new & once & ~np.isin(offsets, earlier)
        kept = got.records if keep.all() else got.records.filter(pa.array(keep))
        kept_offsets = offsets[keep]
        if len(kept_offsets):
            seen.append(kept_offsets)
            seen_max = max(seen_max, int(kept_offsets.max()))
        emit(
            {
                "file": raw,
                "lines": got.lines,
                "end": got.end_offset,
                "kept": int(keep.sum()),
                "max_kept": int(kept_offsets.max()) if len(kept_offsets) else None,
                # Re-deliveries skipped: offsets bronze has passed, or met earlier in the batch.
                "duplicates": int((~keep).sum()),
                "bad": len(got.bad),
            }
        )
        if kept.num_rows:
            n = kept.num_rows
            yield kept.append_column(
                "_batch_id", constant(item["batch_id"], pa.int64(), n)
            ).append_column("_ingested_at", constant(item["ingested_at_us"], ingested_at, n))


def _bad_row(b: BadLine) -> dict[str, Any]:
    row = asdict(b)
    row["raw"] = None if b.raw is None else base64.b64encode(b.raw).decode("ascii")
    return row


def advance(old: Position, files: list[dict[str, Any]], listed_at_ms: int) -> Position:
    """The position after a batch: past every record read, and the files that did not move it."""
    nxt = dict(old.next)
    for f in files:
        p = f["file"]["partition"]
        marks = [nxt.get(p, 0)]
        if f["end"] is not None:
            marks.append(f["end"])
        if f["max_kept"] is not None:
            marks.append(f["max_kept"] + 1)
        nxt[p] = max(marks)
    # A skipped file below the position is covered by the position itself: forget it.
    skip = {
        p: [n for n in names if start_offset_of(n) >= nxt.get(p, 0)]
        for p, names in old.skip.items()
    }
    for f in files:
        p, name = f["file"]["partition"], Path(f["file"]["path"]).name
        if f["file"]["start_offset"] >= nxt.get(p, 0) and name not in skip.setdefault(p, []):
            skip[p].append(name)
    return Position(nxt, {p: v for p, v in skip.items() if v}, listed_at_ms)


def offset_gaps(old: Position, new: Position, files: list[dict[str, Any]]) -> dict[int, int]:
    """Offsets the position moved past that no record of the batch carried (compacted topics
    have such gaps legitimately; bad lines of envelope files too, their offsets unknown)."""
    gaps: dict[int, int] = {}
    for p in {f["file"]["partition"] for f in files}:
        kept = sum(f["kept"] for f in files if f["file"]["partition"] == p)
        missing = new.next.get(p, 0) - old.next.get(p, 0) - kept
        if missing > 0:
            gaps[p] = missing
    return gaps


def _work_items(
    contract: Contract, segments: list[Segment], pos: Position, batch_id: int
) -> list[dict[str, Any]]:
    now_us = int(time.time() * 1_000_000)
    by_partition: dict[int, list[Segment]] = {}
    for s in segments:
        by_partition.setdefault(s.partition, []).append(s)
    items = []
    for p, segs in sorted(by_partition.items()):
        files = [
            asdict(
                SegmentFile(
                    path=str(s.path),
                    partition=p,
                    start_offset=s.start_offset,
                    format=contract.landing_format,
                    keys_path=str(s.keys_path) if s.keys_path else None,
                )
            )
            for s in sorted(segs, key=lambda s: (s.start_offset, s.path.name))
        ]
        items.append(
            {
                "topic": contract.topic,
                "partition": p,
                "committed": pos.next.get(p, 0),
                "files": files,
                "batch_id": batch_id,
                "ingested_at_us": now_us,
                "max_record_bytes": contract.max_record_bytes,
            }
        )
    return items


def _write_quarantine(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    batch_id: int,
    bad: list[dict[str, Any]],
) -> None:
    """Append a batch's bad lines to the topic's bronze quarantine, once per batch."""
    if not bad:
        return
    now = int(time.time() * 1_000_000)
    n = len(bad)
    columns = {
        "topic": [topic] * n,
        **{c: [b[c] for b in bad] for c in ("partition", "source_file", "line", "byte_offset")},
        "reason": [b["reason"] for b in bad],
        "raw": [None if b["raw"] is None else base64.b64decode(b["raw"]) for b in bad],
        "_batch_id": [batch_id] * n,
        "_ingested_at": [now] * n,
    }
    _append_side(
        spark,
        settings,
        settings.quarantine_path("bronze", topic),
        batch_id,
        columns,
        QUARANTINE_SCHEMA,
    )


def _append_side(
    spark: SparkSession,
    settings: Settings,
    path: Location,
    batch_id: int,
    columns: Mapping[str, Any],
    schema: pa.Schema,
) -> None:
    """Append a batch's rows to a side table of bronze (quarantine, gaps), once per batch: the
    same app transaction and batch id as bronze's commit."""
    rows = delta_spark.arrow_frame(spark, pa.table(columns, schema=schema))
    with delta_spark.table_lock(settings, path):
        delta_spark.append(rows, path, txn=Txn(BRONZE_APP, batch_id), create=schema)


def _side_table_behind(
    spark: SparkSession, settings: Settings, topic: str, side: Location
) -> tuple[int, dict[str, Any]] | None:
    """Bronze's last batch and its commit's summary, if a side table written after that commit
    does not have the batch yet (the run died between the two): the caller writes it again."""
    store = DeltaStore(spark)
    path = settings.bronze_path(topic)
    done = store.transaction_version(path, BRONZE_APP)
    if done is None:
        return None
    kept = store.transaction_version(side, BRONZE_APP)
    if kept is not None and kept >= done:
        return None
    summary = store.latest_metadata(path, BATCH_KEY) or {}
    return (done, summary) if summary.get("batch_id") == done else None


def _repair_quarantine(spark: SparkSession, settings: Settings, contract: Contract) -> None:
    """If the last run committed bronze but died before quarantining its bad lines, redo that:
    the segment files are immutable, so reading them again finds the same bad lines."""
    side = settings.quarantine_path("bronze", contract.topic)
    behind = _side_table_behind(spark, settings, contract.topic, side)
    if behind is None or not behind[1].get("files_with_bad_lines"):
        return
    done, summary = behind
    bad = [
        _bad_row(b)
        for raw in summary["files_with_bad_lines"]
        for b in read_segment(SegmentFile(**raw), contract.topic, contract.max_record_bytes).bad
    ]
    _write_quarantine(spark, settings, contract.topic, done, bad)


def ingest(
    spark: SparkSession, settings: Settings, contract: Contract, gate: Gate | None = None
) -> BronzeResult:
    """Ingest every new landing record of a topic as one bronze batch (one Delta commit),
    judged by the table's ``gate`` before it is published.

    The job holds the table's commit lock throughout: a second copy of it (a retried task
    beside the first) waits, then finds the batch done."""
    path = settings.bronze_path(contract.topic)
    client = None
    if contract.kafka is not None:
        from lakehouse.topics import kafka

        client = kafka.client(settings, contract)
        kafka.check_topic(client, contract)
    with delta_spark.table_lock(settings, path):
        delta_spark.create_table(spark, path, BRONZE_SCHEMA, gate=gate)
        if client is not None:
            _repair_gaps(spark, settings, contract)
            return _ingest_kafka(spark, settings, contract, path, client, gate)
        _repair_quarantine(spark, settings, contract)
        return _ingest(spark, settings, contract, path, gate)


def _ingest(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    path: Location,
    gate: Gate | None,
) -> BronzeResult:
    store = DeltaStore(spark)
    topic = contract.topic
    pos = position(store, settings, topic)
    last_batch = store.transaction_version(path, BRONZE_APP)
    batch_id = 0 if last_batch is None else last_batch + 1
    listed_at = int(time.time() * 1000)
    landed, skipped = survey(settings, topic)
    ignored = [i.describe(settings.topic_dir(topic)) for i in skipped]
    for line in ignored:
        log.warning("bronze %s: not read from the landing folder: %s", topic, line)
    segments = select_segments(landed, pos)
    if not segments:
        return BronzeResult(topic, None, next_offsets=pos.next, ignored=ignored)

    items = _work_items(contract, segments, pos, batch_id)
    with rows_from_tasks(spark, items, _partition_task, BRONZE_SCHEMA) as (records, side):
        files = [s for s in side if "file" in s]
        bad = [s["bad_line"] for s in side if "bad_line" in s]
        new_pos = advance(pos, files, listed_at)
        gaps = offset_gaps(pos, new_pos, files)
        kept = sum(f["kept"] for f in files)
        duplicates = sum(f["duplicates"] for f in files)
        bad_files = {b["source_file"] for b in bad}
        summary = {
            "batch_id": batch_id,
            "records": kept,
            "quarantined": len(bad),
            "duplicates": duplicates,
            "gaps": {str(p): g for p, g in gaps.items()},
            "files_with_bad_lines": [f["file"] for f in files if f["file"]["path"] in bad_files],
        }
        result = delta_spark.append(
            records,
            path,
            txn=Txn(BRONZE_APP, batch_id),
            metadata={POSITION_KEY: new_pos.to_json(), BATCH_KEY: summary},
            gate=gate,
            rows=kept,
            source={
                "table": f"landing.{topic}",
                "offsets": {str(p): n for p, n in pos.next.items()},
            },
        )
    if result.committed:
        _write_quarantine(spark, settings, topic, batch_id, bad)
    return BronzeResult(
        topic,
        batch_id,
        records=kept,
        quarantined=len(bad),
        duplicates=duplicates,
        gaps=gaps,
        next_offsets=new_pos.next,
        files=len(files),
        committed=result.committed,
        ignored=ignored,
        table_version=result.table_version,
        reasons=count_reasons((b["reason"], 1) for b in bad),
    )


GAPS_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("first_offset", pa.int64()),
        pa.field("last_offset", pa.int64()),
        pa.field("records", pa.int64()),
        pa.field("_batch_id", pa.int64()),
        pa.field("_ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)


def kafka_plan(
    pos: Position, marks: dict[int, tuple[int, int]]
) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]], dict[int, int]]:
    """From bronze's position and the broker's (earliest, end) offsets per partition: the
    ranges to read, ``[start, end)`` per partition with records; the ranges retention deleted
    before bronze read them; and the position after the batch, for every partition."""
    read: dict[int, tuple[int, int]] = {}
    lost: dict[int, tuple[int, int]] = {}
    after: dict[int, int] = {}
    for p, (low, end) in sorted(marks.items()):
        at = pos.next.get(p, 0)
        if at < low:
            lost[p] = (at, low)
            at = low
        if at < end:
            read[p] = (at, end)
        after[p] = max(at, end)
    return read, lost, after


def _kafka_frame(
    spark: SparkSession, c: Any, read: dict[int, tuple[int, int]], batch_id: int
) -> Any:
    """The records of ``read`` from Spark's Kafka source (one bounded batch read), in bronze's
    schema. ``failOnDataLoss``: records deleted between planning and reading fail the read."""
    import json

    from pyspark.sql import functions as F

    def per_partition(i: int) -> str:
        return json.dumps({c.topic: {str(p): r[i] for p, r in sorted(read.items())}})

    frame = (
        spark.read.format("kafka")
        .options(**c.spark_options())
        .option("assign", json.dumps({c.topic: sorted(read)}))
        .option("startingOffsets", per_partition(0))
        .option("endingOffsets", per_partition(1))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        .option("kafka.isolation.level", c.isolation)
        # Every offset asked for is on the broker: a fetch need not wait for more. Kafka's
        # default (500 ms) made a 1M-record read 2.5x slower here (5.6 s against 2.3 s).
        .option("kafka.fetch.max.wait.ms", c.config.get("fetch.max.wait.ms", "10"))
        # A broker that dies under the read fails it within about a minute (planning tries
        # three times), not the Java client's 3 x 60 s: measured 51 s after a kill -9 here.
        .option("kafka.request.timeout.ms", c.config.get("request.timeout.ms", "10000"))
        .option("kafka.default.api.timeout.ms", c.config.get("default.api.timeout.ms", "15000"))
        .load()
    )
    return frame.select(
        *(c for c in BRONZE_COLUMNS if c != "headers"),
        # The source gives no headers as null; bronze has always kept them as an empty list.
        F.coalesce("headers", F.array().cast(frame.schema["headers"].dataType)).alias("headers"),
        F.lit(None).cast("string").alias("_source_file"),
        F.lit(batch_id).cast("long").alias("_batch_id"),
        F.current_timestamp().alias("_ingested_at"),
    )


def _ingest_kafka(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    path: Location,
    c: kafka.Client,
    gate: Gate | None,
) -> BronzeResult:
    """One bounded read of the topic's partitions, from bronze's position to the end offsets
    read at planning, appended in one Delta commit with the new position."""
    from pyspark import StorageLevel

    from lakehouse.topics import kafka

    store = DeltaStore(spark)
    topic = contract.topic
    pos = position(store, settings, topic)
    last_batch = store.transaction_version(path, BRONZE_APP)
    batch_id = 0 if last_batch is None else last_batch + 1
    read, lost, after = kafka_plan(pos, kafka.offsets(c, contract.partitions))
    assert contract.kafka is not None
    if lost and contract.kafka.on_data_loss == "fail":
        raise DataLossError(c.topic, lost)
    if not read and not lost:
        return BronzeResult(topic, None, next_offsets=pos.next, kafka_topic=c.topic)
    new_pos = Position({**pos.next, **after}, listed_at_ms=int(time.time() * 1000))
    if read:
        records = _kafka_frame(spark, c, read, batch_id)
    else:
        records = delta_spark.arrow_frame(spark, BRONZE_SCHEMA.empty_table())
    summary: dict[str, Any] = {
        "batch_id": batch_id,
        "quarantined": 0,
        "duplicates": 0,
        "lost": {str(p): list(r) for p, r in lost.items()},
    }
    kept: int | None = None
    if gate is not None:
        # The gate judges the rows before they are written: read them from the broker once.
        records = records.persist(StorageLevel.DISK_ONLY)
        kept = records.count()
        summary["records"] = kept
    try:
        result = delta_spark.append(
            records,
            path,
            txn=Txn(BRONZE_APP, batch_id),
            metadata={POSITION_KEY: new_pos.to_json(), BATCH_KEY: summary},
            gate=gate,
            rows=kept,
            source={
                "table": f"kafka.{c.topic}",
                "offsets": {str(p): n for p, n in pos.next.items()},
            },
        )
    finally:
        records.unpersist()
    if kept is None:
        kept = result.rows_written or 0
    gaps: dict[int, int] = {}
    if result.committed and kept < sum(end - start for start, end in read.values()):
        gaps = _kafka_gaps(spark, path, batch_id, read)
    if result.committed:
        _write_gaps(spark, settings, topic, batch_id, lost)
    try:
        kafka.commit_group(c, new_pos.next)
    except BrokerUnavailableError as exc:  # the Delta commit stands; the group only mirrors it
        log.warning("bronze %s: consumer group not updated: %s", topic, exc)
    return BronzeResult(
        topic,
        batch_id,
        records=kept,
        gaps=gaps,
        next_offsets=new_pos.next,
        committed=result.committed,
        kafka_topic=c.topic,
        lost=lost,
        table_version=result.table_version,
    )


def _kafka_gaps(
    spark: SparkSession, path: Location, batch_id: int, read: dict[int, tuple[int, int]]
) -> dict[int, int]:
    """Offsets a batch read past that carried no record (a compacted topic, transaction
    markers), per partition: counted in the batch's rows as written, not read again from Kafka."""
    from pyspark.sql import functions as F

    rows = spark.read.format("delta").load(str(path)).where(F.col("_batch_id") == batch_id)
    counted = {
        r["partition"]: r["n"]
        for r in rows.groupBy("partition").agg(F.count("*").alias("n")).collect()
    }
    gaps = {p: end - start - counted.get(p, 0) for p, (start, end) in read.items()}
    return {p: g for p, g in gaps.items() if g > 0}


def _write_gaps(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    batch_id: int,
    lost: dict[int, tuple[int, int]],
) -> None:
    """Keep the ranges retention deleted (accepted by the contract), once per batch."""
    if not lost:
        return
    now = int(time.time() * 1_000_000)
    parts = sorted(lost)
    columns = {
        "topic": [topic] * len(parts),
        "partition": parts,
        "first_offset": [lost[p][0] for p in parts],
        "last_offset": [lost[p][1] - 1 for p in parts],
        "records": [lost[p][1] - lost[p][0] for p in parts],
        "_batch_id": [batch_id] * len(parts),
        "_ingested_at": [now] * len(parts),
    }
    _append_side(spark, settings, settings.gaps_path(topic), batch_id, columns, GAPS_SCHEMA)


def _repair_gaps(spark: SparkSession, settings: Settings, contract: Contract) -> None:
    """If the last run committed bronze but died before keeping its lost ranges, keep them now
    (they are in that commit's summary)."""
    behind = _side_table_behind(spark, settings, contract.topic, settings.gaps_path(contract.topic))
    if behind is None or not behind[1].get("lost"):
        return
    done, summary = behind
    lost = {int(p): (int(a), int(b)) for p, (a, b) in summary["lost"].items()}
    _write_gaps(spark, settings, contract.topic, done, lost)
