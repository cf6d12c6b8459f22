"""Rebuilding gold tables: full refresh, reprocess from an input version, a table as of an event
time, and restore from the changelog alone.

* **Full refresh** builds the table from its whole input into scratch tables, then folds the
  result into the real table in one merge that deletes, updates and inserts exactly the rows
  that differ. The table keeps its history and its changelog shows only true changes, so the
  tables that read it as a stream stay right. Its position (the input versions consumed) is set
  to what the scratch build consumed.
* **Reprocess from version v** is the same with the scratch build stopped before input version
  ``v``: the table is put back to what it was after consuming ``v - 1``, and the next micro-batch
  re-reads from ``v`` (after a bug fix in the job, say). Incremental runs and a full refresh
  give identical tables, which is what makes both safe.
* **As of event time T** (the seeds' "table as of any time t") rebuilds the table in a scratch
  lake from the streams cut at event time T: only events with ``event_time <= T`` happened.
* **Restore** replays a table's changelog (its Delta change data feed) into a new table: each
  key's last change wins, a delete removes the key. The result equals the table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.errors import LakehouseError
from lakehouse.runtime import objectstore
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, Txn, delta_spark, log
from lakehouse.storage.gates import PublishGate
from lakehouse.tables import common, gold, kind

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession


@dataclass
class RefreshResult:
    table: str
    upto: int | None  # last input version included; None: the input was empty
    table_version: int | None

    def summary(self) -> str:
        what = "nothing" if self.upto is None else f"input versions 0..{self.upto}"
        return f"gold {self.table}: rebuilt from {what}; table now at version {self.table_version}"


@contextmanager
def _scratch(settings: Settings) -> Iterator[Location]:
    """A private folder beside the tables (the same store: the Spark that writes them may run
    on another machine), removed afterwards."""
    path = settings.data_root / "tmp" / f"rebuild-{uuid.uuid4().hex}"
    try:
        yield path
    finally:
        objectstore.remove_tree(path)


def _apps(settings: Settings, catalog: Catalog, contract: Contract, spec: TableSpec) -> list[str]:
    """The app ids under which a table records the input versions it consumed."""
    inputs = kind.of(spec).inputs(settings, catalog, contract, spec)
    return list(dict.fromkeys(i.app for i in inputs))


def _rewinds(store: DeltaStore, path: Location, apps: list[str]) -> list[Txn]:
    """The positions ``path`` holds, as Txns that set them even when not newer. An app with no
    position gets -1: nothing consumed."""
    if not DeltaStore.exists(path):
        return [Txn(app, -1, rewind=True) for app in apps]
    return [
        Txn(app, -1 if v is None else v, rewind=True)
        for app in apps
        for v in [store.transaction_version(path, app)]
    ]


def refresh(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    contract: Contract,
    spec: TableSpec,
    from_version: int | None = None,
    *,
    catch_up: bool = False,
    gate: PublishGate | None = None,
) -> RefreshResult:
    """Rebuild one gold table from its input (all of it, or the versions before
    ``from_version``), keeping the table's history; see the module docstring.

    With ``catch_up``, a reprocess goes on in the scratch tables to the input's head, reading
    from ``from_version`` as the next micro-batch would, before the result is folded into the
    table: the table then changes once, by its net differences, and the tables reading its
    changelog see no back-and-forth (a pipeline run's reprocess does this). ``gate`` judges
    the one write to the table."""
    if from_version is not None and from_version < 0:
        raise LakehouseError(f"gold {spec.name}: an input version is >= 0, not {from_version}")
    store = DeltaStore(spark)
    real = common.outputs(settings, spec)
    apps = _apps(settings, catalog, contract, spec)
    upto = None if from_version is None else from_version - 1
    # Every writer of a gold table and its state and late tables takes the table's lock first.
    with delta_spark.table_lock(settings, real.gold), _scratch(settings) as tmp:
        out = common.Outputs(tmp / "gold", tmp / "state", tmp / "late")
        gold.build_table(spark, settings, contract, spec, catalog, out=out, upto=upto)
        if catch_up and upto is not None:
            gold.build_table(spark, settings, contract, spec, catalog, out=out)
        _fold(store, out.gold, real.gold, contract.table_key_columns(spec), apps, gate)
        # Its side tables (state, late records) are replaced whole by the rebuilt ones.
        sides = kind.of(spec)
        pairs = [
            (mine.path, theirs.path)
            for mine, theirs in zip(
                sides.side_tables(spec, out), sides.side_tables(spec, real), strict=True
            )
        ]
        for scratch, target in pairs:
            _replace(store, scratch, target, apps)
        consumed = store.transaction_version(out.gold, apps[0])
    return RefreshResult(spec.name, consumed, store.version(real.gold))


def _fold(
    store: DeltaStore,
    scratch: Location,
    real: Location,
    keys: tuple[str, ...],
    apps: list[str],
    gate: PublishGate | None,
) -> None:
    """Make ``real`` equal ``scratch`` in one merge: rows only in ``real`` are deleted, rows
    that differ updated, new ones inserted; the positions become the scratch build's. A table
    that already holds exactly the rebuilt rows at the rebuilt positions gets no commit, so its
    changelog shows nothing happened."""
    rebuilt = store.read(scratch)
    rewinds = _rewinds(store, scratch, apps)
    if DeltaStore.exists(real) and all(
        store.transaction_version(real, t.app_id) == t.version for t in rewinds
    ):
        current = store.read(real).select(*rebuilt.columns)
        if rebuilt.exceptAll(current).isEmpty() and current.exceptAll(rebuilt).isEmpty():
            return
    delta_spark.create_table(store.spark, real, store.spark_schema(scratch), gate=gate)
    values = [c for c in rebuilt.columns if c not in keys]
    delta_spark.merge(
        rebuilt,
        real,
        on=list(keys),
        update={c: f"s.{c}" for c in values},
        update_when=" OR ".join(f"(t.{c} IS DISTINCT FROM s.{c})" for c in values) or "false",
        insert={c: f"s.{c}" for c in rebuilt.columns},
        delete_unmatched=True,
        txn=rewinds,
        metadata={**_carried_metadata(scratch), "lakehouse.refresh": {"rebuilt": True}},
        gate=gate,
    )


def _carried_metadata(scratch: Location) -> dict[str, Any]:
    """The rebuilt table's newest ``lakehouse.*`` commit metadata (its position, a windowed
    table's stream time): the real table's next micro-batch reads it from the refresh commit."""
    from deltalake import DeltaTable

    history = DeltaTable(
        str(scratch), storage_options=objectstore.storage_options(scratch)
    ).history(1)
    newest = log.user_metadata(history[0]) if history else {}
    own = {log.WRITE_ID_KEY, log.POSITIONS_KEY}
    return {k: v for k, v in newest.items() if k.startswith("lakehouse.") and k not in own}


def _replace(store: DeltaStore, scratch: Location, real: Location, apps: list[str]) -> None:
    """A private table (state, late records) is replaced whole by its rebuilt version (emptied
    if the rebuild has none), with the rebuild's positions."""
    if DeltaStore.exists(scratch):
        rows = store.read(scratch)
    elif DeltaStore.exists(real):
        rows = store.read(real).limit(0)
    else:
        return
    delta_spark.create_table(store.spark, real, rows.schema)
    rewinds = _rewinds(store, scratch, apps)
    delta_spark.append(rows, real, mode="overwrite", txn=rewinds)


def at_event_time(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    contract: Contract,
    spec: TableSpec,
    when: datetime,
) -> pa.Table:
    """The table as it would be had only the events with event time <= ``when`` happened:
    rebuilt in a scratch lake from the streams cut at ``when``. Within the cut streams records
    keep their partition and offset; they arrive in one batch."""
    from pyspark.sql import functions as F

    from lakehouse.storage import read_arrow

    store = DeltaStore(spark)
    with _scratch(settings) as tmp:
        lake = Settings(home=settings.home, contracts_dir=settings.contracts_dir, data=tmp)
        inputs = kind.of(spec).inputs(settings, catalog, contract, spec)
        streams = [contract.stream]
        streams += [i.name.removeprefix("silver.") for i in inputs if i.name.startswith("silver.")]
        for stream in dict.fromkeys(streams):
            silver = settings.silver_path(stream)
            if not DeltaStore.exists(silver):
                raise LakehouseError(f"stream {stream} has no data yet: run its silver layer")
            cut = store.read(silver).filter(F.col("event_time") <= F.lit(when))
            schema = store.spark_schema(silver)
            delta_spark.append(cut, lake.silver_path(stream), create=schema)
        needed = _with_sources(contract, spec)
        for dep in needed:
            gold.build_table(spark, lake, contract, dep, catalog)
        return read_arrow(lake.gold_path(spec.name))


def _with_sources(contract: Contract, spec: TableSpec) -> list[TableSpec]:
    """``spec`` after the tables whose changelogs it reads, in build order."""
    chain = [spec]
    while chain[0].changelog is not None:
        chain.insert(0, contract.table(chain[0].changelog))
    return chain


def restore(
    spark: SparkSession, settings: Settings, contract: Contract, spec: TableSpec, target: Location
) -> int:
    """Rebuild a gold table from its changelog alone into ``target`` (a new table); returns the
    number of rows. Within a commit a key changes once (a merge), so the last change by commit
    version decides: an insert or update's post-image is the row, a delete removes it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    store = DeltaStore(spark)
    table = settings.gold_path(spec.name)
    if DeltaStore.exists(target):
        raise LakehouseError(f"{target} already exists; restore writes a new table")
    keys = list(contract.table_key_columns(spec))
    feed = store.changes(table, 0).filter(F.col("_change_type") != "update_preimage")
    # A delete sorts before a re-insert of the same key in the same commit (an overwrite).
    rank = F.when(F.col("_change_type") == "delete", 0).otherwise(1)
    order = Window.partitionBy(*keys).orderBy(F.col("_commit_version").desc(), rank.desc())
    last = feed.withColumn("_n", F.row_number().over(order)).filter(F.col("_n") == 1)
    schema = store.spark_schema(table)  # the table's own, NOT NULL keys included
    rows = last.filter(F.col("_change_type") != "delete").select(*schema.fieldNames())
    delta_spark.create_table(spark, target, schema)
    delta_spark.append(rows, target, metadata={"lakehouse.restore": {"from": str(table)}})
    return int(store.read(target).count())
