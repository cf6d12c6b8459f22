"""Assets of the pipeline DAGs: a table per layer and its side tables, what a layer's job reads
and writes, and the records arriving on a Kafka-sourced topic's broker with the trigger callback
that watches them (run in the triggerer).

Imported at DAG parse time: Airflow and the contracts only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import (
    Asset,
    AssetAlias,
    AssetOrTimeSchedule,
    AssetWatcher,
    DeltaTriggerTimetable,
)

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.orchestration.airflow_env import kafka_conn_id
from lakehouse.runtime.config import Layer, Settings
from lakehouse.runtime.objectstore import Location


def table_asset(settings: Settings, layer: Layer, name: str) -> Asset:
    return _asset(f"{layer}.{name}", settings.table_path(layer, name))


def side_assets(
    settings: Settings, contract: Contract, layer: Layer, names: Sequence[str]
) -> list[Asset]:
    """The side tables a layer's job also writes, as Assets: the quarantine of bronze and of
    silver, the late records of each windowed gold table. (The gold tables' private state
    tables are the jobs' own business, not data anyone reads.)"""
    if layer == "bronze":
        return [
            _asset(
                f"quarantine.bronze.{contract.topic}",
                settings.quarantine_path("bronze", contract.topic),
            )
        ]
    if layer == "silver":
        return [
            _asset(
                f"quarantine.silver.{contract.stream}",
                settings.quarantine_path("silver", contract.stream),
            )
        ]
    return [
        _asset(f"late.{t.name}", settings.late_path(t.name))
        for t in contract.tables
        if t.name in names and t.keeps_late
    ]


def inlets(
    settings: Settings, contract: Contract, catalog: Catalog, layer: Layer, names: Sequence[str]
) -> list[Asset]:
    """What a layer's job reads: bronze for silver; for gold, the stream, and the other topics'
    streams (or history tables) that the joins among ``names`` read."""
    if layer == "bronze":
        return []
    if layer == "silver":
        return [table_asset(settings, "bronze", contract.topic)]
    # From the contract, not the tables' kinds: their modules import the storage layer, which
    # DAG parsing must not load.
    joins = [t.join for t in contract.tables if t.name in names and t.join is not None]
    others = sorted({j.other for j in joins if j.table is None})
    versions = sorted({j.table for j in joins if j.table is not None})
    return [
        table_asset(settings, "silver", contract.stream),
        *(table_asset(settings, "silver", catalog.topic(o).stream) for o in others),
        *(table_asset(settings, "gold", v) for v in versions),
    ]


def outlets(
    settings: Settings, contract: Contract, layer: Layer, names: Sequence[str]
) -> list[Asset]:
    """What a layer's job writes: the tables it publishes and their side tables."""
    return [
        *(table_asset(settings, layer, n) for n in names),
        *side_assets(settings, contract, layer, names),
    ]


def changes_alias(contract: Contract, layer: Layer, *, joins: bool = False) -> AssetAlias:
    """What a layer task declares it writes: an alias through which it emits, when its job is
    done, an event for each table the batch changed (:func:`changed`), and none for a table it
    left as it was, so that nothing scheduled on an unchanged table runs for nothing. (An Asset
    among a task's outlets gets an event whenever the task succeeds.)"""
    return AssetAlias(name=f"lakehouse.{layer}.{contract.topic}" + (".joins" if joins else ""))


def changed(
    settings: Settings,
    contract: Contract,
    layer: Layer,
    names: Sequence[str],
    batches: Sequence[Mapping[str, Any]],
) -> list[tuple[Asset, dict[str, Any]]]:
    """The asset events a layer task emits, from the ledger's rows of its DAG run and layer
    (``batches``: its batch rows, one per table per batch; checks' rows are ignored): each table
    of ``names`` a published batch changed, with its version, rows, quarantined and late counts
    and the verdict of its checks in this run; the quarantine of a batch that quarantined
    records; the late table of one that sent records there. The newest batch of a table counts
    (a DAG run cleared and run again adds one)."""
    published: dict[str, Mapping[str, Any]] = {}
    checks: dict[str, list[Mapping[str, Any]]] = {}
    for row in batches:
        if row["table"] not in names:
            continue
        if row["kind"] != "batch":
            checks.setdefault(row["table"], []).append(row)
        elif row["outcome"] == "published":
            seen = published.get(row["table"])
            if seen is None or row["validated_at"] > seen["validated_at"]:
                published[row["table"]] = row
    sides = {a.name: a for a in side_assets(settings, contract, layer, names)}
    out: list[tuple[Asset, dict[str, Any]]] = []
    for name in names:
        batch = published.get(name)
        if batch is None:
            continue
        mine = checks.get(name, [])
        failed = sorted({f"{c['severity']} {c['expectation']}" for c in mine if not c["success"]})
        extra = {
            "table_version": batch["table_version"],
            "rows": batch["rows"],
            "quarantined": batch["quarantined"] or 0,
            "late": batch["late"] or 0,
            "verdict": {
                "outcome": "published",
                "checks": len(mine),
                "met": len(mine) - sum(not c["success"] for c in mine),
                "failed": failed,
            },
            "dag_run_id": batch["dag_run_id"],
        }
        out.append((table_asset(settings, layer, name), extra))
        side = {"rows": None, "table_version": batch["table_version"], "of": f"{layer}.{name}"}
        if batch["quarantined"] and layer in ("bronze", "silver"):
            quarantine = next(a for a in sides.values() if a.name.startswith("quarantine."))
            out.append((quarantine, {**side, "rows": batch["quarantined"]}))
        if batch["late"] and f"late.{name}" in sides:
            out.append((sides[f"late.{name}"], {**side, "rows": batch["late"]}))
    return out


def _asset(name: str, path: Location) -> Asset:
    return Asset(
        name=name, uri=path.as_uri() if isinstance(path, Path) else str(path), group="delta"
    )


def records_asset(contract: Contract) -> Asset:
    """The records arriving on a Kafka-sourced topic's broker, as an Asset watched by Airflow's
    Kafka message-queue trigger in the triggerer. The trigger consumes the topic with the
    connection :func:`lakehouse.orchestration.airflow_env.kafka_conn_id` (a consumer group of its own) and
    asks :func:`record_arrived` about each record; a record that asks for a run becomes an event
    of this Asset, and the trigger starts again after each event."""
    assert contract.kafka is not None
    # Imported here: only a catalog with a Kafka-sourced topic pays for the providers' import.
    from airflow.providers.apache.kafka.triggers.msg_queue import KafkaMessageQueueTrigger

    conn_id = kafka_conn_id(contract.topic)
    trigger = KafkaMessageQueueTrigger(
        topics=[contract.kafka.topic],
        kafka_config_id=conn_id,
        apply_function=f"{__name__}.{record_arrived.__name__}",
        apply_function_kwargs={"kafka_config_id": conn_id, "partitions": contract.partitions},
        # The provider sleeps this long after each record the function turns down: none, so a
        # burst already asked for is read through at once.
        poll_interval=0,
    )
    return Asset(
        name=f"kafka.{contract.topic}",
        group="kafka",
        watchers=[AssetWatcher(name=f"records.{contract.topic}", trigger=trigger)],
    )


# Per connection, topic and partition: the end offset when the trigger last asked for a run, in
# the triggerer's process (a new one starts empty, and asks again at its first record).
_ASKED: dict[tuple[str, str, int], int] = {}


def record_arrived(message: Any, *, kafka_config_id: str, partitions: int) -> Any:
    """The Kafka trigger's test of each record it reads (in the triggerer). Any record that
    arrived asks for a run, unless it was on the broker already when the last run was asked for:
    that run's bronze reads up to end offsets read after the request, so it takes the record.
    A burst of records therefore makes one asset event, not one each (with the DAG's one active
    run, Airflow then queues at most one more run, whatever the number of events).

    A request (truthy) is the asset event's payload, which Airflow stores: the record's place,
    never its key or value. When the end offsets cannot be read, the record asks anyway."""
    from airflow.sdk import BaseHook

    from lakehouse.errors import BrokerUnavailableError
    from lakehouse.orchestration.airflow_env import kafka_trigger_settings
    from lakehouse.topics import kafka

    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if offset < _ASKED.get((kafka_config_id, topic, partition), 0):
        return None
    config = {
        k: str(v)
        for k, v in BaseHook.get_connection(kafka_config_id).extra_dejson.items()
        if k not in kafka_trigger_settings(topic)
    }
    client = kafka.Client(topic, topic, config["bootstrap.servers"], config)
    try:
        ends = kafka.offsets(client, partitions)
    except BrokerUnavailableError:
        ends = {}
    _ASKED.update({(kafka_config_id, topic, p): end for p, (_, end) in ends.items()})
    return {"topic": topic, "partition": partition, "offset": offset}


def pipeline_schedule(contract: Contract) -> Any:
    """When a topic's pipeline DAG runs by itself, once unpaused: every ``schedule_minutes`` if
    the contract asks for it (else never: it runs when triggered), and a Kafka-sourced topic's
    DAG also when records arrive on its broker (:func:`records_asset`). The time half is what
    Airflow makes of a ``timedelta`` schedule, so a landing topic's DAG and a Kafka topic's run
    on the same clock."""
    every = (
        None if contract.schedule_minutes is None else timedelta(minutes=contract.schedule_minutes)
    )
    if contract.kafka is None:
        return every
    if every is None:
        return records_asset(contract)
    return AssetOrTimeSchedule(
        timetable=DeltaTriggerTimetable(every), assets=records_asset(contract)
    )


def schedule_words(contract: Contract) -> str:
    """When the DAG runs, in words (its description says so where the DAG list shows it)."""
    when = ["when triggered"]
    if contract.schedule_minutes is not None:
        when.append(f"every {contract.schedule_minutes} min once unpaused")
    if contract.kafka is not None:
        when.append("when records arrive on its broker once unpaused")
    return ", ".join(when[:-1]) + (" and " if len(when) > 1 else "") + when[-1]
