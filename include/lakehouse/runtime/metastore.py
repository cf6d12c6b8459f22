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
or the database ``LAKEHOUSE_METASTORE_URL`` names on a server of the deployment's (compose's
``postgres``), which any number of processes may open at once; or ``none`` (no metastore: the server keeps the
in-memory catalog, names last as long as it runs).

PostgreSQL's password is never on a command line: the connection's settings go into a
``hive-site.xml`` (mode 0600) under ``<home>/metastore/conf``, a folder on the driver's class
path, where Spark and Hive look for that file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from lakehouse.errors import ConfigError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import private_file

METASTORE_ENV = "LAKEHOUSE_METASTORE"
URL_ENV = "LAKEHOUSE_METASTORE_URL"  # with postgres: a server of the deployment's
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
    starts. With ``postgres``, the connection's ``hive-site.xml`` is written (its folder is the
    class path entry this returns as ``spark.driver.extraClassPath``, to be joined to the
    platform's); :func:`prepare` makes the database."""
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


@dataclass(frozen=True)
class PostgresTarget:
    """The PostgreSQL database that holds the metastore, and how to log in to it."""

    host: str
    port: int
    user: str
    password: str
    database: str

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"

    def create_database(self) -> None:
        """Create the database unless it exists."""
        from lakehouse.runtime.postgres import create_database

        create_database(
            self.database, host=self.host, port=self.port, user=self.user, password=self.password
        )


def postgres_target(settings: Settings) -> PostgresTarget:
    """Where ``LAKEHOUSE_METASTORE=postgres`` keeps the names: the database of
    ``LAKEHOUSE_METASTORE_URL`` (``postgresql://user:password@host:port/database``, a server of
    the deployment's, e.g. compose's ``postgres``) when it is set, else the database
    ``metastore`` on the lakehouse's own PostgreSQL (:mod:`lakehouse.runtime.postgres`), which
    must be running. A malformed URL is a ConfigError saying which part is missing."""
    raw = os.environ.get(URL_ENV, "").strip()
    if raw:
        parts = urlsplit(raw)
        database = parts.path.lstrip("/")
        if parts.scheme not in ("postgresql", "postgres") or not parts.hostname or not database:
            raise ConfigError(
                f"{URL_ENV}: expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE, got "
                f"{parts.scheme or '(no scheme)'}://{parts.hostname or '(no host)'}/"
                f"{database or '(no database)'}"
            )
        if not parts.username or parts.password is None:
            raise ConfigError(f"{URL_ENV}: the URL names no USER:PASSWORD@ to log in with")
        return PostgresTarget(
            parts.hostname,
            parts.port or 5432,
            unquote(parts.username),
            unquote(parts.password),
            database,
        )
    from lakehouse.runtime.postgres import LOOPBACK, ROLE, Cluster, PostgresError

    cluster = Cluster.of(settings)
    status = cluster.status()
    if not status.running or status.port is None:
        raise PostgresError(
            f"{METASTORE_ENV}=postgres keeps the tables' names on the lakehouse's PostgreSQL "
            f"({cluster.root}), which is not running: start it with `lakehouse postgres start`, "
            f"or name another server with {URL_ENV}"
        )
    return PostgresTarget(LOOPBACK, status.port, ROLE, cluster.password(), DATABASE)


def prepare(settings: Settings) -> None:
    """What must exist before a JVM opens the metastore: with ``postgres``, its database
    (created if missing). Derby creates its own database on first use."""
    if kind() == "postgres":
        postgres_target(settings).create_database()


def _postgres_site(settings: Settings) -> Path:
    """Write the ``hive-site.xml`` that connects to the metastore's database and return its
    folder (nothing is connected to here: :func:`prepare` does that)."""
    from xml.sax.saxutils import escape

    target = postgres_target(settings)
    properties = {
        "javax.jdo.option.ConnectionURL": target.jdbc_url,
        "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "javax.jdo.option.ConnectionUserName": target.user,
        "javax.jdo.option.ConnectionPassword": target.password,
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
    that a command starts for itself to use the metastore (whose database :func:`prepare` has
    made)."""
    prepare(settings)
    conf = metastore_conf(settings)
    if options := java_options(settings):
        conf["spark.driver.extraJavaOptions"] = options
    return conf
