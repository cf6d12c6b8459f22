"""spark-submit entry point: one micro-batch of one layer of one topic's pipeline.

    spark-submit jobs/run_layer.py --topic user-locations --layer silver
    spark-submit jobs/run_layer.py --topic user-locations --layer gold \\
        --request='{"full_refresh": ["user_places"]}'

Airflow runs this with the master of a ``lakehouse_spark`` connection of type ``spark``, the
run's request (its Params, see ``lakehouse.pipeline.request``) as the one JSON argument
``--request``. The job is ``lakehouse.pipeline.job.run_job``, as in a task on the Spark server;
this file reads the command line and turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import sys

from lakehouse.errors import (
    CONFIG_ERROR_EXIT,
    GATE_FAILED_EXIT,
    ConfigError,
    LakehouseError,
    QualityGateError,
    TablesFailedError,
)
from lakehouse.pipeline.job import load_topic, run_job
from lakehouse.pipeline.request import RunRequest
from lakehouse.runtime.config import LAYERS, Settings


def parser() -> argparse.ArgumentParser:
    """The job's command line."""
    out = argparse.ArgumentParser(description=__doc__)
    out.add_argument("--topic", required=True)
    out.add_argument("--layer", required=True, choices=LAYERS)
    out.add_argument("--dag-run-id", help="the Airflow DAG run this job is part of (ledger)")
    out.add_argument(
        "--request",
        default="{}",
        metavar="JSON",
        help="what the run asks besides its micro-batch: its Params as a JSON object "
        "(default: none, every layer)",
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the job; 0, or the exit code that says why not (the error is on stderr)."""
    args = parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        catalog, contract = load_topic(settings, args.topic)
        request = RunRequest.from_json(args.request, contract)
    except LakehouseError as exc:  # bad configuration fails before Spark starts
        print(f"error: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    from lakehouse.runtime.spark import get_session

    try:
        run_job(
            settings,
            catalog,
            contract,
            args.layer,
            request,
            session=lambda: get_session(app_name=f"lakehouse-{args.layer}-{args.topic}"),
            dag_run_id=args.dag_run_id,
        )
    except QualityGateError as exc:  # the batch was not published; the task fails
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return GATE_FAILED_EXIT
    except TablesFailedError as exc:  # several tables failed; the others committed
        print(f"error: {exc}", file=sys.stderr, flush=True)
        if exc.quality_only:
            return GATE_FAILED_EXIT
        raise
    except ConfigError as exc:  # e.g. an incompatible schema, or a jar missing from the submit
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return CONFIG_ERROR_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
