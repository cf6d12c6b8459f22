"""The platform on a Spark standalone cluster: a master and two workers started from pyspark's own
``bin/spark-class`` on 127.0.0.1. The first layer is submitted to it the way Airflow's
SparkSubmitOperator does for a ``spark`` connection (``spark-submit --master spark://...
jobs/run_layer.py``); then the lakehouse's Spark server is started with the cluster as its
master (``LAKEHOUSE_SPARK_MASTER``, the one setting), and the other layers of the sample
pipelines run as its clients (``lakehouse run --topic T --layer L``), as Airflow's tasks do.

The executors run in the workers' JVMs, not in the driver's, so this proves that the tasks (the
bronze parsers, silver's decoders, the Delta writer's Parquet files) and the driver's Delta commits
work when they are separate processes, and that the results equal local mode's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lakehouse.orchestration.airflow_env import airflow_environment
from lakehouse.runtime.config import REPO_ROOT, Layer, Settings
from lakehouse.runtime.process import find_java, free_port
from lakehouse.runtime.spark import conf_args, jvm_conf
from lakehouse.storage import changes_arrow, read_arrow

# 3 to 6 minutes of a CI worker (a master, a worker and their JVMs beside the suite's): `make
# reliability` runs it with the heavy fault rounds; neither make test nor CI does.
pytestmark = [pytest.mark.integration, pytest.mark.heavy]

JOB = REPO_ROOT / "jobs" / "run_layer.py"
# user-profiles first (as `make demo`): the gold joins of user-locations read its stream, silver
# `user_profile_changes`. Its own gold tables are read by nothing here, so they are left out to
# keep the test short. The first job is a spark-submit, the others are clients of the server.
SUBMITTED: tuple[str, Layer] = ("user-profiles", "bronze")
SERVED: tuple[tuple[str, Layer], ...] = (
    ("user-profiles", "silver"),
    ("user-locations", "bronze"),
    ("user-locations", "silver"),
    ("user-locations", "gold"),
)
SERVER_APP = "lakehouse-spark-server"
WORKERS = 2
START_TIMEOUT = 120.0
SUBMIT_TIMEOUT = 300


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"<{path}: {exc}>"


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Cluster:
    master_url: str
    webui_url: str
    work_dirs: list[Path]
    root: Path
    daemons: list[Daemon] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=10) as response:
            data: dict[str, Any] = json.load(response)
        return data

    def logs(self) -> str:
        return "\n".join(
            f"--- {d.name} (exit code {d.proc.poll()}), {d.log}:\n{_tail(d.log)}"
            for d in self.daemons
        )


def _daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    _java, _major, java_home = find_java()
    if java_home is not None:
        env["JAVA_HOME"] = str(java_home)
    env.update(
        {
            "SPARK_HOME": str(_spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "512m",
        }
    )
    # The daemons must not pick up a master, conf folder or ports meant for something else.
    for key in ("SPARK_CONF_DIR", "SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_PORT"):
        env.pop(key, None)
    return env


def _start(cluster: Cluster, name: str, args: list[str], env: dict[str, str]) -> None:
    log = cluster.root / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(_spark_home() / "bin" / "spark-class"), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cluster.root,
        )
    cluster.daemons.append(Daemon(name, proc, log))


def _stop(daemons: list[Daemon]) -> None:
    """Terminate, then kill what is left. spark-class execs the JVM, so each pid is the daemon's
    JVM; a worker ends its executors when it stops, and an executor whose worker is gone exits
    by itself (its WorkerWatcher)."""
    for daemon in reversed(daemons):  # workers first, then the master
        if daemon.proc.poll() is None:
            daemon.proc.terminate()
    deadline = time.monotonic() + 30
    for daemon in reversed(daemons):
        try:
            daemon.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait(timeout=30)


def _wait_for_workers(cluster: Cluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last: object = "no answer yet"
    while time.monotonic() < deadline:
        dead = [d for d in cluster.daemons if d.proc.poll() is not None]
        if dead:
            pytest.fail(
                f"Spark standalone daemon(s) {[d.name for d in dead]} exited during startup\n"
                + cluster.logs()
            )
        try:
            status = cluster.status()
        except (OSError, ValueError) as exc:  # not listening yet / half-written answer
            last = exc
        else:
            alive = [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]
            last = {"alive": len(alive), "workers": status.get("workers")}
            if len(alive) >= WORKERS:
                return
        time.sleep(1)
    pytest.fail(
        f"the standalone master at {cluster.webui_url}/json/ did not list {WORKERS} ALIVE "
        f"workers within {START_TIMEOUT:.0f} s (last answer: {last})\n" + cluster.logs()
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Spark standalone master and two one-core workers on 127.0.0.1."""
    root = tmp_path_factory.mktemp("spark-cluster")
    port, webui = free_port(), free_port()
    cluster = Cluster(
        master_url=f"spark://127.0.0.1:{port}",
        webui_url=f"http://127.0.0.1:{webui}",
        work_dirs=[root / f"worker-{i}" for i in range(1, WORKERS + 1)],
        root=root,
    )
    env = _daemon_env()
    try:
        _start(
            cluster,
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui)),
            ],
            env,
        )
        for i, work_dir in enumerate(cluster.work_dirs, start=1):
            work_dir.mkdir()
            _start(
                cluster,
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    cluster.master_url,
                    *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                    *("--webui-port", str(free_port()), "--work-dir", str(work_dir)),
                ],
                env,
            )
        _wait_for_workers(cluster)
        yield cluster
    finally:
        _stop(cluster.daemons)


def _cluster_conf(events: Path) -> dict[str, str]:
    """What a driver on the cluster runs with, beyond the platform's settings: both workers'
    cores, and an event log that tells which executor ran which task."""
    return {
        "spark.executor.memory": "512m",
        "spark.cores.max": str(WORKERS),
        # Wait for both executors before the first job (the standalone default waits 30 s).
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
    }


def _submit(
    cluster: Cluster, settings: Settings, events: Path, topic: str, layer: Layer
) -> subprocess.CompletedProcess[str]:
    """One layer's job, as Airflow's task submits it, with the cluster as master."""
    venv_submit = Path(sys.executable).parent / "spark-submit"
    submit = venv_submit if venv_submit.exists() else _spark_home() / "bin" / "spark-submit"
    env = airflow_environment(settings)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver listens where the executors can reach it
    # As many shuffle partitions as the cluster has cores (the platform's default is 8): the
    # shuffles still cross both executors, with a quarter of the tasks.
    env["LAKEHOUSE_SHUFFLE_PARTITIONS"] = str(WORKERS)
    cmd = [
        str(submit),
        *("--master", cluster.master_url),
        *("--name", f"lakehouse-{layer}-{topic}"),
        *("--conf", f"spark.pyspark.python={sys.executable}"),
        *("--conf", f"spark.pyspark.driver.python={sys.executable}"),
        # The platform's jars (spark.jars: the executors fetch them from the driver) and Delta.
        *conf_args(jvm_conf()),
        *conf_args(_cluster_conf(events)),
        *("--driver-memory", "1g"),
        str(JOB),
        *("--topic", topic, "--layer", layer),
    ]
    return _run(cluster, cmd, env)


def _run(cluster: Cluster, cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a job or a ``lakehouse`` command to its end; fail the test with its output and the
    cluster's logs if it does not end in time."""
    try:
        return subprocess.run(
            cmd,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBMIT_TIMEOUT,
            check=False,
            cwd=REPO_ROOT,
        )
    except subprocess.TimeoutExpired as exc:  # its output comes as bytes, whatever `text` says
        pytest.fail(
            f"{' '.join(cmd[-5:])} did not finish within {SUBMIT_TIMEOUT} s\n"
            f"stdout:\n{_text(exc.stdout)[-3000:]}\nstderr:\n{_text(exc.stderr)[-6000:]}\n"
            + cluster.logs()
        )


def _server_env(cluster: Cluster, settings: Settings, root: Path, events: Path) -> dict[str, str]:
    """The environment of ``lakehouse spark ...`` and its clients: the cluster as the server's
    master, a port of its own, and the drivers' cluster settings in a spark-defaults.conf."""
    from lakehouse.runtime import readers, server

    conf_dir = root / "spark-conf"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in _cluster_conf(events).items())
    )
    return airflow_environment(settings) | {
        "LAKEHOUSE_SPARK_MASTER": cluster.master_url,
        server.PORT_ENV: str(free_port()),
        readers.PORT_ENV: str(free_port()),
        readers.SQL_PORT_ENV: str(free_port()),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "LAKEHOUSE_SHUFFLE_PARTITIONS": str(WORKERS),
    }


def _lakehouse(
    cluster: Cluster, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return _run(cluster, [str(Path(sys.executable).parent / "lakehouse"), *args], env)


def _done(
    cluster: Cluster,
    root: Path,
    what: str,
    started: float,
    job: subprocess.CompletedProcess[str],
) -> str:
    """A layer's job has ended: its output kept in a log, its time printed, its success
    asserted; its standard output."""
    log = root / f"{what.replace(' ', '-')}.log"
    log.write_text(f"$ {job.args}\n--- stdout:\n{job.stdout}\n--- stderr:\n{job.stderr}")
    print(f"{what}: {time.monotonic() - started:.1f} s")
    assert job.returncode == 0, (
        f"{what} failed with exit code {job.returncode} (log: {log})\n"
        f"stdout:\n{job.stdout[-3000:]}\nstderr:\n{job.stderr[-6000:]}\n" + cluster.logs()
    )
    return job.stdout


def _completed(cluster: Cluster, names: set[str], timeout: float = 30) -> dict[str, Any]:
    """The master's status once it lists every application in ``names`` as completed (a driver
    unregisters its application asynchronously as it stops), or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        status = cluster.status()
        done = {a["name"] for a in status.get("completedapps", [])}
        if names <= done or time.monotonic() > deadline:
            return status
        time.sleep(1)


def _event_log(events: Path, app_id: str) -> list[dict[str, Any]]:
    """An application's listener events: one file, or a folder of rolled files (Spark 4)."""
    files = [events / app_id] if (events / app_id).is_file() else []
    files += sorted(
        (events / f"eventlog_v2_{app_id}").glob(f"events_*_{app_id}"),
        key=lambda f: int(f.name.split("_")[1]),
    )
    assert files, f"no event log for {app_id}: {sorted(p.name for p in events.iterdir())}"
    return [
        json.loads(line)
        for f in files
        for line in f.read_text(errors="replace").splitlines()
        if line.strip()
    ]


def _executor_workers(cluster: Cluster, app_id: str) -> dict[str, int]:
    """Executor id -> the worker (1-based) whose work dir holds that executor's own stderr."""
    found: dict[str, int] = {}
    for i, work_dir in enumerate(cluster.work_dirs, start=1):
        for stderr in (work_dir / app_id).glob("*/stderr"):
            found[stderr.parent.name] = i
    return found


def test_sample_pipelines_run_on_a_standalone_cluster(
    cluster: Cluster, settings: Settings, tmp_path: Path
) -> None:
    sample = subprocess.run(
        [str(Path(sys.executable).parent / "lakehouse"), "sample"],
        env=airflow_environment(settings),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert sample.returncode == 0, sample.stderr[-3000:]

    events = tmp_path / "spark-events"
    events.mkdir()
    outputs: dict[str, str] = {}
    topic, layer = SUBMITTED
    started = time.monotonic()
    job = _submit(cluster, settings, events, topic, layer)
    outputs[f"{topic} {layer}"] = _done(
        cluster, tmp_path, f"{topic} {layer} submitted", started, job
    )

    # The lakehouse's Spark server with the cluster as its master, and the layers its clients.
    env = _server_env(cluster, settings, tmp_path, events)
    up = _lakehouse(cluster, env, "spark", "start")
    try:
        assert up.returncode == 0, up.stdout + up.stderr + cluster.logs()
        told = _lakehouse(cluster, env, "spark", "status")
        assert f"master {cluster.master_url}" in told.stdout, told.stdout
        for topic, layer in SERVED:
            started = time.monotonic()
            run = _lakehouse(cluster, env, "run", "--topic", topic, "--layer", layer)
            what = f"{topic} {layer} on the server"
            outputs[f"{topic} {layer}"] = _done(cluster, tmp_path, what, started, run)
            assert "on the Spark server" in run.stderr, run.stderr[-3000:]
    finally:
        down = _lakehouse(cluster, env, "spark", "stop")
    assert down.returncode == 0, down.stdout + down.stderr

    # Each job printed its layer's summary (as in the Airflow task log).
    assert "bronze user-locations: batch 0 committed" in outputs["user-locations bronze"]
    assert "silver user_locations:" in outputs["user-locations silver"]
    assert "gold user_latest_location:" in outputs["user-locations gold"]
    assert "silver user_profile_changes:" in outputs["user-profiles silver"]

    # The master ran the submitted job and the server as applications of their own, to the end.
    expected = {f"lakehouse-{SUBMITTED[1]}-{SUBMITTED[0]}", SERVER_APP}
    status = _completed(cluster, expected)
    apps = {a["name"]: a for a in status["completedapps"]}
    assert expected <= set(apps), f"completed applications: {sorted(apps)}, status: {status}"
    assert {apps[name]["state"] for name in expected} == {"FINISHED"}, apps
    assert len([w for w in status["workers"] if w["state"] == "ALIVE"]) == WORKERS, status

    # Executors ran in the workers' JVMs: each application got an executor (its own work dir
    # with its stderr) on the workers, and every task ran on one of them, never in the driver.
    on_both = []
    for name in sorted(expected):
        app_id = apps[name]["id"]
        executors = _executor_workers(cluster, app_id)
        assert executors, f"{name} ({app_id}) got no executor on any worker\n" + cluster.logs()
        ran = Counter(
            e["Task Info"]["Executor ID"]
            for e in _event_log(events, app_id)
            if e["Event"] == "SparkListenerTaskEnd"
            and e.get("Task End Reason", {}).get("Reason") == "Success"
        )
        assert ran, f"{name} ({app_id}) ran no task"
        assert set(ran) <= set(executors), (
            f"{name} ({app_id}): tasks ran on executors {sorted(ran)}, but the workers hold "
            f"executors {executors}"
        )
        per_worker: Counter[str] = Counter()
        for executor, tasks in ran.items():
            per_worker[f"worker-{executors[executor]}"] += tasks
        print(f"{name} ({app_id}): successful tasks per worker {dict(sorted(per_worker.items()))}")
        if len(per_worker) == WORKERS:
            on_both.append(name)
    assert on_both, "no application ran tasks on both workers' executors"

    # The Delta results equal local mode's.
    bronze = settings.bronze_path("user-locations")
    silver = settings.silver_path("user_locations")
    latest = settings.gold_path("user_latest_location")
    counts = settings.gold_path("user_location_counts")
    assert read_arrow(bronze).num_rows == 5
    assert read_arrow(settings.bronze_path("user-profiles")).num_rows == 6
    assert sorted((r["username"], r["location"]) for r in read_arrow(silver).to_pylist()) == sorted(
        [
            ("alice", "Paris"),
            ("bob", "Sydney"),
            ("alice", "Rome"),
            ("bob", "Lima"),
            ("alice", "Berlin"),
        ]
    )
    assert sorted((r["username"], r["location"]) for r in read_arrow(latest).to_pylist()) == [
        ("alice", "Berlin"),
        ("bob", "Lima"),
    ]
    assert sorted((r["username"], r["count"]) for r in read_arrow(counts).to_pylist()) == [
        ("alice", 3),
        ("bob", 2),
    ]
    feed = changes_arrow(counts).to_pylist()
    assert sorted((r["_change_type"], r["username"], r["count"]) for r in feed) == [
        ("insert", "alice", 3),
        ("insert", "bob", 2),
    ]
    # The join across topics: each check-in with the profile as of its time.
    joined = read_arrow(settings.gold_path("checkins_with_profile")).to_pylist()
    assert sorted(
        (r["offset"], r["username"], r["location"], r["profile_city"]) for r in joined
    ) == [
        (0, "alice", "Paris", "Paris"),
        (1, "bob", "Sydney", "Sydney"),
        (2, "alice", "Rome", "Paris"),
        (3, "bob", "Lima", "Sydney"),
        (4, "alice", "Berlin", "Berlin"),
    ]
    # The Avro topic's stream, decoded by fastavro in the executors' Python workers.
    assert read_arrow(settings.silver_path("user_profile_changes")).num_rows == 6

    # Every version of every table the jobs committed is readable: each commit's files, written
    # by the executors, are where the driver's commit says they are.
    from deltalake import DeltaTable

    for path in (bronze, silver, latest, counts, settings.silver_path("user_profile_changes")):
        newest = DeltaTable(str(path)).version()
        rows = [read_arrow(path, version=v).num_rows for v in range(newest + 1)]
        assert rows[-1] == read_arrow(path).num_rows > 0, (path, rows)
