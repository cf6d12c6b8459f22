"""Warm a Spark server that has just started: micro-batches of the shipped contracts, on a
scratch lake of the server's own, through the same code as a real run.

    python -m lakehouse.pipeline.warmup     (``lakehouse spark start`` runs it: see
                                            :mod:`lakehouse.runtime.warmup`)

The shipped contracts (``contracts/`` of the repository, whatever ``LAKEHOUSE_CONTRACTS`` says)
have a table of every kind (latest, aggregates, the three windows, the changelog, the three
joins, a history table), JSON and Avro values, and the generators of ``lakehouse sample``: their
batches run every code path a user's contracts do. Each round produces 20 random records to each
topic of the scratch lake and runs every layer of both, with their gates validated in the
server's validation service; the first round on an empty scratch lake creates its tables, and
:data:`ROUNDS` more merge into them. The scratch lake stays between starts (the next warm-up
merges at once); one that a round fails on (a contract or the platform changed beneath it) is
made again from empty, once.

Where it writes: ``<home>/spark/warmup`` on a local lake; ``<data>/_warmup`` on a bucket, so the
S3 client is warmed too. Neither is a pipeline table's place, so the metastore names none of its
tables, and the lake's ledger, reports and lag never see it.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
import traceback
from collections.abc import Callable

from lakehouse.contracts.catalog import Catalog
from lakehouse.runtime import objectstore, server, warmup
from lakehouse.runtime.config import REPO_ROOT, Settings

ROUNDS = 2  # merges after the creating round: 86 s, 55 s, 42 s for the first three batches
RECORDS = 20
SHIPPED = REPO_ROOT / "contracts"


def scratch(settings: Settings) -> Settings:
    """The warm-up's own lakehouse: its home beside the server's state, its data there too (a
    bucket's lake: under ``_warmup`` in it), the shipped contracts."""
    home = warmup.folder(settings)
    data = settings.data_root / "_warmup" if settings.remote else home
    return Settings(home=home, contracts_dir=SHIPPED, spark_master=settings.spark_master, data=data)


def warm(
    settings: Settings, *, batches: int | None = None, echo: Callable[[str], None] = print
) -> None:
    """Run the warm-up's batches on the server of ``settings``' lakehouse: ``batches`` of them,
    by default :data:`ROUNDS`, and one more first when the scratch lake has no tables yet."""
    from lakehouse.pipeline.runner import run
    from lakehouse.topics import samples

    catalog = Catalog.load(SHIPPED)
    lake = scratch(settings)
    spark = server.connect(settings)  # the real server (its data is the real lake's)

    def run_batches(made: bool) -> None:
        _share_the_validation_service(settings, lake)
        n = batches or ROUNDS + (0 if made else 1)
        for i in range(n):
            for contract in catalog:
                samples.generate(lake, contract, RECORDS, seed=int(time.time()) + i)
            began = time.monotonic()
            run(spark, lake, catalog, echo=lambda _line: None)
            echo(f"warm-up batch {i + 1} of {n}: {time.monotonic() - began:.1f} s")

    made = objectstore.exists(lake.tables_root)
    try:
        run_batches(made)
    except Exception:  # the scratch lake is stale: made again from empty, once
        if not made:
            raise
        echo(
            "warm-up: a batch failed on the kept scratch lake; making it again\n"
            f"{traceback.format_exc()}"
        )
        _remove(lake)
        run_batches(False)
    finally:
        with contextlib.suppress(Exception):
            spark.stop()


def _share_the_validation_service(settings: Settings, lake: Settings) -> None:
    """The scratch lake's gates validate in the server's validation service: its socket, where
    the scratch lakehouse's gates look for it (a link to the server's own)."""
    link = server.validation_socket(lake)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(server.validation_socket(settings))


def _remove(lake: Settings) -> None:
    objectstore.remove_tree(lake.data_root)
    shutil.rmtree(lake.home, ignore_errors=True)
    lake.home.mkdir(parents=True, exist_ok=True)


def main() -> int:
    settings = Settings.from_env()
    began = time.monotonic()
    try:
        warm(settings)
    except Exception as e:  # said in the record; the server is left as it is
        traceback.print_exc()
        warmup.finish(settings, began, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        return 1
    warmup.finish(settings, began)
    print(f"warm-up: done in {time.monotonic() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
