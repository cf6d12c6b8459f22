"""The JVM jars beyond pyspark's (lakehouse.runtime.jvm): the installed ones are the locked ones and
duplicate nothing of pyspark's; a missing, changed, unlocked or duplicate jar is refused with a
message naming it. No Spark here (tests/integration/test_delta_spark.py starts one)."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from lakehouse.errors import ConfigError, JarsError
from lakehouse.runtime import jvm, spark

# What pyspark lacks and include/jvm/pom.xml adds: nothing else may be copied.
EXPECTED = {
    "delta-spark_4.2_2.13-4.4.0.jar",
    "delta-storage-4.4.0.jar",
    "delta-kernel-api-4.4.0.jar",
    "delta-kernel-defaults-4.4.0.jar",
    "delta-kernel-unitycatalog-4.4.0.jar",
    "unitycatalog-client-0.6.0.jar",
    "unitycatalog-hadoop-0.6.0.jar",
    "spark-avro_2.13-4.2.0.jar",
    "jackson-datatype-jdk8-2.21.2.jar",
    "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    "spark-token-provider-kafka-0-10_2.13-4.2.0.jar",
    "kafka-clients-3.9.2.jar",
    "commons-pool2-2.13.1.jar",
    # Hadoop's S3A connector and the modules of the AWS SDK it uses (not the SDK's bundle).
    "hadoop-aws-3.5.0.jar",
    "hadoop-bare-naked-local-fs-0.1.0.jar",
    # The JDBC driver of the catalog's metastore on PostgreSQL.
    "postgresql-42.7.14.jar",
    "analyticsaccelerator-s3-1.3.1.jar",
    "eventstream-1.0.1.jar",
    "reactive-streams-1.0.4.jar",
    "annotations-2.35.4.jar",
    "apache-client-2.35.4.jar",
    "arns-2.35.4.jar",
    "auth-2.35.4.jar",
    "aws-core-2.35.4.jar",
    "aws-query-protocol-2.35.4.jar",
    "aws-xml-protocol-2.35.4.jar",
    "checksums-2.35.4.jar",
    "checksums-spi-2.35.4.jar",
    "crt-core-2.35.4.jar",
    "endpoints-spi-2.35.4.jar",
    "http-auth-2.35.4.jar",
    "http-auth-aws-2.35.4.jar",
    "http-auth-aws-eventstream-2.35.4.jar",
    "http-auth-spi-2.35.4.jar",
    "http-client-spi-2.35.4.jar",
    "identity-spi-2.35.4.jar",
    "json-utils-2.35.4.jar",
    "metrics-spi-2.35.4.jar",
    "netty-nio-client-2.35.4.jar",
    "profiles-2.35.4.jar",
    "protocol-core-2.35.4.jar",
    "regions-2.35.4.jar",
    "retries-2.35.4.jar",
    "retries-spi-2.35.4.jar",
    "s3-2.35.4.jar",
    "s3-transfer-manager-2.35.4.jar",
    "sdk-core-2.35.4.jar",
    "sts-2.35.4.jar",
    "third-party-jackson-core-2.35.4.jar",
    "utils-2.35.4.jar",
    "utils-lite-2.35.4.jar",
}


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the installed jars, where lakehouse.runtime.jvm now looks for them."""
    copy = tmp_path / "jars"
    shutil.copytree(jvm.jars_dir(), copy)
    monkeypatch.setattr(jvm, "jars_dir", lambda: copy)
    return copy


def test_the_installed_jars_are_the_locked_ones_and_duplicate_nothing_of_pysparks() -> None:
    installed = jvm.check()
    assert {path.name for path in installed} == set(jvm.read_lock()) == EXPECTED
    assert all(path.parent == jvm.jars_dir() for path in installed)
    assert jvm.main([]) == 0


def test_spark_jars_are_the_locked_jars_as_absolute_paths() -> None:
    """Every locked jar, in ``spark.jars`` or (the local file system, which Hadoop looks up
    before it fetches those; the metastore's JDBC driver) on the driver's and executors' class
    path from their start."""
    conf = spark.jvm_conf()
    value = conf["spark.jars"]
    assert value == jvm.spark_jars_conf()
    paths = [Path(path) for path in value.split(",")]
    launched = [Path(path) for path in conf["spark.driver.extraClassPath"].split(":")]
    assert conf["spark.executor.extraClassPath"] == conf["spark.driver.extraClassPath"]
    assert [path.name for path in launched] == [
        "hadoop-bare-naked-local-fs-0.1.0.jar",
        "postgresql-42.7.14.jar",
    ]
    assert sorted(path.name for path in paths + launched) == sorted(jvm.read_lock())
    assert all(path.is_absolute() and path.is_file() for path in paths + launched)


def test_the_jvm_and_python_halves_are_the_versions_pyspark_and_delta_spark_pin() -> None:
    """The pom's Spark and Delta versions are those of the Python packages; its jackson module
    is the Jackson that pyspark ships."""
    pom = jvm.MANIFEST.read_text()

    def prop(name: str) -> str:
        found = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom)
        assert found, name
        return found.group(1)

    spark_version = importlib.metadata.version("pyspark")
    delta_version = importlib.metadata.version("delta-spark")
    assert prop("spark.version") == spark_version
    assert prop("spark.binary.version") == ".".join(spark_version.split(".")[:2])
    assert prop("delta.version") == delta_version
    pyspark_jars = {path.name for path in jvm.pyspark_jars_dir().glob("*.jar")}
    assert f"jackson-databind-{prop('pyspark.jackson.version')}.jar" in pyspark_jars
    assert f"hadoop-client-api-{prop('hadoop.version')}.jar" in pyspark_jars
    assert f"delta-spark_{prop('spark.binary.version')}_2.13-{delta_version}.jar" in EXPECTED


def test_no_class_of_the_added_jars_is_also_in_pysparks() -> None:
    """The proof behind the artifact check, class by class: the class path holds one copy of
    each class. Every Spark module carries the same empty stub class, spark-avro included."""
    stub = "org/apache/spark/unused/UnusedStubClass.class"

    def classes(jar: Path) -> set[str]:
        with zipfile.ZipFile(jar) as z:
            return {
                name
                for name in z.namelist()
                if name.endswith(".class")
                and not name.startswith("META-INF/")
                and name != "module-info.class"
            }

    theirs = set().union(*(classes(jar) for jar in jvm.pyspark_jars_dir().glob("*.jar")))
    ours = {jar.name: classes(jar) for jar in jvm.check()}
    assert all(ours.values())
    assert {name: sorted(found & theirs - {stub}) for name, found in ours.items()} == {
        name: [] for name in ours
    }


def test_the_kafka_brokers_jars_are_locked_and_kept_off_sparks_class_path() -> None:
    """The broker's jars (include/jvm/kafka/pom.xml) are checked against their own lock and
    are its class path alone: Spark's jars and pyspark's are not among them."""
    installed = jvm.check(jvm.kafka_jars_dir(), jvm.KAFKA_LOCK, beside_pyspark=False)
    assert [path.name for path in installed] == list(jvm.read_lock(jvm.KAFKA_LOCK))
    assert "kafka_2.13-4.4.0.jar" in jvm.read_lock(jvm.KAFKA_LOCK)
    classpath = jvm.broker_classpath().split(":")
    assert classpath == [str(path.absolute()) for path in installed]
    assert not set(classpath) & set(jvm.spark_jars_conf().split(","))
    assert jvm.main(["kafka"]) == 0


def test_the_schema_registrys_archive_is_locked_and_unpacked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's archive (include/jvm/registry/pom.xml) is checked against its own lock,
    which names archives, not jars; `make install` unpacked it into .venv/registry. A changed
    archive is refused with both checksums."""
    locked = jvm.read_lock(jvm.REGISTRY_LOCK, "*.tar.gz")
    assert list(locked) == ["apicurio-registry-app-3.3.3-all.tar.gz"]
    installed = jvm.check(
        jvm.registry_dist_dir(), jvm.REGISTRY_LOCK, beside_pyspark=False, pattern="*.tar.gz"
    )
    assert [p.name for p in installed] == list(locked)
    assert (jvm.registry_dir() / "quarkus-run.jar").is_file()
    assert jvm.main(["registry"]) == 0
    with pytest.raises(JarsError, match=r"not `<sha256>  <file>\.jar`"):
        jvm.read_lock(jvm.REGISTRY_LOCK)  # a jar lock's reader refuses it

    fake = tmp_path / next(iter(locked))
    fake.write_bytes(b"not the archive")
    monkeypatch.setattr(jvm, "registry_dist_dir", lambda: tmp_path)
    assert jvm.main(["registry"]) == 1
    with pytest.raises(JarsError, match=rf"{fake}: sha256 {jvm.sha256(fake)}, the lock says"):
        jvm.check(tmp_path, jvm.REGISTRY_LOCK, beside_pyspark=False, pattern="*.tar.gz")


def test_a_missing_broker_jar_names_the_brokers_pom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jvm, "kafka_jars_dir", lambda: tmp_path)
    message = (
        rf"JVM jars missing from {tmp_path}: .*kafka_2\.13-4\.4\.0\.jar.* \(run `make install` "
        r"to copy the locked jars again; after a change of include/jvm/kafka/pom\.xml, "
        r"`make jars-lock`\)"
    )
    with pytest.raises(JarsError, match=message):
        jvm.broker_classpath()
    assert jvm.main(["kafka"]) == 1


def test_a_missing_jar_is_named_and_install_is_the_remedy(jars: Path) -> None:
    (jars / "delta-storage-4.4.0.jar").unlink()
    message = r"JVM jars missing from .*: delta-storage-4\.4\.0\.jar \(run `make install`"
    with pytest.raises(JarsError, match=message):
        jvm.check()
    with pytest.raises(JarsError, match=message):
        jvm.spark_jars()  # the cheap check at each session's start
    assert issubclass(JarsError, ConfigError)  # a job refuses its configuration (exit 2)
    assert jvm.main([]) == 1


def test_a_changed_jar_is_named_with_both_checksums(jars: Path) -> None:
    changed = jars / "spark-avro_2.13-4.2.0.jar"
    with changed.open("ab") as f:
        f.write(b"\0")
    expected = jvm.read_lock()[changed.name]
    with pytest.raises(JarsError) as caught:
        jvm.check()
    message = str(caught.value)
    assert f"{changed}: sha256 {jvm.sha256(changed)}, the lock says {expected}" in message
    assert "run `make install`" in message
    assert caught.value.problems == [message.split(" (run ")[0]]


def test_a_jar_the_lock_does_not_name_is_refused(jars: Path) -> None:
    shutil.copy(jars / "delta-storage-4.4.0.jar", jars / "delta-storage-4.3.0.jar")
    with pytest.raises(JarsError, match=r"the lock does not name: delta-storage-4\.3\.0\.jar"):
        jvm.check()


def test_a_jar_that_duplicates_a_pyspark_artifact_is_refused_whatever_its_version(
    jars: Path, tmp_path: Path
) -> None:
    """Even when locked: e.g. Delta's scala-library 2.13.17 beside pyspark's 2.13.18."""
    (jars / "scala-library-2.13.17.jar").write_bytes(b"not pyspark's")
    lock = tmp_path / "jars.sha256"
    jvm.write_lock(jars, lock)
    with pytest.raises(JarsError) as caught:
        jvm.check(lock=lock)
    assert caught.value.problems == [
        f"{jars / 'scala-library-2.13.17.jar'} duplicates pyspark's scala-library-2.13.18.jar "
        "(artifact scala-library)"
    ]
    assert "exclude it in include/jvm/pom.xml, then run `make jars-lock`" in str(caught.value)


def test_every_problem_is_reported_at_once(jars: Path, tmp_path: Path) -> None:
    (jars / "delta-storage-4.4.0.jar").unlink()
    (jars / "slf4j-api-1.7.36.jar").write_bytes(b"")
    with pytest.raises(JarsError) as caught:
        jvm.check()
    assert [problem.split(":")[0] for problem in caught.value.problems] == [
        f"JVM jars missing from {jars}",
        f"jars in {jars} that the lock does not name",
        f"{jars / 'slf4j-api-1.7.36.jar'} duplicates pyspark's slf4j-api-2.0.17.jar (artifact slf4j-api)",
    ]


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
        ("spark-avro_2.13-4.2.0.jar", "spark-avro_2.13"),
        ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
        ("hive-exec-2.3.10-core.jar", "hive-exec"),
        ("log4j-1.2-api-2.25.4.jar", "log4j-1.2-api"),
        (
            "netty-transport-native-epoll-4.2.13.Final-linux-x86_64.jar",
            "netty-transport-native-epoll",
        ),
        ("jline-3.29.0-jdk8.jar", "jline"),
        ("RoaringBitmap-0.9.25.jar", "RoaringBitmap"),
        ("py4j-0.10.9.9.jar", "py4j"),
    ],
)
def test_a_jars_artifact_is_its_name_without_version(jar: str, artifact: str) -> None:
    assert jvm.artifact(jar) == artifact


def test_the_lock_is_sha256sums_format_one_line_per_jar(tmp_path: Path) -> None:
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "b-1.0.jar").write_bytes(b"b")
    (folder / "a-2.0.jar").write_bytes(b"a")
    lock = tmp_path / "jars.sha256"
    assert jvm.write_lock(folder, lock) == {
        "a-2.0.jar": jvm.sha256(folder / "a-2.0.jar"),
        "b-1.0.jar": jvm.sha256(folder / "b-1.0.jar"),
    }
    assert lock.read_text() == (
        "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb  a-2.0.jar\n"
        "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d  b-1.0.jar\n"
    )
    lock.write_text("ca978112  a-2.0.jar\n")
    with pytest.raises(JarsError, match=r"jars\.sha256:1: not `<sha256>  <file>\.jar`"):
        jvm.read_lock(lock)


def test_a_session_and_a_submit_refuse_to_start_without_the_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any JVM starts: the typed error, not a ClassNotFoundException later."""
    from pyspark.sql import SparkSession

    monkeypatch.setattr(jvm, "jars_dir", lambda: tmp_path / "no-jars")
    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))

    def started(self: object) -> None:
        raise AssertionError("a session was started")

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", started)
    with pytest.raises(JarsError, match=r"delta-spark_4\.2_2\.13-4\.4\.0\.jar.*make install"):
        spark.get_session("local[1]")
    with pytest.raises(JarsError, match="make install"):
        spark.submit_conf()
