"""Gold's entry point: one micro-batch of each of a contract's tables, handed to the module that
builds its kind (:mod:`~lakehouse.tables.aggregates`, :mod:`~lakehouse.tables.windows`,
:mod:`~lakehouse.tables.joins`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from lakehouse.contracts.model import (
    Catalog,
    Contract,
    TableSpec,
)
from lakehouse.runtime.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
from lakehouse.storage.gates import PublishGate
from lakehouse.tables import aggregates, joins, windows
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
    if spec.join is not None:
        return joins.build_join(
            spark, settings, catalog or Catalog.of([contract]), contract, spec, out, upto
        )
    if spec.window is not None:
        return windows.build_windowed(spark, settings, contract, spec, out, upto)
    return aggregates.build_table(spark, settings, contract, spec, out, upto)


def build(
    spark: SparkSession, settings: Settings, contract: Contract, catalog: Catalog | None = None
) -> list[GoldResult]:
    """Every table of a contract, in declaration order (a changelog source comes first)."""
    return [build_table(spark, settings, contract, spec, catalog) for spec in contract.tables]
