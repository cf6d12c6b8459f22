"""Records arriving start a run: a Kafka-sourced topic's pipeline DAG, unpaused and never
triggered by hand, runs when records are produced to its broker topic; and a broken contract in
the same folder breaks only its own DAG.

The stack is docker-compose.yml's, run on this machine from the same settings: each service's
command and environment are taken from the compose file with .env.example filled in as a user
fills it (tests/compose_file.py, as tests/unit/test_compose.py reads them), and started as
compose starts them: the deployment check, airflow-init's script, the Spark server
(`lakehouse spark run`), then Airflow 3's api-server, scheduler, DAG processor and triggerer
(`lakehouse airflow ...`: LocalExecutor on PostgreSQL, the layer tasks clients of that Spark
server, found through the shared lakehouse home as the scheduler finds it in compose's network
namespace and volume). The services compose runs in containers of other images have this
machine's stand-ins: the session's PostgreSQL cluster, its S3 API (moto) with the bucket
minio-init makes, its Kafka broker. Only their addresses and the container paths are mapped
(:class:`ThisMachine`); the data is in the bucket, as LAKEHOUSE_DATA says.

The DAG is scheduled on its time schedule or on the Asset that Airflow's Kafka message-queue
trigger watches (lakehouse.orchestration.assets.records_asset). Unpausing it also starts its first
interval run; the records are produced once the trigger's consumer has joined its group and that
run is done, and the run the asset events create must take them through bronze, silver and gold,
alone.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from airflow_stack import Airflow, free_port, wait_healthy

from compose_file import container_env, environment, filled_env, published, service, services
from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract
from lakehouse.orchestration.airflow_env import kafka_trigger_group
from lakehouse.runtime import deployment, objectstore, server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.postgres import Cluster
from lakehouse.storage import read_arrow
from lakehouse.storage.store import table_version
from lakehouse.topics import kafka
from lakehouse.topics import produce as producing
from lakehouse.topics.landing import Record
from lakes import S3_REGION, S3Store

pytestmark = [pytest.mark.e2e, pytest.mark.s3, pytest.mark.timeout(900)]

TOPIC = "kt-checkins"
DAG_ID = f"pipeline__{TOPIC}"
LATEST, COUNTS = "kt_latest_location", "kt_checkin_counts"
EVENTS = [("alice", "Paris"), ("bob", "Lima"), ("alice", "Rome"), ("carol", "Quito")]
BASE_MS = 1_700_000_000_000
BROKEN = "kt-broken"
BROKEN_TEXT = """\
topic: kt-broken
partitions: 1
key: {format: string, name: id}
value: {format: json, fields: [{name: amount, type: long}]}
stream: {name: kt_broken}
tabels: [{name: kt_broken_latest, kind: latest}]
"""
# The Airflow services, in the order compose starts them (the scheduler once the Spark server is
# healthy), each named by its component (its command's third word: `lakehouse airflow <it>`).
AIRFLOW_SERVICES = (
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
# What the image installs, which on this machine is the checkout's virtualenv (its `python`,
# `lakehouse` and `airflow` first on PATH): the image's ENV of it is left out.
IMAGE_INSTALLATION = ("JAVA_HOME", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


def _contract_text(kafka_topic: str) -> str:
    # No bootstrap_servers: the topic is read from the broker compose gives every service
    # (LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS).
    return f"""\
topic: {TOPIC}
description: Check-ins from a Kafka broker, for the trigger test.
partitions: 2
schedule_minutes: 60
key: {{format: string, name: username}}
value:
  format: json
  fields:
    - {{name: location, type: string, nullable: true}}
stream: {{name: kt_checkins}}
tables:
  - {{name: {LATEST}, kind: latest}}
  - name: {COUNTS}
    kind: aggregate
    aggregations:
      - {{name: count, fn: count}}
kafka: {{topic: {kafka_topic}}}
"""


# -- docker-compose.yml's stack on this machine -----------------------------------------------
@dataclass(frozen=True)
class ThisMachine:
    """Where compose's stack is on this machine: the one mapping from compose's settings to this
    test's. A service compose runs from another image is reached at its stand-in's address
    instead of its own; a path in the containers is a folder here. Everything else in a
    service's command and environment is compose's, as the filled .env gives it."""

    dotenv: dict[str, str]
    addresses: dict[str, str]  # a service's address in the compose network -> its stand-in's
    paths: dict[str, Path]  # a path in the containers -> a folder here
    api_port: int  # airflow-apiserver's port 8080, published on AIRFLOW_UI_ADDRESS
    spark_port: int  # localhost:15002 in spark-server's network namespace (LAKEHOUSE_SPARK_PORT)
    catalog_port: (
        int  # the readers' catalog, 9083 in spark-server's network (LAKEHOUSE_CATALOG_PORT)
    )
    logs: Path

    def value(self, text: str) -> str:
        for path in sorted(self.paths, key=len, reverse=True):
            if text == path or text.startswith(path + "/"):
                return str(self.paths[path]) + text[len(path) :]
        for address, here in self.addresses.items():
            text = text.replace(address, here)
        return text

    def environment(self, name: str) -> dict[str, str]:
        """What a process of service ``name`` gets: this machine's environment without a
        deployment's variables, then the service's (:func:`compose_file.container_env`) mapped."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(deployment.PREFIXES)}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        for key, value in container_env(name, self.dotenv).items():
            if key not in IMAGE_INSTALLATION:
                env[key] = self.value(value)
        svc = service(name, self.dotenv)
        if name == "airflow-apiserver":
            # It listens on every interface of its container, published on the host's
            # AIRFLOW_UI_ADDRESS: here, that address.
            ((address, _),) = published(svc).values()
            env["AIRFLOW__API__HOST"] = address
        if name == "spark-server" or svc.get("network_mode") == "service:spark-server":
            env[server.PORT_ENV] = str(self.spark_port)
            env[server.CATALOG_PORT_ENV] = str(self.catalog_port)
        return env

    def command(self, name: str) -> list[str]:
        args = [str(arg) for arg in service(name, self.dotenv)["command"]]
        if name == "airflow-apiserver":
            args[args.index("--port") + 1] = str(self.api_port)
        return args

    def run(self, name: str, timeout: float = 600) -> None:
        """Run a service that exits when done (config-check, airflow-init): it must succeed."""
        done = subprocess.run(
            self.command(name),
            env=self.environment(name),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{name} exited with {done.returncode}:\n{done.stderr[-3000:]}"

    def start(self, name: str, log_name: str | None = None) -> subprocess.Popen[bytes]:
        """Start a long-running service in a session of its own, its output to
        logs/<log_name or name>.log."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{log_name or name}.log").open("wb") as log:
            return subprocess.Popen(
                self.command(name),
                env=self.environment(name),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def settings(self, name: str) -> Settings:
        """The lakehouse a process of service ``name`` finds from its environment."""
        env = self.environment(name)
        return Settings.from_env(
            env["LAKEHOUSE_HOME"], env["LAKEHOUSE_CONTRACTS"], env["LAKEHOUSE_DATA"]
        )


def this_machine(
    root: Path, contracts: Path, postgres: Cluster, broker: Any, store: S3Store
) -> ThisMachine:
    """Compose's stack mapped to this machine, its stand-ins made ready as compose's services
    would be (the metadata database, the bucket)."""
    dotenv = filled_env()
    db = environment(service("postgres", dotenv))
    home, airflow_home = root / "lakehouse", root / "airflow"
    # The image makes these, and compose mounts the volumes `lakehouse`, `airflow-logs` and
    # `airflow-auth` on them: one folder each here, shared by every service as the volumes are.
    for folder in (home, airflow_home / "logs", airflow_home / "auth"):
        folder.mkdir(parents=True)
    api_port = free_port()
    return ThisMachine(
        dotenv=dotenv,
        addresses={
            f"postgres:5432/{db['POSTGRES_DB']}": _postgres_service(
                postgres, db, db["POSTGRES_DB"]
            ),
            # The Spark server's metastore (LAKEHOUSE_METASTORE_URL), on the same service.
            "postgres:5432/metastore": _postgres_service(postgres, db, "metastore"),
            # The schema registry's, which airflow-init creates (the registry's image is not run).
            "postgres:5432/registry": _postgres_service(postgres, db, "registry"),
            "minio:9000": _minio_service(store, dotenv),
            "kafka:9092": broker.bootstrap_servers,
            "airflow-apiserver:8080": f"127.0.0.1:{api_port}",
        },
        paths={
            "/lakehouse": home,
            "/opt/airflow": airflow_home,
            "/opt/lakehouse/contracts": contracts,  # the image's contracts: the test's
            "/opt/lakehouse": REPO_ROOT,  # the image's project (DAGs, jobs): this checkout
        },
        api_port=api_port,
        spark_port=free_port(),
        catalog_port=free_port(),
        logs=root / "logs",
    )


def _postgres_service(cluster: Cluster, db: dict[str, str | None], name: object) -> str:
    """compose's `postgres` in the session's cluster: its user with its password, owning a
    database ``name`` of its own, as the postgres image makes POSTGRES_USER and POSTGRES_DB
    (under another name each run: the cluster has databases of its own). Its address and
    database."""
    import psycopg
    from psycopg import sql

    user, password = db["POSTGRES_USER"], db["POSTGRES_PASSWORD"]
    database = f"{name}_{secrets.token_hex(4)}"
    url = cluster.url("postgres").replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(url, autocommit=True) as conn:
        known = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone()
        role = sql.SQL("ALTER ROLE {} PASSWORD {}" if known else "CREATE ROLE {} LOGIN PASSWORD {}")
        conn.execute(role.format(sql.Identifier(str(user)), sql.Literal(password)))
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(str(user))
            )
        )
    return f"127.0.0.1:{cluster.status().port}/{database}"


def _minio_service(store: S3Store, dotenv: dict[str, str]) -> str:
    """compose's `minio` and `minio-init`: the session's S3 API with the bucket minio-init makes
    (moto checks no credentials, so the lakehouse's user and its policy have no stand-in). Its
    address."""
    import boto3

    bucket = environment(service("minio-init", dotenv))["LAKEHOUSE_BUCKET"]
    client = boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        region_name=S3_REGION,
        aws_access_key_id=dotenv["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=dotenv["AWS_SECRET_ACCESS_KEY"],
    )
    if bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=bucket)
    return urlsplit(store.endpoint).netloc


class ComposeAirflow(Airflow):
    """The Airflow services' REST API, logged in as the admin airflow-init writes."""

    @property
    def password(self) -> str:
        path = Path(self.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
        return str(json.loads(path.read_text())["admin"])


@contextlib.contextmanager
def compose_up(here: ThisMachine) -> Iterator[ComposeAirflow]:
    """Start the stack's services of the project's image as compose does, each with its own
    command and environment; stop every process at the end."""
    here.run("config-check")
    with contextlib.ExitStack() as stack:
        spark = here.start("spark-server")
        stack.callback(_stop_spark_server, spark, here.settings("spark-server"))
        here.run("airflow-init")  # while the Spark server starts
        _wait_for_spark_server(here, spark)
        airflow = ComposeAirflow(
            here.settings("airflow-scheduler"),
            here.environment("airflow-scheduler"),
            here.api_port,
            here.logs,
        )
        stack.callback(airflow.stop)
        for name in AIRFLOW_SERVICES:
            component = here.command(name)[2]  # `lakehouse airflow <component>`: its log's name
            airflow.procs[component] = here.start(name, component)
        wait_healthy(airflow, 300, tuple(airflow.procs))
        yield airflow


def _wait_for_spark_server(
    here: ThisMachine, spark: subprocess.Popen[bytes], timeout: float = 300
) -> None:
    """Until spark-server's health check (`lakehouse spark status`) passes, as the scheduler
    waits for it."""
    check = [str(arg) for arg in services()["spark-server"]["healthcheck"]["test"][1:]]
    deadline = time.monotonic() + timeout
    while not server.status(here.settings("spark-server")).running:
        log = (here.logs / "spark-server.log").read_text(errors="replace")[-3000:]
        assert spark.poll() is None, f"spark-server exited with {spark.returncode}:\n{log}"
        assert time.monotonic() < deadline, f"spark-server not up after {timeout} s:\n{log}"
        time.sleep(1)
    done = subprocess.run(
        check, env=here.environment("spark-server"), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{check}: {done.stdout}{done.stderr}"


def _stop_spark_server(spark: subprocess.Popen[bytes], settings: Settings) -> None:
    """As compose stops it: SIGTERM to `lakehouse spark run`, which stops the server whole; what
    is left after a minute is stopped here."""
    with contextlib.suppress(ProcessLookupError):
        spark.send_signal(signal.SIGTERM)
    try:
        spark.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(spark.pid, signal.SIGKILL)
        spark.wait(timeout=10)
    server.stop(settings)


@dataclass
class Stack:
    settings: Settings
    contract: Contract
    airflow: Airflow
    spark_port: int  # where spark-server's Spark server listens


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    postgres: Cluster,
    kafka_broker: Any,
    s3_server: S3Store,
) -> Iterator[Stack]:
    """The stack up, the topic created on the broker, the DAG stored. This process is a client
    of the stack as `docker compose exec airflow-scheduler ...` is: the scheduler's lakehouse
    settings in its environment."""
    root = tmp_path_factory.mktemp("kafka-trigger")
    contracts = root / "contracts"
    contracts.mkdir()
    kafka_topic = f"kt-checkins-{uuid.uuid4().hex[:8]}"
    (contracts / f"{TOPIC}.yaml").write_text(_contract_text(kafka_topic))
    # Beside it, a contract with a misspelled field: it must break its own DAG and nothing else.
    (contracts / f"{BROKEN}.yaml").write_text(BROKEN_TEXT)
    here = this_machine(root, contracts, postgres, kafka_broker, s3_server)
    try:
        with compose_up(here) as airflow, pytest.MonkeyPatch.context() as mp:
            for key, value in here.environment("airflow-scheduler").items():
                if key.startswith(("LAKEHOUSE_", "AWS_")):
                    mp.setenv(key, value)
            objectstore.reset()
            settings = here.settings("airflow-scheduler")
            contract = Catalog.load_each(contracts).topic(TOPIC)  # beside a broken contract
            assert producing.create_topic(settings, contract, io.StringIO()) == 0
            airflow.wait_for_dag(DAG_ID)
            yield Stack(settings, contract, airflow, here.spark_port)
    finally:
        objectstore.reset()


def _wait_for_trigger_consumer(stack: Stack, timeout: float = 180) -> None:
    """Until the trigger's consumer holds the topic's partitions in its group: it reads from the
    end of the topic the first time, so records produced before that would not start a run."""
    from confluent_kafka import ConsumerGroupState, KafkaException
    from confluent_kafka.admin import AdminClient

    client = kafka.client(stack.settings, stack.contract)
    admin = AdminClient({"bootstrap.servers": client.bootstrap_servers})
    group = kafka_trigger_group(TOPIC)
    deadline = time.monotonic() + timeout
    state: Any = None
    assigned: list[int] = []
    while True:
        try:
            described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        except KafkaException as exc:  # no such group yet: its coordinator does not know it
            state = exc.args[0]
        else:
            state = described.state
            assigned = [
                tp.partition
                for member in described.members
                for tp in (member.assignment.topic_partitions if member.assignment else [])
            ]
            if state == ConsumerGroupState.STABLE and sorted(assigned) == [0, 1]:
                return
        stack.airflow.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the Kafka trigger's group {group} is {state} with partitions {assigned} "
                f"after {timeout} s\n" + stack.airflow.log_tail("triggerer")
            )
        time.sleep(1)


def _trigger_behind(stack: Stack) -> int:
    """Records of the topic the trigger's group has not committed yet (not read through)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    client = kafka.client(stack.settings, stack.contract)
    admin = AdminClient({"bootstrap.servers": client.bootstrap_servers})
    group = kafka_trigger_group(TOPIC)
    answer = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    committed = {tp.partition: tp.offset for tp in answer[group].result().topic_partitions}
    ends = kafka.offsets(client, stack.contract.partitions)
    return sum(end - max(committed.get(p, 0), 0) for p, (_, end) in ends.items())


def _runs(airflow: Airflow, run_type: str) -> list[dict[str, Any]]:
    return [r for r in airflow.dag_runs(DAG_ID) if r["run_type"] == run_type]


def _kafka_events(airflow: Airflow) -> list[dict[str, Any]]:
    reply = airflow.api("GET", "/assets/events?limit=100")["asset_events"]
    return [e for e in reply if e["name"] == f"kafka.{TOPIC}"]


def test_records_arriving_start_a_run_that_takes_them_to_gold(stack: Stack) -> None:
    airflow = stack.airflow
    started = time.monotonic()
    airflow.set_paused(DAG_ID, False)
    _wait_for_trigger_consumer(stack)
    print(f"\ntrigger consuming {time.monotonic() - started:.1f} s after unpausing")
    # Unpausing also started the DAG's interval run at once (catchup off): it finds nothing and
    # must be done before the records are produced, so that only the trigger can take them.
    while not (scheduled_runs := _runs(airflow, "scheduled")):
        assert time.monotonic() < started + 60, "no interval run after unpausing"
        time.sleep(0.5)
    (scheduled,) = scheduled_runs
    assert airflow.wait_for_run(DAG_ID, scheduled["dag_run_id"])["state"] == "success"
    print(f"interval run done {time.monotonic() - started:.1f} s after unpausing")
    assert (
        not objectstore.exists(stack.settings.bronze_path(TOPIC))
        or not read_arrow(stack.settings.bronze_path(TOPIC)).num_rows
    )

    records = [
        Record(user.encode(), json.dumps({"location": place}).encode(), BASE_MS + 60_000 * i)
        for i, (user, place) in enumerate(EVENTS)
    ]
    client = kafka.client(stack.settings, stack.contract)
    kafka.Producer(client, stack.contract.partitions).send_batch(records)
    produced = time.monotonic()

    while not (runs := _runs(airflow, "asset_triggered")):
        airflow.check_alive()
        assert time.monotonic() < produced + 120, airflow.log_tail("triggerer")
        time.sleep(0.5)
    created = time.monotonic()
    (run,) = runs
    finished = airflow.wait_for_run(DAG_ID, run["dag_run_id"], timeout=600)
    print(
        f"asset-triggered run created {created - produced:.1f} s after producing, "
        f"{finished['state']} {time.monotonic() - produced:.1f} s after"
    )
    assert finished["state"] == "success", _tasks(airflow, run["dag_run_id"])
    assert finished["triggered_by"] == "asset"
    # Its layers ran on spark-server's Spark server, which the scheduler's `lakehouse airflow`
    # found through the shared home, as in compose's shared network namespace and volume.
    for layer in ("bronze", "silver", "gold"):
        log = airflow.task_log(DAG_ID, run["dag_run_id"], layer)
        assert f"on the Spark server at localhost:{stack.spark_port}" in log, log[-2000:]

    # It took the records through every layer.
    bronze = read_arrow(stack.settings.bronze_path(TOPIC)).to_pylist()
    assert sorted(r["key"] for r in bronze) == sorted(u.encode() for u, _ in EVENTS)
    assert read_arrow(stack.settings.silver_path(stack.contract.stream)).num_rows == len(EVENTS)
    gold = {t: read_arrow(stack.settings.gold_path(t)).to_pylist() for t in (LATEST, COUNTS)}
    assert {r["username"]: r["location"] for r in gold[LATEST]} == {
        "alice": "Rome",
        "bob": "Lima",
        "carol": "Quito",
    }
    assert {r["username"]: r["count"] for r in gold[COUNTS]} == {"alice": 2, "bob": 1, "carol": 1}

    # Each layer task told what its batch changed: one asset event per table, carrying the
    # version it made, its rows and counts and the verdict; nothing for the quarantine (no bad
    # record), and nothing at all from the interval run before, which found nothing.
    stream = stack.contract.stream
    told = {
        e["name"]: e
        for e in airflow.api("GET", "/assets/events?limit=100")["asset_events"]
        if not e["name"].startswith("kafka.")
    }
    assert set(told) == {f"bronze.{TOPIC}", f"silver.{stream}", f"gold.{LATEST}", f"gold.{COUNTS}"}
    assert {e["source_run_id"] for e in told.values()} == {run["dag_run_id"]}
    paths = {
        f"bronze.{TOPIC}": stack.settings.bronze_path(TOPIC),
        f"silver.{stream}": stack.settings.silver_path(stream),
        f"gold.{LATEST}": stack.settings.gold_path(LATEST),
        f"gold.{COUNTS}": stack.settings.gold_path(COUNTS),
    }
    for name, path in paths.items():
        extra = told[name]["extra"]
        assert extra["table_version"] == table_version(path), (name, extra)
        assert extra["verdict"]["outcome"] == "published" and extra["quarantined"] == 0
        assert extra["dag_run_id"] == run["dag_run_id"]
    assert told[f"bronze.{TOPIC}"]["extra"]["rows"] == len(EVENTS)
    assert told[f"silver.{stream}"]["extra"]["rows"] == len(EVENTS)
    assert told[f"gold.{LATEST}"]["extra"]["rows"] == 3  # three users

    # The tables are in the bucket, under compose's LAKEHOUSE_DATA; nothing of them is under the
    # home (the volume `lakehouse`).
    data = environment(services()["airflow-scheduler"])["LAKEHOUSE_DATA"]
    assert str(stack.settings.data_root) == data
    tables = [
        stack.settings.bronze_path(TOPIC),
        stack.settings.silver_path(stack.contract.stream),
        *(stack.settings.gold_path(t) for t in (LATEST, COUNTS)),
    ]
    assert all(str(t).startswith(f"{data}/") for t in tables), tables
    assert all(objectstore.exists(t / "_delta_log") for t in tables), tables
    assert [p for p in stack.settings.home.rglob("*") if p.name == "_delta_log"] == []

    # The run consumed the Kafka asset's events, which name a record's place, not its content.
    path = f"/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents"
    consumed = airflow.api("GET", path)["asset_events"]
    assert consumed and {e["name"] for e in consumed} == {f"kafka.{TOPIC}"}, consumed
    assert all(set(e["extra"]["payload"]) == {"topic", "partition", "offset"} for e in consumed)

    # No storm: the burst made one run, not one each. What shows that the triggerer and the
    # scheduler are done with the burst is a later record's own event and run: the trigger reads
    # the topic in order and yields one event at a time (it starts again after each), so once
    # the event of a record produced after it read the burst through is stored, every event of
    # the burst is stored too, and the run it makes is the next one after the burst's.
    while behind := _trigger_behind(stack):
        assert time.monotonic() < produced + 120, f"the trigger is {behind} record(s) behind"
        time.sleep(0.5)
    late = Record(b"dave", json.dumps({"location": "Oslo"}).encode(), BASE_MS + 60_000 * 9)
    (placed,) = kafka.Producer(client, stack.contract.partitions).send_batch([late])
    late_place = {"topic": client.topic, "partition": placed.partition, "offset": placed.offset}
    deadline = time.monotonic() + 120
    while not [e for e in _kafka_events(airflow) if e["extra"]["payload"] == late_place]:
        airflow.check_alive()
        assert time.monotonic() < deadline, airflow.log_tail("triggerer")
        time.sleep(0.5)
    first = run["dag_run_id"]
    while not (later := [r for r in _runs(airflow, "asset_triggered") if r["dag_run_id"] != first]):
        assert time.monotonic() < deadline, "no run for the record produced after the burst"
        time.sleep(0.5)
    events = _kafka_events(airflow)
    burst = {e["id"] for e in events if e["extra"]["payload"] != late_place}
    print(
        f"{len(EVENTS)} records: {len(burst)} asset event(s), "
        f"{len(_runs(airflow, 'asset_triggered')) - 1} asset-triggered run(s)"
    )
    assert len(burst) < len(EVENTS)
    assert {e["id"] for e in consumed} == burst
    (after,) = later
    assert airflow.wait_for_run(DAG_ID, after["dag_run_id"], timeout=600)["state"] == "success"
    path = f"/dags/{DAG_ID}/dagRuns/{after['dag_run_id']}/upstreamAssetEvents"
    assert [e["extra"]["payload"] for e in airflow.api("GET", path)["asset_events"]] == [late_place]


def _tasks(airflow: Airflow, run_id: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in airflow.task_instances(DAG_ID, run_id)}


def test_a_broken_contract_beside_it_breaks_only_its_own_dag(stack: Stack) -> None:
    """The good topic's DAG is there and runs (the test above: its interval run and its
    asset-triggered run, with the broken file in the same folder all along); the DAG files parse
    without an import error; the broken contract's DAG says what is wrong and where; the
    maintenance DAG is there."""
    airflow = stack.airflow
    assert airflow.api("GET", "/importErrors")["import_errors"] == []
    broken = airflow.wait_for_dag(f"pipeline__{BROKEN}.broken")
    assert broken["dag_display_name"] == (
        f"pipeline__{BROKEN}: broken contract: {BROKEN}.yaml: unknown key 'tabels' (did you "
        "mean 'tables'?)"
    )
    assert broken["description"].startswith(f"broken contract {BROKEN}.yaml: ")
    assert "tabels" in broken["description"]
    assert {t["name"] for t in broken["tags"]} >= {"broken contract"}
    details = airflow.api("GET", f"/dags/pipeline__{BROKEN}.broken/details")
    assert str(stack.settings.contracts_dir / f"{BROKEN}.yaml") in details["doc_md"]
    assert airflow.wait_for_dag("lakehouse__maintenance")["dag_id"] == "lakehouse__maintenance"
    assert airflow.wait_for_dag(DAG_ID)["is_paused"] is False
