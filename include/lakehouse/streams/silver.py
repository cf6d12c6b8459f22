"""Silver: a stream is a topic with a schema.

The silver job reads bronze's change feed from the last bronze version it consumed, decodes key
and value by the contract (schema-on-read), and appends the typed stream; records that do not
decode go to the stream's quarantine table with their reason and origin. The consumed bronze
version is committed atomically with the output (app transaction), so a rerun is a no-op.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Contract
from lakehouse.quality.gate import Gate
from lakehouse.quality.ledger import PUBLISHED, BatchOutcome, count_reasons
from lakehouse.quality.verdict import Verdict
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, delta_spark, is_table
from lakehouse.streams.decode import decode, stream_rows
from lakehouse.streams.schema import TOMBSTONE, stream_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def input_app(contract: Contract) -> str:
    """The app id under which silver records how far it has read bronze."""
    return f"bronze.{contract.topic}"


def quarantine_rows(
    decoded: DataFrame, records: DataFrame | None = None, verdict: Verdict | None = None
) -> DataFrame:
    """The rows for the quarantine table: the records that did not decode, and those a
    quarantine expectation of ``verdict`` routed, with their raw key and value. The decoded
    batch keeps raw bytes only for records that did not decode; routed records take theirs from
    ``records`` (the bronze rows decoded), by partition and offset."""
    from pyspark.sql import functions as F

    bad = decoded.filter(F.col("_reason").isNotNull()).select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        F.col("_reason").alias("reason"),
    )
    if verdict is None or not verdict.to_quarantine:
        return bad
    assert records is not None, "routed records take their raw bytes from the bronze rows"
    raw = records.select(*RECORD_KEY, "key", "value")
    return bad.drop("key", "value").join(raw, RECORD_KEY).select(*bad.columns)


@dataclass
class SilverResult:
    stream: str
    input_versions: tuple[int, int] | None
    records: int = 0
    quarantined: int = 0
    committed: bool = False
    table_version: int | None = None  # the version the batch committed
    reasons: dict[str, int] = field(default_factory=dict)  # quarantined, by reason kind
    lineage: dict[str, Any] | None = None  # what it read: bronze's versions, writer schemas

    def batch(self) -> BatchOutcome | None:
        """The batch's outcome for the ledger (None: no batch, or one committed before)."""
        if not self.committed:
            return None
        # It read bronze up to the head it planned with: as planned, it is not behind.
        return BatchOutcome(
            "silver",
            self.stream,
            PUBLISHED,
            self.records,
            self.table_version,
            self.reasons,
            lag=0,
            lag_unit="versions",
            lineage=self.lineage,
        )

    def summary(self) -> str:
        if self.input_versions is None:
            return f"silver {self.stream}: bronze has no new versions"
        lo, hi = self.input_versions
        state = "committed" if self.committed else "already applied (skipped)"
        return (
            f"silver {self.stream}: bronze versions {lo}..{hi} {state}: "
            f"{self.records} records, {self.quarantined} quarantined"
        )


def build(
    spark: SparkSession, settings: Settings, contract: Contract, gate: Gate | None = None
) -> SilverResult:
    """Decode bronze versions not yet consumed into the silver stream (one micro-batch), judged
    by the stream's ``gate``.

    The job holds the stream's and its quarantine's commit locks throughout: a second copy of
    it waits, then finds the batch done."""
    silver_path = settings.silver_path(contract.stream)
    quarantine_path = settings.quarantine_path("silver", contract.stream)
    with (
        delta_spark.table_lock(settings, silver_path),
        delta_spark.table_lock(settings, quarantine_path),
    ):
        return _build(spark, settings, contract, silver_path, quarantine_path, gate)


def _build(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    silver_path: Location,
    quarantine_path: Location,
    gate: Gate | None,
) -> SilverResult:
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    bronze_path = settings.bronze_path(contract.topic)
    head = store.version(bronze_path)
    consumed = store.transaction_version(silver_path, input_app(contract))
    start = 0 if consumed is None else consumed + 1
    if head is None or start > head:
        return SilverResult(contract.stream, None)

    changes = store.changes(bronze_path, start, head).filter(F.col("_change_type") == "insert")
    decoded = _decoded(changes, contract)
    txn = Txn(input_app(contract), head)
    lineage: dict[str, Any] = {"table": f"bronze.{contract.topic}", "versions": [start, head]}
    source = contract.value_registry
    if source is not None and source.looked_up:
        # The writer schemas the batch was decoded with, as the registry gave them.
        lineage["schemas"] = {"subject": source.subject, "ids": sorted(contract.value_writers)}
    meta: dict[str, Any] = {"lakehouse.source": lineage}
    n_good, reasons = _split_counts(decoded)
    decoded, verdict = _judge(decoded, contract, gate, lineage, at_most=n_good)
    if verdict is not None and verdict.to_quarantine:  # the gate routed some: count again
        n_good, reasons = _split_counts(decoded)
    n_bad = sum(reasons.values())
    good = stream_rows(decoded, contract)
    bad = quarantine_rows(decoded, changes, verdict)
    quarantined = store.transaction_version(quarantine_path, input_app(contract))
    if n_bad and quarantined is not None and quarantined >= start:
        # A run died between the quarantine's commit and the stream's: the quarantine already
        # holds the bad records of bronze versions start..quarantined. Bronze may have moved on
        # since, so this batch is larger and its Txn newer: append only the records not there.
        held = store.read(quarantine_path).select(*RECORD_KEY)
        bad = bad.join(held, RECORD_KEY, "left_anti")
        n_bad = bad.count()
        reasons = {} if n_bad == 0 else _reason_counts(bad)
    if n_bad:
        delta_spark.append(bad, quarantine_path, txn=txn, metadata=meta, create=bad.schema)
    # The registry (checked when the job started) has allowed the contract's schema: new
    # optional fields become new columns; columns the contract dropped are written as nulls.
    # The gate's verdict is the one that routed the rows.
    result = delta_spark.append(
        good,
        silver_path,
        txn=txn,
        metadata=meta,
        schema_mode="add_columns",
        create=stream_schema(contract),
        gate=gate,
        verdict=verdict,
    )
    decoded.unpersist()
    return SilverResult(
        contract.stream,
        (start, head),
        n_good,
        n_bad,
        result.committed,
        result.table_version,
        reasons,
        lineage,
    )


def _split_counts(decoded: DataFrame) -> tuple[int, dict[str, int]]:
    """How many of the batch's records go to the stream, and how many to quarantine by reason
    kind (:func:`~lakehouse.quality.ledger.reason_kind`): one Spark job over the cached batch,
    not one per output."""
    counts = _grouped_reasons(decoded, "_reason")
    good = counts.pop(None, 0)
    return good, count_reasons((r, n) for r, n in counts.items() if r is not None)


def _reason_counts(bad: DataFrame) -> dict[str, int]:
    """Quarantine rows counted by reason kind."""
    return count_reasons(
        (r, n) for r, n in _grouped_reasons(bad, "reason").items() if r is not None
    )


def _grouped_reasons(rows: DataFrame, column: str) -> dict[str | None, int]:
    """Rows counted by their reason's text up to its first ": " (what follows names the value
    found, different in each record), null for a good row."""
    from pyspark.sql import functions as F

    cut = F.substring_index(F.col(column), ": ", 1).alias("r")
    return {
        row["r"]: int(row["n"]) for row in rows.groupBy(cut).agg(F.count("*").alias("n")).collect()
    }


def _decoded(changes: DataFrame, contract: Contract) -> DataFrame:
    """Bronze records decoded by the contract, cached once for both outputs. The raw bytes are
    kept for records that did not decode only: they are most of a record's size, and the rest
    do not need them (the few that a quarantine expectation routes get theirs from bronze, see
    :func:`quarantine_rows`)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    decoded = decode(changes, contract)
    bad_row = F.col("_reason").isNotNull()
    return decoded.select(
        *(c for c in decoded.columns if c not in {"key", "value"}),
        F.when(bad_row, F.col("key")).alias("key"),
        F.when(bad_row, F.col("value")).alias("value"),
    ).persist(StorageLevel.DISK_ONLY)  # on disk: see lakehouse.storage.tasks


def _judge(
    decoded: DataFrame,
    contract: Contract,
    gate: Gate | None,
    lineage: dict[str, Any],
    *,
    at_most: int | None = None,
) -> tuple[DataFrame, Verdict | None]:
    """The gate judges the records that decoded and carry a value (``at_most`` of them, if the
    caller knows a bound); tombstones (deletes) pass through. A failed `fail` expectation raises
    here, before anything is written; the records failing a `quarantine` expectation are given
    its reason."""
    from pyspark.sql import functions as F

    if gate is None:
        return decoded, None
    judged = stream_rows(decoded, contract).filter(~F.col(TOMBSTONE))
    verdict = gate.check(judged, lineage=lineage, at_most=(at_most, None))
    if verdict.to_quarantine:
        routed = F.when(~F.col(TOMBSTONE), gate.quarantine_reason(verdict.to_quarantine))
        decoded = decoded.withColumn("_reason", F.coalesce(F.col("_reason"), routed))
    return decoded, verdict


RECORD_KEY = ["partition", "offset"]


@dataclass
class ReprocessResult:
    """A reprocess of bronze records the stream has already consumed (see :func:`reprocess`)."""

    stream: str
    scope: str
    candidates: int = 0  # records in scope that are not in the stream
    recovered: int = 0  # of which now decode and joined the stream
    quarantined: int = 0  # of which still fail and were not in quarantine yet
    released: int = 0  # quarantine rows removed because their record is now in the stream
    held: int = 0  # dry run: how many of the candidates are in quarantine now
    dry_run: bool = False

    def summary(self) -> str:
        head = f"silver {self.stream}: reprocess of {self.scope}"
        if self.dry_run:
            return (
                f"{head} (dry run): would decode again {self.candidates} record(s) not in the "
                f"stream, {self.held} of them in quarantine now; nothing changed"
            )
        return (
            f"{head}: {self.candidates} record(s) not in the stream decoded again: "
            f"{self.recovered} joined the stream, {self.quarantined} newly quarantined, "
            f"{self.released} released from quarantine"
        )


def reprocess(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    *,
    from_version: int | None = None,
    from_offsets: Mapping[int, int] | None = None,
    dry_run: bool = False,
    gate: Gate | None = None,
) -> ReprocessResult:
    """Decode again the bronze records the stream has consumed from bronze version
    ``from_version``, or from an offset per partition (other partitions untouched).

    A stream is append-only and its records are immutable, so a record already in the stream
    stays as it is; the records in scope that are not (those in quarantine, after a contract or
    decoder fix) are decoded and gated again. The ones that now pass are appended (as late
    arrivals: gold tables take them by their offsets and event times, as Kafka Streams would)
    and leave the quarantine; the ones that still fail stay in it, once. Idempotent: a rerun, or
    a rerun after a crash between the two tables' commits, finds the records in the stream and
    only finishes the release."""
    silver_path = settings.silver_path(contract.stream)
    quarantine_path = settings.quarantine_path("silver", contract.stream)
    with (
        delta_spark.table_lock(settings, silver_path),
        delta_spark.table_lock(settings, quarantine_path),
    ):
        return _reprocess(
            spark, settings, contract, from_version, from_offsets or {}, dry_run=dry_run, gate=gate
        )


def _reprocess(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    from_version: int | None,
    from_offsets: Mapping[int, int],
    *,
    dry_run: bool,
    gate: Gate | None,
) -> ReprocessResult:
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    bronze_path = settings.bronze_path(contract.topic)
    silver_path = settings.silver_path(contract.stream)
    quarantine_path = settings.quarantine_path("silver", contract.stream)
    consumed = store.transaction_version(silver_path, input_app(contract))
    start = from_version or 0
    where = f" from offsets {_offsets_text(from_offsets)}" if from_offsets else ""
    scope = f"bronze.{contract.topic} versions {start}..{consumed}{where}"
    if consumed is None or start > consumed:
        scope = f"bronze.{contract.topic} from version {start}{where} (not consumed yet)"
        return ReprocessResult(contract.stream, scope, dry_run=dry_run)

    rows = store.changes(bronze_path, start, consumed).filter(F.col("_change_type") == "insert")
    done = store.read(silver_path).select(*RECORD_KEY)
    if from_offsets:
        # The stream's side of the anti join is cut to the same offsets as the records.
        in_scope = functools.reduce(
            lambda a, b: a | b,
            [
                (F.col("partition") == p) & (F.col("offset") >= o)
                for p, o in sorted(from_offsets.items())
            ],
        )
        rows, done = rows.filter(in_scope), done.filter(in_scope)
    todo = rows.join(done, RECORD_KEY, "left_anti")
    held = (
        store.read(quarantine_path).select(*RECORD_KEY).distinct()
        if DeltaStore.exists(quarantine_path)
        else None
    )
    if dry_run:
        todo = todo.cache()
        n_held = 0 if held is None else todo.join(held, RECORD_KEY, "left_semi").count()
        planned = ReprocessResult(contract.stream, scope, todo.count(), held=n_held, dry_run=True)
        todo.unpersist()
        return planned

    decoded = _decoded(todo, contract)
    lineage: dict[str, Any] = {"table": f"bronze.{contract.topic}", "versions": [start, consumed]}
    if from_offsets:
        lineage["offsets"] = {str(p): o for p, o in sorted(from_offsets.items())}
    decoded, verdict = _judge(decoded, contract, gate, lineage)
    meta: dict[str, Any] = {"lakehouse.reprocess": lineage}
    good = stream_rows(decoded, contract)
    bad = quarantine_rows(decoded, todo, verdict)
    if held is not None:
        bad = bad.join(held, RECORD_KEY, "left_anti")
    n_todo, n_good, n_bad = decoded.count(), good.count(), bad.count()
    # The stream first: a crash before the quarantine's release leaves a record in both, which
    # the rerun's release removes (never a record in neither).
    if n_good:
        delta_spark.append(
            good, silver_path, metadata=meta, schema_mode="add_columns", gate=gate, verdict=verdict
        )
    if n_bad:
        delta_spark.append(bad, quarantine_path, metadata=meta, create=bad.schema)
    released = 0
    if is_table(quarantine_path):
        in_stream = (
            store.read(quarantine_path)
            .select(*RECORD_KEY)
            .join(store.read(silver_path).select(*RECORD_KEY), RECORD_KEY, "left_semi")
            .distinct()
        )
        released = delta_spark.delete_matching(
            in_stream, quarantine_path, on=RECORD_KEY, metadata=meta
        )
    decoded.unpersist()
    return ReprocessResult(contract.stream, scope, n_todo, n_good, n_bad, released)


def _offsets_text(offsets: Mapping[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
