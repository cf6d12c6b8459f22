"""spark-submit entry point: one micro-batch of one layer of one topic's pipeline.

    spark-submit jobs/run_layer.py --topic user-locations --layer silver

Airflow runs this with the master of a ``lakehouse_spark`` connection of type ``spark``; the
flags after ``--layer`` come from the run's Params (see ``lakehouse.pipeline.request``).
"""

from __future__ import annotations

import argparse
import sys

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import (
    CONFIG_ERROR_EXIT,
    GATE_FAILED_EXIT,
    ConfigError,
    LakehouseError,
    QualityGateError,
    TablesFailedError,
)
from lakehouse.pipeline.request import LayerRequest, parse_offsets
from lakehouse.runtime.config import LAYERS, Settings


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, LayerRequest]:
    """The command line, and the request its flags make (ConfigError if they conflict)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--layer", required=True, choices=LAYERS)
    parser.add_argument("--dag-run-id", help="the Airflow DAG run this job is part of (ledger)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be read and written; change nothing",
    )
    parser.add_argument(
        "--tables", help="gold: only these tables (comma-separated; default: all the topic's)"
    )
    parser.add_argument(
        "--full-refresh", action="append", default=[], metavar="TABLE",
        help="gold: rebuild this table from the whole stream first (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--from-version", type=int,
        help="reprocess from this input version (silver: bronze's; gold: silver's)",
    )  # fmt: skip
    parser.add_argument(
        "--from-offsets", help="silver: reprocess from these offsets, e.g. 0:120,1:0"
    )
    args = parser.parse_args(argv)
    return args, _request(args)


def main(argv: list[str] | None = None) -> int:
    try:
        args, request = parse(argv)
        settings = Settings.from_env()
        loaded = Catalog.load_each(settings.contracts_dir)  # another topic's broken one: not ours
        catalog, contract = loaded.catalog, loaded.topic(args.topic)
        request.check(contract)
    except LakehouseError as exc:  # bad configuration fails before Spark starts
        print(f"error: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    from lakehouse.pipeline.runner import run_layer
    from lakehouse.quality.ledger import RunInfo
    from lakehouse.runtime.spark import get_session

    run = RunInfo.from_env(dag_run_id=args.dag_run_id)
    spark = None
    try:
        spark = get_session(app_name=f"lakehouse-{args.layer}-{args.topic}")
        for line in run_layer(
            spark, settings, contract, args.layer, catalog, run=run, echo=_say, request=request
        ):
            _say(line)
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
    finally:
        if spark is not None:
            spark.stop()
    return 0


def _request(args: argparse.Namespace) -> LayerRequest:
    if args.from_version is not None and args.from_version < 0:
        raise ConfigError(f"--from-version: {args.from_version} is not a version (>= 0)")
    if args.from_version is not None and args.from_offsets:
        raise ConfigError("--from-version and --from-offsets: give one or the other")
    if args.from_offsets and args.layer != "silver":
        raise ConfigError("--from-offsets reprocesses silver (offsets are bronze's)")
    if (args.tables or args.full_refresh) and args.layer != "gold":
        raise ConfigError("--tables and --full-refresh are for the gold layer")
    return LayerRequest(
        dry_run=args.dry_run,
        full_refresh=tuple(args.full_refresh),
        from_version=args.from_version,
        from_offsets=parse_offsets(args.from_offsets, "--from-offsets")
        if args.from_offsets
        else None,
        tables=tuple(t for t in args.tables.split(",") if t) if args.tables else None,
    )


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
