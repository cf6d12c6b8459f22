"""One micro-batch of a topic's pipeline: bronze -> silver -> gold, layer by layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from lakehouse import bronze, streams, tables
from lakehouse.config import LAYERS, Layer, Settings
from lakehouse.contracts import Catalog, Contract

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_layer(
    spark: SparkSession, settings: Settings, contract: Contract, layer: Layer
) -> list[str]:
    """Run one layer of one topic; return one summary line per table written."""
    if layer == "bronze":
        return [bronze.ingest(spark, settings, contract).summary()]
    if layer == "silver":
        return [streams.build(spark, settings, contract).summary()]
    return [r.summary() for r in tables.build(spark, settings, contract)]


def run(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    *,
    topics: Sequence[str] = (),
    layers: Sequence[Layer] = LAYERS,
    echo: Callable[[str], None] = print,
) -> None:
    """Run the given layers (in pipeline order) for the given topics (all when empty)."""
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    ordered = [layer for layer in LAYERS if layer in layers]
    for contract in contracts:
        for layer in ordered:
            for line in run_layer(spark, settings, contract, layer):
                echo(line)
