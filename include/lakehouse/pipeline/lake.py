"""Every table the platform writes, under the one name the command line takes for it.

A name says what the table is and mirrors where it lies under ``LAKEHOUSE_DATA``:

===============================  ==========  =======================================================
name                             kind        what it holds
===============================  ==========  =======================================================
``bronze.<topic>``               bronze      the topic's records, raw (``tables/bronze/<topic>``)
``silver.<stream>``              silver      the stream, decoded (also the bare ``<stream>``)
``<table>``, ``gold.<table>``    gold        a gold table
``quarantine.bronze.<topic>``    quarantine  landing lines bronze could not read, and why
``quarantine.silver.<stream>``   quarantine  records silver could not decode, and why
``late.<table>``                 late        a windowed table's records that came after its window
``state.<table>``                state       a gold table's private state; ``state.<table>__<x>``:
                                             a further one (a table-table join's other side)
``gaps.<topic>``                 gaps        a Kafka topic's offsets its retention deleted unread
``quality.ledger``               ledger      every data-quality check's result (``quality/ledger``)
``schemas.registry``             registry    every registered key and value schema (``schemas``)
===============================  ==========  =======================================================

Every table is also found by its name in the catalog (:mod:`lakehouse.storage.metastore`:
``bronze.user_locations``, ``quarantine_silver.<stream>`` ...). Names are looked up among the
ones the contracts give rise to, never turned into paths as typed, so no name reaches outside
the lake. Read with delta-rs: no Spark.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.errors import UnknownTableError
from lakehouse.runtime.config import Layer, Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.storage import metastore
from lakehouse.storage.log import is_table, load, position, table_rows

Kind = Literal[
    "bronze", "silver", "gold", "quarantine", "late", "state", "gaps", "ledger", "registry"
]
LEDGER = "quality.ledger"
REGISTRY = "schemas.registry"

# The columns whose order `show` prints a kind's rows in (those the table has).
_RECORD_ORDER = ("partition", "offset")
_ORDER: dict[Kind, tuple[str, ...]] = {
    "gaps": ("partition", "first_offset"),
    "ledger": ("validated_at", "layer", "table", "expectation"),
    "registry": ("topic", "subject", "version"),
}


@dataclass(frozen=True)
class LakeTable:
    """One table of the lake: its name, what kind of table it is, where it lies, the columns
    its rows are shown in the order of, and the contract (and gold table) it belongs to."""

    name: str
    kind: Kind
    path: Location
    order: tuple[str, ...]
    contract: Contract | None = None
    spec: TableSpec | None = None

    @property
    def topic(self) -> str | None:
        return None if self.contract is None else self.contract.topic


@dataclass(frozen=True)
class TableState:
    """An existing table's latest version and its rows (from its log: no data read; None if
    a file was added without its row count)."""

    table: LakeTable
    version: int
    rows: int | None


def _of_topic(settings: Settings, c: Contract) -> Iterator[LakeTable]:
    """The tables a topic's contract gives rise to, in pipeline order: each gold table followed
    by the side tables its kind keeps (:func:`lakehouse.tables.kind.side_tables`)."""
    from lakehouse.tables import kind

    yield LakeTable(f"bronze.{c.topic}", "bronze", settings.bronze_path(c.topic), _RECORD_ORDER, c)
    yield LakeTable(
        f"quarantine.bronze.{c.topic}",
        "quarantine",
        settings.quarantine_path("bronze", c.topic),
        ("partition", "source_file", "line"),
        c,
    )
    if c.kafka is not None:
        yield LakeTable(f"gaps.{c.topic}", "gaps", settings.gaps_path(c.topic), _ORDER["gaps"], c)
    yield LakeTable(
        f"silver.{c.stream}", "silver", settings.silver_path(c.stream), _RECORD_ORDER, c
    )
    yield LakeTable(
        f"quarantine.silver.{c.stream}",
        "quarantine",
        settings.quarantine_path("silver", c.stream),
        _RECORD_ORDER,
        c,
    )
    for spec in c.tables:
        keys = c.table_key_columns(spec)
        yield LakeTable(spec.name, "gold", settings.gold_path(spec.name), keys, c, spec)
        for side in kind.side_tables(settings, spec):
            order = _RECORD_ORDER if side.role == "late" else (*_RECORD_ORDER, *keys)
            yield LakeTable(side.name, side.role, side.path, order, c, spec)


def tables(settings: Settings, catalog: Catalog, topics: Sequence[str] = ()) -> list[LakeTable]:
    """Every table the platform may write for the catalog's topics (``topics``: those only, and
    without the lake-wide ledger and registry), whether it exists yet or not."""
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    found = [t for c in contracts for t in _of_topic(settings, c)]
    if not topics:
        found.append(LakeTable(LEDGER, "ledger", settings.ledger_path, _ORDER["ledger"]))
        found.append(LakeTable(REGISTRY, "registry", settings.registry_path, _ORDER["registry"]))
    return found


def existing(settings: Settings, catalog: Catalog, topics: Sequence[str] = ()) -> list[TableState]:
    """The tables of :func:`tables` that exist, with their latest version and rows."""
    out = []
    for t in tables(settings, catalog, topics):
        if is_table(t.path):
            dt = load(t.path)
            out.append(TableState(t, int(dt.version()), table_rows(dt)))
    return out


def _aliases(settings: Settings, t: LakeTable) -> Iterable[str]:
    """The names a table is also known by: its name in the catalog
    (:func:`lakehouse.storage.metastore.table_name`: ``gold.<table>``,
    ``bronze.<topic identifier>``, ``quarantine_silver.<stream>`` ...), and a stream its bare
    name."""
    if (named := metastore.table_name(settings.data_root, t.path)) is not None:
        yield str(named)
    if t.kind == "silver":
        yield t.name.removeprefix("silver.")


def resolve(settings: Settings, catalog: Catalog, name: str) -> LakeTable:
    """The table called ``name`` (see the module's table). An unknown name is an
    :class:`UnknownTableError` listing the tables that exist (or, in a lake with none yet, the
    names the contracts give rise to)."""
    every = tables(settings, catalog)
    for t in every:
        if name == t.name or name in _aliases(settings, t):
            return t
    have = [t.name for t in every if is_table(t.path)]
    raise UnknownTableError(name, have, declared=[t.name for t in every])


@dataclass(frozen=True)
class InputLag:
    """How far a table has read one of its inputs: the input's latest version, the last one the
    table consumed (None: none yet), and the versions between."""

    layer: Layer  # the table's
    table: str
    input: str
    consumed: int | None
    latest: int | None

    @property
    def lag(self) -> int:
        """Versions of the input the table has still to read."""
        if self.latest is None:
            return 0
        return max(0, self.latest - (-1 if self.consumed is None else self.consumed))


def input_lag(
    settings: Settings,
    catalog: Catalog,
    contracts: Iterable[Contract],
    layers: Collection[Layer] = ("silver", "gold"),
    tables: Collection[str] | None = None,
) -> list[InputLag]:
    """How far each silver and gold table of the topics (of ``layers``; of those named
    ``tables``, if given) has read its inputs, by the positions its commits record: silver
    reads bronze; a gold table the stream (a join also the other topic's), or another table's
    changelog. Only the logs of the tables asked about are read. (Bronze's lag behind the
    topic, in records, is :func:`lakehouse.topics.lag.lag`'s.)"""
    from lakehouse.streams import silver
    from lakehouse.tables import kind

    def behind(
        layer: Layer, table: str, path: Location, input_name: str, input_path: Location, app: str
    ) -> InputLag:
        latest = int(load(input_path).version()) if is_table(input_path) else None
        return InputLag(layer, table, input_name, position(path, app), latest)

    def wanted(layer: Layer, name: str) -> bool:
        return layer in layers and (tables is None or name in tables)

    out = []
    for c in contracts:
        if wanted("silver", c.stream):
            out.append(
                behind(
                    "silver",
                    f"silver.{c.stream}",
                    settings.silver_path(c.stream),
                    f"bronze.{c.topic}",
                    settings.bronze_path(c.topic),
                    silver.input_app(c),
                )
            )
        for spec in c.tables:
            if not wanted("gold", spec.name):
                continue
            path = settings.gold_path(spec.name)
            inputs = kind.of(spec).inputs(settings, catalog, c, spec)
            out.extend(behind("gold", spec.name, path, i.name, i.path, i.app) for i in inputs)
    return out
