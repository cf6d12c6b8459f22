"""spark-submit entry point: one micro-batch of one layer of one topic's pipeline.

    spark-submit jobs/run_layer.py --topic user-locations --layer silver

Airflow's SparkSubmitOperator runs this with the ``spark_default`` connection's master.
"""

from __future__ import annotations

import argparse
import sys

from lakehouse.config import LAYERS, Settings
from lakehouse.contracts import Catalog
from lakehouse.errors import GATE_FAILED_EXIT, LakehouseError, QualityGateError
from lakehouse.pipeline import run_layer
from lakehouse.quality import RunInfo
from lakehouse.spark import get_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--layer", required=True, choices=LAYERS)
    parser.add_argument("--dag-run-id", help="the Airflow DAG run this job is part of (ledger)")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        catalog = Catalog.load(settings.contracts_dir)
        contract = catalog.topic(args.topic)
    except LakehouseError as exc:  # bad configuration fails before Spark starts
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spark = get_session(app_name=f"lakehouse-{args.layer}-{args.topic}")
    run = RunInfo.from_env(dag_run_id=args.dag_run_id)
    try:
        for line in run_layer(spark, settings, contract, args.layer, catalog, run=run, echo=_say):
            _say(line)
    except QualityGateError as exc:  # the batch was not published; the task fails
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return GATE_FAILED_EXIT
    finally:
        spark.stop()
    return 0


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
