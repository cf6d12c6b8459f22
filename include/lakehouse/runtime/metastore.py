"""Where the lakehouse's catalog of table names lives: Spark's own Hive metastore support.

The Spark server keeps every table's name in a Hive metastore (Spark's built-in Hive 2.3 client,
shipped with pyspark), so readers say ``gold.user_latest_location`` instead of a path. By default
the metastore is an embedded Derby database under ``$LAKEHOUSE_HOME/metastore`` (``derby``). Derby
admits one JVM at a time: the Spark server opens it, and a command that needs the catalog while
no server runs (``lakehouse catalog sync``) opens it in a Spark of its own.

Sessions that do not ask for the metastore (a ``lakehouse run`` without a server, the tests' shared
local session) keep Spark's in-memory catalog, so they never wait on a Derby another process
holds; the tables they create get their names with ``lakehouse catalog sync``.

``LAKEHOUSE_METASTORE`` chooses: ``derby`` (the default); ``postgres``, the database ``metastore``
on the lakehouse's PostgreSQL (:mod:`lakehouse.runtime.postgres`, which ``make airflow`` runs),
which any number of processes may open at once; or ``none`` (no metastore: the server keeps the
in-memory catalog, names last as long as it runs).

PostgreSQL's password is never on a command line: the connection's settings go into a
``hive-site.xml`` (mode 0600) under ``<home>/metastore/conf``, a folder on the driver's class
path, where Spark and Hive look for that file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from lakehouse.errors import ConfigError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import private_file

METASTORE_ENV = "LAKEHOUSE_METASTORE"
Kind = Literal["derby", "postgres", "none"]
KINDS: tuple[Kind, ...] = ("derby", "postgres", "none")
DATABASE = "metastore"  # on the lakehouse's PostgreSQL
# The schemas the platform's tables are in (lakehouse.storage.metastore names them): the Spark
# server refuses the readers' credential any change in them.
PIPELINE_SCHEMAS = (
    "bronze",
    "silver",
    "gold",
    "quarantine_bronze",
    "quarantine_silver",
    "late",
    "state",
    "gaps",
    "quality",
    "schemas",
)
# The Spark setting naming the lake (its LAKEHOUSE_DATA) whose tables a metastore session names.
LAKE_CONF = "spark.lakehouse.data"


def kind() -> Kind:
    """The metastore ``LAKEHOUSE_METASTORE`` names (default ``derby``); anything else is a
    ConfigError naming the variable and the choices."""
    raw = os.environ.get(METASTORE_ENV, "").strip().lower() or "derby"
    for known in KINDS:
        if raw == known:
            return known
    raise ConfigError(f"{METASTORE_ENV}={raw!r}: expected one of {', '.join(KINDS)}")


def folder(settings: Settings) -> Path:
    """The metastore's local folder: the embedded Derby database and Derby's log, the
    PostgreSQL connection's ``conf/hive-site.xml``, and Spark's warehouse folder (which the
    platform's external tables never use: their data stays at their locations)."""
    return settings.home / "metastore"


def metastore_conf(settings: Settings) -> dict[str, str]:
    """The Spark settings of a session that keeps its table names in the lakehouse's metastore
    (empty with ``LAKEHOUSE_METASTORE=none``). Static settings: they take effect when the JVM
    starts. With ``postgres``, the cluster must run: its database ``metastore`` is created if
    missing, and the connection's ``hive-site.xml`` written (its folder is the class path entry
    this returns as ``spark.driver.extraClassPath``, to be joined to the platform's)."""
    chosen = kind()
    if chosen == "none":
        return {}
    root = folder(settings)
    root.mkdir(parents=True, exist_ok=True)  # Derby writes its log there from the start
    conf = {
        "spark.sql.catalogImplementation": "hive",
        # The lake whose tables this session names (lakehouse.storage.metastore).
        LAKE_CONF: str(settings.data_root),
        # Tables created without a location (the platform creates none) would go here, not
        # into the working directory's spark-warehouse.
        "spark.sql.warehouse.dir": str(root / "warehouse"),
    }
    if chosen == "postgres":
        return {**conf, "spark.driver.extraClassPath": str(_postgres_site(settings))}
    database = root / "derby"
    if ";" in str(database):
        # Derby's URL separates its attributes with ';': such a home cannot be named in it.
        raise ConfigError(
            f"LAKEHOUSE_HOME={settings.home}: the embedded metastore's folder {database} has a "
            f"';', which Derby's connection URL cannot hold; choose another home or set "
            f"{METASTORE_ENV}=postgres"
        )
    return {
        **conf,
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={database};create=true"
        ),
        "spark.hadoop.javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
    }


def _postgres_site(settings: Settings) -> Path:
    """Make sure the metastore's database exists on the lakehouse's running PostgreSQL, write
    the ``hive-site.xml`` that connects to it, and return its folder."""
    from xml.sax.saxutils import escape

    from lakehouse.runtime.postgres import ROLE, Cluster, PostgresError

    cluster = Cluster.of(settings)
    status = cluster.status()
    if not status.running:
        raise PostgresError(
            f"{METASTORE_ENV}=postgres keeps the tables' names on the lakehouse's PostgreSQL "
            f"({cluster.root}), which is not running: start it with `lakehouse postgres start`"
        )
    cluster.create_database(DATABASE)
    properties = {
        "javax.jdo.option.ConnectionURL": (f"jdbc:postgresql://127.0.0.1:{status.port}/{DATABASE}"),
        "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "javax.jdo.option.ConnectionUserName": ROLE,
        "javax.jdo.option.ConnectionPassword": cluster.password(),
        # The metastore's tables are made by its client when it first needs each (Hive's
        # schematool is not shipped with pyspark), and the schema's version is not checked
        # against a record of it. Tables and columns only: DataNucleus adds a new table's
        # foreign keys from a second connection of its pool, which waits for the first one's
        # open transaction while that waits for it (on PostgreSQL, a client hung there for
        # good). The metastore's client keeps its rows consistent itself. (autoCreateAll would
        # turn the constraints back on.)
        "datanucleus.schema.autoCreateAll": "false",
        "datanucleus.schema.autoCreateTables": "true",
        "datanucleus.schema.autoCreateColumns": "true",
        "datanucleus.schema.autoCreateConstraints": "false",
        "hive.metastore.schema.verification": "false",
    }
    text = (
        '<?xml version="1.0"?>\n<configuration>\n'
        + "".join(
            f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
            for k, v in properties.items()
        )
        + "</configuration>\n"
    )
    site = folder(settings) / "conf" / "hive-site.xml"
    if not site.is_file() or site.read_text(encoding="utf-8") != text:
        site.unlink(missing_ok=True)  # written anew (the port may have changed), mode 0600
        private_file(site, lambda: text)
    return site.parent


def java_options(settings: Settings) -> str:
    """The driver JVM's options the metastore needs: Derby's log in the metastore's folder, not
    ``derby.log`` in the working directory."""
    if kind() != "derby":
        return ""
    return f"-Dderby.stream.error.file={folder(settings) / 'derby.log'}"


def session_conf(settings: Settings) -> dict[str, str]:
    """:func:`metastore_conf` with the driver's :func:`java_options`: the settings of a Spark
    that a command starts for itself to use the metastore."""
    conf = metastore_conf(settings)
    if options := java_options(settings):
        conf["spark.driver.extraJavaOptions"] = options
    return conf
