"""One configuration root for everything the platform stores.

Every path the platform reads or writes derives from two roots: ``LAKEHOUSE_DATA``, where the
data lives (tables, schema registry, quality ledger, landing files: a local folder or
``s3://bucket/prefix``, see :mod:`lakehouse.runtime.objectstore`), and ``LAKEHOUSE_HOME``, a local folder
for what belongs to this machine (Airflow's home, the Spark server's and the broker's files,
table locks, validation results and Data Docs). ``LAKEHOUSE_DATA`` defaults to
``LAKEHOUSE_HOME``, which defaults to ``.lakehouse`` inside the checkout, so a test, the demo and a
deployment differ only by those roots and by the Spark master. Names that become paths (topics, streams, tables) are validated here, once, so no
name taken from a contract, a Param or the command line can leave the root.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lakehouse.errors import ConfigError
from lakehouse.runtime.objectstore import Location, ObjectPath, location

Layer = Literal["bronze", "silver", "gold"]
LAYERS: tuple[Layer, ...] = ("bronze", "silver", "gold")

# Kafka's own rule for topic names (kafka.common.internals.Topic): ASCII alphanumerics, '.',
# '_' and '-', at most 249 characters, and not '.' or '..'. Matched whole (``fullmatch``: a
# pattern's '$' would also accept a trailing newline).
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
# Streams, tables and columns are also SQL identifiers, written unquoted into delta-rs
# predicates and Spark column references: keep them to lower-case snake case.
IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,127}")
IDENTIFIER_RULE = (
    "use lower-case letters, digits and '_', starting with a letter (at most 128 characters)"
)

REPO_ROOT = Path(__file__).resolve().parents[3]

# The Airflow connection that data-quality notifications are sent through (a deployment's, never a
# contract's): its id, from this variable.
NOTIFY_CONN_ENV = "LAKEHOUSE_NOTIFY_CONN"
DEFAULT_NOTIFY_CONN = "lakehouse_notify"
# Airflow's own rule for connection ids (``airflow.utils.helpers.validate_key``), in ASCII.
_CONN_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")


def validate_topic_name(name: str) -> str:
    """Return ``name`` if it is a legal Kafka topic name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name) or name in {".", ".."}:
        raise ConfigError(
            f"invalid topic name {name!r}: use 1-249 characters from [A-Za-z0-9._-], "
            "not '.' or '..'"
        )
    return name


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a legal stream/table name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name):
        raise ConfigError(f"invalid stream or table name {name!r}: {IDENTIFIER_RULE}")
    return name


def stream_table_name(topic: str) -> str:
    """The default identifier derived from a topic name (``user-locations`` -> ``user_locations``)."""
    return re.sub(r"[^a-z0-9_]", "_", validate_topic_name(topic).lower())


def notify_connection() -> str:
    """The id of the Airflow connection that data-quality notifications go through:
    ``$LAKEHOUSE_NOTIFY_CONN`` if set and not empty, else ``lakehouse_notify``; one that is no Airflow connection id
    is a ConfigError naming the variable."""
    raw = os.environ.get(NOTIFY_CONN_ENV) or DEFAULT_NOTIFY_CONN
    if not _CONN_ID.fullmatch(raw):
        raise ConfigError(
            f"{NOTIFY_CONN_ENV}={raw!r} is not an Airflow connection id: use 1-250 characters "
            "from [A-Za-z0-9_.-]"
        )
    return raw


def whole_number_setting(name: str, default: int, unit: str, *, least: int = 0) -> int:
    """The whole number of ``unit`` in the environment variable ``name`` (``default`` when
    unset); anything else, or one below ``least``, is a ConfigError naming the variable."""
    raw = os.environ.get(name, str(default))
    if not raw.strip().isdigit() or int(raw) < least:
        bound = f" (at least {least})" if least else ""
        raise ConfigError(f"{name} must be a whole number of {unit}{bound}, not {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class Settings:
    """Resolved locations and runtime defaults. Build with :meth:`from_env`."""

    home: Path
    contracts_dir: Path
    spark_master: str = "local[2]"
    data: Location | None = None  # None: the home folder
    notify_conn_id: str = DEFAULT_NOTIFY_CONN

    def __post_init__(self) -> None:
        if self.data is None:
            object.__setattr__(self, "data", self.home)

    @classmethod
    def from_env(
        cls,
        home: str | os.PathLike[str] | None = None,
        contracts_dir: str | os.PathLike[str] | None = None,
        data: str | os.PathLike[str] | None = None,
    ) -> Settings:
        """Resolve settings from arguments first, then the environment, then defaults. A data
        root that is neither a local path nor ``s3://``/``s3a://`` is a ConfigError."""
        raw_home = home or os.environ.get("LAKEHOUSE_HOME") or REPO_ROOT / ".lakehouse"
        if "://" in str(raw_home):
            raise ConfigError(
                f"LAKEHOUSE_HOME={str(raw_home)!r}: the home is a local folder (Airflow's home, "
                "the Spark server's files, locks); put the data in a bucket with "
                "LAKEHOUSE_DATA=s3://bucket/prefix"
            )
        resolved_home = Path(raw_home).expanduser().resolve()
        raw_data = str(data or os.environ.get("LAKEHOUSE_DATA", "")).strip()
        raw_contracts = (
            contracts_dir or os.environ.get("LAKEHOUSE_CONTRACTS") or REPO_ROOT / "contracts"
        )
        master = os.environ.get("LAKEHOUSE_SPARK_MASTER", "local[2]")
        return cls(
            home=resolved_home,
            contracts_dir=Path(raw_contracts).expanduser().resolve(),
            spark_master=master,
            data=location(raw_data) if raw_data else resolved_home,
            notify_conn_id=notify_connection(),
        )

    @property
    def data_root(self) -> Location:
        assert self.data is not None
        return self.data

    @property
    def remote(self) -> bool:
        """Whether the data is in a bucket."""
        return isinstance(self.data, ObjectPath)

    # -- folders -----------------------------------------------------------------------------
    @property
    def landing_root(self) -> Location:
        return self.data_root / "landing"

    @property
    def tables_root(self) -> Location:
        return self.data_root / "tables"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def registry_path(self) -> Location:
        """The schema registry: every registered version of every topic's key and value schema,
        one row each, a Delta table."""
        return self.data_root / "schemas"

    @property
    def reports_root(self) -> Path:
        return self.home / "reports"

    @property
    def data_docs_root(self) -> Path:
        """Great Expectations Data Docs (HTML), rebuilt by ``lakehouse report``."""
        return self.reports_root / "data_docs"

    @property
    def quality_root(self) -> Path:
        """This machine's quality files: validation results and the Data Docs' GX project."""
        return self.home / "quality"

    @property
    def ledger_path(self) -> Location:
        """The results ledger: one row per expectation per validation, a Delta table."""
        return self.data_root / "quality" / "ledger"

    @property
    def validations_root(self) -> Path:
        """Each validation's full Great Expectations result (JSON), what Data Docs are built from."""
        return self.quality_root / "validations"

    # -- paths of named things ---------------------------------------------------------------
    def topic_dir(self, topic: str) -> Location:
        """Landing folder of a topic, laid out as Kafka Connect's S3/HDFS sinks write it."""
        return self._inside(self.landing_root / "topics" / validate_topic_name(topic))

    def bronze_path(self, topic: str) -> Location:
        return self._inside(self.tables_root / "bronze" / validate_topic_name(topic))

    def silver_path(self, stream: str) -> Location:
        return self._inside(self.tables_root / "silver" / validate_table_name(stream))

    def gold_path(self, table: str) -> Location:
        return self._inside(self.tables_root / "gold" / validate_table_name(table))

    def state_path(self, table: str) -> Location:
        """A gold table's own state (e.g. each input key's latest value, for an input read as a table)."""
        return self._inside(self.tables_root / "state" / validate_table_name(table))

    def late_path(self, table: str) -> Location:
        """A windowed gold table's late-records side table: records whose window had closed."""
        return self._inside(self.tables_root / "late" / validate_table_name(table))

    def quarantine_path(self, layer: Layer, name: str) -> Location:
        """Quarantine table beside a layer's table: bad records with their reason and origin."""
        checked = validate_topic_name(name) if layer == "bronze" else validate_table_name(name)
        return self._inside(self.tables_root / "quarantine" / layer / checked)

    def gaps_path(self, topic: str) -> Location:
        """Offsets of a Kafka topic that its retention deleted before bronze read them, kept
        because the contract accepts the loss (``kafka.on_data_loss: record``)."""
        return self._inside(self.tables_root / "gaps" / validate_topic_name(topic))

    def table_path(self, layer: Layer, name: str) -> Location:
        """The table a layer publishes under ``name``: a topic's bronze table, a stream's silver
        table, a gold table."""
        return {"bronze": self.bronze_path, "silver": self.silver_path, "gold": self.gold_path}[
            layer
        ](name)

    def task_environment(self) -> dict[str, str]:
        """What a process started for a task needs to find this lakehouse (a job, a
        `lakehouse` command): its home, its data and its contracts."""
        return {
            "LAKEHOUSE_HOME": str(self.home),
            "LAKEHOUSE_DATA": str(self.data_root),
            "LAKEHOUSE_CONTRACTS": str(self.contracts_dir),
        }

    def _inside(self, path: Location) -> Location:
        resolved = path.resolve()
        root = self.data_root
        if not (
            resolved.is_relative_to(root)
            if isinstance(resolved, ObjectPath)
            else isinstance(root, Path) and resolved.is_relative_to(root)
        ):
            raise ConfigError(f"path {resolved} escapes the lakehouse root {self.data_root}")
        return resolved

    def lock_path(self, table: Location) -> Path:
        """The local file whose ``flock`` is ``table``'s commit lock: beside a local table, under
        the home's ``locks`` for one in a bucket."""
        if isinstance(table, ObjectPath):
            return self.home / "locks" / table.bucket / f"{table.key}.lock"
        return table.parent / f".{table.name}.lock"
