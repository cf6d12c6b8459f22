"""``windowed`` tables: aggregations on event time (Kafka Streams' TimeWindows and
SessionWindows).

A windowed table is an aggregate table whose key is (group, ``window_start``, ``window_end``).
The aggregations are those of :mod:`lakehouse.tables.aggregations` (count, sum, min, max, avg,
count_distinct, earliest, latest, collect), computed per window by the same helpers.

Stream time
    Kafka Streams' stream time, which belongs to a task: a windowed aggregation grouped by the
    record key runs in one task per input partition, so each partition has its own stream time,
    the largest event time among that partition's records so far, in offset order (the stream
    commit, then the offset; the input key breaks ties, which only a changelog input has). A
    record is judged by its own partition's stream time, itself included
    (``observedStreamTime = max(observed, ts)`` comes before the check, as in Kafka). Records
    that arrive in order are therefore never late, whatever the number of partitions, and the
    result does not depend on where micro-batches are cut: an incremental build equals a full
    recompute exactly.

    A re-keyed aggregation (``group_by``) is judged the same way, by the stream time of the
    partition each record came from. (Kafka Streams repartitions first, and a repartition
    topic's partition interleaves the input partitions in the order their tasks happened to
    process them, which no rule can reproduce. If the tasks kept in step by timestamp, the
    stream time a record met there would be at most its own partition's; this rule is that
    bound, and it needs nothing but the record's own partition.)

    Records that an aggregation ignores (a tombstone, a record without a group) do not move
    stream time, nor do records without an event time. The stream times are stored in the gold
    table's commit metadata (:data:`WINDOW_META`: the versions consumed, the stream times per
    partition before and after them), so the next batch continues from them. Being a function
    of the input versions consumed, they are computed again from the input when the newest such
    metadata is not for the table's position (a rebuild folded another build in, or moved the
    position back). A table built when stream time was one per table (a number in its
    metadata) is rebuilt by the next pipeline run (:func:`needs_rebuild`).

Time windows (tumbling, hopping)
    Aligned to the epoch: a record at ``t`` belongs to every window ``[start, start + size)``
    with ``start = k * advance >= 0`` and ``start <= t < start + size`` (tumbling: ``advance =
    size``; no window starts before the epoch, as in Kafka's ``TimeWindows.windowsFor``).
    ``window_end`` is exclusive. A window is closed once ``window_end + grace <=
    stream time`` (Kafka: ``windowEnd > observedStreamTime - grace`` accepts). A record is
    counted in each of its windows that is open and goes to the late table once for each one
    that is closed (a hopping record may do both).

Session windows
    A session per group is a run of records whose event times are at most ``gap`` apart;
    ``window_start`` is the first event time and ``window_end`` the last, both inclusive (as in
    Kafka's SessionWindows). Per record, in processing order, exactly as Kafka's
    ``KStreamSessionWindowAggregate``: find the group's sessions with ``end >= t - gap`` and
    ``start <= t + gap``; the merged window spans them and ``t``; the record is late when
    ``merged end + gap + grace < stream time`` (Kafka's ``mergedWindow.end() <
    observedStreamTime - grace - inactivityGap``; note the strict ``<``, unlike time windows);
    otherwise the sessions found are replaced by the merged one. In the gold table that is a
    delete of each old session row and an insert of the merged one, so the changelog shows the
    deletes as Kafka emits tombstones for merged sessions; a record inside an existing session
    updates its row in place.

    Which sessions can be found: Kafka's session store keeps a session for ``gap + grace``
    behind stream time and then drops it. Here a session is *open* while it could still accept a
    record on its own (``end + gap + grace >= stream time``) and *closed* (final, never merged or
    extended again) after; a closed session is not found. This is Kafka's rule with an in-memory
    session store, whose retention boundary is exactly the processor's, rather than RocksDB's
    segment-granular one. It follows that a record is late exactly when no open session lies within ``gap`` of it
    and ``t + gap + grace < stream time``; its late row names the window ``[t, t]`` it would
    have created.

    State: earliest, latest and collect need every value's arrival position to merge two
    sessions, which the gold row does not keep. So the state table (``out.state``) keeps the raw
    records of the *open* sessions (the columns the aggregations read, the arrival position and
    the session bounds), and every batch recomputes the sessions it touches from their records
    with the same aggregate helper as everything else. Each batch rewrites the state without the
    records of sessions that have closed, so it stays the size of the open sessions.

Late records
    Never dropped silently: each goes to the late-records side table (``out.late``) with its
    key, value, partition, offset, timestamp and event time, the window it missed
    (``window_start``, ``window_end``), the ``stream_time`` it was judged by and a ``reason``.
    A record without an event time goes there too, with reason ``no event time`` and no window,
    as does one with an event time before the epoch (Kafka refuses negative timestamps).

Exactly once
    A batch commits the gold table first (its Txn and the stream time), then the late table,
    then (sessions) the state, each with ``Txn(app, end)`` for the same input versions; the
    late table only if a record was late, the state only if a record joined a session, and the
    gold commit's metadata names which of the two the batch commits. A run that finds one of
    those behind the gold table redoes that batch (the versions and starting stream time are in
    the gold commit's metadata; the state is still as it was before the batch, being committed
    last): the gold merge is skipped as already applied, and the rest is written. Nothing is
    counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lakehouse.contracts.model import (
    WINDOW_END,
    WINDOW_LATE_COLUMNS,
    WINDOW_START,
    Contract,
    TableSpec,
    Window,
)
from lakehouse.errors import LakehouseError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.spark import is_empty
from lakehouse.storage import DeltaStore, Txn, WriteResult, delta_spark
from lakehouse.streams.schema import (
    EVENT_TIME,
    TOMBSTONE,
    key_spark_type,
    spark_type,
    stream_schema,
)
from lakehouse.tables import aggregations, common
from lakehouse.tables.common import StreamTimes, format_duration
from lakehouse.tables.kind import Context, SideTable, StreamKind

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

WINDOW_META = "lakehouse.window"  # gold commit metadata: versions, stream times before and after
LATE, STATE = "late", "state"  # the tables a batch committed after the gold table, in WINDOW_META
STREAM_TIME, REASON = "stream_time", "reason"
LATE_COLUMNS = WINDOW_LATE_COLUMNS  # the contract refuses value fields of these names
NO_EVENT_TIME = "no event time"
BEFORE_EPOCH = "event time before 1970-01-01 (a negative timestamp, invalid as in Kafka)"
# The state table's session bounds (hidden names: a value field may be called window_start).
SESSION_START, SESSION_END = "__session_start", "__session_end"

# Working columns (epoch milliseconds): event time, stream time at the record, window bounds.
_T, _ST, _WS, _WE = "__t", "__st", "__ws", "__we"
_NEW, _STATUS, _OLD_WS, _OLD_WE = "__new", "__status", "__old_ws", "__old_we"
_OP = "__window_op"
_LATE = "__late"
_OPEN = "__open"


# -- pure helpers --------------------------------------------------------------------------------


def time_windows(t: int, size: int, advance: int) -> list[tuple[int, int]]:
    """The epoch-aligned windows ``[start, end)`` that an event time ``t >= 0`` (ms) falls in;
    none starts before the epoch (Kafka's ``TimeWindows.windowsFor``). The reference for
    :func:`assign_time_windows`, which does the same in Spark."""
    last = t - t % advance
    first = max(0, last - (-(-size // advance) - 1) * advance)
    return [(s, s + size) for s in range(first, last + 1, advance) if s + size > t]


@dataclass(frozen=True)
class Placement:
    """Where one record lands in :func:`sessionize`: ``member`` of a session the batch left
    unchanged, of a ``changed`` (new, grown or merged) session, or ``late``; ``start`` and
    ``end`` are the session's final bounds (for a late record, the window it would have
    created)."""

    status: Literal["member", "changed", "late"]
    start: int
    end: int


class _Session:
    __slots__ = ("changed", "end", "into", "start")

    def __init__(self, start: int, end: int, changed: bool) -> None:
        self.start, self.end, self.changed = start, end, changed
        self.into: _Session | None = None  # the session it was merged into

    def final(self) -> _Session:
        s = self
        while s.into is not None:
            s = s.into
        return s


def sessionize(
    stored: Sequence[tuple[int, int]],
    new: Sequence[tuple[int, int]],
    gap: int,
    grace: int,
) -> tuple[list[Placement], list[Placement]]:
    """Session windows of one group, Kafka Streams' way (see the module docstring).

    ``stored``: the bounds ``(start, end)`` of the open session each stored record belongs to;
    ``new``: each new record's ``(event time, stream time at it)``, in processing order. Returns
    the placements of the stored records and of the new ones, in the order given. Pure.
    """
    sessions: dict[tuple[int, int], _Session] = {}
    stored_at = [sessions.setdefault(b, _Session(b[0], b[1], False)) for b in stored]
    live = list(sessions.values())
    new_at: list[_Session | None] = []
    for t, st in new:
        # A session closed at the record's stream time is final: not found, never merged again.
        # (Each record is judged by its own partition's stream time, so a session closed for
        # one record may still be found by a record of a partition whose stream time is behind.)
        near = [s for s in live if s.end >= t - gap and s.start <= t + gap]
        found = [s for s in near if s.end + gap + grace >= st]
        start = min([t, *(s.start for s in found)])
        end = max([t, *(s.end for s in found)])
        if end + gap + grace < st:
            new_at.append(None)
            continue
        merged = _Session(start, end, True)
        for s in found:
            s.into = merged
            live.remove(s)
        live.append(merged)
        new_at.append(merged)

    def place(s: _Session) -> Placement:
        f = s.final()
        return Placement("changed" if f.changed else "member", f.start, f.end)

    late = [Placement("late", t, t) for t, _ in new]
    return (
        [place(s) for s in stored_at],
        [late[i] if s is None else place(s) for i, s in enumerate(new_at)],
    )


def _sessionize_table(table: Any, key: str, gap: int, grace: int) -> Any:
    """:func:`sessionize` over one group's rows as Arrow (stored rows and new rows together):
    adds the status and the final bounds."""
    import pyarrow as pa

    is_new = table.column(_NEW).to_pylist()
    stored_idx = [i for i, n in enumerate(is_new) if not n]
    new_rows = table.filter(pa.array(is_new)).sort_by(
        [(c, "ascending") for c in (*common.ARRIVAL, key)]
    )
    stored_rows = table.take(pa.array(stored_idx, pa.int64()))
    old_ws, old_we = (
        stored_rows.column(_OLD_WS).to_pylist(),
        stored_rows.column(_OLD_WE).to_pylist(),
    )
    times, stream_times = new_rows.column(_T).to_pylist(), new_rows.column(_ST).to_pylist()
    on_stored, on_new = sessionize(
        list(zip(old_ws, old_we, strict=True)),
        list(zip(times, stream_times, strict=True)),
        gap,
        grace,
    )
    rows = pa.concat_tables([stored_rows, new_rows])
    placed = on_stored + on_new
    return (
        rows.append_column(_STATUS, pa.array([p.status for p in placed], pa.string()))
        .append_column(_WS, pa.array([p.start for p in placed], pa.int64()))
        .append_column(_WE, pa.array([p.end for p in placed], pa.int64()))
    )


def _session_udf(key: str, gap: int, grace: int) -> Any:
    # No type hints that Spark could read: the plain-function form takes and returns a Table.
    def apply(table: Any) -> Any:
        return _sessionize_table(table, key, gap, grace)

    return apply


# -- schemas -------------------------------------------------------------------------------------


def late_schema(stream: Contract) -> StructType:
    """The late-records side table: the stream's columns (no tombstone: tombstones are never
    late), the window missed, the stream time the record was judged by, and why."""
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    kept = [f for f in stream_schema(stream).fields if f.name != TOMBSTONE]
    return StructType(
        [
            *kept,
            StructField(WINDOW_START, TimestampType(), True),
            StructField(WINDOW_END, TimestampType(), True),
            StructField(STREAM_TIME, TimestampType(), True),
            StructField(REASON, StringType(), True),
        ]
    )


def _state_fields(stream: Contract, spec: TableSpec) -> list[str]:
    """The value fields a session's records must keep to recompute it."""
    wanted = {spec.group_by, *(a.field for a in spec.aggregations)} - {None, EVENT_TIME}
    return [f.name for f in stream.fields if f.name in wanted]


def session_state_schema(stream: Contract, spec: TableSpec) -> StructType:
    """The raw records of a session table's open sessions, with their session's bounds."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField(stream.key_name, key_spark_type(stream), True),
            *(
                T.StructField(n, spark_type(stream.field(n)), True)
                for n in _state_fields(stream, spec)
            ),
            T.StructField(EVENT_TIME, T.TimestampType(), True),
            T.StructField("partition", T.IntegerType(), True),
            T.StructField("offset", T.LongType(), True),
            T.StructField("_commit_version", T.LongType(), True),
            T.StructField(SESSION_START, T.TimestampType(), True),
            T.StructField(SESSION_END, T.TimestampType(), True),
        ]
    )


# -- Spark transforms ----------------------------------------------------------------------------


def _valid(events: DataFrame, stream: Contract, spec: TableSpec) -> DataFrame:
    """The records a windowed aggregation takes (:func:`lakehouse.tables.aggregations.taken`)."""
    return events.filter(aggregations.taken(stream, spec))


def _event_millis() -> Column:
    """A record's event time in ms; null when it has none or a negative one (Kafka refuses
    negative timestamps): such records go to the late table and do not move stream time."""
    from pyspark.sql import functions as F

    ms = _millis(EVENT_TIME)
    return F.when(ms >= 0, ms)


def _millis(col: Column | str) -> Column:
    from pyspark.sql import functions as F

    return F.unix_millis(F.col(col) if isinstance(col, str) else col)


def _ts(col: str) -> Column:
    from pyspark.sql import functions as F

    return F.timestamp_millis(F.col(col))


def with_stream_time(
    valid: DataFrame, key: str, before: StreamTimes
) -> tuple[DataFrame, StreamTimes]:
    """Add ``__t`` (event time, ms) and ``__st``: the stream time of the record's partition at
    it, itself included, starting from ``before``; and the stream times after them
    (:func:`lakehouse.tables.common.with_partition_time`)."""
    return common.with_partition_time(valid.withColumn(_T, _event_millis()), _T, _ST, key, before)


def _fmt(col: str) -> Column:
    from pyspark.sql import functions as F

    return F.date_format(_ts(col), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")


def late_reason(window: Window) -> Column:
    """Why a record with ``__ws``, ``__we`` and ``__st`` (ms) is late."""
    from pyspark.sql import functions as F

    grace = f"grace {format_duration(window.grace_ms)}"
    if window.type == "session":
        head, close, tail = (
            "session window [",
            "] ",
            f"gap {format_duration(window.gap_ms)}, {grace}",
        )
    else:
        head, close, tail = "window [", ") ", grace
    return F.concat(
        F.lit(head),
        _fmt(_WS),
        F.lit(", "),
        _fmt(_WE),
        F.lit(close + "closed at stream time "),
        _fmt(_ST),
        F.lit("; " + tail),
    )


def late_rows(records: DataFrame, stream: Contract, reason: Column) -> DataFrame:
    """Late records (with ``__ws``, ``__we``, ``__st`` in ms) shaped as :func:`late_schema`."""
    from pyspark.sql import functions as F

    schema = late_schema(stream)
    extra = {
        WINDOW_START: _ts(_WS),
        WINDOW_END: _ts(_WE),
        STREAM_TIME: _ts(_ST),
        REASON: reason,
    }
    return records.select(
        *(
            (extra[f.name] if f.name in extra else F.col(f.name)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        )
    )


def assign_time_windows(timed: DataFrame, window: Window) -> DataFrame:
    """One row per (record, window it falls in), with ``__ws``/``__we`` (ms) and ``__late``."""
    from pyspark.sql import functions as F

    size, advance = window.size_ms, window.advance_ms
    per_record = -(-size // advance)
    last = F.col(_T) - F.pmod(F.col(_T), F.lit(advance))
    first = last - F.lit((per_record - 1) * advance)
    starts = F.sequence(first, last, F.lit(advance).cast("long"))
    return (
        timed.withColumn(_WS, F.explode(starts))
        .filter((F.col(_WS) + size > F.col(_T)) & (F.col(_WS) >= 0))
        .withColumn(_WE, F.col(_WS) + size)
        .withColumn(_LATE, F.coalesce(F.col(_WE) + window.grace_ms <= F.col(_ST), F.lit(False)))
    )


# -- the build -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Batch:
    start: int
    end: int
    stream_times: StreamTimes  # before the batch


@dataclass(frozen=True)
class Batch:
    """A micro-batch: its input versions and stream times before it, its events, and (session
    windows) the stored records of the open sessions."""

    start: int
    end: int
    stream_times: StreamTimes
    events: DataFrame
    state: DataFrame | None


@dataclass(frozen=True)
class Changes:
    """What a batch changes: the gold rows, the late records, the session state after it (or
    None), the stream times after it, which side tables it commits, and what it cached."""

    gold: DataFrame
    late: DataFrame
    state: DataFrame | None
    stream_times: StreamTimes
    followers: list[str]
    cached: list[DataFrame]


class Windowed(StreamKind):
    name = "windowed"

    def side_tables(self, spec: TableSpec, out: common.Outputs) -> tuple[SideTable, ...]:
        return (
            SideTable("late", f"late.{spec.name}", out.late),
            SideTable("state", f"state.{spec.name}", out.state),
        )

    def create(self, ctx: Context) -> None:
        window, spark, stream = _window(ctx.spec), ctx.spark, ctx.stream
        schema = aggregations.table_schema(stream, ctx.spec, windowed=True)
        delta_spark.create_table(spark, ctx.out.gold, schema, gate=ctx.out.gate)
        delta_spark.create_table(spark, ctx.out.late, late_schema(stream))
        if window.type == "session":
            # Nobody reads the state's changes, and its `_commit_version` column is one the
            # change feed reserves: the state is the one table created without it.
            no_feed = {"delta.enableExpiredLogCleanup": "false"}
            delta_spark.create_table(
                spark, ctx.out.state, session_state_schema(stream, ctx.spec), properties=no_feed
            )

    def unfinished(self, ctx: Context) -> Batch | None:
        followers = [ctx.out.late]
        if _window(ctx.spec).type == "session":
            followers.append(ctx.out.state)
        redo = _unfinished(ctx.store, ctx.out, ctx.app, followers)
        return None if redo is None else self._batch(ctx, redo)

    def read(self, ctx: Context) -> Batch | None:
        todo = ctx.pending()
        if todo is None:
            return None
        times = _stream_times_at(
            ctx.store, ctx.settings, ctx.contract, ctx.spec, ctx.out.gold, todo[0] - 1
        )
        return self._batch(ctx, _Batch(*todo, times))

    def _batch(self, ctx: Context, at: _Batch) -> Batch:
        events = common.read_input(
            ctx.store, ctx.settings, ctx.contract, ctx.spec, at.start, at.end
        )
        state = ctx.store.read(ctx.out.state) if _window(ctx.spec).type == "session" else None
        return Batch(at.start, at.end, at.stream_times, events, state)

    def transform(self, ctx: Context, batch: Batch) -> Changes:
        return _changes(batch, ctx.stream, ctx.spec)

    def commit(self, ctx: Context, batch: Batch, changes: Changes) -> common.GoldResult:
        try:
            return _commit(ctx, batch, changes)
        finally:
            for df in changes.cached:
                df.unpersist()

    def needs_rebuild(self, store: DeltaStore, spec: TableSpec, out: common.Outputs) -> bool:
        return needs_rebuild(store, out.gold)


def _window(spec: TableSpec) -> Window:
    assert spec.window is not None, f"{spec.name} is a windowed table"
    return spec.window


def _stream_times_at(
    store: DeltaStore,
    settings: Settings,
    contract: Contract,
    spec: TableSpec,
    gold: Any,
    consumed: int,
) -> StreamTimes:
    """The stream times after input version ``consumed``: from the gold commit that consumed
    it, else (a rebuild folded another build into the table, or moved its position back)
    computed again from the input, of which they are a function."""
    from pyspark.sql import functions as F

    if consumed < 0:
        return {}
    meta = store.latest_metadata(gold, WINDOW_META)
    if meta and meta["versions"][1] == consumed:
        if not built_per_partition(meta):
            raise LakehouseError(
                f"{gold}: built when stream time was one per table, not one per partition; "
                f"rebuild it (`lakehouse refresh {spec.name}`; a pipeline run does it by itself)"
            )
        return common.stream_times_of(meta["stream_time"])
    stream = contract.input(spec)
    events = common.read_input(store, settings, contract, spec, 0, consumed)
    tops = _valid(events, stream, spec).groupBy("partition").agg(F.max(_event_millis()).alias("m"))
    return {r["partition"]: r["m"] for r in tops.collect() if r["m"] is not None}


def built_per_partition(meta: Mapping[str, Any]) -> bool:
    """Whether a windowed table's commit metadata keeps a stream time per partition; tables
    built before that kept one for the whole table (a number), and are rebuilt."""
    return isinstance(meta.get("stream_time"), dict)


def needs_rebuild(store: DeltaStore, gold: Any) -> bool:
    """A windowed table built by the earlier stream-time rule (one stream time per table): its
    windows and late records may be wrong on a topic with several partitions, so the pipeline
    rebuilds it (a full refresh, which changes only the rows that differ) before its next
    micro-batch."""
    if not DeltaStore.exists(gold):
        return False
    meta = store.latest_metadata(gold, WINDOW_META)
    return bool(meta) and not built_per_partition(meta)


def _unfinished(
    store: DeltaStore, out: common.Outputs, app: str, followers: list[Any]
) -> _Batch | None:
    """The batch whose gold commit is in but whose late (or state) commit, which the gold
    commit says it has, is not, if any."""
    done = store.transaction_version(out.gold, app)
    if done is None:
        return None
    meta = store.latest_metadata(out.gold, WINDOW_META)
    if meta and meta["versions"][1] == done and "followers" in meta:
        named = {LATE: out.late, STATE: out.state}
        followers = [named[f] for f in meta["followers"]]
    # (A gold commit without the list is older than it: every batch committed both.)
    behind = [p for p in followers if (store.transaction_version(p, app) or -1) < done]
    if not behind:
        return None
    if not meta or meta["versions"][1] != done:
        raise LakehouseError(
            f"{out.gold}: consumed version {done} but its commit has no {WINDOW_META!r} "
            "metadata; the late-records table cannot be caught up (rebuild the table)"
        )
    start = meta["versions"][0]
    if out.late in behind and (store.transaction_version(out.state, app) or -1) >= start:
        raise LakehouseError(f"{out.state}: session state is ahead of {out.late}; rebuild")
    if not built_per_partition(meta):
        raise LakehouseError(
            f"{out.gold}: built when stream time was one per table; rebuild it "
            "(`lakehouse refresh`; a pipeline run does it by itself)"
        )
    return _Batch(start, done, common.stream_times_of(meta["stream_time_before"]))


def _changes(batch: Batch, stream: Contract, spec: TableSpec) -> Changes:
    """The gold rows, late records and session state a batch gives (Spark transforms of the
    batch and the stored state; the emptiness checks that decide which side tables it commits
    are its only actions)."""
    from pyspark.sql import functions as F

    window = _window(spec)
    timed, after = with_stream_time(
        _valid(batch.events, stream, spec), stream.key_name, batch.stream_times
    )
    timed = timed.cache()
    cached = [timed]
    no_time = timed.filter(F.col(_T).isNull()).select(
        "*", *(F.lit(None).cast("long").alias(c) for c in (_WS, _WE))
    )
    why = F.when(F.col(EVENT_TIME).isNull(), NO_EVENT_TIME).otherwise(BEFORE_EPOCH)
    late = late_rows(no_time, stream, why)
    with_time = timed.filter(F.col(_T).isNotNull())
    state = None
    if batch.state is not None:
        placed = place_sessions(batch.state, with_time, stream, spec).cache()
        cached.append(placed)
        gold_rows = session_changes(placed, stream, spec)
        late = late.unionByName(session_late(placed, stream, window))
        state = session_state(placed, batch.state, with_time, stream, spec, after)
    else:
        placed = assign_time_windows(with_time, window)
        gold_rows = aggregations.aggregate_per_key(
            placed.filter(~F.col(_LATE)), stream, spec, by=_window_columns()
        )
        late = late.unionByName(late_rows(placed.filter(F.col(_LATE)), stream, late_reason(window)))
    gold_rows = gold_rows.cache()
    cached.append(gold_rows)
    # Only a table with something to take is committed: the late table when a record is
    # late, the state when a record joined a session (no other batch changes the state:
    # sessions close only as stream time moves, which only such a record does). The gold
    # commit names them, for the crash protocol (:func:`_unfinished`).
    followers = []
    if not is_empty(late):
        followers.append(LATE)
    if state is not None and not is_empty(placed.filter(F.col(_NEW) & (F.col(_STATUS) != "late"))):
        followers.append(STATE)
    return Changes(gold_rows, late, state, after, followers, cached)


def _commit(ctx: Context, batch: Batch, changes: Changes) -> common.GoldResult:
    """The gold commit (with the position and the stream times), then the late table's and
    the state's, each with the same position."""
    spec, out, app = ctx.spec, ctx.out, ctx.app
    position = common.input_meta(app, batch.start, batch.end)
    meta = {
        **position,
        WINDOW_META: {
            "versions": [batch.start, batch.end],
            "stream_time_before": common.stream_times_meta(batch.stream_times),
            "stream_time": common.stream_times_meta(changes.stream_times),
            "followers": changes.followers,
        },
    }
    txn = Txn(app, batch.end)
    result = _commit_gold(ctx.stream, spec, out, changes.gold, txn, meta)
    late_rows_written = 0
    if LATE in changes.followers:
        written = delta_spark.append(changes.late, out.late, txn=txn, metadata=position)
        late_rows_written = written.rows_written or 0
    if changes.state is not None and STATE in changes.followers:
        delta_spark.append(changes.state, out.state, txn=txn, metadata=position, mode="overwrite")
    return common.GoldResult(
        spec.name,
        (batch.start, batch.end),
        result.source_rows or 0,
        result.committed,
        table_version=result.table_version,
        late=late_rows_written,
        late_table=f"late.{spec.name}",
    )


def _commit_gold(
    stream: Contract,
    spec: TableSpec,
    out: common.Outputs,
    rows: DataFrame,
    txn: Txn,
    meta: dict[str, Any],
) -> WriteResult:
    """Merge the batch's rows; a session table's rows replace (or, marked, delete) stored ones,
    a time window's partial aggregates fold into them. The commit always happens, even when
    nothing changed (a MERGE always commits): it carries the position and the stream
    time."""
    rules = aggregations.merge_rules(stream, spec, windowed=True)
    if _window(spec).type == "session":
        update = {c: e for c, e in rules.insert.items() if c not in rules.on}
        result = delta_spark.merge(
            rows,
            out.gold,
            on=rules.on,
            update=update,
            insert=rules.insert,
            delete_when=f"s.{_OP} = 'delete'",
            insert_when=f"s.{_OP} = 'upsert'",
            txn=txn,
            metadata=meta,
            gate=out.gate,
        )
    else:
        result = delta_spark.merge(
            rows,
            out.gold,
            on=rules.on,
            update=rules.update,
            insert=rules.insert,
            txn=txn,
            metadata=meta,
            gate=out.gate,
        )
    return result


def _window_columns() -> list[Column]:
    return [_ts(_WS).alias(WINDOW_START), _ts(_WE).alias(WINDOW_END)]


def place_sessions(
    state: DataFrame, timed: DataFrame, stream: Contract, spec: TableSpec
) -> DataFrame:
    """The batch's timed records (``__new``) and the stored records of their groups' open
    sessions, each placed by :func:`sessionize`: ``__status`` and the final bounds ``__ws``,
    ``__we`` (ms); stored records keep their old bounds in ``__old_ws``, ``__old_we``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    window = _window(spec)
    group = spec.group_by or stream.key_name
    names = [f.name for f in session_state_schema(stream, spec).fields]
    stored = state.join(timed.select(group).distinct(), group, "left_semi").select(
        *(n for n in names if n not in (SESSION_START, SESSION_END)),
        _millis(EVENT_TIME).alias(_T),
        _millis(SESSION_START).alias(_OLD_WS),
        _millis(SESSION_END).alias(_OLD_WE),
        F.lit(False).alias(_NEW),
    )
    both = timed.withColumn(_NEW, F.lit(True)).unionByName(stored, allowMissingColumns=True)
    schema = StructType(
        [
            *(StructField(f.name, f.dataType, True) for f in both.schema.fields),
            StructField(_STATUS, StringType(), True),
            StructField(_WS, LongType(), True),
            StructField(_WE, LongType(), True),
        ]
    )
    udf = _session_udf(stream.key_name, window.gap_ms, window.grace_ms)
    return both.groupBy(group).applyInArrow(udf, schema)


def session_changes(placed: DataFrame, stream: Contract, spec: TableSpec) -> DataFrame:
    """The gold rows a batch of sessions changes: the full aggregates of every changed session
    (``upsert``: a new, grown or merged one, or one updated in place), and a ``delete`` for each
    stored session replaced by one with other bounds."""
    from pyspark.sql import functions as F

    group = spec.group_by or stream.key_name
    changed = placed.filter(F.col(_STATUS) == "changed").withColumn(TOMBSTONE, F.lit(False))
    upserts = aggregations.aggregate_per_key(changed, stream, spec, by=_window_columns())
    moved = changed.filter(
        ~F.col(_NEW) & ((F.col(_OLD_WS) != F.col(_WS)) | (F.col(_OLD_WE) != F.col(_WE)))
    )
    deletes = moved.select(
        group, _ts(_OLD_WS).alias(WINDOW_START), _ts(_OLD_WE).alias(WINDOW_END)
    ).distinct()
    return upserts.withColumn(_OP, F.lit("upsert")).unionByName(
        deletes.withColumn(_OP, F.lit("delete")), allowMissingColumns=True
    )


def session_late(placed: DataFrame, stream: Contract, window: Window) -> DataFrame:
    from pyspark.sql import functions as F

    return late_rows(placed.filter(F.col(_STATUS) == "late"), stream, late_reason(window))


def session_state(
    placed: DataFrame,
    state: DataFrame,
    timed: DataFrame,
    stream: Contract,
    spec: TableSpec,
    stream_times: StreamTimes,
) -> DataFrame:
    """The state after the batch: the records of every session still open (the batch's groups
    as placed, the other groups' as stored). A session grouped by the record key is open while
    it is open at the stream time of a partition its records came from (the partition its next
    records come from); a re-keyed one, whose next record may come from any partition, while it
    is open at the stream time of every partition of the input (all of them kept until each
    partition has had a record)."""
    from pyspark.sql import Window as W
    from pyspark.sql import functions as F

    window = _window(spec)
    group = spec.group_by or stream.key_name
    schema = session_state_schema(stream, spec)
    bounds = (SESSION_START, SESSION_END)
    kept = placed.filter(F.col(_STATUS) != "late").select(
        *(f.name for f in schema.fields if f.name not in bounds),
        _ts(_WS).alias(SESSION_START),
        _ts(_WE).alias(SESSION_END),
    )
    others = state.join(timed.select(group).distinct(), group, "left_anti")
    both = kept.unionByName(others.select(*kept.columns))
    closes = _millis(SESSION_END) + window.gap_ms + window.grace_ms
    if spec.group_by is None:
        open_here = F.coalesce(
            closes >= common.stream_time_column(stream_times, F.col("partition")), F.lit(True)
        )
        session = W.partitionBy(group, SESSION_START, SESSION_END)
        both = (
            both.withColumn(_OPEN, F.max(open_here.cast("int")).over(session))
            .filter(F.col(_OPEN) == 1)
            .drop(_OPEN)
        )
    elif set(stream_times) >= set(range(stream.partitions)):
        both = both.filter(closes >= F.lit(min(stream_times.values())))
    return both.select(*(F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields))


KIND = Windowed()
