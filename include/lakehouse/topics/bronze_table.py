"""The bronze table of a topic, whichever origin its records come from: its schema, the position
it has reached in each partition (the next offset, kept in its commits), the outcome of a batch,
and the side tables (quarantine, gaps) written once per batch beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse.quality.ledger import PUBLISHED, BatchOutcome
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, delta_spark
from lakehouse.topics.segments import RECORD_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
    # The topic's end offset per partition when the batch was planned (the broker's, or the
    # landing files' listed): with next_offsets, the batch's lag without asking the topic again.
    end_offsets: dict[int, int] | None = None

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
            lag=self.lag(),
            lag_unit=None if self.end_offsets is None else "records",
        )

    def lag(self) -> int | None:
        """Records the topic held at planning that bronze has still to read (None: not known)."""
        if self.end_offsets is None:
            return None
        return sum(max(0, end - self.next_offsets.get(p, 0)) for p, end in self.end_offsets.items())

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


def append_side(
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


def side_table_behind(
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
