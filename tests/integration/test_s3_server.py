"""The lakehouse's local S3 API (`lakehouse s3 start | stop | status`, moto's server) driven
through the command line, and Spark with Delta Lake on it through Hadoop's S3A connector (the
jars of include/jvm/pom.xml): a table written, appended to and read at each version, over s3a://
and s3://; a multipart upload, and its rename (a copy by the AWS SDK's transfer manager, on the
SDK's Netty client over pyspark's Netty); a conditional put."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from lakehouse.runtime.process import alive, free_port
from lakehouse.runtime.s3server import lists_buckets
from lakes import lakehouse, processes_with

pytestmark = pytest.mark.integration


def _lakehouse(home: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return lakehouse(home, *args, env={"LAKEHOUSE_S3_PORT": str(port)}, timeout=120)


def _listening(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on ``port`` (from /proc)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            address, at = line.split()[1].split(":")
            if line.split()[3] == "0A" and int(at, 16) == port:  # LISTEN
                found.add(socket.inet_ntoa(bytes.fromhex(address[-8:])[::-1]))
    return found


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_start_serve_stop_through_the_cli(tmp_path: Path) -> None:
    home = tmp_path / "lakehouse"
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        down = _lakehouse(home, port, "s3", "status")
        assert down.returncode == 1
        assert "S3 API (moto): not running" in down.stdout
        assert "lakehouse s3 start" in down.stdout

        started = _lakehouse(home, port, "s3", "start")
        assert started.returncode == 0, started.stderr
        assert "running, pid " in started.stdout and f"endpoint {endpoint}" in started.stdout
        state = json.loads((home / "s3" / "server.json").read_text())
        pid = state["pid"]
        assert state["endpoint"] == endpoint
        assert processes_with("moto.server", str(port)) == [pid]
        assert _listening(port) == {"127.0.0.1"}
        up = _lakehouse(home, port, "s3", "status")
        assert up.returncode == 0
        assert f"running, pid {pid}, endpoint {endpoint}" in up.stdout
        assert str(home / "s3" / "server.log") in up.stdout

        # It is an S3 API: a bucket made, an object put and read back.
        s3 = _client(endpoint)
        s3.create_bucket(Bucket="cli-check")
        s3.put_object(Bucket="cli-check", Key="a/b.txt", Body=b"hello")
        assert s3.get_object(Bucket="cli-check", Key="a/b.txt")["Body"].read() == b"hello"
        assert "PUT /cli-check/a/b.txt" in (home / "s3" / "server.log").read_text()

        # A second start finds it running and starts nothing.
        again = _lakehouse(home, port, "s3", "start")
        assert again.returncode == 0
        assert f"already running, pid {pid}" in again.stdout
        assert processes_with("moto.server", str(port)) == [pid]

        stopped = _lakehouse(home, port, "s3", "stop")
        assert stopped.returncode == 0 and "S3 API (moto): stopped" in stopped.stdout
        assert not alive(pid) and processes_with("moto.server", str(port)) == []
        assert not lists_buckets("127.0.0.1", port)
        assert not (home / "s3" / "server.json").exists()
        after = _lakehouse(home, port, "s3", "status")
        assert after.returncode == 1 and "not running" in after.stdout
        not_again = _lakehouse(home, port, "s3", "stop")
        assert not_again.returncode == 0 and "was not running" in not_again.stdout

        # In memory: started again, it has no buckets.
        restarted = _lakehouse(home, port, "s3", "start")
        assert restarted.returncode == 0, restarted.stderr
        assert _client(endpoint).list_buckets()["Buckets"] == []
    finally:
        _lakehouse(home, port, "s3", "stop")
    assert processes_with("moto.server", str(port)) == []


def test_the_sessions_server_has_the_bucket(s3_server: Any) -> None:
    """The ``s3_server`` fixture (tests/conftest.py) other tests share."""
    s3 = _client(s3_server.endpoint)
    assert s3_server.bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert s3_server.env["LAKEHOUSE_S3_ENDPOINT"] == s3_server.endpoint


# A plain pyspark session with Delta (lakehouse.runtime.spark.jvm_conf: the jars and Delta's settings)
# and S3A's settings for the store the environment names (LAKEHOUSE_S3_*), as a lakehouse process
# gets them. Credentials are not settings: S3A's default chain finds them in AWS_* variables.
# Its own process: a JVM reads its environment once, when it starts.
JOB = """\
import json, os, sys
from pyspark.sql import SparkSession
from lakehouse.runtime.spark import jvm_conf

bucket, prefix = sys.argv[1], sys.argv[2]
S3A = {
    "spark.hadoop.fs.s3a.endpoint": os.environ["LAKEHOUSE_S3_ENDPOINT"],
    "spark.hadoop.fs.s3a.endpoint.region": os.environ["LAKEHOUSE_S3_REGION"],
    "spark.hadoop.fs.s3a.path.style.access": os.environ["LAKEHOUSE_S3_PATH_STYLE"],
    "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
    # apache/hadoop#8059: what stores other than AWS's want (3.5.0's defaults, said out loud).
    "spark.hadoop.fs.s3a.checksum.generation": "false",
    "spark.hadoop.fs.s3a.request.md5.header": "true",
    # s3:// URIs through S3A too.
    "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
}
builder = SparkSession.builder.master("local[2]").appName("lakehouse-s3a-check")
for key, value in {
    **jvm_conf(),
    **S3A,
    "spark.sql.shuffle.partitions": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.enabled": "false",
}.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
jvm = spark._jvm
out = {}

def rows(df):
    return sorted([list(r) for r in df.collect()])

table = f"s3a://{bucket}/{prefix}/t"
spark.createDataFrame([(1, "alice"), (2, "bob")], "id INT, name STRING").write.format(
    "delta"
).save(table)
out["first"] = rows(spark.read.format("delta").load(table))
spark.createDataFrame([(3, "carol")], "id INT, name STRING").write.format("delta").mode(
    "append"
).save(table)
out["latest"] = rows(spark.read.format("delta").load(table))
out["version_0"] = rows(spark.read.format("delta").option("versionAsOf", 0).load(table))
out["version_1"] = rows(spark.read.format("delta").option("versionAsOf", 1).load(table))
out["history"] = [
    [r.version, r.operation]
    for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
]
out["via_s3"] = rows(spark.read.format("delta").load(table.replace("s3a://", "s3://", 1)))

# The log store Delta picked for each scheme (DelegatingLogStore's delegate).
Path = jvm.org.apache.hadoop.fs.Path
gateway = spark.sparkContext._gateway
def log_store(uri):
    store = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, Path(uri)).store()
    types = gateway.new_array(jvm.java.lang.Class, 1)
    types[0] = jvm.java.lang.Class.forName("org.apache.hadoop.fs.Path")
    get = store.getClass().getDeclaredMethod("getDelegate", types)
    get.setAccessible(True)
    args = gateway.new_array(jvm.java.lang.Object, 1)
    args[0] = Path(uri)
    delegate = get.invoke(store, args)
    return [store.getClass().getName(), delegate.logStoreImpl().getClass().getName()]
out["log_store_s3a"] = log_store(table)
out["log_store_s3"] = log_store(table.replace("s3a://", "s3://", 1))

# A file of three 5 MiB parts: written as a multipart upload, renamed and read back. S3 has no
# rename: S3A copies, and a file above its multipart threshold is copied by the SDK's transfer
# manager on its async client, Netty's (pyspark's Netty 4.2, not the 4.1 the SDK asks for).
conf = jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
conf.set("fs.s3a.multipart.size", "5M")
conf.set("fs.s3a.multipart.threshold", "5M")
fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(jvm.java.net.URI(f"s3a://{bucket}/"), conf)
block = bytes(range(256)) * 4096  # 1 MiB
big, moved = Path(f"s3a://{bucket}/{prefix}/big.bin"), Path(f"s3a://{bucket}/{prefix}/moved.bin")
stream = fs.create(big)
for _ in range(11):
    stream.write(block)
stream.close()
source_etag = fs.getFileStatus(big).getEtag()
renamed = fs.rename(big, moved)
stream = fs.open(moved)
digest = jvm.org.apache.commons.codec.digest.DigestUtils.sha256Hex(stream)
stream.close()
out["multipart"] = {"source_etag": source_etag, "renamed": renamed, "sha256": digest,
                    "source_exists": fs.exists(big), "length": fs.getFileStatus(moved).getLen()}

# A conditional put (If-None-Match: *), as a log store without a lock would commit.
def put_if_absent(name):
    stream = fs.createFile(Path(f"s3a://{bucket}/{prefix}/{name}")).must(
        "fs.option.create.conditional.overwrite", True
    ).build()
    stream.write(b"{}")
    try:
        stream.close()
        return "written"
    except Exception as exc:  # py4j's error: the Java exception is what S3A raised
        java = exc.java_exception
        return f"{java.getClass().getName()}: {java.getMessage()}"
out["conditional"] = [put_if_absent("0.json"), put_if_absent("0.json")]
fs.close()

# No credential is a Spark setting.
out["credential_settings"] = [
    k for k, _ in spark.sparkContext.getConf().getAll() if "key" in k.lower() or "secret" in k.lower()
]
print("RESULT " + json.dumps(out))
spark.stop()
"""


@pytest.fixture(scope="module")
def s3a_job(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job above, run once against the session's S3 API, in a process whose environment is
    this one's and the store's (``s3_server.env``); its results."""
    prefix = f"s3a-check-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LAKEHOUSE_S3_"))}
    proc = subprocess.run(
        [sys.executable, "-c", JOB, s3_server.bucket, prefix],
        env=env | s3_server.env,
        cwd=tmp_path_factory.mktemp("s3a-job"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, proc.stderr[-6000:]
    out: dict[str, Any] = json.loads(results[-1].removeprefix("RESULT "))
    out["prefix"] = prefix
    return out


def test_delta_on_s3a_writes_appends_and_time_travels(s3a_job: Any, s3_server: Any) -> None:
    alice, bob, carol = [1, "alice"], [2, "bob"], [3, "carol"]
    assert s3a_job["first"] == [alice, bob]
    assert s3a_job["latest"] == [alice, bob, carol]
    assert s3a_job["version_0"] == [alice, bob]
    assert s3a_job["version_1"] == [alice, bob, carol]
    assert s3a_job["history"] == [[0, "WRITE"], [1, "WRITE"]]
    # The same table through s3:// (fs.s3.impl set to S3A's file system).
    assert s3a_job["via_s3"] == [alice, bob, carol]
    # What the store holds: the table's log, one JSON commit per version, beside its files.
    keys = [
        o["Key"]
        for o in _client(s3_server.endpoint).list_objects_v2(
            Bucket=s3_server.bucket, Prefix=f"{s3a_job['prefix']}/t/"
        )["Contents"]
    ]
    log = f"{s3a_job['prefix']}/t/_delta_log/"
    assert f"{log}00000000000000000000.json" in keys
    assert f"{log}00000000000000000001.json" in keys
    assert sum(key.endswith(".parquet") for key in keys) >= 2


def test_delta_commits_on_s3_through_its_single_driver_log_store(s3a_job: Any) -> None:
    """Delta's default for s3a:// and s3://: commits are serialised within one driver only
    (no two Spark applications may write one table at once)."""
    single_driver = [
        "org.apache.spark.sql.delta.storage.DelegatingLogStore",
        "io.delta.storage.S3SingleDriverLogStore",
    ]
    assert s3a_job["log_store_s3a"] == single_driver
    assert s3a_job["log_store_s3"] == single_driver


def test_a_multipart_upload_and_a_rename_above_the_multipart_threshold(
    s3a_job: Any, s3_server: Any
) -> None:
    size = 11 * (1 << 20)
    expected = hashlib.sha256((bytes(range(256)) * 4096) * 11).hexdigest()
    multipart = dict(s3a_job["multipart"])
    assert multipart.pop("source_etag").strip('"').endswith("-3")  # uploaded in three parts
    assert multipart == {
        "renamed": True,
        "sha256": expected,
        "source_exists": False,
        "length": size,
    }
    head = _client(s3_server.endpoint).head_object(
        Bucket=s3_server.bucket, Key=f"{s3a_job['prefix']}/moved.bin"
    )
    assert head["ContentLength"] == size


def test_a_conditional_put_refuses_an_existing_key(s3a_job: Any) -> None:
    first, second = s3a_job["conditional"]
    assert first == "written"
    refused = "org.apache.hadoop.fs.s3a.RemoteFileChangedException: Writing Object on "
    assert second.startswith(refused), second
    assert "Status Code: 412" in second and "PreconditionFailed" in second, second


def test_credentials_come_from_the_environment_not_from_settings(s3a_job: Any) -> None:
    assert s3a_job["credential_settings"] == []
