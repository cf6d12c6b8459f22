"""The kinds of gold table, and the one small protocol each kind's module implements.

A kind is one module (:data:`KINDS`): ``latest``, ``aggregate``, ``windowed``, ``stream-table``,
``table-table``, ``stream-stream`` and ``history``. Gold, the runner, rebuilds and the lake's lag
ask the table's kind (:func:`of`) what they need, and never look at a spec's fields to find out
which kind it is:

* :meth:`TableKind.inputs`: what the table reads (the app ids under which it records its
  positions, the tables they are of);
* :meth:`TableKind.side_tables`: the tables it keeps beside itself (state, late records);
* :meth:`TableKind.create`, :meth:`TableKind.read`, :meth:`TableKind.transform`,
  :meth:`TableKind.commit`: one micro-batch, read at the edge, transformed by a pure function of
  the batch and the table's state into its changes, and committed with its positions in one
  commit (:func:`build` runs them in that order, under the tables' locks);
* :meth:`TableKind.unfinished`: a batch a crash left half-committed, finished first;
* :meth:`TableKind.needs_rebuild`: whether the table must be rebuilt before its next batch
  (rebuilds themselves, :mod:`lakehouse.tables.rebuild`, run :func:`build` into scratch tables);
* :meth:`TableKind.plan`: what a dry run says it would do.

A new kind is a module with a class implementing this protocol, listed in :data:`KINDS` by the
contract model's kind name (:data:`lakehouse.contracts.model.Kind`).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, Kind, TableSpec
from lakehouse.runtime.config import Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import DeltaStore, delta_spark
from lakehouse.tables.common import GoldResult, Outputs, input_app, input_path, outputs, pending

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Input:
    """A table a gold table reads: its name (``silver.<stream>``, ``gold.<table>``), where it
    is, and the app id under which the gold table records the version of it consumed."""

    name: str
    path: Location
    app: str


@dataclass(frozen=True)
class SideTable:
    """A table a gold table keeps beside itself: its role (``state``: what the table needs to
    fold its next batch in; ``late``: records too late for it), its name as the catalog and the
    CLI name it, and where it is."""

    role: Literal["state", "late"]
    name: str
    path: Location


@dataclass(frozen=True)
class Context:
    """What one build of a table works with: the session and its store, the lakehouse's
    settings and contracts, the table, where it writes (``out``) and the last input version it
    may read (``upto``)."""

    store: DeltaStore
    settings: Settings
    catalog: Catalog
    contract: Contract
    spec: TableSpec
    out: Outputs
    upto: int | None

    @property
    def spark(self) -> SparkSession:
        return self.store.spark

    @property
    def stream(self) -> Contract:
        """The stream the table reads (the topic's, or another table's changelog)."""
        return self.contract.input(self.spec)

    @property
    def app(self) -> str:
        return input_app(self.contract, self.spec)

    def pending(self) -> tuple[int, int] | None:
        """This side's input versions the table has yet to consume (up to ``upto``)."""
        path = input_path(self.settings, self.contract, self.spec)
        return pending(self.store, self.out.gold, self.app, path, self.upto)


class TableKind(Protocol):
    """One kind of gold table (see the module docstring). ``B`` is what :meth:`read` gives
    :meth:`transform`, ``C`` what :meth:`transform` gives :meth:`commit`; each kind has its
    own."""

    name: Kind

    def inputs(
        self, settings: Settings, catalog: Catalog, contract: Contract, spec: TableSpec
    ) -> tuple[Input, ...]:
        """What the table reads, this side first."""
        ...

    def side_tables(self, spec: TableSpec, out: Outputs) -> tuple[SideTable, ...]:
        """The tables it keeps beside itself where it writes into ``out`` (none: a table of
        its rows alone)."""
        ...

    def create(self, ctx: Context) -> None:
        """Create the table and its side tables where they do not exist."""
        ...

    def unfinished(self, ctx: Context) -> Any | None:
        """A batch a crash left half-committed, read again to be finished (None: none)."""
        ...

    def read(self, ctx: Context) -> Any | None:
        """The next micro-batch and the state it needs (None: nothing new)."""
        ...

    def transform(self, ctx: Context, batch: Any) -> Any:
        """The batch's changes to the table (and its side tables): pure Spark transforms of
        the batch and the state it carries."""
        ...

    def commit(self, ctx: Context, batch: Any, changes: Any) -> GoldResult:
        """Write the changes with the batch's positions: one commit of the table, then its
        side tables' (each with the same positions)."""
        ...

    def needs_rebuild(self, store: DeltaStore, spec: TableSpec, out: Outputs) -> bool:
        """Whether the table must be rebuilt before its next micro-batch."""
        ...

    def plan(self, ctx: Context) -> list[str]:
        """What a dry run says this table's micro-batch would read and write."""
        ...


class StreamKind:
    """What the kinds that read one stream share unless they say otherwise: the stream is their
    only input, no side tables, nothing left unfinished by a crash, never a rebuild, and a dry
    run saying which of the stream's versions they would fold."""

    def inputs(
        self, settings: Settings, catalog: Catalog, contract: Contract, spec: TableSpec
    ) -> tuple[Input, ...]:
        return (stream_input(contract, spec, settings),)

    def side_tables(self, spec: TableSpec, out: Outputs) -> tuple[SideTable, ...]:
        return ()

    def unfinished(self, ctx: Context) -> Any | None:
        return None

    def needs_rebuild(self, store: DeltaStore, spec: TableSpec, out: Outputs) -> bool:
        return False

    def plan(self, ctx: Context) -> list[str]:
        return plan_stream(ctx)


# The module of each kind (lakehouse.tables.<module>), whose ``KIND`` implements the protocol.
KINDS: dict[Kind, str] = {
    "latest": "latest",
    "aggregate": "aggregate",
    "windowed": "windowed",
    "stream-table": "stream_table",
    "table-table": "table_table",
    "stream-stream": "stream_stream",
    "history": "history",
}


def stream_input(contract: Contract, spec: TableSpec, settings: Settings) -> Input:
    """The stream a table reads on its own side: the topic's, or another table's changelog."""
    path = input_path(settings, contract, spec)
    return Input(f"{path.parent.name}.{path.name}", path, input_app(contract, spec))


def plan_stream(ctx: Context, *, also: str = "") -> list[str]:
    """A dry run's line for a table folding its stream's new versions (``also``: what else it
    reads)."""
    source = stream_input(ctx.contract, ctx.spec, ctx.settings)
    todo = ctx.pending()
    head = f"gold {ctx.spec.name} (dry run): "
    if todo is None:
        return [f"{head}{source.name} has no new versions{also}"]
    return [
        f"{head}would fold {source.name} versions {todo[0]}..{todo[1]} into "
        f"gold.{ctx.spec.name}{also}"
    ]


def of(spec: TableSpec) -> TableKind:
    """The kind of table ``spec`` is."""
    module = importlib.import_module(f"lakehouse.tables.{KINDS[spec.kind]}")
    kind: TableKind = module.KIND
    return kind


def side_tables(settings: Settings, spec: TableSpec) -> tuple[SideTable, ...]:
    """The tables ``spec``'s table keeps beside itself in the lake."""
    return of(spec).side_tables(spec, outputs(settings, spec))


def build(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    contract: Contract,
    spec: TableSpec,
    out: Outputs,
    upto: int | None,
) -> GoldResult:
    """One micro-batch of a table: under the locks of the table and its side tables (one
    committing driver per table), create what is missing, finish a half-committed batch, then
    read, transform and commit the next one."""
    kind = of(spec)
    store = DeltaStore(spark)
    ctx = Context(store, settings, catalog, contract, spec, out, upto)
    with contextlib.ExitStack() as locks:
        for path in (out.gold, *(t.path for t in kind.side_tables(spec, out))):
            locks.enter_context(delta_spark.table_lock(settings, path))
        kind.create(ctx)
        result = None
        redo = kind.unfinished(ctx)
        if redo is not None:
            result = kind.commit(ctx, redo, kind.transform(ctx, redo))
        batch = kind.read(ctx)
        if batch is None:
            return result or GoldResult(spec.name, None)
        result = kind.commit(ctx, batch, kind.transform(ctx, batch))
        if upto is None:
            # Every kind reads each of its inputs up to the head it found when it planned the
            # batch: as planned, the table is not behind (a rebuild capped by ``upto`` may be,
            # and is measured).
            result.lag = 0
        return result
