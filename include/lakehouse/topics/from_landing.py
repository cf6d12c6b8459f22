"""Bronze from landing: a topic's records ingested exactly once from its landing segment files.

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
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse.contracts.model import Contract
from lakehouse.quality.gate import Gate
from lakehouse.quality.ledger import count_reasons
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location, ObjectPath
from lakehouse.storage import DeltaStore, Txn, delta_spark
from lakehouse.storage.tasks import rows_from_tasks
from lakehouse.topics.bronze_table import (
    BATCH_KEY,
    BRONZE_APP,
    BRONZE_SCHEMA,
    POSITION_KEY,
    BronzeResult,
    Position,
    append_side,
    position,
    side_table_behind,
)
from lakehouse.topics.landing import Segment, end_offsets, list_segments, start_offset_of, survey
from lakehouse.topics.segments import BadLine, SegmentFile, constant, read_segment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

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


def plan(settings: Settings, contract: Contract, pos: Position) -> str:
    """A dry run of :func:`ingest` from bronze's position ``pos``: the segments it would read per
    partition, up to the landing's end offsets. Reads the logs only; changes nothing."""
    topic = contract.topic
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
    append_side(
        spark,
        settings,
        settings.quarantine_path("bronze", topic),
        batch_id,
        columns,
        QUARANTINE_SCHEMA,
    )


def repair_quarantine(spark: SparkSession, settings: Settings, contract: Contract) -> None:
    """If the last run committed bronze but died before quarantining its bad lines, redo that:
    the segment files are immutable, so reading them again finds the same bad lines."""
    side = settings.quarantine_path("bronze", contract.topic)
    behind = side_table_behind(spark, settings, contract.topic, side)
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
            lineage={
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
        # Every segment listed is read: the landing's end, as listed, is where bronze now is.
        end_offsets=dict(new_pos.next),
    )
