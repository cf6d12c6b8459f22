"""Where the lakehouse's catalog of table names lives: Spark's own Hive metastore support.

The Spark server keeps every table's name in a Hive metastore (Spark's built-in Hive 2.3 client,
shipped with pyspark), so readers say ``gold.user_latest_location`` instead of a path. By default
the metastore is an embedded Derby database under ``$LAKEHOUSE_HOME/metastore`` (``derby``). Derby
admits one JVM at a time: the Spark server opens it, and a command that needs the catalog while
no server runs (``lakehouse catalog sync``) opens it in a Spark of its own.

Sessions that do not ask for the metastore (a ``lakehouse run`` without a server, the tests' shared
local session) keep Spark's in-memory catalog, so they never wait on a Derby another process
holds; the tables they create get their names with ``lakehouse catalog sync``.

``LAKEHOUSE_METASTORE`` chooses: ``derby`` (the default) or ``none`` (no metastore: the server
keeps the in-memory catalog, names last as long as it runs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from lakehouse.errors import ConfigError
from lakehouse.runtime.config import Settings

METASTORE_ENV = "LAKEHOUSE_METASTORE"
Kind = Literal["derby", "none"]
KINDS: tuple[Kind, ...] = ("derby", "none")


def kind() -> Kind:
    """The metastore ``LAKEHOUSE_METASTORE`` names (default ``derby``); anything else is a
    ConfigError naming the variable and the choices."""
    raw = os.environ.get(METASTORE_ENV, "").strip().lower() or "derby"
    for known in KINDS:
        if raw == known:
            return known
    raise ConfigError(f"{METASTORE_ENV}={raw!r}: expected one of {', '.join(KINDS)}")


def folder(settings: Settings) -> Path:
    """The embedded metastore's folder: its Derby database, Derby's log, and Spark's warehouse
    folder (which the platform's external tables never use: their data stays at their
    locations)."""
    return settings.home / "metastore"


def metastore_conf(settings: Settings) -> dict[str, str]:
    """The Spark settings of a session that keeps its table names in the lakehouse's metastore
    (empty with ``LAKEHOUSE_METASTORE=none``). Static settings: they take effect when the JVM
    starts."""
    if kind() == "none":
        return {}
    root = folder(settings)
    root.mkdir(parents=True, exist_ok=True)  # Derby writes its log there from the start
    database = root / "derby"
    if ";" in str(database):
        # Derby's URL separates its attributes with ';': such a home cannot be named in it.
        raise ConfigError(
            f"LAKEHOUSE_HOME={settings.home}: the embedded metastore's folder {database} has a "
            f"';', which Derby's connection URL cannot hold; choose another home or set "
            f"{METASTORE_ENV}=none"
        )
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={database};create=true"
        ),
        "spark.hadoop.javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
        # Tables created without a location (the platform creates none) would go here, not
        # into the working directory's spark-warehouse.
        "spark.sql.warehouse.dir": str(root / "warehouse"),
    }


def java_options(settings: Settings) -> str:
    """The driver JVM's options the metastore needs: Derby's log in the metastore's folder, not
    ``derby.log`` in the working directory."""
    if kind() == "none":
        return ""
    return f"-Dderby.stream.error.file={folder(settings) / 'derby.log'}"


def session_conf(settings: Settings) -> dict[str, str]:
    """:func:`metastore_conf` with the driver's :func:`java_options`: the settings of a Spark
    that a command starts for itself to use the metastore."""
    conf = metastore_conf(settings)
    if options := java_options(settings):
        conf["spark.driver.extraJavaOptions"] = options
    return conf
