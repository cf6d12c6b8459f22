"""Shared fixtures: a temporary lakehouse root per test, one SparkSession and one Kafka Streams
oracle per test process, one Kafka broker and one S3 API for the whole run."""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest
from hypothesis import settings as hypothesis_settings

from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.process import free_port
from lakes import S3_REGION, S3Store, shared_by_the_run
from oracle import StreamsOracle

T = TypeVar("T")

# Spark's Python workers must run this interpreter (the one with `lakehouse` installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# The tests' batches are a few rows to a few thousand: the platform's settings for small
# micro-batches, for this process and every job it starts (spark-submit, Airflow, the CLI).
os.environ.setdefault("LAKEHOUSE_SHUFFLE_PARTITIONS", "1")
os.environ.setdefault("LAKEHOUSE_SPARK_CODEGEN", "off")
# The tests' servers live for a module or less: a warm-up of each would take the cores their
# batches need (tests/integration/test_warmup.py runs it).
os.environ.setdefault("LAKEHOUSE_SPARK_WARMUP", "off")
# The Spark server's SQL endpoint on a port of this test process's own (its default, 10000, is
# one port for the machine; a test that starts servers in parallel would find it taken). A test
# of the endpoint sets its own.
os.environ.setdefault("LAKEHOUSE_SQL_PORT", str(free_port()))
# Other Spark defaults for the tests' JVMs (see the file).
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).with_name("spark")))

# Hypothesis draws the same examples on every run that draws any (CI's; seeded from each test),
# so that a run's time and verdict do not change by chance; make reliability passes
# --hypothesis-profile=random and draws new ones each time (see lakes.DRAWS).
hypothesis_settings.register_profile("derandomized", derandomize=True)
hypothesis_settings.register_profile("random", derandomize=False)
hypothesis_settings.load_profile("derandomized")


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A fresh, empty lakehouse root with the shipped contracts."""
    home = tmp_path / "lakehouse"
    monkeypatch.setenv("LAKEHOUSE_HOME", str(home))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
    return Settings.from_env()


@pytest.fixture(scope="session")
def s3_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """What a JVM the run starts for good (a SparkSession, the Spark server) needs in its
    environment to use the run's S3 API, as a deployment's Spark would have it: the store's
    settings and credentials when the run has tests on S3 (marker ``s3``), else nothing. A JVM
    reads its environment once, when it starts."""
    if any(item.get_closest_marker("s3") for item in request.session.items):
        store: S3Store = request.getfixturevalue("s3_server")
        return store.env
    return {}


@pytest.fixture(scope="session")
def spark(s3_env: dict[str, str]) -> Iterator[object]:
    """One local SparkSession shared by every test that needs Spark, started with
    :func:`s3_env` in its environment (for its JVM and Python workers)."""
    from lakehouse.runtime.spark import get_session

    os.environ.update(s3_env)
    session = get_session("local[2]", app_name="lakehouse-tests")
    yield session
    session.stop()


@dataclass(frozen=True)
class KafkaBroker:
    """The test run's broker: where clients find it, and the folder it keeps."""

    bootstrap_servers: str
    root: Path
    pid: int


def _start_on_a_free_port(start: Callable[[int], T], error: type[Exception]) -> T:
    """``start(port)`` on a free port: one can be taken again before the server binds it (by
    another worker); then its start fails, and up to two more ports are tried."""
    for attempt in range(3):
        try:
            return start(free_port())
        except error:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One local Kafka broker (lakehouse.runtime.broker) for the whole test run, on a free port
    (:func:`lakes.shared_by_the_run`); stopped at the end, whatever the tests did. Tests share it:
    each uses topics of its own."""
    from lakehouse.runtime.broker import Broker, BrokerError

    def start(folder: Path) -> KafkaBroker:
        broker = Broker(folder / "kafka")
        status = _start_on_a_free_port(broker.start, BrokerError)
        assert status.bootstrap_servers is not None and status.pid is not None
        return KafkaBroker(status.bootstrap_servers, broker.root, status.pid)

    with shared_by_the_run(
        tmp_path_factory, "kafka-broker", start, lambda folder: Broker(folder / "kafka").stop()
    ) as broker:
        yield broker


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    """One local S3 API (lakehouse.runtime.s3server: moto's server, in memory) for the whole
    test run, on a free port (:func:`lakes.shared_by_the_run`), with one bucket; stopped at the
    end, whatever the tests did. Tests share the bucket: each uses keys of its own. moto checks
    no signature: the secret key is one of the run's own, so that a test can look for it where
    it must not be (logs, task output, reports)."""
    import boto3

    from lakehouse.runtime.s3server import S3Server, S3ServerError

    def start(folder: Path) -> S3Store:
        server = S3Server(folder / "s3")
        status = _start_on_a_free_port(server.start, S3ServerError)
        assert status.endpoint is not None and status.pid is not None
        secret = folder / "secret"
        if not secret.exists():
            secret.write_text(f"not-a-real-secret-{secrets.token_hex(8)}")
        store = S3Store(
            status.endpoint, "lakehouse-tests", server.root, status.pid, secret.read_text()
        )
        client = boto3.client(
            "s3",
            endpoint_url=store.endpoint,
            region_name=S3_REGION,
            aws_access_key_id=store.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=store.env["AWS_SECRET_ACCESS_KEY"],
        )
        if store.bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
            client.create_bucket(Bucket=store.bucket)
        return store

    with shared_by_the_run(
        tmp_path_factory, "s3-server", start, lambda folder: S3Server(folder / "s3").stop()
    ) as store:
        yield store


@pytest.fixture(scope="session")
def streams_oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamsOracle]:
    """Real Kafka Streams as an oracle (tests/oracle.py): one JVM per test process, started by
    the first test that asks for it (a few seconds: Java compiles the oracle first), ended at the
    end of the run. Its log is in the process's temp folder, streams-oracle*/oracle.log."""
    with StreamsOracle(tmp_path_factory.mktemp("streams-oracle") / "oracle.log") as oracle:
        yield oracle


@pytest.fixture
def layer_job() -> ModuleType:
    """jobs/run_layer.py, the spark-submit entry point, loaded as a module (it is a script
    beside the package, not part of it)."""
    spec = importlib.util.spec_from_file_location("run_layer", REPO_ROOT / "jobs" / "run_layer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The files whose tests take minutes (their sum, in `make test`'s durations on this machine),
# longest first. `make test` runs `pytest -n 2 --dist loadfile --no-loadscope-reorder`, which
# hands files out in collection order (xdist's default orders them by their number of tests,
# which put these last), one to each worker and then one at a time to the first one free: the
# long files first keep one worker from running the last of them alone while the other has
# nothing left to do.
LONGEST_FIRST = (
    "tests/e2e/test_airflow.py",
    "tests/integration/test_catalog.py",
    "tests/integration/test_readers.py",
    "tests/e2e/test_records_start_runs.py",
    "tests/integration/test_dbt.py",
    "tests/e2e/test_airflow_on_postgres.py",
    "tests/integration/test_semantics.py",
    "tests/integration/test_warmup.py",
    "tests/integration/test_history_tables.py",
    "tests/integration/test_readers_s3.py",
    "tests/e2e/test_data_quality_page.py",
    "tests/integration/test_registry_topics.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def order(item: pytest.Item) -> int:
        path = Path(str(item.path)).resolve()
        name = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else ""
        return rank.get(name, len(rank))

    items.sort(key=order)  # stable: each file's tests, and the other files, keep their order
