"""The names of the lake's tables in the metastore (``lakehouse catalog list | sync | drop``)
and the session that keeps them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import ConfigError
from lakehouse.pipeline import lake
from lakehouse.runtime.config import Settings
from lakehouse.storage import is_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def metastore_session(settings: Settings) -> SparkSession:
    """A session that keeps names in the lakehouse's metastore: the Spark server's when it runs,
    else a Spark of this process's own opening the metastore itself (the embedded one admits
    one process at a time). Raises :class:`~lakehouse.storage.metastore.CatalogError` when the
    session has no metastore (a server started with ``LAKEHOUSE_METASTORE=none``)."""
    from lakehouse.runtime import metastore as where
    from lakehouse.runtime import server
    from lakehouse.runtime.spark import get_session, session_log
    from lakehouse.storage import metastore

    if server.status(settings).running:
        spark = server.connect(settings)
        if not metastore.uses_metastore(spark):
            raise metastore.CatalogError(
                "the Spark server runs without a metastore (started with "
                f"{where.METASTORE_ENV}=none, or by an older version): restart it with "
                "`lakehouse spark stop` and `lakehouse spark start`"
            )
        return spark
    conf = where.session_conf(settings)
    if not conf:
        raise metastore.CatalogError(
            f"{where.METASTORE_ENV}=none: the lakehouse keeps no catalog of names; unset it to "
            "use the embedded metastore"
        )
    log = session_log(settings.home)
    print(f"in a Spark of its own (its log: {log})", file=sys.stderr)
    return get_session(settings.spark_master, app_name="lakehouse-catalog", log=log, extra=conf)


def catalog_command(settings: Settings, catalog: Catalog, action: str, name: str | None) -> int:
    """``lakehouse catalog list | sync | drop NAME``: the names in the metastore and their
    tables; name every table on storage (a lake older than the catalog gets its names); remove
    one name (the table's files stay)."""
    from lakehouse.storage import metastore

    if action == "drop":
        if not name:
            raise ConfigError("lakehouse catalog drop: name the table, e.g. gold.user_places")
        table = metastore.TableName.parse(name)
        where = metastore.drop(metastore_session(settings), table)
        print(f"dropped {table} from the catalog (its table stays at {where})")
        return 0
    if name:
        raise ConfigError(f"lakehouse catalog {action} takes no name (only drop does)")
    spark = metastore_session(settings)
    if action == "list":
        for entry, at in sorted(metastore.names(spark).items(), key=lambda e: str(e[0])):
            print(f"{entry}  {at}")
        return 0
    on_storage = [t.path for t in lake.tables(settings, catalog) if is_table(t.path)]
    for done in metastore.sync(spark, settings, on_storage):
        print(f"{done.done:<10}  {done.name}  {done.path}")
    stale = [
        f"{table} ({where})"
        for table, where in sorted(metastore.names(spark).items(), key=lambda e: str(e[0]))
        if where is None or not any(metastore.same_location(where, p) for p in on_storage)
    ]
    if stale:
        print(
            f"note: {len(stale)} name(s) are of no table of this lake's contracts, and are kept: "
            + ", ".join(stale)
            + " (`lakehouse catalog drop NAME` removes one)"
        )
    return 0
