"""Delta tables written by delta-spark, Delta Lake's own Spark connector: every pipeline table.

Exactly once: a write carries the positions it consumed (:class:`~lakehouse.storage.Txn`) and
its commit metadata in the same commit as its rows. One position is Delta's app transaction
(``txnAppId`` / ``txnVersion``); several, or one moving back, are kept in the commit's metadata
(see :func:`position`). The commit metadata is a JSON object in the commit's ``userMetadata``.
delta-spark silently skips a write whose ``txnVersion`` is not newer than the one it recorded;
each write therefore also carries a write id, and the write is reported committed only if a
commit with that id is in the log.

One committing driver per table: Delta's log store excludes concurrent commits only inside one
JVM on a local filesystem (and assumes one driver on S3), so a job holds :func:`table_lock` on the
table from reading its position to committing, and a second process (a retried task running
beside the first) waits for it, then finds the work done.
"""

from __future__ import annotations

import fcntl
import json
import re
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lakehouse.errors import ConcurrentWriteError
from lakehouse.runtime import objectstore
from lakehouse.runtime.objectstore import Location
from lakehouse.runtime.spark import is_empty
from lakehouse.storage import metastore
from lakehouse.storage.gates import PublishGate
from lakehouse.storage.log import (
    FENCE_APP,
    POSITIONS_KEY,
    WRITE_ID_KEY,
    Txn,
    WriteResult,
    as_txns,
    is_table,
    kept_positions,
    load,
    table_rows,
    user_metadata,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lakehouse.runtime.config import Settings


CDF_PROPERTIES: Mapping[str, str] = {"delta.enableChangeDataFeed": "true"}
# The platform's tables: the change data feed on, and Delta's own cleanup of expired commits off
# (it runs at every checkpoint, and would delete commits a lagging consumer still reads for the
# change feed); `lakehouse maintain` cleans the log once every consumer is past it.
TABLE_PROPERTIES: Mapping[str, str] = {**CDF_PROPERTIES, "delta.enableExpiredLogCleanup": "false"}


@contextmanager
def table_lock(settings: Settings, path: Location) -> Iterator[None]:
    """Hold the table's commit lock (an exclusive ``flock`` on a local file: beside a local
    table, under the ``locks`` folder of ``settings``' home for one in a bucket) for the ``with``
    block; threads and processes of this machine take turns. Only this machine's: on S3 the
    platform's rule is one committing driver, the Spark server every layer task is a client of."""
    lock = settings.lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_table(
    spark: SparkSession,
    path: Location,
    schema: StructType | pa.Schema,
    *,
    properties: Mapping[str, str] = TABLE_PROPERTIES,
    gate: PublishGate | None = None,
) -> None:
    """Create an empty table with ``schema`` (its non-nullable fields NOT NULL) and table
    ``properties`` (by default :data:`TABLE_PROPERTIES`), unless one is there. The table's
    ``gate`` then adds its CHECK constraints while the table is still empty (see
    :meth:`~lakehouse.storage.gates.PublishGate.created`): the first batch is held to them by
    Delta like every later one, and adding them reads no rows.

    On a session that keeps names in the metastore (the Spark server's), the new table is
    registered under its name there (:mod:`lakehouse.storage.metastore`); a name already taken
    by a table elsewhere stops the creation first, with a
    :class:`~lakehouse.storage.metastore.CatalogError`."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    if is_table(path):
        return
    metastore.check_free(spark, path)
    if not isinstance(schema, StructType):
        schema = from_arrow_schema(schema)
    if objectstore.is_dir(path / "_delta_log"):
        # A creation killed before its first commit: start again.
        objectstore.remove_tree(path / "_delta_log")
    columns = ", ".join(
        f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
        for f in schema.fields
    )
    props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({columns}) USING delta"
        + (f" TBLPROPERTIES ({props})" if props else "")
    )
    if gate is not None:
        gate.created(spark, path)
    metastore.register_created(spark, path)


def append(
    df: DataFrame,
    path: Location,
    *,
    txn: Txn | Sequence[Txn] | None = None,
    metadata: Mapping[str, Any] | None = None,
    schema_mode: Literal["strict", "add_columns"] = "strict",
    create: StructType | pa.Schema | None = None,
    mode: Literal["append", "overwrite"] = "append",
    gate: PublishGate | None = None,
    verdict: Any = None,
    rows: int | None = None,
    lineage: Mapping[str, Any] | None = None,
) -> WriteResult:
    """Append ``df`` to the table in one commit that records the positions ``txn`` and
    ``metadata``; with ``txn``, at most once (see :func:`position`). ``schema_mode="add_columns"``
    lets new columns of ``df`` into the table (Delta's ``mergeSchema``); otherwise a schema that
    differs from the table's is refused. ``create``: the schema to create the table with (see
    :func:`create_table`) if there is none yet. ``mode="overwrite"`` replaces every row instead
    (the table's schema stays).

    ``gate`` judges ``df`` (``rows`` of them, if the caller knows) as published from ``lineage``,
    the input positions the batch was read from (default: the metadata's ``lakehouse.source``), unless the caller passes the ``verdict`` it
    already has; see :func:`_publish`. The caller holds :func:`table_lock`."""
    if create is not None:
        create_table(df.sparkSession, path, create, gate=gate)

    def judge(gate: PublishGate, dt: DeltaTable) -> Any:
        whole = None
        if gate.needs_whole_table and mode == "append":
            current = df.sparkSession.read.format("delta").load(str(path))
            whole = current.unionByName(df, allowMissingColumns=True)
        elif gate.needs_whole_table:
            whole = df
        return gate.check(df, rows, whole=whole, lineage=_lineage(lineage, metadata))

    def commit(plan: _Plan) -> None:
        writer = df.write.format("delta").mode(mode).option("userMetadata", _json(plan.metadata))
        if plan.app is not None:
            writer = writer.option("txnAppId", plan.app[0]).option("txnVersion", plan.app[1])
        if schema_mode == "add_columns":
            writer = writer.option("mergeSchema", "true")
        try:
            writer.save(str(path))
        except Exception as exc:
            _raise_if_conflict(exc, path)
            raise

    result, _ = _publish(path, txn, metadata, gate, judge, commit, verdict)
    return result


# -- positions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """How one commit records its positions: the app transaction it carries, and its metadata
    (the caller's, the write id, and the positions kept in metadata)."""

    app: tuple[str, int] | None
    metadata: dict[str, Any]
    write_id: str

    def with_metadata(self, more: Mapping[str, Any]) -> _Plan:
        """The same commit carrying ``more`` metadata too (a gate's verdict)."""
        return _Plan(self.app, {**more, **self.metadata}, self.write_id)


def _plan(
    path: Location,
    dt: DeltaTable,
    txn: Txn | Sequence[Txn] | None,
    metadata: Mapping[str, Any] | None,
) -> _Plan | None:
    """The commit's plan, or None when every position of ``txn`` is already recorded (the
    batch is in; a rewind never is)."""

    txns = as_txns(txn)
    kept = kept_positions(dt, path)

    def current(app: str) -> int | None:
        v = kept.get(app) if kept is not None else dt.transaction_version(app)
        return None if v is None else int(v)

    def done(t: Txn) -> bool:
        v = current(t.app_id)
        return v is not None and v >= t.version

    forward = not any(t.rewind for t in txns)
    if txns and forward and all(done(t) for t in txns):
        return None
    write_id = uuid.uuid4().hex
    user = {**(metadata or {}), WRITE_ID_KEY: write_id}
    if not txns:
        return _Plan(None, user, write_id)
    if kept is None and len(txns) == 1 and forward:
        return _Plan((txns[0].app_id, txns[0].version), user, write_id)
    user[POSITIONS_KEY] = {**(kept or {}), **{t.app_id: t.version for t in txns}}
    fence = dt.transaction_version(FENCE_APP)
    return _Plan((FENCE_APP, 0 if fence is None else int(fence) + 1), user, write_id)


def _raise_if_conflict(exc: BaseException, path: Location) -> None:
    """Delta's report that another commit won the race, as :class:`ConcurrentWriteError`."""
    if "ConcurrentTransactionException" in f"{type(exc).__name__} {exc}":
        raise ConcurrentWriteError(str(path), str(exc).splitlines()[0]) from None


def delete_matching(
    keys: DataFrame,
    path: Location,
    *,
    on: list[str],
    metadata: Mapping[str, Any] | None = None,
) -> int:
    """Delete the rows of ``path`` whose ``on`` columns equal those of a row of ``keys``, in one
    commit (a MERGE) carrying ``metadata``; return how many went. No commit when none match.
    The caller holds :func:`table_lock`."""
    keys = keys.select(*on).distinct()
    if is_empty(keys):
        return 0
    spark = keys.sparkSession
    user = {**(metadata or {}), WRITE_ID_KEY: uuid.uuid4().hex}
    with session_settings(spark, {"spark.databricks.delta.commitInfo.userMetadata": _json(user)}):
        metrics = _merge_into(path, keys, on, ["WHEN MATCHED THEN DELETE"])
    return 0 if metrics is None else int(metrics["num_deleted_rows"])


def merge(
    source: DataFrame,
    path: Location,
    *,
    on: Sequence[str],
    update: Mapping[str, str],
    insert: Mapping[str, str],
    delete_when: str | None = None,
    update_when: str | None = None,
    insert_when: str | None = None,
    delete_unmatched: bool = False,
    txn: Txn | Sequence[Txn] | None = None,
    metadata: Mapping[str, Any] | None = None,
    gate: PublishGate | None = None,
) -> WriteResult:
    """Upsert ``source`` (at most one row per ``on`` key) into the table in one MERGE commit
    that records the positions ``txn`` and ``metadata``; with ``txn``, at most once.

    ``update`` and ``insert`` map the table's columns to SQL expressions over ``s`` (the source)
    and ``t`` (the table); a column ``update`` leaves out keeps its value, one ``insert`` leaves
    out is null. Clauses, in Delta's order: ``delete_when`` deletes matched rows where it holds
    (tombstones); other matched rows are updated where ``update_when`` holds (always if None);
    unmatched source rows are inserted where ``insert_when`` holds; ``delete_unmatched`` deletes
    the table's rows the source lacks (the source is then the whole table). The commit is made
    even when no row changes, so the position always advances.

    ``gate`` judges the rows the merge would publish, computed by Spark from the same clauses,
    before anything is written; see :func:`_publish`. The caller holds :func:`table_lock`."""
    from pyspark import StorageLevel

    spark = source.sparkSession
    rules = MergePlan(list(on), update, insert, delete_when, update_when, insert_when)
    # The gate and the MERGE read the same source (a change feed read and folded per key): it
    # is computed once for both, not once per reader (unless the caller keeps it already).
    ours = gate is not None and source.storageLevel == StorageLevel.NONE
    staged = source.persist() if ours else source

    def judge(gate: PublishGate, dt: DeltaTable) -> Any:
        target = spark.read.format("delta").load(str(path))
        incoming, written = rules.survey(staged)
        off_source = None if written is None else rules.outcome_of_source(staged, target.schema)
        post, gone = off_source or rules.outcome(staged, target)
        whole = None
        if gate.needs_whole_table:
            whole = rules.table_after(staged, target, post, gone, delete_unmatched, BATCH_MARKER)
        # At most how many rows the merge publishes (one per source row), and the table has
        # after it (its own, from its log, and those): the gate collects what it judges
        # without counting it first (and nothing, if it only counts rows the survey counted).
        rows = table_rows(dt)
        return gate.check(
            post,
            written,
            whole=whole,
            lineage=_lineage(None, metadata),
            at_most=(incoming, None if rows is None else rows + incoming),
            marker=None if whole is None else BATCH_MARKER,
        )

    def commit(plan: _Plan) -> Any:
        conf = {"spark.databricks.delta.commitInfo.userMetadata": _json(plan.metadata)}
        if plan.app is not None:
            conf["spark.databricks.delta.write.txnAppId"] = plan.app[0]
            conf["spark.databricks.delta.write.txnVersion"] = str(plan.app[1])
        clauses = []
        if delete_when:
            clauses.append(f"WHEN MATCHED AND ({delete_when}) THEN DELETE")
        sets = ", ".join(f"`{c}` = {e}" for c, e in update.items())
        clauses.append(f"WHEN MATCHED{_and(update_when)} THEN UPDATE SET {sets}")
        names = ", ".join(f"`{c}`" for c in insert)
        values = ", ".join(insert.values())
        clauses.append(
            f"WHEN NOT MATCHED{_and(insert_when)} THEN INSERT ({names}) VALUES ({values})"
        )
        if delete_unmatched:
            clauses.append("WHEN NOT MATCHED BY SOURCE THEN DELETE")
        with session_settings(spark, conf):
            try:
                return _merge_into(path, staged, on, clauses)
            except Exception as exc:
                _raise_if_conflict(exc, path)
                raise

    try:
        result, metrics = _publish(path, txn, metadata, gate, judge, commit)
    finally:
        if ours:
            staged.unpersist()
    changed = 0 if metrics is None else int(metrics["num_affected_rows"])
    return WriteResult(result.committed, result.table_version, changed)


def _publish(
    path: Location,
    txn: Txn | Sequence[Txn] | None,
    metadata: Mapping[str, Any] | None,
    gate: PublishGate | None,
    judge: Callable[[PublishGate, DeltaTable], Any],
    commit: Callable[[_Plan], Any],
    verdict: Any = None,
) -> tuple[WriteResult, Any]:
    """The one publish sequence every write to a table goes through, in this order:

    1. plan the commit: its positions (``txn``) and ``metadata``; a batch whose positions are
       all recorded already is in, and nothing more happens;
    2. the table's ``gate`` judges what the write would publish (``judge``), unless the caller
       has its ``verdict`` already (silver routes rows by it first); a failed gate raises
       here, before anything is written;
    3. ``commit``: one Delta commit carrying the rows, the positions and the verdict's metadata;
    4. the gate records the verdict with the table version it published (the run's ledger).

    Returns the write's result and what ``commit`` returned (a MERGE's metrics)."""
    dt = load(path, own=True)
    before = int(dt.version())
    plan = _plan(path, dt, txn, metadata)
    if plan is None:
        return WriteResult(False, before), None
    if gate is not None:
        if verdict is None:
            verdict = judge(gate, dt)
        plan = plan.with_metadata(gate.commit_metadata(verdict))
    returned = commit(plan)
    result = _outcome(path, before, plan.write_id)
    if gate is not None:
        gate.record(verdict, table_version=result.table_version, published=result.committed)
    return result, returned


def _lineage(
    lineage: Mapping[str, Any] | None, metadata: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """What a batch was read from, for the gate's record: the caller's, or the commit's
    ``lakehouse.source`` metadata."""
    return lineage if lineage is not None else (metadata or {}).get("lakehouse.source")


# The column of a MERGE's would-be table that marks the rows the MERGE writes (for its gate).
BATCH_MARKER = "__lakehouse_written"


def _and(condition: str | None) -> str:
    return "" if condition is None else f" AND ({condition})"


def _merge_into(
    path: Location, source: DataFrame, on: Sequence[str], clauses: Sequence[str]
) -> Any:
    """Run Delta's ``MERGE INTO`` the table at ``path`` ``USING`` ``source`` (as ``s``; the table
    as ``t``) matched on the ``on`` columns, with ``clauses`` in order; return its metrics row
    (None when Delta skipped the commit). SQL rather than delta-spark's Python ``DeltaTable``,
    which needs Delta's Spark Connect plugin on a Connect session."""
    spark = source.sparkSession
    view = f"lakehouse_merge_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    match = " AND ".join(f"t.`{k}` = s.`{k}`" for k in on)
    try:
        return spark.sql(
            f"MERGE INTO delta.`{path}` AS t USING {view} AS s ON {match} " + " ".join(clauses)
        ).first()
    finally:
        spark.catalog.dropTempView(view)


@dataclass(frozen=True)
class MergePlan:
    """A MERGE's clauses, evaluated by Spark without writing: what a gate judges."""

    on: list[str]
    update: Mapping[str, str]
    insert: Mapping[str, str]
    delete_when: str | None
    update_when: str | None
    insert_when: str | None

    def survey(self, source: DataFrame) -> tuple[int, int | None]:
        """How many rows ``source`` has; and, if each is written or not whether or not the table
        holds its key (no clause reads the table, and a row is written matched exactly when it
        would be unmatched), how many the merge writes (else None). One Spark job either way."""
        from pyspark.sql import functions as F

        conditions = (self.delete_when, self.update_when, self.insert_when)
        if any(c is not None and _TARGET.search(c) for c in conditions):
            return source.count(), None
        if_matched, if_not = self._writes(F.lit(True)), self._writes(F.lit(False))
        row = (
            source.alias("s")
            .agg(F.count(F.lit(1)), F.count_if(if_matched != if_not), F.count_if(if_not))
            .first()
        )
        assert row is not None
        return int(row[0]), int(row[2]) if row[1] == 0 else None

    def outcome_of_source(
        self, source: DataFrame, schema: StructType
    ) -> tuple[DataFrame, DataFrame] | None:
        """:meth:`outcome` read off the source alone, if :meth:`survey` counted the rows written
        and each stored value is the same updated or inserted (None if not): the rows written,
        and the keys of the source rows that delete (a key the table lacks is deleted from
        nothing)."""
        from pyspark.sql import functions as F

        values = self._values_of_source(schema)
        if values is None:
            return None
        rows = source.alias("s")
        post = rows.filter(self._writes(F.lit(False))).select(
            *(F.expr(values[f.name]).cast(f.dataType).alias(f.name) for f in schema.fields)
        )
        gone = rows.filter(_holds(self.delete_when)).select(
            *(F.col(f"s.`{k}`").alias(k) for k in self.on)
        )
        return post, gone

    def _writes(self, matched: Column) -> Column:
        """Whether the merge writes a source row (updates or inserts it), given whether the
        table holds its key; the clauses in Delta's order."""
        from pyspark.sql import functions as F

        updated = ~_holds(self.delete_when) & _holds(self.update_when, default=True)
        return F.when(matched, updated).otherwise(_holds(self.insert_when, default=True))

    def _values_of_source(self, schema: StructType) -> dict[str, str] | None:
        """Each stored column's value as SQL over the source alone, the same for an updated row
        and an inserted one; None if a value reads the table (``t``), or if a column keeps the
        table's value or is left null on insert. A key column's stored value is the source's
        either way (the rows matched on it)."""
        values = {}
        for f in schema.fields:
            fresh = self.insert.get(f.name)
            if fresh is None or _TARGET.search(fresh):
                return None
            if f.name in self.on:
                same = fresh in (f"s.{f.name}", f"s.`{f.name}`")
                same = same and self.update.get(f.name, fresh) == fresh
            else:
                same = self.update.get(f.name) == fresh
            if not same:
                return None
            values[f.name] = fresh
        return values

    def outcome(self, source: DataFrame, target: DataFrame) -> tuple[DataFrame, DataFrame]:
        """The rows the merge would insert or update, as they would be stored, and the keys of
        the rows it would delete."""
        from pyspark.sql import functions as F

        matched = F.col("t.__matched").isNotNull()
        joined = source.alias("s").join(
            target.withColumn("__matched", F.lit(True)).alias("t"),
            [F.col(f"s.`{k}`") == F.col(f"t.`{k}`") for k in self.on],
            "left",
        )
        deleted = matched & _holds(self.delete_when)
        columns = []
        for f in target.schema.fields:
            new = F.expr(self.update[f.name]) if f.name in self.update else F.col(f"t.`{f.name}`")
            fresh = F.expr(self.insert[f.name]) if f.name in self.insert else F.lit(None)
            value = F.when(matched, new).otherwise(fresh)
            columns.append(value.cast(f.dataType).alias(f.name))
        post = joined.filter(self._writes(matched)).select(*columns)
        gone = joined.filter(deleted).select(*(F.col(f"t.`{k}`").alias(k) for k in self.on))
        return post, gone

    def table_after(
        self,
        source: DataFrame,
        target: DataFrame,
        post: DataFrame,
        gone: DataFrame,
        delete_unmatched: bool,
        marker: str,
    ) -> DataFrame:
        """The whole table as the merge would leave it (for table-level checks), with a boolean
        column ``marker`` that is true on the rows the merge writes (``post``)."""
        from pyspark.sql import functions as F

        kept = target.join(post.select(*self.on).unionByName(gone), self.on, "left_anti")
        if delete_unmatched:
            kept = kept.join(source.select(*self.on), self.on, "left_semi")
        return kept.withColumn(marker, F.lit(False)).unionByName(
            post.withColumn(marker, F.lit(True))
        )


# A reference to the MERGE's table (``t.column``) in a clause's SQL; not part of a longer name.
_TARGET = re.compile(r"(?<![\w.`])t\.")


def _holds(condition: str | None, *, default: bool = False) -> Column:
    """A clause's SQL condition as a column, null counting as false; ``default`` if None."""
    from pyspark.sql import functions as F

    if condition is None:
        return F.lit(default)
    return F.coalesce(F.expr(condition), F.lit(False))


# MERGE, UPDATE and DELETE take their commit's metadata and app transaction only from session
# settings, which every thread sharing the session sees: one such command at a time per session
# (threads that want theirs side by side each use a session of their own: :func:`own_session`).
_SESSION_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_SESSION_LOCKS_LOCK = threading.Lock()


def _session_lock(spark: SparkSession) -> threading.Lock:
    with _SESSION_LOCKS_LOCK:
        return _SESSION_LOCKS.setdefault(spark, threading.Lock())


@contextmanager
def session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Set ``settings`` on the session for the ``with`` block, alone among the threads that
    share the session, and remove them after."""
    with _session_lock(spark):
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in settings:
                spark.conf.unset(key)


def _outcome(path: Location, before: int, write_id: str) -> WriteResult:
    """Whether the log holds the commit of ``write_id`` after version ``before``, and which."""

    after = load(path, own=True)
    newer = int(after.version()) - before
    commits = after.history(newer) if newer > 0 else []
    ours = [c for c in commits if user_metadata(c).get(WRITE_ID_KEY) == write_id]
    if not ours:
        return WriteResult(False, int(after.version()))
    written = (ours[0].get("operationMetrics") or {}).get("numOutputRows")
    return WriteResult(
        True, int(ours[0]["version"]), rows_written=None if written is None else int(written)
    )


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def arrow_frame(spark: SparkSession, data: pa.Table) -> DataFrame:
    """An Arrow table computed in the driver as a DataFrame of the same schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(data, schema=from_arrow_schema(data.schema))
