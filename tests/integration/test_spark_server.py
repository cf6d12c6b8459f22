"""The long-lived Spark server (`lakehouse spark start | run | stop | status`) and its clients.

Clients run in their own processes, as Airflow tasks and the CLI do: a Spark Connect session
switches pyspark's column functions of its whole process to Connect, which would break the
classic session the other tests of this process share."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from delta_log import checkpoints, operations

from lakehouse.runtime import launch, readers, server
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.process import alive, free_port
from lakehouse.storage import log, read_arrow
from lakehouse.storage.log import load
from lakes import DEMO_TABLES, shipped_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A lakehouse with the shipped topics and sample records, and its server running. Each
    topic has the gold tables the tests read (the latest and count tables `make demo` prints,
    the profiles' latest table): what a client of the server does, not every shipped table."""
    root = tmp_path_factory.mktemp("served")
    home = root / "lakehouse"
    contracts = shipped_topic(root / "contracts", "user-locations", DEMO_TABLES)
    shipped_topic(contracts, "user-profiles", ("user_profiles",))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKEHOUSE_HOME", str(home))
        mp.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
        mp.setenv(server.PORT_ENV, str(free_port()))
        # A Python daemon with no worker quits after a second (see test_idle_python_workers_go).
        mp.setenv(server.PYTHON_IDLE_ENV, "1")
        settings = Settings.from_env()
        subprocess.run(
            [sys.executable, "-m", "lakehouse.cli", "sample"], check=True, capture_output=True
        )
        server.start(settings, only="pipeline")
        try:
            yield settings
        finally:
            server.stop(settings)


def _client(settings: Settings, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a thin client), with this lakehouse's settings and no
    token but what ``code`` gives."""
    return _process(settings, "-c", code)


def _lakehouse(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """A ``lakehouse`` command of this lakehouse, in its own process."""
    return _process(settings, "-m", "lakehouse.cli", *args)


def _process(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=_client_env(settings),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _client_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != server.TOKEN_ENV}
    return {**env, "LAKEHOUSE_HOME": str(settings.home)}


def _listening_addresses(pid: int) -> set[str]:
    """The local addresses of the TCP sockets ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address = fields[1].split(":")[0]
                # IPv4 (or IPv4-mapped IPv6) in /proc's little-endian hex
                found.add(socket.inet_ntoa(bytes.fromhex(address[-8:])[::-1]))
    return found


def test_status_says_where_it_runs_and_every_port_is_on_loopback(served: Settings) -> None:
    status = server.status(served)
    assert status.running and status.pid is not None
    assert status.port == int(os.environ[server.PORT_ENV])
    assert status.master == served.spark_master
    assert f"sc://localhost:{status.port}" in status.describe()
    token = server.state_dir(served) / "token"
    assert token.stat().st_mode & 0o777 == 0o600
    # The JVM listens for Connect clients, and for Spark's own driver and block manager: all on
    # the loopback address, none of them reachable from another machine.
    jvm = [p for p in [status.pid, *server._descendants(status.pid)] if _listening_addresses(p)]
    assert jvm, "found no listening process"
    assert {a for p in jvm for a in _listening_addresses(p)} == {"127.0.0.1"}
    assert server.token(served) not in Path(f"/proc/{status.pid}/cmdline").read_text()


@pytest.mark.parametrize("token", ["", ";token=not-the-token"])
def test_a_client_without_the_token_is_refused(served: Settings, token: str) -> None:
    port = server.status(served).port
    done = _client(
        served,
        "from pyspark.sql import SparkSession\n"
        f"s = SparkSession.builder.remote('sc://localhost:{port}/{token}').getOrCreate()\n"
        "s.sql('SELECT 1').collect()\n",
    )
    assert done.returncode != 0
    assert "UNAUTHENTICATED" in done.stderr


def test_the_pipeline_runs_on_the_server(served: Settings) -> None:
    """The shipped Avro topic through bronze, silver and gold, every layer a client of the
    server, its values decoded by the server's Python workers (the JSON topic runs through the
    `lakehouse` command below)."""
    done = _client(
        served,
        "import json\n"
        "from lakehouse.pipeline import runner\n"
        "from lakehouse.runtime import server\n"
        "from lakehouse.runtime.config import Settings\n"
        "from lakehouse.contracts.catalog import Catalog\n"
        "from lakehouse.storage import read_arrow\n"
        "settings = Settings.from_env()\n"
        "spark = server.connect(settings)\n"
        "print(type(spark).__module__)\n"
        "catalog = Catalog.load(settings.contracts_dir)\n"
        "runner.run(spark, settings, catalog, topics=['user-profiles'])\n"
        "rows = read_arrow(settings.gold_path('user_profiles')).to_pylist()\n"
        "print(json.dumps(sorted([r['username'], r['city'], r['email']] for r in rows)))\n",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "pyspark.sql.connect.session"
    assert json.loads(lines[-1]) == [
        ["alice", "Berlin", "alice@example.org"],
        ["bob", "Lima", None],
    ]
    assert "bronze user-profiles: batch 0 committed" in done.stdout
    # The Avro topic's values were decoded by Python workers of the server.
    silver = [line for line in lines if line.startswith("silver user_profile_changes")]
    assert any(re.search(r"committed: \d+ records, 0 quarantined", line) for line in silver), silver


def test_lakehouse_run_is_a_client_of_the_running_server(served: Settings) -> None:
    """`lakehouse run` of the JSON topic on the server: the gold tables `make demo` prints."""
    done = _lakehouse(served, "run", "--topic", "user-locations")
    assert done.returncode == 0, done.stderr[-3000:]
    port = server.status(served).port
    assert f"on the Spark server at sc://localhost:{port}" in done.stderr
    assert "bronze user-locations: batch 0 committed: 5 records" in done.stdout
    # Its gates were judged by the server's validation service, not in the client.
    assert "quality bronze.user-locations:" in done.stdout
    assert "validating in this process" not in done.stderr
    latest = read_arrow(served.gold_path("user_latest_location")).to_pylist()
    assert sorted((r["username"], r["location"]) for r in latest) == [
        ("alice", "Berlin"),
        ("bob", "Lima"),
    ]
    counts = read_arrow(served.gold_path("user_location_counts")).to_pylist()
    assert sorted((r["username"], r["count"]) for r in counts) == [("alice", 3), ("bob", 2)]


def test_maintain_runs_on_the_server(served: Settings) -> None:
    """`maintain` as a client of the server (no JVM of its own to call Delta's log on): it
    compacts, vacuums, checkpoints the table and gives it back its own properties, and the rows
    and the positions kept in commit metadata stay what they were."""
    path = served.home / "maintained" / "t"
    setup = (
        "from pathlib import Path\n"
        "from lakehouse.runtime import server\n"
        "from lakehouse.runtime.config import Settings\n"
        "from lakehouse.storage import Txn, delta_spark\n"
        "spark = server.connect(Settings.from_env())\n"
        f"path = Path({str(path)!r})\n"
        "for i in range(4):\n"
        "    rows = spark.range(i * 3, i * 3 + 3, 1, 1).withColumnRenamed('id', 'n')\n"
        "    txn = [Txn('left', i), Txn('right', 0)]\n"
        "    delta_spark.append(rows, path, txn=txn, create=rows.schema)\n"
    )
    done = _client(served, setup)
    assert done.returncode == 0, done.stderr[-3000:]
    before = load(path)
    version, properties = int(before.version()), dict(before.metadata().configuration)
    files = {p.name for p in path.glob("*.parquet")}
    rows = sorted(r["n"] for r in read_arrow(path).to_pylist())
    assert version == 4 and len(files) == 4 and rows == list(range(12))

    done = _client(
        served,
        "import dataclasses, json\n"
        "from pathlib import Path\n"
        "from lakehouse.runtime import server\n"
        "from lakehouse.runtime.config import Settings\n"
        "from lakehouse.storage.maintenance import maintain\n"
        "spark = server.connect(Settings.from_env())\n"
        "print(type(spark).__module__)\n"
        f"report = maintain(spark, Settings.from_env(), Path({str(path)!r}), retention_hours=0, "
        "allow_unsafe_retention=True)\n"
        "print(json.dumps(dataclasses.asdict(report)))\n",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    module, line = done.stdout.splitlines()[-2:]
    assert module == "pyspark.sql.connect.session"
    report = json.loads(line)
    assert report["version_before"] == version
    assert report["files_compacted"] == 4 and report["files_written"] == 1
    # Vacuum deleted the four files compaction replaced, and nothing else.
    assert {Path(p).name for p in report["vacuumed"]} == files
    assert not any((path / name).exists() for name in files)
    assert len(list(path.glob("*.parquet"))) == 1
    # Maintenance's commits: compaction, vacuum, then one setting Delta's checkpoint interval to
    # 1 (and its log cleanup on, recording the table's own values), which Delta checkpointed, and
    # two putting the table's own properties back: the first sets its log cleanup off again
    # (still under interval 1: checkpointed), the last unsets the interval and the record (it is
    # version 10, a multiple of Delta's default interval: checkpointed too).
    assert list(operations(path, version + 1).values()) == [
        "OPTIMIZE",
        "VACUUM START",
        "VACUUM END",
        "SET TBLPROPERTIES",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
    ]
    assert report["checkpoint"] == version + 4 and report["version_after"] == version + 6
    assert checkpoints(path) == [version + 4, version + 5, version + 6]
    assert report["log_cleanup"] == "done"
    maintained = load(path)
    assert dict(maintained.metadata().configuration) == properties
    assert sorted(r["n"] for r in read_arrow(path).to_pylist()) == rows
    # The positions live in an older commit now; they are still found.
    assert log.position(path, "left") == 3
    assert log.position(path, "right") == 0
    assert log.positions_commit(path) == version


def test_lakehouse_maintain_is_a_client_of_the_running_server(served: Settings) -> None:
    """`lakehouse maintain` on the server, here of the quality ledger alone (the runs above
    appended a commit to it each; every table of a topic is maintained the same way, see
    test_maintain_runs_on_the_server)."""
    assert log.is_table(served.ledger_path)
    done = _lakehouse(served, "maintain", "--ledger")
    assert done.returncode == 0, done.stderr[-3000:]
    port = server.status(served).port
    assert f"on the Spark server at sc://localhost:{port}" in done.stderr
    ledger = served.ledger_path
    summary = next(line for line in done.stdout.splitlines() if line.startswith(f"{ledger}:"))
    checkpoint = int(re.search(r"checkpoint at (\d+);", summary).group(1))
    assert checkpoint in checkpoints(ledger)


def test_rebuilds_are_clients_of_the_running_server(served: Settings) -> None:
    """`refresh`, `restore` and `show --at-event-time` run on the server, as `run` does: no JVM
    of their own (they used to start one beside the running server)."""
    from datetime import UTC, datetime

    port = server.status(served).port
    if not log.is_table(served.gold_path("user_latest_location")):
        ran = _lakehouse(served, "run", "--topic", "user-locations")
        assert ran.returncode == 0, ran.stderr[-3000:]
    on_server = f"on the Spark server at sc://localhost:{port}\n"
    restored = _lakehouse(served, "restore", "user_latest_location")
    assert (restored.returncode, restored.stderr) == (0, on_server), restored.stderr[-3000:]
    assert restored.stdout.splitlines()[-1] == "equal to the table: yes"
    refreshed = _lakehouse(served, "refresh", "user_location_counts")
    assert (refreshed.returncode, refreshed.stderr) == (0, on_server), refreshed.stderr[-3000:]
    assert refreshed.stdout.startswith("gold user_location_counts: rebuilt from input versions")
    now = datetime.now(UTC).isoformat()
    shown = _lakehouse(served, "show", "user_latest_location", "--at-event-time", now)
    assert (shown.returncode, shown.stderr) == (0, on_server), shown.stderr[-3000:]
    assert "| alice    | Berlin   |" in shown.stdout and "(2 rows)" in shown.stdout


# A client's session that runs Python work (mapInArrow) on the server; `again` on its stdin runs
# it once more in the same session.
_PYTHON_WORK = """\
import sys
import pyarrow as pa
from lakehouse.runtime import server
from lakehouse.runtime.config import Settings
spark = server.connect(Settings.from_env())
def doubled(batches):
    for batch in batches:
        yield pa.RecordBatch.from_pydict({"n": [2 * i for i in batch.column(0).to_pylist()]})
def work():
    rows = spark.range(0, 4, 1, 2).mapInArrow(doubled, "n long").collect()
    print(sorted(r.n for r in rows), flush=True)
work()
while sys.stdin.readline().strip() == "again":
    work()
spark.stop()
"""


def _python_processes(pid: int) -> dict[int, str]:
    """The server's Python processes, each with its command line: its descendants running this
    interpreter (its Python workers and the daemons that fork them)."""
    found = {}
    for child in server._descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == os.fsencode(sys.executable):
            found[child] = b" ".join(argv).decode(errors="replace")
    return found


def test_idle_python_workers_go(served: Settings) -> None:
    """Clients' sessions ran Python work on the server, one of them ended and the other waits:
    the server's Python processes go (Spark ends idle workers after a minute, here the daemons
    that forked them after a second more), and the waiting session's next Python work runs on
    new ones. They used to stay until the server stopped, a daemon for every client session."""
    import time

    pid = server.status(served).pid
    assert pid is not None
    waiting = subprocess.Popen(
        [sys.executable, "-c", _PYTHON_WORK],
        env=_client_env(served),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stdin is not None and waiting.stdout is not None
        assert waiting.stdout.readline() == "[0, 2, 4, 6]\n", waiting.communicate()
        ended = _process(served, "-c", _PYTHON_WORK)
        assert (ended.returncode, ended.stdout) == (0, "[0, 2, 4, 6]\n"), ended.stderr[-3000:]
        assert _python_processes(pid), "the clients ran no Python worker on the server"
        deadline = time.monotonic() + 300
        while _python_processes(pid) and time.monotonic() < deadline:
            time.sleep(1)
        assert not _python_processes(pid), f"they stayed: {_python_processes(pid)}"
        out, err = waiting.communicate("again\n", timeout=600)
        assert (waiting.returncode, out) == (0, "[0, 2, 4, 6]\n"), err[-3000:]
    finally:
        if waiting.poll() is None:
            waiting.kill()


def test_a_client_whose_server_is_down_is_told_how_to_start_it(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "lakehouse", REPO_ROOT / "contracts")
    assert not server.status(settings).running
    with pytest.raises(server.ServerDown, match="lakehouse spark start"):
        server.connect(settings)


def test_the_servers_log_has_spark_at_warn_only(served: Settings) -> None:
    """After the module's clients ran their pipelines, queries and maintenance on it, the
    server's log holds no INFO line of Spark's (a line per task of every query, megabytes an
    hour at Spark's default)."""
    logged = (server.state_dir(served) / "server.log").read_text(errors="replace")
    assert not [line for line in logged.splitlines() if " INFO " in line], logged[:2000]


def test_spark_run_holds_the_foreground_rolls_its_log_and_stops_whole_on_sigint(
    tmp_path: Path,
) -> None:
    """`lakehouse spark run`, as a container or a service manager runs it: the server starts and
    the command stays; its log rolls over at the size set (here at INFO, so it grows fast); a
    SIGINT (Ctrl-C) stops the server, its Python workers and its validation service within
    30 s, and the command exits 0."""
    import signal
    import time

    settings = Settings.from_env(tmp_path / "lakehouse", REPO_ROOT / "contracts")
    env = {
        **{k: v for k, v in os.environ.items() if k != server.TOKEN_ENV},
        "LAKEHOUSE_HOME": str(settings.home),
        server.PORT_ENV: str(free_port()),
        readers.PORT_ENV: str(free_port()),  # beside the module's server
        readers.SQL_PORT_ENV: str(free_port()),
        launch.LOG_LEVEL_ENV: "INFO",
        launch.LOG_SIZE_ENV: "16KB",
        launch.LOG_FILES_ENV: "2",
    }
    foreground = subprocess.Popen(
        [sys.executable, "-m", "lakehouse.cli", "spark", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert foreground.stdout is not None
        said = foreground.stdout.readline()  # once started (or failed)
        assert said.startswith("Spark server: running"), (said, foreground.communicate())
        running = server.status(settings)
        assert running.running and running.pid is not None
        family = [running.pid, *server._descendants(running.pid)]
        family.append(
            json.loads((server.state_dir(settings) / "server.json").read_text())["validation_pid"]
        )
        folder = server.state_dir(settings)
        assert (folder / "server.log.1").is_file()  # Spark's start-up at INFO is over 16 KB
        assert not (folder / "server.log.3").exists()  # two old files kept
        assert (folder / "server.log").stat().st_size < 2 * 16 * 1024
        assert foreground.poll() is None  # it holds the foreground
        asked = time.monotonic()
        foreground.send_signal(signal.SIGINT)
        out, err = foreground.communicate(timeout=30)
        assert time.monotonic() - asked < 30
        assert foreground.returncode == 0, err
        assert "Spark server: stopped (SIGINT)" in out
        assert not any(alive(p) for p in family)
        assert not server.status(settings).running
    finally:
        if foreground.poll() is None:
            foreground.kill()
        server.stop(settings)


def test_stop_ends_the_server_its_python_workers_and_its_validation_service(
    served: Settings,
) -> None:
    status = server.status(served)
    assert status.pid is not None
    service = json.loads((server.state_dir(served) / "server.json").read_text())["validation_pid"]
    assert alive(service)
    family = [status.pid, *server._descendants(status.pid), service]
    assert server.stop(served)
    assert not server.status(served).running
    assert not any(alive(p) for p in family)
    assert not (server.state_dir(served) / "gx.sock").exists()
    assert not server.stop(served)  # nothing left to stop
