"""The tables the pipeline wrote with delta-spark, as a plain PySpark user with Delta Lake sees
them: a fresh session configured only as Delta's documentation says (its jars, its SQL extension
and catalog) reads them, their history and their change feed, and is held to their CHECK
constraints."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.pipeline.runner import run_layer
from lakehouse.runtime.config import Settings
from lakehouse.runtime.jvm import spark_jars_conf
from lakehouse.storage import read_arrow
from lakehouse.topics.landing import Producer, Record

pytestmark = pytest.mark.integration

CONTRACT = """\
topic: orders
partitions: 2
key: {format: string, name: order_id}
value:
  format: json
  fields:
    - {name: city, type: string}
    - {name: amount, type: long}
stream: {name: orders_stream}
expectations:
  silver:
    - {name: amount_range, expect: between, column: amount, min: 0, max: 100, severity: fail}
"""

# Runs in its own interpreter: a new JVM with nothing of the platform's settings.
PLAIN_USER = textwrap.dedent(
    """\
    import json, sys
    from pyspark.sql import SparkSession

    jars, tables, silver = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog",
                "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .getOrCreate()
    )
    out = {"rows": {}, "history": {}}
    for name, path in tables.items():
        out["rows"][name] = spark.read.format("delta").load(path).count()
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        out["history"][name] = [[h.operation, h.engineInfo] for h in history]
    feed = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", 0).load(tables["bronze"])
    )
    out["bronze_feed"] = [r[0] for r in feed.select("_change_type").distinct().collect()]
    row = spark.read.format("delta").load(silver).limit(1)
    try:
        row.withColumn("amount", row.amount + 1000).write.format("delta").mode("append").save(silver)
        out["refused"] = None
    except Exception as exc:
        lines = str(exc).splitlines()
        out["refused"] = next((x for x in lines if "CHECK constraint" in x), lines[0])
    print(json.dumps(out))
    """
)


def test_a_plain_delta_spark_session_reads_what_the_pipeline_wrote(
    spark: Any, tmp_path: Path
) -> None:
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "orders.yaml").write_text(CONTRACT)
    lake = Settings.from_env(tmp_path / "home", contracts)
    Producer(lake, "orders", 2).send_batch(
        Record(f"o{i}".encode(), json.dumps({"city": "Lima", "amount": i}).encode(), partition=0)
        for i in range(5)
    )
    (lake.topic_dir("orders") / "partition=1").mkdir(parents=True, exist_ok=True)
    (lake.topic_dir("orders") / "partition=1" / "orders+1+0000000000.json").write_text("{bad\n")
    Producer(lake, "orders", 2).send_batch(
        [Record(b"o9", b"not json", partition=0)]  # decodes badly: silver's quarantine
    )
    contract = Catalog.load(lake.contracts_dir).topic("orders")
    for layer in ("bronze", "silver"):
        run_layer(spark, lake, contract, layer, echo=lambda _: None)  # type: ignore[arg-type]

    tables = {
        "bronze": lake.bronze_path("orders"),
        "bronze_quarantine": lake.quarantine_path("bronze", "orders"),
        "silver": lake.silver_path("orders_stream"),
        "silver_quarantine": lake.quarantine_path("silver", "orders_stream"),
        "ledger": lake.ledger_path,  # the gates' verdicts
    }
    seen = subprocess.run(
        [
            sys.executable,
            "-c",
            PLAIN_USER,
            spark_jars_conf(),
            json.dumps({k: str(v) for k, v in tables.items()}),
            str(tables["silver"]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert seen.returncode == 0, seen.stderr[-3000:]
    out = json.loads(seen.stdout.strip().splitlines()[-1])

    # The same rows as the platform's own reader (delta-rs) finds, table by table.
    assert out["rows"] == {name: read_arrow(path).num_rows for name, path in tables.items()}
    assert out["rows"] | {"ledger": 0} == {
        "bronze": 6,
        "bronze_quarantine": 1,
        "silver": 5,
        "silver_quarantine": 1,
        "ledger": 0,
    }
    assert out["rows"]["ledger"] > 0
    # Every commit of every table, the quality ledger's too, was made by Delta Lake's own
    # connector: creation, appends and the constraint the contract's `fail` expectation made.
    for name, history in out["history"].items():
        assert {op for op, _ in history} >= {"CREATE TABLE", "WRITE"}, (name, history)
        assert all(engine.startswith("Apache-Spark/4.2.0 Delta-Lake/") for _, engine in history)
    assert "ADD CONSTRAINT" in {op for op, _ in out["history"]["silver"]}
    assert out["bronze_feed"] == ["insert"]
    # The contract's `fail` expectation is a CHECK constraint that binds every writer.
    assert out["refused"] is not None and "CHECK constraint" in out["refused"], out["refused"]
    assert read_arrow(tables["silver"]).num_rows == 5
