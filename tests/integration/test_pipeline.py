"""The seed's example end to end through the layers (no Airflow): landing -> bronze -> silver ->
gold, with the changelog, a tombstone, a null key, quarantine and idempotent reruns; on local
files and on the test S3 API (the ``s3`` parameter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from lakehouse.runtime import objectstore
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.storage import changes_arrow, read_arrow
from lakehouse.topics import samples
from lakes import DEMO_TABLES, STORAGES, lake_settings, produce, rows, run_pipeline, shipped_topic

pytestmark = pytest.mark.integration
TOPIC = "user-locations"


# What a micro-batch, bad input and reruns do to the layers does not depend on which gold
# tables a topic has: these tests run the topic with its first two tables, the ones they read,
# not the shipped ten. Every shipped table is built, in a bucket, by the Airflow bucket test
# (tests/e2e/test_airflow.py: the pipeline and joins DAGs); one of each kind, on local files,
# by test_kafka_source's comparison of its two sources.
TABLES = DEMO_TABLES


@pytest.fixture(params=STORAGES)
def two_tables(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The shipped topic with :data:`TABLES` only."""
    contracts = shipped_topic(tmp_path / "contracts", TOPIC, TABLES)
    return lake_settings(request, tmp_path, monkeypatch, contracts)


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The shipped topic with :data:`TABLES` only, on local files only: what the storage does
    not change (a rerun's no-op, silver's quarantine), kept out of the S3 runs for make test's
    time."""
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv(
        "LAKEHOUSE_CONTRACTS", str(shipped_topic(tmp_path / "contracts", TOPIC, TABLES))
    )
    return Settings.from_env()


def _versions(settings: Settings) -> dict[str, int]:
    from deltalake import DeltaTable

    paths = {
        "bronze": settings.bronze_path(TOPIC),
        "silver": settings.silver_path("user_locations"),
        "latest": settings.gold_path("user_latest_location"),
        "counts": settings.gold_path("user_location_counts"),
    }
    return {
        k: DeltaTable(str(p), storage_options=objectstore.storage_options(p)).version()
        for k, p in paths.items()
    }


def test_seed_example_tombstone_null_key_and_changelog(
    spark: Any, two_tables: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two micro-batches through every layer; then ``lakehouse lag`` (landing's end offsets
    against bronze's position) and ``lakehouse dq`` (the ledger) read the lake where it is:
    nothing behind, every published check recorded."""
    from lakehouse import cli

    settings = two_tables
    produce(
        settings, TOPIC, [(u, {"location": p}) for u, p in samples.SAMPLE_EVENTS], partition=None
    )
    run_pipeline(spark, settings)
    assert rows(settings.gold_path("user_latest_location"), "username", "location") == [
        ("alice", "Berlin"),
        ("bob", "Lima"),
    ]
    assert rows(settings.gold_path("user_location_counts"), "username", "count") == [
        ("alice", 3),
        ("bob", 2),
    ]
    before = _versions(settings)

    # A null key is ignored by tables; a tombstone deletes bob from the latest-value table but
    # is not counted; alice moves on.
    produce(
        settings,
        TOPIC,
        [(None, {"location": "Nowhere"}), ("bob", None), ("alice", {"location": "Madrid"})],
        partition=None,
    )
    run_pipeline(spark, settings)
    assert rows(settings.gold_path("user_latest_location"), "username", "location") == [
        ("alice", "Madrid")
    ]
    assert rows(settings.gold_path("user_location_counts"), "username", "count") == [
        ("alice", 4),
        ("bob", 2),
    ]

    silver = read_arrow(settings.silver_path("user_locations")).to_pylist()
    assert len(silver) == 8  # the stream keeps every event, null key and tombstone included
    assert sum(r["tombstone"] for r in silver) == 1
    assert sum(r["username"] is None for r in silver) == 1

    feed = changes_arrow(
        settings.gold_path("user_latest_location"), before["latest"] + 1
    ).to_pylist()
    assert sorted((r["_change_type"], r["username"], r["location"]) for r in feed) == [
        ("delete", "bob", "Lima"),
        ("update_postimage", "alice", "Madrid"),
        ("update_preimage", "alice", "Berlin"),
    ]
    # The whole changelog replays to the table: inserts - deletes == rows.
    full = changes_arrow(settings.gold_path("user_latest_location")).to_pylist()
    kinds = [r["_change_type"] for r in full]
    assert kinds.count("insert") - kinds.count("delete") == 1

    capsys.readouterr()
    assert cli.main(["lag", "--topic", TOPIC, "--format", "json"]) == 0
    lag = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["partition"] for r in lag] == [0, 1, 2]
    assert sum(r["end_offset"] for r in lag) == 8 and all(r["lag"] == 0 for r in lag)
    assert cli.main(["dq", "--table", "user_locations", "--format", "json"]) == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["layer"] for r in runs} == {"silver"}
    seen = [
        (r["outcome"], r["table_version"], r["rows"], r["checks"], r["met"], r["failed"])
        for r in runs
    ]
    # Each batch's checks: username_present, location_length, volume and the stream's
    # freshness. The null key is a warning: recorded, the batch published all the same. Its
    # rows are the records the stream took, the tombstone with them.
    assert seen == [
        ("published", 1, 5, 4, 4, []),
        ("published", 2, 3, 4, 3, ["warn username_present"]),
    ]
    assert all(r["quarantined"] == 0 and r["lag"] == 0 for r in runs)


def test_rerun_without_new_data_changes_nothing(spark: Any, local: Settings) -> None:
    settings = local
    produce(settings, TOPIC, [("alice", {"location": "Paris"})], partition=None)
    run_pipeline(spark, settings)
    before = _versions(settings)
    lines = run_pipeline(spark, settings)
    assert _versions(settings) == before
    assert any("no new segments" in line for line in lines)
    assert rows(settings.gold_path("user_location_counts"), "username", "count") == [("alice", 1)]


def test_a_topic_with_nothing_landed_says_so_at_each_layer_and_makes_no_table(
    spark: Any, local: Settings
) -> None:
    """A run before any record landed: each layer says there is nothing yet and leaves the
    lake as it was (making its empty tables and committing them is what made such a run take
    minutes); the first records then make every table as usual."""
    lines = run_pipeline(spark, local)
    assert lines == [
        f"bronze {TOPIC}: nothing has landed on the topic yet: nothing to ingest (its table is "
        "made with the first batch)",
        f"silver user_locations: bronze.{TOPIC} has no table yet (nothing has landed): nothing "
        "to decode",
        *(
            f"gold {name}: silver.user_locations has no table yet (nothing has landed): "
            "nothing to fold"
            for name in TABLES
        ),
    ]
    assert not (local.home / "tables").exists() and not local.ledger_path.exists()
    produce(local, TOPIC, [("alice", {"location": "Paris"})], partition=None)
    run_pipeline(spark, local)
    assert rows(local.gold_path("user_location_counts"), "username", "count") == [("alice", 1)]


def test_bad_values_go_to_quarantine_and_good_ones_still_land(spark: Any, local: Settings) -> None:
    settings = local
    produce(
        settings,
        TOPIC,
        [
            ("alice", {"location": "Paris"}),
            ("bob", b"{not json"),
            ("carol", b'"just a string"'),
            ("dave", {"location": "Oslo"}),
        ],
        partition=None,
    )
    run_pipeline(spark, settings)
    assert rows(settings.gold_path("user_latest_location"), "username", "location") == [
        ("alice", "Paris"),
        ("dave", "Oslo"),
    ]
    bad = read_arrow(settings.quarantine_path("silver", "user_locations")).to_pylist()
    assert sorted((r["key"], r["value"], r["reason"]) for r in bad) == [
        (b"bob", b"{not json", "value is not valid JSON"),
        (b"carol", b'"just a string"', "value is a JSON string, not an object"),
    ]
    assert all(r["topic"] == TOPIC and r["offset"] is not None for r in bad)


def test_corrupt_segment_line_is_quarantined_with_its_origin(
    spark: Any, two_tables: Settings
) -> None:
    settings = two_tables
    produce(settings, TOPIC, [("alice", {"location": "Paris"})], partition=None)
    (segment,) = [
        e.path
        for e in objectstore.walk_files(settings.topic_dir(TOPIC))
        if e.name.endswith(".json")
    ]
    good_line = objectstore.read_bytes(segment).decode()
    objectstore.write_bytes(segment, (good_line + "this is not an envelope\n").encode())
    run_pipeline(spark, settings)
    bad = read_arrow(settings.quarantine_path("bronze", TOPIC)).to_pylist()
    assert [(r["raw"], r["source_file"], r["line"], r["byte_offset"]) for r in bad] == [
        (b"this is not an envelope", str(segment), 2, len(good_line))
    ]
    assert bad[0]["reason"].startswith("not JSON")
    assert rows(settings.gold_path("user_latest_location"), "username", "location") == [
        ("alice", "Paris")
    ]


CONTRACT = """\
topic: cli-check
partitions: 2
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: city, type: string}
stream: {name: cli_check}
tables:
  - {name: cli_check_latest, kind: latest}
expectations:
  bronze:
    - {name: partition_ok, expect: between, column: partition, min: 0, max: 1, severity: fail}
  silver:
    - {name: user_present, expect: not_null, column: user, severity: quarantine}
  gold:
    - {name: one_row_per_user, table: cli_check_latest, expect: unique, column: user, severity: fail}
"""


def test_the_lakehouse_command_runs_a_micro_batch_validated_by_the_worker(tmp_path: Path) -> None:
    """``lakehouse produce``, ``run`` and ``show`` through the entry point pyproject.toml
    declares for the ``lakehouse`` script, each in a new process: every layer validated by
    the GX worker (no in-process fallback), the table published."""
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "cli-check.yaml").write_text(CONTRACT)
    env = os.environ | {
        "LAKEHOUSE_HOME": str(tmp_path / "lakehouse"),
        "LAKEHOUSE_CONTRACTS": str(contracts),
        "LAKEHOUSE_GX_WORKER": "1",
    }
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    entry = declared["project"]["scripts"]["lakehouse"]
    script = (
        "import sys; from importlib.metadata import EntryPoint; "
        f"sys.exit(EntryPoint('lakehouse', {entry!r}, 'console_scripts').load()())"
    )
    records = "".join(
        json.dumps({"key": user, "value": {"city": city}}) + "\n"
        for user, city in [("ana", "Oslo"), ("bo", "Lima"), ("ana", "Rome")]
    )

    def command(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script, *argv],
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    produced = command("produce", "cli-check", stdin=records)
    assert produced.returncode == 0, produced.stderr
    ran = command("run", "--topic", "cli-check")
    assert ran.returncode == 0, ran.stderr
    assert "validating in this process" not in ran.stderr
    verdicts = [line for line in ran.stdout.splitlines() if "checks met" in line]
    assert [line.split(":")[0] for line in verdicts] == [
        "quality bronze.cli-check",
        "quality silver.cli_check",
        "quality gold.cli_check_latest",
    ]
    shown = command("show", "cli_check_latest", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = sorted((r["user"], r["city"]) for r in map(json.loads, shown.stdout.splitlines()))
    assert rows == [("ana", "Rome"), ("bo", "Lima")]
