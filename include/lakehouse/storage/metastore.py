"""The platform's tables by name, in the metastore (:mod:`lakehouse.runtime.metastore`).

Each table the platform writes is an external Delta table in a schema of its kind, at the
location it lies at under ``LAKEHOUSE_DATA``:

=============================  ==============================================
name in the metastore          table (its location under ``tables/``)
=============================  ==============================================
``bronze.<topic>``             ``bronze/<topic>``
``silver.<stream>``            ``silver/<stream>``
``gold.<table>``               ``gold/<table>``
``quarantine_bronze.<topic>``  ``quarantine/bronze/<topic>``
``quarantine_silver.<stream>`` ``quarantine/silver/<stream>``
``late.<table>``               ``late/<table>``
``state.<table>``              ``state/<table>`` (and ``state/<table>__<what>``)
``gaps.<topic>``               ``gaps/<topic>``
``quality.ledger``             ``quality/ledger`` (beside ``tables/``)
``schemas.registry``           ``schemas`` (beside ``tables/``)
=============================  ==============================================

A metastore's names have two parts and only letters, digits and ``_``: a topic's name becomes
its identifier (``user-locations`` -> ``user_locations``, lower case, every other character
``_``), and the quarantine tables' ``quarantine.<layer>`` becomes one schema per layer.

A table is registered when the platform creates it (:func:`register_created`, called by
:func:`lakehouse.storage.delta_spark.create_table` on a session whose catalog is the metastore;
such a session's settings name the lake it keeps names for,
:data:`lakehouse.runtime.metastore.LAKE_CONF`),
and keeps its name until ``lakehouse catalog drop`` removes it. Its schema is not copied into the
metastore: Delta reads a registered table's schema from its log, so a column a write adds is in
the named table at once. Dropping a name never deletes the table's files (the tables are
external).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime.config import Settings, stream_table_name
from lakehouse.runtime.metastore import LAKE_CONF, PIPELINE_SCHEMAS
from lakehouse.runtime.objectstore import Location
from lakehouse.runtime.objectstore import location as location_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_NAME = re.compile(r"([a-z][a-z0-9_]*)\.([a-z0-9_]+)")


class CatalogError(LakehouseError):
    """A table's name in the metastore cannot be set or removed as asked: the message says which
    name, where it points, and what to run."""


@dataclass(frozen=True)
class TableName:
    """A table's two-part name in the metastore."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def sql(self) -> str:
        """The name quoted for SQL."""
        return f"`{self.schema}`.`{self.table}`"

    @classmethod
    def parse(cls, text: str) -> TableName:
        """``schema.table`` in one of the platform's schemas; anything else is a ConfigError
        saying what a name looks like."""
        found = _NAME.fullmatch(text.strip().lower())
        if found is None or found.group(1) not in PIPELINE_SCHEMAS:
            raise ConfigError(
                f"{text!r} is not a name of the lakehouse's catalog: give <schema>.<table>, the "
                f"schema one of {', '.join(PIPELINE_SCHEMAS)} (e.g. gold.user_latest_location)"
            )
        return cls(found.group(1), found.group(2))


def table_name(data_root: Location, path: Location) -> TableName | None:
    """The name in the metastore of the platform's table at ``path`` in the lake at
    ``data_root``, or None for a location that is no pipeline table (a rebuild's scratch
    tables, a restored copy)."""
    parts = _under(data_root, path)
    if parts == ("quality", "ledger"):
        return TableName("quality", "ledger")
    if parts == ("schemas",):
        return TableName("schemas", "registry")
    match parts[1:] if parts and parts[0] == "tables" else None:
        case ("bronze" | "gaps" as schema, topic):
            return TableName(schema, stream_table_name(topic))
        case ("silver" | "gold" | "late" | "state" as schema, name):
            return TableName(schema, name)
        case ("quarantine", "bronze", topic):
            return TableName("quarantine_bronze", stream_table_name(topic))
        case ("quarantine", "silver", stream):
            return TableName("quarantine_silver", stream)
    return None


def _under(root: Location, path: Location) -> tuple[str, ...] | None:
    """``path``'s parts below ``root``, or None if it is not below it."""
    top, below = str(root).rstrip("/"), str(path).rstrip("/")
    if not below.startswith(top + "/"):
        return None
    return tuple(p for p in below[len(top) + 1 :].split("/") if p)


def uses_metastore(spark: SparkSession) -> bool:
    """Whether ``spark`` keeps its table names in a Hive metastore (the Spark server does; a
    session with Spark's in-memory catalog does not)."""
    return spark.conf.get("spark.sql.catalogImplementation", "in-memory") == "hive"


def _named(spark: SparkSession, path: Location) -> TableName | None:
    """The name ``spark``'s metastore gives the table at ``path``: None when the session keeps
    no names, or names another lake's tables, or ``path`` is no pipeline table."""
    if not uses_metastore(spark):
        return None
    lake = spark.conf.get(LAKE_CONF, None)
    return None if not lake else table_name(location_of(lake), path)


def check_free(spark: SparkSession, path: Location) -> None:
    """Before the platform creates the table at ``path``: raise :class:`CatalogError` if its name
    is taken by a table elsewhere (a lake moved or recreated at another location; two topics
    whose names become the same identifier), so nothing is written under a name that reads
    another table."""
    name = _named(spark, path)
    if name is None:
        return
    where = location(spark, name)
    if where is not None and not same_location(where, path):
        raise CatalogError(
            f"{name} in the metastore is the table at {where}, not the one the pipeline is "
            f"creating at {path}: if that table is gone or moved, point the names at this "
            f"lake's tables with `lakehouse catalog sync`; if it belongs to another topic, "
            "rename one topic (their names become the same identifier)"
        )


def register_created(spark: SparkSession, path: Location) -> None:
    """Register the table the platform has just created at ``path`` under its name, if ``spark``
    keeps names in the metastore and ``path`` is a pipeline table's."""
    name = _named(spark, path)
    if name is not None:
        register(spark, name, path)


def register(spark: SparkSession, name: TableName, path: Location) -> str:
    """Give the Delta table at ``path`` the name ``name`` (creating its schema if needed); return
    what was done: ``registered``, ``kept`` (the name is the table already) or ``moved`` (the name
    was another location's and now is this one's). Only the name changes: no data is read or
    written."""
    where = location(spark, name)
    if where is not None and same_location(where, path):
        return "kept"
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS `{name.schema}`")
    if where is not None:
        # External: dropping the entry leaves the old location's files where they are.
        spark.sql(f"DROP TABLE {name.sql}")
    spark.sql(f"CREATE TABLE IF NOT EXISTS {name.sql} USING DELTA LOCATION {_literal(path)}")
    return "registered" if where is None else "moved"


def location(spark: SparkSession, name: TableName) -> str | None:
    """Where the table called ``name`` lies, or None if the metastore has no such name."""
    if not spark.catalog.tableExists(str(name)):
        return None
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {name.sql}").collect():
        if row[0] == "Location":
            return str(row[1])
    return None


def names(spark: SparkSession) -> dict[TableName, str | None]:
    """Every name in the platform's schemas, with the location of its table."""
    have = {row[0] for row in spark.sql("SHOW SCHEMAS").collect()}
    out: dict[TableName, str | None] = {}
    for schema in PIPELINE_SCHEMAS:
        if schema not in have:
            continue
        for row in spark.sql(f"SHOW TABLES IN `{schema}`").collect():
            if not row["isTemporary"]:
                name = TableName(schema, row["tableName"])
                out[name] = location(spark, name)
    return out


def drop(spark: SparkSession, name: TableName) -> str:
    """Remove ``name`` from the metastore and return where its table lies; the table itself stays
    (its files are not touched). A name the metastore lacks is a :class:`CatalogError` listing the
    names there are."""
    where = location(spark, name)
    if where is None:
        known = ", ".join(sorted(map(str, names(spark)))) or "(none)"
        raise CatalogError(f"no table {name} in the metastore; its names: {known}")
    kind = [
        r[1] for r in spark.sql(f"DESCRIBE TABLE EXTENDED {name.sql}").collect() if r[0] == "Type"
    ]
    if kind and str(kind[0]).upper() != "EXTERNAL":
        # Dropping a managed table deletes its files: never the platform's to do.
        raise CatalogError(
            f"{name} is a {kind[0]} table, not one of the platform's external tables: drop it "
            "with Spark SQL yourself if its data is to go"
        )
    spark.sql(f"DROP TABLE {name.sql}")
    return where


@dataclass(frozen=True)
class Synced:
    """What :func:`sync` did with one table."""

    name: TableName
    path: Location
    done: str  # registered | kept | moved


def sync(spark: SparkSession, settings: Settings, paths: Iterable[Location]) -> list[Synced]:
    """Name every table at ``paths`` (the tables on storage) in the metastore: a lake created
    before the catalog gets its entries, and a name that points elsewhere is pointed at the
    table. Two tables whose names would be the same are a :class:`CatalogError` before anything
    is registered. Names of tables that are gone are left alone."""
    planned: dict[TableName, Location] = {}
    for path in paths:
        name = table_name(settings.data_root, path)
        if name is None:
            continue
        if name in planned:
            raise CatalogError(
                f"the tables at {planned[name]} and {path} would both be {name}: rename one of "
                "their topics, so that their identifiers differ"
            )
        planned[name] = path
    return [Synced(name, path, register(spark, name, path)) for name, path in planned.items()]


def same_location(where: str, path: Location) -> bool:
    """Whether the metastore's location ``where`` (``file:/...``, ``s3a://...``) is ``path``."""
    parts = urlsplit(where)
    plain = parts.path if parts.scheme == "file" else where
    return plain.rstrip("/") == str(path).rstrip("/")


def _literal(path: Location) -> str:
    """``path`` as a SQL string literal."""
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"
