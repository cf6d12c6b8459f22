"""Helpers the test modules share (imported by name: ``from lakes import ...``): a lakehouse made
of contracts (:func:`lake_with`, :func:`shipped_topic`, the :data:`ORDERS` topic), records
produced to its topics (:func:`record`, :func:`produce`), the pipeline run on it with its lines
kept (:func:`run_pipeline`, :func:`run_layers`), a table's rows (:func:`rows`, :func:`records`),
the ``lakehouse`` command in a process of its own (:func:`lakehouse`), the processes running a
command (:func:`processes_with`), the size of the fault rounds and of the property tests, the
test S3 API's description, a lakehouse's settings on local files or in the test bucket, and a
local server the whole test run shares (:func:`shared_by_the_run`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lakehouse.runtime import process
from lakehouse.runtime.config import LAYERS, REPO_ROOT, Settings
from lakehouse.runtime.objectstore import Location
from lakehouse.topics.landing import Producer, Record, RecordMetadata

T = TypeVar("T")

S3_REGION = "us-east-1"

# The one setting for the size of every fault test (all marked ``reliability``): how many times
# each kills its target (kill -9 of a writer, a job, the Spark server, the broker) or cuts the
# store. `make reliability` runs 20, CI's short rounds 1; 1 when a module is run by hand.
KILLS = int(os.environ.get("LAKEHOUSE_RELIABILITY_KILLS", "1"))

# The one setting for the gold property tests (Hypothesis): how many histories each draws
# beside its written examples (the histories chosen by hand for what they exercise). An example
# is one to three pipeline runs of 10-40 s here. make test runs the written examples alone (0);
# CI draws 2 more, the same 2 on every run (the tests/conftest.py profile is derandomized: its
# time and its verdict do not change by chance); make reliability draws 8 new ones each run.
DRAWS = int(os.environ.get("LAKEHOUSE_PROPERTY_DRAWS", "0"))


def histories() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The Hypothesis settings of a gold property test: its written examples, then
    :data:`DRAWS` drawn histories (none: the written examples alone), with no deadline (a
    pipeline run takes seconds) and no health check (the strategies draw whole histories)."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=max(DRAWS, 1),
        phases=(Phase.explicit,) if DRAWS == 0 else tuple(Phase),  # tuple(Phase): the default
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@dataclass(frozen=True)
class S3Store:
    """The test session's S3 API: its endpoint, a bucket made for the tests, and ``env``, what a
    lakehouse process needs in its environment to use them (the session's ``spark`` fixture
    exports it when the run has tests marked ``s3``: a JVM reads its environment once)."""

    endpoint: str
    bucket: str
    root: Path
    pid: int
    secret: str  # the secret access key (moto checks none): the run's own

    @property
    def env(self) -> dict[str, str]:
        return {
            "LAKEHOUSE_S3_ENDPOINT": self.endpoint,
            "LAKEHOUSE_S3_PATH_STYLE": "true",
            "LAKEHOUSE_S3_REGION": S3_REGION,
            # moto checks no credentials; S3 clients still sign every request with some.
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": self.secret,
        }


# A fixture parametrized with these runs its tests on local files and, marked ``s3``, on the
# test S3 API: the same tests, the same assertions (`make test-s3` runs the S3 ones alone).
STORAGES = ["local", pytest.param("s3", marks=pytest.mark.s3)]


def lake_settings(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    contracts: Path = REPO_ROOT / "contracts",
) -> Settings:
    """The body of a ``settings`` fixture parametrized with :data:`STORAGES`: a fresh lakehouse
    with the ``contracts`` (default: the shipped ones), its data under the home or under a
    prefix of its own in the test bucket (``LAKEHOUSE_DATA``), set in this process's
    environment for the test."""
    from lakehouse.runtime import objectstore

    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
    if request.param == "s3":
        request.getfixturevalue("spark")  # started with the store's settings
        store: S3Store = request.getfixturevalue("s3_server")
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("LAKEHOUSE_DATA", f"s3://{store.bucket}/{tmp_path.name}")
    objectstore.reset()
    request.addfinalizer(objectstore.reset)
    return Settings.from_env()


def lake_with(root: Path, *contracts: str, data: str | None = None) -> Settings:
    """A lakehouse under ``root`` (its home ``root/home``) whose contracts folder holds
    ``contracts``: each a topic's YAML text, in a file named after its ``topic``; its tables
    under ``data`` (default: under the home)."""
    import yaml

    folder = root / "contracts"
    folder.mkdir(parents=True, exist_ok=True)
    for text in contracts:
        (folder / f"{yaml.safe_load(text)['topic']}.yaml").write_text(text)
    return Settings.from_env(root / "home", folder, data)


# A JSON topic of orders with two partitions, up to its stream: a test adds its tables and
# expectations.
ORDERS = """\
topic: orders
partitions: 2
key: {format: string, name: order_id}
value:
  format: json
  fields:
    - {name: city, type: string}
    - {name: amount, type: long}
stream: {name: orders_stream}
"""

# A record as a test writes it: its key (None: no key) and its value (see :func:`record`).
Event = tuple[str | None, Any]


def record(
    key: str | None, value: Any, *, partition: int | None = 0, timestamp_ms: int | None = None
) -> Record:
    """The record a producer of a JSON topic sends: the key as UTF-8, the value as JSON text
    (bytes as they are, say a value that does not decode; None, a tombstone), in ``partition``
    (default 0: one partition, so offset order is the order of the test's history; None: the
    partition Kafka's default partitioner picks) at ``timestamp_ms`` (None: when it is sent)."""
    if value is not None and not isinstance(value, bytes):
        value = json.dumps(value).encode()
    return Record(
        None if key is None else key.encode(), value, timestamp_ms=timestamp_ms, partition=partition
    )


def produce(
    lake: Settings, topic: str, events: Iterable[Event | Record], *, partition: int | None = 0
) -> list[RecordMetadata]:
    """Append ``events`` to ``topic``'s landing partitions (as many as its contract has) in one
    batch, as the producer of ``lakehouse produce`` does: each ``(key, value)`` as
    :func:`record` makes it in ``partition``, a :class:`Record` as it is. Returns each one's
    partition and offset, in order."""
    from lakehouse.contracts.catalog import Catalog

    partitions = Catalog.load(lake.contracts_dir).topic(topic).partitions
    return Producer(lake, topic, partitions).send_batch(
        e if isinstance(e, Record) else record(*e, partition=partition) for e in events
    )


def run_pipeline(
    spark: Any, lake: Settings, layers: Sequence[str] = LAYERS, topics: Sequence[str] = ()
) -> list[str]:
    """One micro-batch of the ``layers`` (default all) of the ``topics`` (default all) of the
    lakehouse's contracts, layer by layer across topics (a gold join sees the other topic's
    stream as of this run); the lines it would print, printed nowhere."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.pipeline.runner import run

    lines: list[str] = []
    catalog = Catalog.load(lake.contracts_dir)
    run(spark, lake, catalog, layers=layers, topics=topics, echo=lines.append)  # type: ignore[arg-type]
    return lines


def run_layers(
    spark: Any,
    lake: Settings,
    topic: str,
    *layers: str,
    run_id: str = "manual__test",
    params: Mapping[str, Any] | None = None,
    tables: Sequence[str] | None = None,
) -> list[str]:
    """Each of ``layers`` of ``topic``, in the order given, as the layer tasks of the DAG run
    ``run_id`` triggered with ``params`` run them, of a DAG whose gold step builds ``tables``
    (default: every table of the topic); each layer's lines, printed nowhere."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.pipeline.request import RunRequest
    from lakehouse.pipeline.runner import run_layer
    from lakehouse.quality.ledger import RunInfo

    contract = Catalog.load(lake.contracts_dir).topic(topic)
    request = RunRequest.from_params(params or {}, contract, tables)
    lines: list[str] = []
    for layer in layers:
        lines += run_layer(
            spark,
            lake,
            contract,
            layer,  # type: ignore[arg-type]
            run=RunInfo(dag_run_id=run_id),
            echo=lines.append,
            request=request,
        )
    return lines


# The shipped user-locations topic's first two gold tables, the ones `make demo` prints: what a
# test of a whole micro-batch reads when which gold tables the topic has does not matter.
DEMO_TABLES = ("user_latest_location", "user_location_counts")


def shipped_topic(folder: Path, topic: str, tables: Sequence[str]) -> Path:
    """A contracts ``folder`` holding the shipped contract of ``topic`` with only its gold
    ``tables`` (and their expectations), for tests of what the other tables do not change: a
    micro-batch of the shipped topic builds ten. The files the contract names (an Avro topic's
    schemas, in a folder named after the topic) come along. Returns the folder."""
    import shutil

    import yaml

    contract = yaml.safe_load((REPO_ROOT / "contracts" / f"{topic}.yaml").read_text())
    contract["tables"] = [t for t in contract["tables"] if t["name"] in tables]
    assert [t["name"] for t in contract["tables"]] == list(tables), "no such shipped table"
    checks = contract.get("expectations", {})
    if "gold" in checks:
        checks["gold"] = [c for c in checks["gold"] if c["table"] in tables]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{topic}.yaml").write_text(yaml.safe_dump(contract, sort_keys=False))
    if (REPO_ROOT / "contracts" / topic).is_dir():
        shutil.copytree(REPO_ROOT / "contracts" / topic, folder / topic)
    return folder


def row_order(row: Sequence[Any]) -> tuple[tuple[bool, Any], ...]:
    """The order :func:`rows` sorts in: by each value, a null after any value."""
    return tuple((value is None, value) for value in row)


def rows(path: Location, *columns: str, version: int | None = None) -> list[tuple[Any, ...]]:
    """The ``columns`` of a table's rows (at ``version``, default the latest), as tuples in
    :func:`row_order`; [] if there is no table."""
    from lakehouse.storage import is_table, read_arrow

    if not is_table(path):
        return []
    data = read_arrow(path, version).to_pylist()
    return sorted((tuple(r[c] for c in columns) for r in data), key=row_order)


def records(path: Location, *, by: Sequence[str] = ()) -> list[dict[str, Any]]:
    """A table's rows as dicts, sorted by the ``by`` columns (else by their whole content); []
    if there is no table."""
    from lakehouse.storage import is_table, read_arrow

    if not is_table(path):
        return []
    data = read_arrow(path).to_pylist()
    if by:
        return sorted(data, key=lambda r: row_order([r[c] for c in by]))
    return sorted(data, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def lakehouse(
    home: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``lakehouse --home <home> <args>`` in a process of its own, with none of this process's
    ``LAKEHOUSE_*`` settings and ``env`` added; its output captured."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    return subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", "--home", str(home), *args],
        env=clean | dict(env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def processes_with(*words: str) -> list[int]:
    """The pids of the running processes whose command line has each of ``words`` as one of its
    arguments (read from /proc)."""
    wanted = [word.encode() for word in words]
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # the process ended while the folder was read
            continue
        if all(word in args for word in wanted):
            found.append(int(cmdline.parent.name))
    return found


@contextlib.contextmanager
def shared_by_the_run(
    factory: pytest.TempPathFactory,
    name: str,
    start: Callable[[Path], T],
    stop: Callable[[Path], object],
) -> Iterator[T]:
    """A local server the whole test run shares, kept in ``<the run's temp folder>/<name>``:
    every test process (xdist worker) that needs it calls ``start(folder)``, which starts it
    unless it runs there already and returns how to reach it; the last process to finish with
    it calls ``stop(folder)``. A count of its users is kept beside it, under a lock: a process
    never finds it half started, nor stopped under another."""
    shared = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    folder = shared / name
    folder.mkdir(exist_ok=True)
    users = folder / "users"
    with process.start_lock(folder):
        started = start(folder)
        users.write_text(str(int(users.read_text() if users.exists() else 0) + 1))
    try:
        yield started
    finally:
        with process.start_lock(folder):
            left = int(users.read_text()) - 1
            users.write_text(str(left))
            if left == 0:
                stop(folder)


# The suite of the one validation :func:`save_failing_validation` saves.
FAILING_SUITE = "silver.demo_stream"


def save_failing_validation(settings: Settings) -> None:
    """Save one validation result of ``silver.demo_stream`` whose only expectation (a city in
    a set) fails on one of two rows: what the Data Docs tests build a site from."""
    import pyarrow as pa

    from lakehouse.contracts.model import Expectation
    from lakehouse.quality.ledger import RunInfo, save_result
    from lakehouse.quality.verdict import Verdict, run_suite

    exps = [
        Expectation(
            layer="silver",
            name="city_known",
            expect="in_set",
            severity="warn",
            column="city",
            params=(("values", ("Berlin", "Lima")),),
        )
    ]
    batch = pa.table({"city": ["Berlin", "Paris"]})
    outcomes, engine, result = run_suite(FAILING_SUITE, exps, batch, batch.num_rows)
    assert not all(o.success for o in outcomes), "the tests need a failing expectation"
    verdict = Verdict("silver", "demo_stream", outcomes, batch.num_rows, engine, result)
    assert save_result(settings, verdict, RunInfo()) is not None
