"""One micro-batch of a topic's pipeline: bronze -> silver -> gold, layer by layer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lakehouse.contracts import confluent
from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.errors import QualityGateError, TablesFailedError
from lakehouse.pipeline.request import RunRequest
from lakehouse.quality.expectations import pandas_max_rows, sync_constraints
from lakehouse.quality.gate import Gate, freshness_outcome
from lakehouse.quality.ledger import (
    BLOCKED,
    BatchOutcome,
    LedgerBuffer,
    RunInfo,
    restore_ledger,
    write_ledger,
)
from lakehouse.quality.verdict import Verdict
from lakehouse.runtime import objectstore
from lakehouse.runtime.config import LAYERS, Layer, Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.runtime.spark import (
    adaptive_for,
    adaptive_mode,
    own_session,
    small_batch_rows,
    tagged,
)
from lakehouse.storage import DeltaStore, is_table
from lakehouse.storage.log import position, rows_after
from lakehouse.storage.maintenance import Consumer, MaintenanceReport, maintain
from lakehouse.streams import silver
from lakehouse.streams.registry import SchemaRegistry
from lakehouse.tables import common, gold, kind
from lakehouse.tables.common import GoldResult
from lakehouse.topics import bronze, bronze_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def layer_tables(
    settings: Settings, contract: Contract, layer: Layer
) -> list[tuple[str, Location]]:
    """The tables a layer of a topic publishes (name, path): the gated ones."""
    return [(name, settings.table_path(layer, name)) for name in contract.published_tables(layer)]


def run_layer(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    layer: Layer,
    catalog: Catalog | None = None,
    *,
    run: RunInfo | None = None,
    echo: Callable[[str], None] = print,
    request: RunRequest | None = None,
    ledger: LedgerBuffer | None = None,
) -> list[str]:
    """Run one layer of one topic; return one summary line per table written.

    The contract's schemas are checked against the topic's registered versions first, so a
    contract that breaks its compatibility mode stops every layer before any data moves. Each
    table the layer publishes is gated by the contract's expectations for it (see
    :mod:`lakehouse.quality`); the gates' results go to the ledger and, line by line, to
    ``echo`` (the task log). ``catalog`` resolves the other topic of a gold join. ``request``
    (the run's, checked by its maker; :mod:`lakehouse.pipeline.request`) adds the layer's
    reprocess or full refresh, restricts gold to the DAG's tables, or makes it a dry run. The layer's ledger rows are written when it ends, in
    one commit, unless the caller passes the ``ledger`` it writes them with (:func:`run`: one
    commit for all the layers it runs). Its Spark jobs carry the tag ``lakehouse:<layer>:<topic>``
    (a gold table's, ``lakehouse:gold:<table>``).
    """
    with tagged(spark, layer, contract.topic):
        return _run_layer(spark, settings, contract, layer, catalog, run, echo, request, ledger)


def _run_layer(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    layer: Layer,
    catalog: Catalog | None,
    run: RunInfo | None,
    echo: Callable[[str], None],
    request: RunRequest | None,
    ledger: LedgerBuffer | None,
) -> list[str]:
    request = request or RunRequest()
    specs = _selected(contract, layer, request)
    objectstore.check_reachable(settings.data_root)
    waiting = nothing_landed(settings, contract, layer, specs, request)
    if waiting is not None:
        return waiting
    registry = SchemaRegistry(settings)
    if layer == "silver" or registry.reader_changed(contract):
        # Values written through a schema registry: the writers' schemas, looked up now (a
        # registry that does not answer fails the batch here, before anything is written).
        # Any layer looks them up when the contract's reader schema changed: the registry's
        # subject judges it before the first job registers it.
        contract = confluent.resolve(contract, settings)
    if request.dry_run:
        registry.check(contract)
        return plan_layer(spark, settings, contract, layer, catalog, request)
    registry.register(contract, spark)
    # A bad setting fails here, before any data moves.
    pandas_max_rows()
    adaptive_mode()
    small_batch_rows()
    workers = gold.parallelism()
    run = run or RunInfo.from_env()
    own_ledger = ledger is None
    ledger = ledger or LedgerBuffer(spark, settings)
    names = None if specs is None else {s.name for s in specs}
    gates = {
        path: Gate(settings, contract, layer, name, run, path, ledger, echo=echo)
        for name, path in layer_tables(settings, contract, layer)
        if names is None or name in names
    }
    # The verdicts of commits whose job died before writing them to the ledger, written now:
    # this layer's commits will make newer ones, which the next job would look at instead.
    write_ledger(
        spark, settings, restore_ledger(settings, [p for p, g in gates.items() if g.active])
    )
    # A table this run creates gets its constraints when it is created (Gate.created).
    for path, gate in gates.items():
        if is_table(path):
            _constrain(spark, path, gate, echo)
    # Each table's writes are judged by its gate, handed to the layer that writes it. A reprocess
    # or a refresh is judged by the same expectations, but it is not a micro-batch: its size is
    # no sign of an unusual volume (``Gate.regular``).
    active = {path: gate for path, gate in gates.items() if gate.active}
    resets = {p: replace(g, regular=False, verdicts=g.verdicts) for p, g in active.items()}
    lines: list[str] = []
    batches = _Batches(layer)
    try:
        if layer == "gold":
            lines += _reset_gold(spark, settings, contract, catalog, request, resets)
        if layer == "bronze":
            judge = active.get(settings.bronze_path(contract.topic))
            with batches.judged(judge):
                ingested = bronze.ingest(spark, settings, contract, judge)
            batches.add(ingested.batch())
            lines.append(ingested.summary())
        elif layer == "silver":
            judge = active.get(settings.silver_path(contract.stream))
            bronze_input = [(settings.bronze_path(contract.topic), silver.input_app(contract))]
            rows = _pending(settings.silver_path(contract.stream), bronze_input)
            with batches.judged(judge), adaptive_for(spark, rows):
                decoded = silver.build(spark, settings, contract, judge)
            batches.add(decoded.batch())
            lines.append(decoded.summary())
        else:
            assert specs is not None
            lines += _build_gold(
                spark, settings, contract, specs, catalog, active, workers, echo, batches
            )
        if layer == "silver" and request.reprocesses_silver:
            judge = resets.get(settings.silver_path(contract.stream))
            lines.append(_reprocess_silver(spark, settings, contract, request, judge))
        for gate in gates.values():
            check_freshness(gate)
    finally:
        ledger.rows += batches.rows(settings, contract, catalog, run, echo)
        if own_ledger:
            ledger.flush()  # failed checks too: a failed gate is recorded, then raised
    return lines


def nothing_landed(
    settings: Settings,
    contract: Contract,
    layer: Layer,
    specs: Sequence[TableSpec] | None,
    request: RunRequest,
) -> list[str] | None:
    """What a layer whose topic has had nothing land yet says, instead of doing anything (None
    when it has something to do): no table is made and nothing is committed or recorded until
    the first records arrive, so a run on an empty topic takes seconds, not the minutes that
    making and committing its empty tables cost. Bronze of a landing topic with no segment and
    no table yet; silver while bronze has no table; gold tables while their inputs and they
    themselves have none. (A Kafka topic's bronze always asks its broker.)"""
    if request.dry_run or request.reprocesses_silver or request.full_refresh:
        return None
    topic = contract.topic
    bronze_path = settings.bronze_path(topic)
    if layer == "bronze":
        from lakehouse.topics.landing import list_segments

        if contract.kafka is not None or is_table(bronze_path) or list_segments(settings, topic):
            return None
        return [
            f"bronze {topic}: nothing has landed on the topic yet: nothing to ingest (its "
            "table is made with the first batch)"
        ]
    if layer == "silver":
        if is_table(bronze_path):
            return None
        return [
            f"silver {contract.stream}: bronze.{topic} has no table yet (nothing has landed): "
            "nothing to decode"
        ]
    if request.reprocessed(contract):
        return None
    lines = []
    for spec in specs or ():
        source = common.input_path(settings, contract, spec)
        if is_table(source) or is_table(settings.gold_path(spec.name)):
            return None
        lines.append(
            f"gold {spec.name}: {_table_name(settings, source)} has no table yet (nothing has "
            "landed): nothing to fold"
        )
    return lines or None


class _Batches:
    """The outcome of each batch a layer's job publishes or its gate blocks, for the ledger:
    one row per table per batch, beside its checks' rows, with the table's lag once the layer
    is done."""

    def __init__(self, layer: Layer) -> None:
        self.layer = layer
        self.found: list[BatchOutcome] = []
        self._lock = threading.Lock()  # gold tables finish side by side

    def add(self, outcome: BatchOutcome | None) -> None:
        if outcome is not None:
            with self._lock:
                self.found.append(outcome)

    @contextmanager
    def judged(self, gate: Gate | None) -> Iterator[None]:
        """Records the batch a ``fail`` expectation of ``gate`` blocks (then re-raises)."""
        try:
            yield
        except QualityGateError:
            if gate is not None and gate.verdicts:
                held = gate.verdicts[-1]
                self.add(
                    BatchOutcome(self.layer, gate.table, BLOCKED, held.rows, lineage=gate.lineage)
                )
            raise

    def rows(
        self,
        settings: Settings,
        contract: Contract,
        catalog: Catalog | None,
        run: RunInfo,
        echo: Callable[[str], None],
    ) -> list[dict[str, Any]]:
        if not self.found:
            return []
        # A batch that knows its lag (bronze's, silver's: from what it planned with) keeps it; the
        # others' is read from the logs, once for the layer.
        unknown = {o.table for o in self.found if o.lag is None}
        lags: dict[str, int] = {}
        if unknown:
            try:
                lags = _lags(settings, contract, catalog, self.layer, unknown)
            except Exception as exc:  # the batches' rows still go in, without their lag
                echo(
                    f"{self.layer} {contract.topic}: lag not measured: {type(exc).__name__}: {exc}"
                )
        unit = "records" if self.layer == "bronze" else "versions"
        now = datetime.now(UTC)
        return [
            (
                o
                if o.lag is not None
                else replace(o, lag=lags.get(o.table), lag_unit=unit if o.table in lags else None)
            ).row(run, now)
            for o in self.found
        ]


def _lags(
    settings: Settings,
    contract: Contract,
    catalog: Catalog | None,
    layer: Layer,
    tables: Collection[str],
) -> dict[str, int]:
    """How far each of the layer's ``tables`` is behind its input: bronze behind the topic, in
    records; a silver or gold table behind the newest of its inputs, in versions."""
    from lakehouse.pipeline.lake import input_lag
    from lakehouse.topics.lag import lag

    if layer == "bronze":
        return {contract.topic: sum(p.lag for p in lag(settings, [contract]).partitions)}
    out: dict[str, int] = {}
    catalog = catalog or Catalog.of([contract])
    for i in input_lag(settings, catalog, [contract], (layer,), tables):
        name = i.table.removeprefix(f"{layer}.")
        out[name] = max(out.get(name, 0), i.lag)
    return out


def _build_gold(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    specs: list[TableSpec],
    catalog: Catalog | None,
    gates: dict[Location, Gate],
    workers: int,
    echo: Callable[[str], None],
    batches: _Batches,
) -> list[str]:
    """The micro-batch of each gold table of ``specs``, side by side; their summary lines in
    declaration order. When tables fail, the others' commits stand: each failure is told to
    ``echo``, then the only one is raised as it is, or several as a
    :class:`~lakehouse.errors.TablesFailedError`."""

    # One session per thread, made when the thread builds its first table, all released after.
    sessions: dict[int, SparkSession] = {}
    made = threading.Lock()

    def build_one(spec: TableSpec) -> GoldResult:
        gate = gates.get(settings.gold_path(spec.name))
        session = spark
        if workers > 1:
            thread = threading.get_ident()
            if thread not in sessions:
                with made:
                    sessions[thread] = held.enter_context(own_session(spark))
            session = sessions[thread]
        path = settings.gold_path(spec.name)
        inputs = kind.of(spec).inputs(settings, catalog or Catalog.of([contract]), contract, spec)
        rows = _pending(path, [(i.path, i.app) for i in inputs])
        with batches.judged(gate), tagged(session, "gold", spec.name), adaptive_for(session, rows):
            result = gold.build_table(session, settings, contract, spec, catalog, gate=gate)
        batches.add(result.batch())
        return result

    with ExitStack() as held:
        results, failures = gold.build_side_by_side(specs, build_one, workers)
    lines = [results[spec.name].summary() for spec in specs if spec.name in results]
    if not failures:
        return lines
    for line in lines:
        echo(line)
    for name, error in failures.items():
        echo(f"gold {name}: failed: {type(error).__name__}: {error}")
    if len(failures) == 1:
        raise next(iter(failures.values()))
    raise TablesFailedError("gold", failures, [spec.name for spec in specs if spec.name in results])


def _pending(path: Location, inputs: Collection[tuple[Location, str]]) -> int | None:
    """The input rows a table's next batch reads: for each ``(input, app)``, the change rows
    of the input's commits after the table's position (None if any is not known)."""
    total = 0
    for input_path, app in inputs:
        rows = rows_after(input_path, position(path, app))
        if rows is None:
            return None
        total += rows
    return total


def _reprocess_silver(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    request: RunRequest,
    gate: Gate | None,
) -> str:
    result = silver.reprocess(
        spark,
        settings,
        contract,
        from_version=request.reprocess_silver_from_version,
        from_offsets=request.reprocess_silver_from_offsets,
        dry_run=request.dry_run,
        gate=gate,
    )
    return result.summary()


def _selected(contract: Contract, layer: Layer, request: RunRequest) -> list[TableSpec] | None:
    """The gold tables this job builds (all the topic's, or the request's DAG's), in declaration
    order; None for bronze and silver."""
    if layer != "gold":
        return None
    wanted = set(request.gold_tables(contract))
    return [t for t in contract.tables if t.name in wanted]


def _reset_gold(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    catalog: Catalog | None,
    request: RunRequest,
    gates: Mapping[Location, Gate],
) -> list[str]:
    """Full refreshes and reprocesses first; the micro-batch that follows then reads on from the
    positions they set, and the tables reading their changelogs take the corrections."""
    from lakehouse.tables import rebuild

    catalog = catalog or Catalog.of([contract])
    store = DeltaStore(spark)
    lines = []
    for spec in contract.tables:
        gold_path = settings.gold_path(spec.name)
        if spec.name in request.full_refresh:
            gate = gates.get(gold_path)
            lines.append(
                rebuild.refresh(spark, settings, catalog, contract, spec, gate=gate).summary()
            )
        elif _outdated(store, settings, spec, request):
            gate = gates.get(gold_path)
            result = rebuild.refresh(spark, settings, catalog, contract, spec, gate=gate)
            lines.append(
                f"{result.summary()} (built when stream time was one per table: rebuilt with "
                "a stream time per partition)"
            )
        elif spec.name in request.reprocessed(contract):
            version = request.reprocess_gold_from_version
            result = rebuild.refresh(
                spark,
                settings,
                catalog,
                contract,
                spec,
                version,
                catch_up=True,
                gate=gates.get(settings.gold_path(spec.name)),
            )
            lines.append(f"{result.summary()} (reprocessed from version {version})")
    return lines


def _outdated(store: DeltaStore, settings: Settings, spec: TableSpec, request: RunRequest) -> bool:
    """A table this run builds that its kind says must be rebuilt first (one an earlier version
    of the platform built by another rule): rebuilt before its micro-batch."""
    wanted = request.tables is None or spec.name in request.tables
    return wanted and kind.of(spec).needs_rebuild(store, spec, common.outputs(settings, spec))


def plan_layer(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    layer: Layer,
    catalog: Catalog | None,
    request: RunRequest,
) -> list[str]:
    """A dry run: what the layer would read and write, from the tables' logs and positions
    (and, for a reprocess, a count of the records in scope). Changes nothing."""
    from lakehouse.storage.store import table_version

    tag = "(dry run)"
    if layer == "bronze":
        return [bronze.plan(settings, contract)]
    if layer == "silver":
        store = DeltaStore(spark)
        head = table_version(settings.bronze_path(contract.topic))
        consumed = store.transaction_version(
            settings.silver_path(contract.stream), silver.input_app(contract)
        )
        start = 0 if consumed is None else consumed + 1
        lines = [
            f"silver {contract.stream} {tag}: bronze has no new versions"
            if head is None or start > head
            else f"silver {contract.stream} {tag}: would decode bronze versions {start}..{head} "
            f"({_bronze_records(settings.bronze_path(contract.topic), start, head)} records) "
            f"into silver.{contract.stream} and its quarantine"
        ]
        if request.reprocesses_silver:
            lines.append(_reprocess_silver(spark, settings, contract, request, None))
        return lines
    specs = _selected(contract, layer, request) or []
    store = DeltaStore(spark)
    lines = []
    reset = set(request.full_refresh) | set(request.reprocessed(contract))
    for spec in specs:
        source = common.input_path(settings, contract, spec)
        if spec.name in request.full_refresh:
            lines.append(
                f"gold {spec.name} {tag}: would rebuild from the whole of "
                f"{_table_name(settings, source)} (version {table_version(source)}) and publish "
                "only the rows that differ"
            )
            continue
        if spec.name not in reset and _outdated(store, settings, spec, request):
            lines.append(
                f"gold {spec.name} {tag}: built when stream time was one per table: would "
                f"rebuild it from the whole of {_table_name(settings, source)} with a stream "
                "time per partition and publish only the rows that differ"
            )
            continue
        if spec.name in reset:
            version = request.reprocess_gold_from_version
            lines.append(
                f"gold {spec.name} {tag}: would be put back to {_table_name(settings, source)} "
                f"version {version - 1 if version else -1} and "
                f"read again from version {version} to {table_version(source)}"
            )
            continue
        ctx = kind.Context(
            store,
            settings,
            catalog or Catalog.of([contract]),
            contract,
            spec,
            common.outputs(settings, spec),
            None,
        )
        planned = kind.of(spec).plan(ctx)
        feeding = [n for n in reset if spec.changelog == n]
        if feeding:
            planned[-1] += f"; then the corrections of {', '.join(feeding)}"
        lines += planned
    return lines


def _table_name(settings: Settings, path: Location) -> str:
    return f"{path.parent.name}.{path.name}"


def _bronze_records(path: Location, start: int, end: int) -> int:
    """The records bronze added in versions start..end, from its commits' batch summaries (or,
    where one does not count them, the commit's own metrics)."""
    from lakehouse.storage import snapshots
    from lakehouse.storage.log import commit_metadata

    total = 0
    for commit in snapshots.latest(path).history():
        version = commit.get("version")
        value = commit_metadata(commit, bronze_table.BATCH_KEY)
        if version is None or value is None or not start <= int(version) <= end:
            continue
        metrics = commit.get("operationMetrics") or {}
        total += int(value.get("records", metrics.get("numOutputRows", 0)))
    return total


def _constrain(
    spark: SparkSession, path: Location, gate: Gate, echo: Callable[[str], None]
) -> None:
    for note in sync_constraints(spark, path, gate.expectations):
        echo(f"quality {gate.layer}.{gate.table}: {note}")


def check_freshness(gate: Gate) -> None:
    """Record whether the table has had new data within the contract's freshness interval."""
    if gate.contract.quality.freshness_ms is None:
        return
    from lakehouse.storage.store import last_commit_time, table_version

    published = [v for v in gate.verdicts if v.published_version is not None]
    last: datetime | None
    if published:  # this very run added data: no need to read the table's log
        last, version = published[-1].validated_at, published[-1].published_version
    else:
        last, version = last_commit_time(gate.path), table_version(gate.path)
    outcome = freshness_outcome(gate.contract, last)
    if outcome is not None:
        verdict = Verdict(gate.layer, gate.table, [outcome], 0, "none")
        gate.record(verdict, table_version=version, published=False)


def run(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    *,
    topics: Sequence[str] = (),
    layers: Sequence[Layer] = LAYERS,
    echo: Callable[[str], None] = print,
    requests: Mapping[str, RunRequest] | None = None,
) -> None:
    """Run the given layers (in pipeline order) for the given topics (all when empty);
    ``requests``: what a topic's run asks besides its micro-batch (checked by the caller)."""
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    ordered = [layer for layer in LAYERS if layer in layers]

    # Every layer's verdicts go to the ledger in one commit at the end (a commit costs as much
    # as a small layer); a run killed before it leaves them in the tables' commits, and the next
    # run restores them (see run_layer).
    ledger = LedgerBuffer(spark, settings)
    try:
        # Layer by layer across topics: a gold join then sees the other topic's stream as of
        # this run, not as of the previous one.
        gold_order = _readers_last(settings, catalog, contracts)
        for layer in ordered:
            for contract in gold_order if layer == "gold" else contracts:
                request = (requests or {}).get(contract.topic)
                for line in run_layer(
                    spark,
                    settings,
                    contract,
                    layer,
                    catalog,
                    echo=echo,
                    request=request,
                    ledger=ledger,
                ):
                    echo(line)
    finally:
        ledger.flush()


def _readers_last(
    settings: Settings, catalog: Catalog, contracts: Sequence[Contract]
) -> list[Contract]:
    """The topics in catalog order, but a topic with a table that reads another topic's gold
    table (a join with its history table) after that topic, so that it reads this run's
    version of it; a cycle keeps catalog order."""
    from lakehouse.tables import kind

    owner = {f"gold.{t.name}": c.topic for c in contracts for t in c.tables}
    needs = {
        c.topic: {
            owner[i.name]
            for t in c.tables
            for i in kind.of(t).inputs(settings, catalog, c, t)
            if i.name in owner
        }
        - {c.topic}
        for c in contracts
    }
    ordered: list[Contract] = []
    placed: set[str] = set()
    while len(ordered) < len(contracts):
        waiting = [c for c in contracts if c.topic not in placed]
        ready = [c for c in waiting if needs[c.topic] <= placed] or waiting[:1]
        ordered += ready
        placed |= {c.topic for c in ready}
    return ordered


def topic_tables(
    settings: Settings, contract: Contract, catalog: Catalog | None = None
) -> list[tuple[Location, list[Consumer]]]:
    """Every table of a topic's pipeline with the consumers reading its change feed (a gold
    table reads the stream, another table's changelog, or for a join the other topic's stream
    too; its private state tables read what it reads)."""
    readers: dict[Location, list[Consumer]] = {
        settings.bronze_path(contract.topic): [
            Consumer(
                f"silver.{contract.stream}",
                settings.silver_path(contract.stream),
                silver.input_app(contract),
            )
        ],
        settings.silver_path(contract.stream): [],
    }
    owned: list[Location] = []
    for spec in contract.tables:
        out = common.outputs(settings, spec)
        inputs = (
            kind.of(spec).inputs(settings, catalog, contract, spec)
            if catalog is not None
            else (kind.stream_input(contract, spec, settings),)
        )
        # The gold table always; its side tables once they exist (a consumer without a position
        # would keep the whole history from being vacuumed).
        private = [side.path for side in kind.of(spec).side_tables(spec, out)]
        for path in [out.gold, *(p for p in private if is_table(p))]:
            owned.append(path)
            for feed in inputs:
                readers.setdefault(feed.path, []).append(
                    Consumer(f"gold.{spec.name}", path, feed.app)
                )
    listed = [*readers.items(), *((p, []) for p in owned if p not in readers)]
    return [
        *listed,
        (settings.quarantine_path("bronze", contract.topic), []),
        (settings.quarantine_path("silver", contract.stream), []),
    ]


def maintained_tables(
    settings: Settings,
    catalog: Catalog,
    *,
    topics: Sequence[str] = (),
    ledger: bool = False,
) -> list[tuple[Location, list[Consumer]]]:
    """The existing tables :func:`maintain_topics` maintains, each with the consumers of its
    change feed: every table of the topics (all when empty), or with ``ledger`` the data-quality
    results ledger alone. Read from the filesystem, without Spark; an unknown topic is a
    ConfigError."""
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    if ledger:  # no consumers: the reports read snapshots
        return [(settings.ledger_path, [])] if is_table(settings.ledger_path) else []
    return [
        (path, consumers)
        for contract in contracts
        for path, consumers in topic_tables(settings, contract, catalog)
        if is_table(path)
    ]


def maintain_topics(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    *,
    topics: Sequence[str] = (),
    retention_hours: float,
    compact: bool = True,
    dry_run: bool = False,
    ledger: bool = False,
    echo: Callable[[str], None] = print,
) -> list[MaintenanceReport]:
    """Compact, vacuum (consumer-aware), checkpoint and clean the logs of every existing table of
    the topics (all when empty); with ``ledger``, of the data-quality results ledger instead
    (every job appends one small commit to it: it needs compacting most of all). The tables are
    :func:`maintained_tables`."""
    reports = []
    for path, consumers in maintained_tables(settings, catalog, topics=topics, ledger=ledger):
        report = maintain(
            spark,
            settings,
            path,
            consumers,
            retention_hours=retention_hours,
            compact=compact,
            dry_run=dry_run,
        )
        echo(report.summary())
        reports.append(report)
    return reports


def run_command(
    settings: Settings,
    catalog: Catalog,
    topics: Sequence[str],
    layers: Sequence[Layer],
    asked: Mapping[str, Any] | None = None,
) -> int:
    """One micro-batch of the given layers and topics (each: all when empty), plus what the
    flags ask (``asked``: the keys of a triggered run's Params). Every request is checked
    before Spark starts."""
    from lakehouse.pipeline.request import run_requests
    from lakehouse.runtime import server

    requests = run_requests(catalog, topics, layers, asked)
    if any(v for v in (asked or {}).values()):
        for name, request in requests.items():
            for line in request.describe(catalog.topic(name)):
                print(line)
    # The requests above are checked before Spark is set up.
    objectstore.check_reachable(settings.data_root)  # before a JVM starts, not after
    spark = server.session(settings, "lakehouse-run")
    run(spark, settings, catalog, topics=topics, layers=layers or LAYERS, requests=requests)
    return 0


def maintain_command(
    settings: Settings,
    catalog: Catalog,
    topics: Sequence[str],
    *,
    retention_hours: float,
    compact: bool,
    dry_run: bool,
    ledger: bool,
) -> int:
    """``lakehouse maintain``: an unknown topic is refused, and a lakehouse without tables
    done, before Spark starts."""
    from lakehouse.runtime import server

    if not maintained_tables(settings, catalog, topics=topics, ledger=ledger):
        print("no tables to maintain")
        return 0
    maintain_topics(
        server.session(settings, "lakehouse-maintain"),
        settings,
        catalog,
        topics=topics,
        retention_hours=retention_hours,
        compact=compact,
        dry_run=dry_run,
        ledger=ledger,
    )
    return 0
