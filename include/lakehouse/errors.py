"""Typed errors. Each says what was wrong and where, so a user can act on it."""

from __future__ import annotations

from collections.abc import Sequence


class LakehouseError(Exception):
    """Base class of every error the platform raises on purpose."""


class ConfigError(LakehouseError):
    """Bad configuration: raised before any data moves."""


class ContractError(ConfigError):
    """A contract file is invalid. The message names the file, the path inside it
    (``tables[1].window.size``) and, once :meth:`name_items` has been told, what the path's
    items are called in the file (``table 'order_counts'``)."""

    def __init__(self, file: str, path: str, problem: str) -> None:
        self.file = file
        self.path = path
        self.problem = problem
        self.items = ""  # the names of the path's items, e.g. "table 'order_counts'"
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"{self.file}: {self.path}" if self.path else self.file
        named = f" ({self.items})" if self.items else ""
        return f"{where}{named}: {self.problem}"

    def name_items(self, items: str) -> None:
        """Say what the path's items are called (a reader finds ``table 'x'`` sooner than
        ``tables[3]``)."""
        self.items = items
        self.args = (self._message(),)


class UnknownTopicError(LakehouseError):
    def __init__(self, topic: str, known: list[str]) -> None:
        self.topic = topic
        listing = ", ".join(sorted(known)) or "(none)"
        super().__init__(f"unknown topic {topic!r}; topics with a contract: {listing}")


class UnknownTableError(LakehouseError):
    """A table name that names no table. ``known``: the tables there are; where there are none
    yet, ``declared`` (the names the contracts will give tables) says what will be."""

    def __init__(self, table: str, known: list[str], *, declared: Sequence[str] = ()) -> None:
        self.table = table
        listing = ", ".join(sorted(known)) or "(none)"
        if not known and declared:
            listing = f"none yet; once the pipeline runs: {', '.join(declared)}"
        super().__init__(f"unknown table {table!r}; known tables: {listing}")


class BadRecordError(LakehouseError):
    """A record given to the producer cannot be accepted (e.g. a line that is not JSON)."""

    def __init__(self, origin: str, problem: str) -> None:
        self.origin = origin
        self.problem = problem
        super().__init__(f"{origin}: {problem}")


class TableNotFoundError(LakehouseError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no Delta table at {path} (has its pipeline run yet?)")


class JavaNotFoundError(ConfigError):
    """No usable Java runtime for Spark."""


class JarsError(ConfigError):
    """The JVM jars Spark is given (``spark.jars``, see :mod:`lakehouse.runtime.jvm`) are not the locked
    ones: a jar is missing, differs from its checksum, is not in the lock, or duplicates one of
    pyspark's. The message names each jar and says what to run."""

    def __init__(self, problems: list[str], remedy: str) -> None:
        self.problems = problems
        super().__init__("; ".join(problems) + f" ({remedy})")


class WebAssetsError(ConfigError):
    """The styles, fonts and scripts the Data Docs pages load (``include/web/package.json``, see
    :mod:`lakehouse.quality.web_assets`) are not installed as locked: a package is missing, at
    another version, or lacks a file. The message names each and says what to run."""

    def __init__(self, problems: list[str], remedy: str) -> None:
        self.problems = problems
        super().__init__("; ".join(problems) + f" ({remedy})")


class OfflineDocsError(LakehouseError):
    """A Data Docs page loads something from another host that the site does not serve: the
    page would not render on a closed network. ``references``: each (address, page)."""

    def __init__(self, references: Sequence[tuple[str, str]]) -> None:
        self.references = list(dict.fromkeys(references))
        shown = "; ".join(f"{page} loads {url}" for url, page in self.references[:10])
        more = len(self.references) - 10
        super().__init__(
            "Data Docs would load files from other hosts, which the site does not serve: "
            + shown
            + (f"; and {more} more" if more > 0 else "")
            + ". Map each address to a file of an npm package in lakehouse.quality.web_assets.CDN "
            "and add that package to include/web/package.json (then `make web-assets`)"
        )


class ConcurrentWriteError(LakehouseError):
    """Another commit to the same table conflicts with this one; nothing of this write is
    visible. Retry (an exactly-once write then finds its version applied, or applies it)."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(f"{path}: concurrent write conflict: {detail}")


class SchemaMismatchError(LakehouseError):
    """Data does not fit a table's schema in a way the write allows."""


class SchemaEvolutionError(ContractError):
    """A contract's new key or value schema breaks the topic's compatibility mode (or a rule of
    the registry such as immutable schema ids). Raised before any data moves."""


# The exit code of a job stopped by a `fail` expectation (Airflow then fails without retrying).
GATE_FAILED_EXIT = 3
# The exit status of a job that refused its configuration (nothing moved; a retry fails again).
CONFIG_ERROR_EXIT = 2


class QualityGateError(LakehouseError):
    """A ``fail`` expectation did not hold: the batch was not published."""

    def __init__(self, layer: str, table: str, failures: list[str]) -> None:
        self.layer, self.table, self.failures = layer, table, failures
        super().__init__(
            f"{layer} table {table}: quality gate failed, nothing published: " + "; ".join(failures)
        )


class TablesFailedError(LakehouseError):
    """Several tables of a layer failed in one batch; the others (``built``) committed.
    ``failures``: each failed table's error, by table name."""

    def __init__(self, layer: str, failures: dict[str, Exception], built: list[str]) -> None:
        self.layer, self.failures, self.built = layer, failures, built
        told = "; ".join(f"{name}: {type(e).__name__}: {e}" for name, e in failures.items())
        kept = f"the other {len(built)} committed" if built else "none committed"
        super().__init__(f"{len(failures)} {layer} tables failed ({kept}): {told}")

    @property
    def quality_only(self) -> bool:
        """Whether the tables failed only because ``fail`` expectations held them back (theirs,
        or their input's): a retry would fail again."""
        kinds = {type(e) for e in self.failures.values()}
        return QualityGateError in kinds and kinds <= {QualityGateError, InputFailedError}


class InputFailedError(LakehouseError):
    """A table was not built because the table it reads (``upstream``) failed in the batch."""

    def __init__(self, layer: str, table: str, upstream: str) -> None:
        self.upstream = upstream
        super().__init__(
            f"{layer} table {table} was not built: its input, the changelog of "
            f"{layer}.{upstream}, failed in this batch"
        )


class BrokerUnavailableError(LakehouseError):
    """A Kafka broker did not answer: nothing was read or committed."""


class DataLossError(LakehouseError):
    """Records bronze had not read yet were deleted by the broker's retention."""

    def __init__(self, topic: str, lost: dict[int, tuple[int, int]]) -> None:
        self.topic, self.lost = topic, lost
        ranges = "; ".join(
            f"partition {p}: offsets {a}..{b - 1}" for p, (a, b) in sorted(lost.items())
        )
        super().__init__(
            f"Kafka topic {topic}: records bronze had not ingested were deleted by the broker's "
            f"retention ({ranges}); nothing was committed. To accept the loss and go on, set "
            "kafka.on_data_loss: record in the topic's contract (the gap is kept in the bronze "
            "gaps table)"
        )
