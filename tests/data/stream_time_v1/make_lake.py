"""Write a small lakehouse as the platform wrote it when a windowed table kept one stream time
for the whole topic (the rule before stream time became per partition): the lake that
``tests/integration/test_gold_windows.py`` upgrades.

It must run with that earlier code, so it is run from a checkout of it (the commit before
stream time became per partition, 72995b3):

    git worktree add /tmp/v1 72995b3
    PYTHONPATH=/tmp/v1/include .venv/bin/python tests/data/stream_time_v1/make_lake.py
    git worktree remove /tmp/v1

The lake (``lake/``: contracts, landing files, bronze, silver and gold tables, positions) is
committed. Topic ``orders`` has 3 partitions and 120 records whose event times only increase
(one every 2 s, 20 users), produced in two micro-batches; the earlier rule sent most of
partitions 1 and 2 to the late table.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from lakehouse.contracts.catalog import Catalog
from lakehouse.pipeline.runner import run
from lakehouse.runtime.config import Settings
from lakehouse.runtime.spark import get_session
from lakehouse.topics.landing import Producer, Record

HERE = Path(__file__).resolve().parent
LAKE = HERE / "lake"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONTRACT = """\
topic: orders
partitions: 3
key: {format: string, name: user}
value:
  format: json
  fields:
    - {name: event_time, type: timestamp}
    - {name: amount, type: long}
event_time: event_time
stream: {name: orders_stream}
tables:
  - name: orders_per_minute
    kind: aggregate
    window: {type: tumbling, size: 1m, grace: 30s}
    aggregations:
      - {name: n, fn: count}
      - {name: total, fn: sum, field: amount}
  - name: order_sessions
    kind: aggregate
    window: {type: session, gap: 1m}
    aggregations:
      - {name: n, fn: count}
"""


def records(lo: int, hi: int) -> list[Record]:
    def value(i: int) -> bytes:
        at = (T0 + timedelta(seconds=2 * i)).isoformat().replace("+00:00", "Z")
        return json.dumps({"event_time": at, "amount": i}).encode()

    return [Record(f"user-{i % 20}".encode(), value(i), timestamp_ms=0) for i in range(lo, hi)]


def main() -> None:
    shutil.rmtree(LAKE, ignore_errors=True)
    (LAKE / "contracts").mkdir(parents=True)
    (LAKE / "contracts" / "orders.yaml").write_text(CONTRACT)
    settings = Settings.from_env(LAKE / "home", LAKE / "contracts")
    spark = get_session("local[2]", app_name="stream-time-v1")
    producer = Producer(settings, "orders", 3)
    for lo, hi in [(0, 60), (60, 120)]:
        producer.send_batch(records(lo, hi))
        run(spark, settings, Catalog.load(settings.contracts_dir), echo=print)
    spark.stop()
    # What Airflow and the Spark server would keep beside the data: not part of the lake.
    for extra in ("reports", "locks", "airflow", "spark"):
        shutil.rmtree(LAKE / "home" / extra, ignore_errors=True)


if __name__ == "__main__":
    main()
