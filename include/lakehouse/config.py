"""One configuration root for everything the platform stores.

Every path the platform reads or writes derives from ``LAKEHOUSE_HOME`` (default: ``.lakehouse``
inside the checkout), so a test, the demo and a deployment differ only by that root and by the
Spark master. Names that become paths (topics, streams, tables) are validated here, once, so no
name taken from a contract, a Param or the command line can leave the root.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lakehouse.errors import ConfigError

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

REPO_ROOT = Path(__file__).resolve().parents[2]


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


def megabytes_setting(name: str, default: int) -> int:
    """A size in whole MB from the environment variable ``name`` (``default`` when unset), in
    bytes; anything but a whole number is a ConfigError naming the variable."""
    raw = os.environ.get(name, str(default))
    if not raw.strip().isdigit():
        raise ConfigError(f"{name} must be a whole number of MB, not {raw!r}")
    return int(raw) << 20


@dataclass(frozen=True)
class Settings:
    """Resolved locations and runtime defaults. Build with :meth:`from_env`."""

    home: Path
    contracts_dir: Path
    spark_master: str = "local[2]"

    @classmethod
    def from_env(
        cls,
        home: str | os.PathLike[str] | None = None,
        contracts_dir: str | os.PathLike[str] | None = None,
    ) -> Settings:
        """Resolve settings from arguments first, then the environment, then defaults."""
        raw_home = home or os.environ.get("LAKEHOUSE_HOME") or REPO_ROOT / ".lakehouse"
        raw_contracts = (
            contracts_dir or os.environ.get("LAKEHOUSE_CONTRACTS") or REPO_ROOT / "contracts"
        )
        master = os.environ.get("LAKEHOUSE_SPARK_MASTER", "local[2]")
        return cls(
            home=Path(raw_home).expanduser().resolve(),
            contracts_dir=Path(raw_contracts).expanduser().resolve(),
            spark_master=master,
        )

    # -- folders -----------------------------------------------------------------------------
    @property
    def landing_root(self) -> Path:
        return self.home / "landing"

    @property
    def tables_root(self) -> Path:
        return self.home / "tables"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def registry_path(self) -> Path:
        """The schema registry: every registered version of every topic's key and value schema,
        one row each, a Delta table."""
        return self.home / "schemas"

    @property
    def reports_root(self) -> Path:
        return self.home / "reports"

    @property
    def data_docs_root(self) -> Path:
        """Great Expectations Data Docs (HTML), rebuilt by ``lakehouse report``."""
        return self.reports_root / "data_docs"

    @property
    def quality_root(self) -> Path:
        return self.home / "quality"

    @property
    def ledger_path(self) -> Path:
        """The results ledger: one row per expectation per validation, a Delta table."""
        return self.quality_root / "ledger"

    @property
    def validations_root(self) -> Path:
        """Each validation's full Great Expectations result (JSON), the source of Data Docs."""
        return self.quality_root / "validations"

    # -- paths of named things ---------------------------------------------------------------
    def topic_dir(self, topic: str) -> Path:
        """Landing folder of a topic, laid out as Kafka Connect's S3/HDFS sinks write it."""
        return self._inside(self.landing_root / "topics" / validate_topic_name(topic))

    def bronze_path(self, topic: str) -> Path:
        return self._inside(self.tables_root / "bronze" / validate_topic_name(topic))

    def silver_path(self, stream: str) -> Path:
        return self._inside(self.tables_root / "silver" / validate_table_name(stream))

    def gold_path(self, table: str) -> Path:
        return self._inside(self.tables_root / "gold" / validate_table_name(table))

    def state_path(self, table: str) -> Path:
        """A gold table's own state (e.g. each source key's latest value, for table sources)."""
        return self._inside(self.tables_root / "state" / validate_table_name(table))

    def late_path(self, table: str) -> Path:
        """A windowed gold table's late-records side table: records whose window had closed."""
        return self._inside(self.tables_root / "late" / validate_table_name(table))

    def quarantine_path(self, layer: Layer, name: str) -> Path:
        """Quarantine table beside a layer's table: bad records with their reason and origin."""
        checked = validate_topic_name(name) if layer == "bronze" else validate_table_name(name)
        return self._inside(self.tables_root / "quarantine" / layer / checked)

    def gaps_path(self, topic: str) -> Path:
        """Offsets of a Kafka topic that its retention deleted before bronze read them, kept
        because the contract accepts the loss (``kafka.on_data_loss: record``)."""
        return self._inside(self.tables_root / "gaps" / validate_topic_name(topic))

    def _inside(self, path: Path) -> Path:
        resolved = path.resolve()
        if not resolved.is_relative_to(self.home):
            raise ConfigError(f"path {resolved} escapes the lakehouse root {self.home}")
        return resolved
