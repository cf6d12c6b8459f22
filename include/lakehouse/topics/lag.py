"""Kafka's consumer lag, for bronze as the consumer of a topic: per partition, the topic's end
offset (its landing files', or the broker's), the next offset bronze will read (its committed
position), and the difference, in records. Read from the files, the broker and the Delta log:
no Spark."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from lakehouse.contracts.model import Contract
from lakehouse.runtime.config import Settings
from lakehouse.storage.store import latest_metadata
from lakehouse.topics import kafka
from lakehouse.topics.bronze_table import POSITION_KEY, Position
from lakehouse.topics.landing import end_offsets, survey


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a topic: where it ends and where bronze stands."""

    topic: str
    partition: int
    end_offset: int  # the offset the next record written to the partition gets
    bronze_offset: int  # the offset bronze reads next

    @property
    def lag(self) -> int:
        """Records written to the partition that bronze has not read yet."""
        return max(0, self.end_offset - self.bronze_offset)


@dataclass
class TopicLag:
    """The lag of every partition of some topics, and the files of their landing folders that
    bronze does not read (each as ``topic: path (reason)``)."""

    partitions: list[PartitionLag] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def lag(settings: Settings, contracts: Iterable[Contract]) -> TopicLag:
    """Bronze's lag behind each partition of each topic. A partition bronze has a position for
    that the topic no longer has (fewer partitions now) is listed too, at end offset 0."""
    out = TopicLag()
    for c in contracts:
        if c.kafka is not None:
            marks = kafka.offsets(kafka.client(settings, c), c.partitions)
            ends = {p: end for p, (_, end) in marks.items()}
        else:
            ends = end_offsets(settings, c.topic, c.partitions, c.landing_format)
            root = settings.topic_dir(c.topic)
            out.ignored.extend(
                f"{c.topic}: {i.describe(root)}" for i in survey(settings, c.topic)[1]
            )
        committed = Position.from_json(
            latest_metadata(settings.bronze_path(c.topic), POSITION_KEY)
        ).next
        out.partitions.extend(
            PartitionLag(c.topic, p, ends.get(p, 0), committed.get(p, 0))
            for p in sorted(set(ends) | set(committed))
        )
    return out
