"""One micro-batch of a topic's pipeline: bronze -> silver -> gold, layer by layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse import bronze, streams, tables
from lakehouse.config import LAYERS, Layer, Settings
from lakehouse.contracts import Catalog, Contract
from lakehouse.registry import SchemaRegistry
from lakehouse.storage.maintenance import Consumer, MaintenanceReport, maintain

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_layer(
    spark: SparkSession, settings: Settings, contract: Contract, layer: Layer
) -> list[str]:
    """Run one layer of one topic; return one summary line per table written.

    The contract's schemas are checked against the topic's registered versions first, so a
    contract that breaks its compatibility mode stops every layer before any data moves.
    """
    SchemaRegistry(settings.registry_root).register(contract)
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


def topic_tables(settings: Settings, contract: Contract) -> list[tuple[Path, list[Consumer]]]:
    """Every table of a topic's pipeline with the consumers reading its change feed."""
    silver = settings.silver_path(contract.stream)
    gold_consumers = [
        Consumer(f"gold.{t.name}", settings.gold_path(t.name), tables.source_app(contract))
        for t in contract.tables
    ]
    states = [t.name for t in contract.tables if t.source == "table"]
    gold_consumers += [
        Consumer(f"state.{name}", settings.state_path(name), tables.source_app(contract))
        for name in states
    ]
    return [
        (
            settings.bronze_path(contract.topic),
            [Consumer(f"silver.{contract.stream}", silver, streams.source_app(contract))],
        ),
        (silver, gold_consumers),
        *((settings.gold_path(t.name), []) for t in contract.tables),
        *((settings.state_path(name), []) for name in states),
        (settings.quarantine_path("bronze", contract.topic), []),
        (settings.quarantine_path("silver", contract.stream), []),
    ]


def maintain_topics(
    settings: Settings,
    catalog: Catalog,
    *,
    topics: Sequence[str] = (),
    retention_hours: float,
    compact: bool = True,
    dry_run: bool = False,
    echo: Callable[[str], None] = print,
) -> list[MaintenanceReport]:
    """Compact, vacuum (consumer-aware), checkpoint and clean the logs of every existing table."""
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    reports = []
    for contract in contracts:
        for path, consumers in topic_tables(settings, contract):
            if not (path / "_delta_log").is_dir():
                continue
            report = maintain(
                path, consumers, retention_hours=retention_hours, compact=compact, dry_run=dry_run
            )
            echo(report.summary())
            reports.append(report)
    return reports
