"""Lineage from the contracts: the graph of the shipped topics (every edge, no other, each with
the task that moves data along it), ``lakehouse lineage``, and the OpenLineage datasets the
layer and gate tasks report, validated against OpenLineage's published JSON schemas."""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
from openlineage.client.serde import Serde

import openlineage_spec
from lakehouse import cli
from lakehouse.contracts.catalog import Catalog, parse_contract
from lakehouse.errors import UnknownTableError
from lakehouse.orchestration.lineage import LayerLineage
from lakehouse.pipeline import lineage
from lakehouse.pipeline.request import dag_id, join_dag_id, joined, own
from lakehouse.runtime import readers
from lakehouse.runtime.config import REPO_ROOT, Settings

SHIPPED = Catalog.load(REPO_ROOT / "contracts")
P, J = "pipeline__user-locations", "joins__user-locations"
PP = "pipeline__user-profiles"

# Read off contracts/*.yaml and analytics/models/*.sql by hand.
EXPECTED = {
    ("topic.user-locations", "bronze.user-locations", P, "bronze"),
    ("bronze.user-locations", "silver.user_locations", P, "silver"),
    *(
        ("silver.user_locations", t, P, "gold")
        for t in (
            "user_latest_location",
            "user_location_counts",
            "user_places",
            "checkins_5m",
            "checkins_10m_every_5m",
            "user_sessions",
        )
    ),
    ("user_latest_location", "user_moves", P, "gold"),
    *(
        (side, t, J, "gold")
        for t in ("checkins_with_profile", "user_location_profile", "checkins_near_profile_changes")
        for side in ("silver.user_locations", "silver.user_profile_changes")
    ),
    ("topic.user-profiles", "bronze.user-profiles", PP, "bronze"),
    ("bronze.user-profiles", "silver.user_profile_changes", PP, "silver"),
    *(
        ("silver.user_profile_changes", t, PP, "gold")
        for t in ("user_profiles", "user_city_history", "user_profile_updates", "users_per_city")
    ),
    ("user_latest_location", "dbt.user_summary", None, None),
    ("user_location_counts", "dbt.user_summary", None, None),
    ("user_places", "dbt.user_summary", None, None),
    ("dbt.user_summary", "dbt.users_by_location", None, None),
}


def test_the_shipped_contracts_graph_has_every_edge_and_no_other() -> None:
    g = lineage.graph(SHIPPED)
    assert {(e.source, e.target, e.dag, e.task) for e in g.edges} == EXPECTED
    assert {e.source for e in g.edges} | {e.target for e in g.edges} == set(g.nodes)


def test_upstream_and_downstream_follow_the_edges_only() -> None:
    g = lineage.graph(SHIPPED)
    up = g.upstream(g.resolve("user_moves"))
    assert set(up.nodes) == {
        "user_moves",
        "user_latest_location",
        "silver.user_locations",
        "bronze.user-locations",
        "topic.user-locations",
    }
    down = g.downstream(g.resolve("user-profiles"))  # a topic by its bare name
    assert "checkins_with_profile" in down.nodes and "user_latest_location" not in down.nodes
    assert set(g.downstream("user_places").nodes) == {
        "user_places",
        "dbt.user_summary",
        "dbt.users_by_location",
    }
    assert g.resolve("gold.user_places") == "user_places"
    assert g.resolve("user_locations") == "silver.user_locations"  # a stream by its name
    with pytest.raises(UnknownTableError, match="unknown table 'nope'"):
        g.resolve("nope")


def test_column_lineage_says_which_fields_a_column_is_made_of() -> None:
    g = lineage.graph(SHIPPED)
    moves = g.columns["user_moves"]["moves"]
    assert [(s.node, s.column, s.subtype, s.description) for s in moves] == [
        ("user_latest_location", "username", "AGGREGATION", "count")
    ]
    (place,) = g.columns["user_places"]["first_place"]
    assert (place.node, place.column, place.type, place.description) == (
        "silver.user_locations",
        "location",
        "DIRECT",
        "earliest",
    )
    city = g.columns["checkins_with_profile"]["profile_city"]
    assert [(s.node, s.column, s.type, s.subtype) for s in city] == [
        ("silver.user_profile_changes", "city", "DIRECT", "IDENTITY"),
        ("silver.user_profile_changes", "username", "INDIRECT", "JOIN"),
    ]
    window = g.columns["checkins_5m"]
    assert [(s.column, s.subtype) for s in window["location"]] == [
        ("location", "IDENTITY"),
        ("location", "GROUP_BY"),
    ]
    assert [s.column for s in window["window_start"]] == ["event_time"]
    location = g.columns["silver.user_locations"]["location"]
    assert [(s.node, s.column, s.description) for s in location] == [
        ("bronze.user-locations", "value", "field location of the json value")
    ]
    # Every column of every table has its sources, each a column its input has.
    for name, node in g.nodes.items():
        if node.kind not in ("bronze", "silver", "gold"):
            continue
        assert set(g.columns[name]) == set(node.columns) - {"topic"}, name
        for sources in g.columns[name].values():
            for s in sources:
                assert s.column in g.nodes[s.node].columns, (name, s)


def test_lakehouse_lineage_prints_a_tables_upstream_and_downstream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["lineage", "user_latest_location"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "user_latest_location (gold, topic user-locations)"
    assert (
        "    <- bronze.user-locations (bronze, topic user-locations)  by "
        "pipeline__user-locations.silver"
    ) in out
    assert "  -> user_moves (gold, topic user-locations)  by pipeline__user-locations.gold" in out
    assert "    -> dbt.users_by_location (dbt)  by dbt build" in out
    assert cli.main(["lineage", "dbt.user_summary", "--downstream"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "dbt.user_summary (dbt)",
        "downstream:",
        "  -> dbt.users_by_location (dbt)  by dbt build",
    ]
    assert cli.main(["lineage", "--format", "json"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)  # JSON is YAML
    assert len(shown["edges"]) == len(EXPECTED)
    assert cli.main(["lineage", "nope"]) != 0


def _event(state: RunState, job: str, found: Any) -> dict[str, Any]:
    """A run event of the datasets a task reports, as Airflow's provider sends it (its own run
    and job facets aside: tests/e2e check those on the events a DAG run sends)."""
    event = RunEvent(
        eventType=state,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=str(uuid.uuid4())),
        job=Job(namespace="default", name=job),
        producer="https://github.com/apache/airflow/tree/providers-openlineage/2.20.3",
        inputs=found.inputs,
        outputs=found.outputs,
    )
    result: dict[str, Any] = Serde.to_dict(event)
    return result


def _batch(table: str, version: int, rows: int) -> dict[str, Any]:
    return {
        "table": table,
        "kind": "batch",
        "published": True,
        "table_version": version,
        "rows": rows,
        "expectation": None,
    }


def test_the_layer_tasks_events_are_valid_openlineage_and_draw_the_contracts_graph(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    found = LayerLineage(settings, SHIPPED)
    events = []
    for c in SHIPPED:
        tasks = [
            (dag_id(c.topic), "bronze", None),
            (dag_id(c.topic), "silver", None),
            (dag_id(c.topic), "gold", own(c)),
        ]
        if joined(c):
            tasks.append((join_dag_id(c.topic), "gold", joined(c)))
        for dag, layer, tables in tasks:
            names = c.published_tables(layer) if tables is None else tables
            batches = [_batch(n, 3, 20) for n in names]
            lineage_ = found.task(c, layer, names, batches)  # type: ignore[arg-type]
            event = _event(RunState.COMPLETE, f"{dag}.{layer}", lineage_)
            openlineage_spec.validate(event)
            events.append(event)
    g = lineage.graph(SHIPPED, None)
    expected = {(_named(found, e.source), _named(found, e.target)) for e in g.edges}
    assert openlineage_spec.edges(events) == expected

    bronze = next(e for e in events if e["job"]["name"] == f"{P}.bronze")
    (topic,) = bronze["inputs"]  # a topic landing as files: its folder
    assert (topic["namespace"], topic["name"]) == (
        "file",
        str(settings.home / "landing" / "topics" / "user-locations"),
    )
    (table,) = bronze["outputs"]
    assert (table["namespace"], table["name"]) == (
        "file",
        str(settings.home / "tables" / "bronze" / "user-locations"),
    )
    sql = f"spark://127.0.0.1:{os.environ.get(readers.SQL_PORT_ENV, readers.DEFAULT_SQL_PORT)}"
    assert table["facets"]["symlinks"]["identifiers"] == [
        {"namespace": sql, "name": "bronze.user_locations", "type": "TABLE"}
    ]
    assert table["facets"]["version"]["datasetVersion"] == "3"
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 20
    gold = next(e for e in events if e["job"]["name"] == f"{P}.gold")
    counts = next(o for o in gold["outputs"] if o["name"].endswith("/user_location_counts"))
    assert {f["name"]: f.get("type") for f in counts["facets"]["schema"]["fields"]} == {
        "username": "string",
        "count": "long",
    }
    joins = next(e for e in events if e["job"]["name"] == f"{J}.gold")
    profile = next(o for o in joins["outputs"] if o["name"].endswith("/checkins_with_profile"))
    typed = {f["name"]: f.get("type") for f in profile["facets"]["schema"]["fields"]}
    assert typed["profile_city"] == "string" and typed["offset"] == "long", typed
    # The changelog a table reads is an input of the task that writes both.
    assert any(i["name"].endswith("/gold/user_latest_location") for i in gold["inputs"])


def _named(found: LayerLineage, node: str) -> str:
    namespace, name = found.naming.of(node)
    return f"{namespace}/{name}"


def test_a_kafka_topic_is_named_by_its_bootstrap_server(tmp_path: Path) -> None:
    doc = {
        "topic": "payments",
        "partitions": 3,
        "key": {"format": "string", "name": "id"},
        "value": {"format": "json", "fields": [{"name": "amount", "type": "long"}]},
        "stream": {"name": "payments_stream"},
        "tables": [{"name": "payment_latest", "kind": "latest"}],
        "kafka": {"topic": "payments-v1", "bootstrap_servers": "broker:9092,other:9092"},
    }
    contract = parse_contract(doc)
    settings = Settings.from_env(tmp_path / "home", tmp_path / "contracts")
    found = LayerLineage(settings, Catalog.of([contract])).task(contract, "bronze", ["payments"])
    event = _event(RunState.START, "pipeline__payments.bronze", found)
    openlineage_spec.validate(event)
    assert [(i["namespace"], i["name"]) for i in event["inputs"]] == [
        ("kafka://broker:9092", "payments-v1")
    ]
    assert "version" not in event["outputs"][0]["facets"]  # nothing written yet


def test_a_gate_reports_the_tables_it_judged_with_their_assertions(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    c = SHIPPED.topic("user-locations")
    rows = [
        _batch("user_locations", 4, 5),
        {
            "table": "user_locations",
            "kind": "in_set",
            "expectation": "berlin_only",
            "column": "location",
            "severity": "fail",
            "success": False,
            "observed_value": "4 of 5 rows unexpected",
        },
        {
            "table": "user_locations",
            "kind": "not_null",
            "expectation": "username_present",
            "column": "username",
            "severity": "warn",
            "success": True,
            "observed_value": None,
        },
    ]
    found = LayerLineage(settings, SHIPPED).gate(c, "silver", ["user_locations"], rows)
    event = _event(RunState.FAIL, f"{P}.gate_silver", found)
    openlineage_spec.validate(event)
    assert event["outputs"] == []
    (judged,) = event["inputs"]
    assert judged["name"] == str(settings.home / "tables" / "silver" / "user_locations")
    assertions = judged["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert assertions == [
        {
            "assertion": "in_set",
            "success": False,
            "column": "location",
            "severity": "error",
            "name": "berlin_only",
            "actual": "4 of 5 rows unexpected",
            "params": {},
        },
        {
            "assertion": "not_null",
            "success": True,
            "column": "username",
            "severity": "warn",
            "name": "username_present",
            "params": {},
        },
    ]


def test_the_spec_check_refuses_what_the_spec_refuses() -> None:
    """The validator is not a rubber stamp: a run event without its run id, or a facet of a
    schema nobody published, is refused."""
    import jsonschema

    nothing = OperatorLineage()
    event = _event(RunState.START, "x", nothing)
    del event["run"]["runId"]
    with pytest.raises(jsonschema.ValidationError):
        openlineage_spec.validate(event)
    event = _event(RunState.START, "x", nothing)
    event["run"]["facets"] = {"mine": {"_producer": "x", "_schemaURL": "https://example.com/x"}}
    with pytest.raises(AssertionError, match="no published schema"):
        openlineage_spec.validate(event)


def test_the_lineage_page_draws_every_node_and_edge_and_a_selection(tmp_path: Path) -> None:
    import re

    from lakehouse.pipeline.lineage_page import NodeState, render_page

    g = lineage.graph(SHIPPED)
    found = {
        "silver.user_locations": NodeState(7, "0 versions", "ok"),
        "user_latest_location": NodeState(4, "1 versions", "failed: fail one_row_per_user"),
    }
    page = render_page(g, found, None, "http://airflow/")
    drawn = re.findall(r"<g class='node [^']*' data-node='([^']+)'", page)
    assert sorted(drawn) == sorted(g.nodes)
    assert page.count("<path class='edge'") == len(g.edges)
    assert "v7 · lag 0 versions · ok" in page
    assert "<g class='node gold bad' data-node='user_latest_location'>" in page
    assert "href='http://airflow/dags/joins__user-locations' target='_top'" in page
    assert "<script" not in page and "http" not in page.split("<body>")[0]

    picked = render_page(g, found, "user_latest_location", "http://airflow/")
    lit = set(re.findall(r"<g class='node [a-z]+ [a-z]+' data-node='([^']+)'", picked))
    dim = set(re.findall(r"<g class='node [a-z]+ [a-z]+ dim' data-node='([^']+)'", picked))
    assert lit == {
        "topic.user-locations",
        "bronze.user-locations",
        "silver.user_locations",
        "user_moves",
        "dbt.user_summary",
        "dbt.users_by_location",
    }
    assert "user_latest_location" not in dim and "user_places" in dim
    assert "<tr><td>username</td><td>silver.user_locations.username (identity)</td></tr>" in picked


def test_the_lineage_page_is_served_with_the_lakes_state_and_names_bad_requests(
    tmp_path: Path,
) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from lakehouse.pipeline.lineage_page import create_router

    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    app = FastAPI()
    app.include_router(create_router(lambda: settings))
    client = TestClient(app)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
    assert "no table yet" in page.text and "dbt.users_by_location" in page.text
    picked = client.get("/", params={"node": "gold.user_moves"})
    assert picked.status_code == 200 and "<h2 id='selected'>user_moves" in picked.text
    assert client.get("/", params={"node": "nope"}).status_code == 404
    assert client.get("/", params={"table": "x"}).status_code == 400


def test_a_dbt_model_on_another_lakes_tables_is_left_out(tmp_path: Path) -> None:
    project = tmp_path / "dbt"
    (project / "models").mkdir(parents=True)
    (project / "models" / "mine.sql").write_text(
        "select * from {{ source('gold', 'user_places') }} join {{ ref('theirs') }}"
    )
    (project / "models" / "theirs.sql").write_text("select * from {{ source('gold', 'orders') }}")
    (project / "models" / "on_mine.sql").write_text("select * from {{ ref('mine') }}")
    g = lineage.graph(SHIPPED, project)
    dbt = {(e.source, e.target) for e in g.edges if e.dag is None}
    assert dbt == {("user_places", "dbt.mine"), ("dbt.mine", "dbt.on_mine")}
    assert "dbt.theirs" not in g.nodes


def test_without_a_transport_the_provider_is_off(tmp_path: Path) -> None:
    """Airflow's environment as `lakehouse airflow` makes it configures no OpenLineage transport:
    the provider is disabled (its listener sends nothing and calls no task's lineage methods);
    a deployment's transport setting turns it on."""
    import subprocess
    import sys

    from lakehouse.orchestration.airflow_env import airflow_environment

    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    base = {k: v for k, v in os.environ.items() if "OPENLINEAGE" not in k}
    probe = "from airflow.providers.openlineage import conf; print(conf.is_disabled())"

    def disabled(env: dict[str, str]) -> str:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env=airflow_environment(settings, env),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout.strip()

    assert disabled(base) == "True"
    transport = '{"type": "http", "url": "http://127.0.0.1:9"}'
    assert disabled({**base, "AIRFLOW__OPENLINEAGE__TRANSPORT": transport}) == "False"


def test_a_join_with_a_history_table_reads_it_and_takes_its_types(tmp_path: Path) -> None:
    """A stream-table join may read the other topic's history table instead of its stream: the
    edge comes from that gold table, and the taken columns have its columns' types, though the
    other contract comes later in the catalog."""
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    for name in ("user-locations.yaml", "user-profiles.yaml"):
        (contracts / name).write_text((REPO_ROOT / "contracts" / name).read_text())
    shutil.copytree(REPO_ROOT / "contracts" / "user-profiles", contracts / "user-profiles")
    doc = (contracts / "user-locations.yaml").read_text()
    doc = doc.replace(
        "      with: user-profiles\n      how: left\n      fields: [name, city]\n",
        "      with: user-profiles\n      how: left\n      table: user_city_history\n"
        "      fields: [city]\n",
        1,
    )
    (contracts / "user-locations.yaml").write_text(doc)
    catalog = Catalog.load(contracts)
    g = lineage.graph(catalog, None)
    assert ("user_city_history", "checkins_with_profile") in {(e.source, e.target) for e in g.edges}
    settings = Settings.from_env(tmp_path / "home", contracts)
    types = LayerLineage(settings, catalog).types
    assert types["checkins_with_profile"]["profile_city"] == types["user_city_history"]["city"]
    assert types["user_city_history"]["valid_from"] == "timestamp"
