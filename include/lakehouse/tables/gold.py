"""Gold's entry point: one micro-batch of each of a contract's tables, each built by its kind
(:mod:`lakehouse.tables.kind`), side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.errors import InputFailedError
from lakehouse.runtime.config import Settings, whole_number_setting

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
from lakehouse.storage.gates import PublishGate
from lakehouse.tables import kind
from lakehouse.tables.common import GoldResult, Outputs, outputs


def build_table(
    spark: SparkSession,
    settings: Settings,
    contract: Contract,
    spec: TableSpec,
    catalog: Catalog | None = None,
    *,
    out: Outputs | None = None,
    upto: int | None = None,
    gate: PublishGate | None = None,
) -> GoldResult:
    """Fold the input's new versions (up to ``upto``, default all) into one gold table: one
    micro-batch, one commit. ``out`` redirects the writes (a full refresh builds into scratch
    tables); ``catalog`` resolves the other side of a join; ``gate`` judges every write to the
    table (not to a redirected one)."""
    out = out or replace(outputs(settings, spec), gate=gate)
    catalog = catalog or Catalog.of([contract])
    return kind.build(spark, settings, catalog, contract, spec, out, upto)


# How many of a topic's gold tables one job builds at a time (LAKEHOUSE_GOLD_PARALLELISM).
DEFAULT_PARALLELISM = 4


def parallelism() -> int:
    """The number of gold tables a job builds side by side: ``LAKEHOUSE_GOLD_PARALLELISM``
    (default :data:`DEFAULT_PARALLELISM`; 1 builds them one after another)."""
    return whole_number_setting(
        "LAKEHOUSE_GOLD_PARALLELISM", DEFAULT_PARALLELISM, "tables", least=1
    )


def build_side_by_side(
    specs: Sequence[TableSpec],
    build_one: Callable[[TableSpec], GoldResult],
    workers: int,
) -> tuple[dict[str, GoldResult], dict[str, Exception]]:
    """Build ``specs`` (in declaration order, as a contract has them: a table before the tables
    that read its changelog) with ``build_one``, up to ``workers`` at a time, each in a thread of its
    own with its own reads, commits and position. The commits are still the Spark driver's
    (the one committing driver) and each still takes its table's lock. A table that reads
    another's changelog starts once that one has committed; one whose input failed is not
    built (:class:`~lakehouse.errors.InputFailedError`). Return the results and the failures,
    by table name: a table's failure leaves the others' commits as they are."""
    names = {spec.name for spec in specs}
    waiting = list(specs)
    results: dict[str, GoldResult] = {}
    failures: dict[str, Exception] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gold") as pool:
        running: dict[Future[GoldResult], TableSpec] = {}
        while waiting or running:
            for spec in list(waiting):
                upstream = spec.changelog if spec.changelog in names else None
                if upstream is not None and upstream in failures:
                    waiting.remove(spec)
                    failures[spec.name] = InputFailedError("gold", spec.name, upstream)
                elif upstream is None or upstream in results:
                    waiting.remove(spec)
                    running[pool.submit(build_one, spec)] = spec
            if not running:
                if waiting:  # only tables whose input is never built: a contract forbids it
                    raise AssertionError(f"gold tables wait on each other: {waiting}")
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                spec = running.pop(future)
                error = future.exception()
                if error is None:
                    results[spec.name] = future.result()
                elif isinstance(error, Exception):
                    failures[spec.name] = error
                else:  # KeyboardInterrupt, SystemExit: not a table's failure
                    raise error
    return results, failures
