"""The one place a SparkSession is built. Jobs and tests receive it; nothing builds its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.errors import ConfigError, JarsError
from lakehouse.runtime import jvm
from lakehouse.runtime.config import whole_number_setting
from lakehouse.runtime.process import ensure_java

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


# Delta Lake in every session: its SQL (DESCRIBE HISTORY, `delta.`<path>``, ...) and its catalog
# over Spark's own, for format("delta") and Delta tables by name. The classes are in the jars of
# :func:`jvm_conf`.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


# Local files without a process started per file or commit. Hadoop's local file system runs
# `chmod` for every file it creates (no native Hadoop library is on the class path), and its
# FileContext (Delta's default log store for `file:`, HDFSLogStore, and the checkpoint file
# manager Delta writes each version's checksum file with) runs `readlink` four times per
# rename: about 24 processes a commit. BareLocalFileSystem (hadoop-bare-naked-local-fs) is
# Hadoop's LocalFileSystem with permissions and file status through java.nio; Delta's
# LocalLogStore and Spark's FileSystem-based checkpoint file manager rename through it. On
# local files neither log store excludes another process (HDFSLogStore locks only on a
# RawLocalFileSystem); the platform's table lock does (lakehouse.storage.delta_spark). The
# checkpoint manager's setting is session-wide: on s3a it renames through S3AFileSystem rather
# than FileContext over it, the same copy and delete.
LOCAL_FILES_CONF = {
    "spark.hadoop.fs.file.impl": "com.globalmentor.apache.hadoop.fs.BareLocalFileSystem",
    "spark.delta.logStore.file.impl": "io.delta.storage.LocalLogStore",
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
}


def jvm_conf() -> dict[str, str]:
    """The JVM jars beyond pyspark's (Delta Lake, Spark's Avro source), installed once by
    ``make install`` (:mod:`lakehouse.runtime.jvm`), as ``spark.jars`` and (the local file
    system) the class path, and Delta's settings (:data:`DELTA_CONF`, :data:`LOCAL_FILES_CONF`).
    Raises :class:`~lakehouse.errors.JarsError` if a jar is missing."""
    launch = jvm.launch_classpath()
    return {
        "spark.jars": jvm.spark_jars_conf(),
        "spark.driver.extraClassPath": launch,
        "spark.executor.extraClassPath": launch,
        **DELTA_CONF,
        **LOCAL_FILES_CONF,
    }


def submit_conf() -> dict[str, str]:
    """The settings a ``spark-submit`` of a job passes beyond its master: the interpreter the
    driver and executors run (the one with `lakehouse`), the jars and Delta's settings
    (:func:`jvm_conf`)."""
    return {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **jvm_conf(),
    }


# Settings whose values are class paths: more settings add to them instead of replacing them.
CLASS_PATH_KEYS = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")


def merged(conf: Mapping[str, str], more: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with ``more``'s settings: a class path of :data:`CLASS_PATH_KEYS` is joined to
    the one ``conf`` has (the platform's launch jars stay on it), every other setting replaced."""
    out = dict(conf)
    for key, value in more.items():
        if key in CLASS_PATH_KEYS and out.get(key):
            out[key] = os.pathsep.join((out[key], value))
        else:
            out[key] = value
    return out


def conf_args(conf: dict[str, str]) -> list[str]:
    """``conf`` as spark-submit's command-line flags."""
    return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]


OPENLINEAGE_URL_ENV = "LAKEHOUSE_SPARK_OPENLINEAGE_URL"
OPENLINEAGE_NAMESPACE_ENV = "LAKEHOUSE_SPARK_OPENLINEAGE_NAMESPACE"
OPENLINEAGE_LISTENER = "io.openlineage.spark.agent.OpenLineageSparkListener"


def openlineage_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with OpenLineage's Spark listener when the deployment turns it on:
    ``LAKEHOUSE_SPARK_OPENLINEAGE_URL`` is the OpenLineage backend's HTTP address (events go to
    its ``/api/v1/lineage``), ``LAKEHOUSE_SPARK_OPENLINEAGE_NAMESPACE`` the jobs' namespace
    (default ``lakehouse-spark``). Unset: ``conf`` as it is, and the jar is not loaded."""
    url = os.environ.get(OPENLINEAGE_URL_ENV, "").strip()
    if not url:
        return dict(conf)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{OPENLINEAGE_URL_ENV}={url!r}: give the backend's http(s):// address")
    jars = [str(p.absolute()) for p in jvm.openlineage_jars()]
    # On the class path the JVM starts with, beside Delta's: the listener finds the connectors'
    # lineage extensions through the class loader that loaded them.
    launched = merged(conf, {"spark.driver.extraClassPath": os.pathsep.join(jars)})
    return {
        **launched,
        "spark.jars": ",".join(j for j in (conf.get("spark.jars", ""), *jars) if j),
        "spark.extraListeners": OPENLINEAGE_LISTENER,
        "spark.openlineage.transport.type": "http",
        "spark.openlineage.transport.url": url,
        "spark.openlineage.namespace": os.environ.get(OPENLINEAGE_NAMESPACE_ENV)
        or "lakehouse-spark",
    }


def spark_conf(master: str, app_name: str) -> dict[str, str]:
    """Settings every job runs with, whatever the master (with OpenLineage's listener when
    the deployment turns it on: :func:`openlineage_conf`)."""
    return openlineage_conf(_spark_conf(master, app_name))


def _spark_conf(master: str, app_name: str) -> dict[str, str]:
    return {
        "spark.master": master,
        "spark.app.name": app_name,
        # Event times and offsets are compared across machines: always UTC.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": _partitions("LAKEHOUSE_SHUFFLE_PARTITIONS", 8),
        # delta-spark reads a table's log state (every write that records its position does) in
        # this many partitions (its default: 50). A log of a few thousand files is read fastest
        # in one: a 10K-row append with its position took 0.69 s so against 0.97 s in 8.
        "spark.databricks.delta.snapshotPartitions": _partitions(
            "LAKEHOUSE_SNAPSHOT_PARTITIONS", 1
        ),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        **codegen_conf(),
        # Executors must run the project's interpreter, which has the `lakehouse` package.
        **submit_conf(),
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": os.environ.get("LAKEHOUSE_SPARK_UI", "false"),
        "spark.driver.memory": os.environ.get("LAKEHOUSE_DRIVER_MEMORY", "2g"),
        # HotSpot does not JIT-compile methods over 8000 bytes of bytecode; a whole-stage
        # method larger than that (silver's decoding with its per-field diagnosis) would run
        # interpreted, several times slower. Spark's documentation suggests this limit on
        # HotSpot: larger stages fall back to smaller, compiled pieces.
        "spark.sql.codegen.hugeMethodLimit": "8000",
        # A layer caches a batch it reads twice (silver's decoded records feed the gate, the
        # stream and the quarantine) for the length of one job. Compressing the cache's columns
        # cost silver a fifth of its time on a million records; the cache is short-lived and
        # spills to disk when it does not fit (MEMORY_AND_DISK).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # A Spark task has one core (spark.task.cpus), and its neighbours use the others. A
        # Python task that parses with polars (bronze's segment reader) would otherwise start a
        # thread per core of the machine in every task, and the tasks contend for the cores.
        "spark.executorEnv.POLARS_MAX_THREADS": "1",
        **storage_conf(),
    }


EVENT_LOG_ENV = "LAKEHOUSE_SPARK_EVENT_LOG"


def event_log_conf() -> dict[str, str]:
    """The pipeline's Spark server's event log, written to the folder ``LAKEHOUSE_SPARK_EVENT_LOG``
    names (none when it is unset; the readers' server writes no file outside its warehouse): what Spark's history server shows, and what ``bench/batch_jobs.py`` counts a
    batch's jobs from. Each job carries the layer and table it was for as a job tag
    (:func:`lakehouse.runtime.spark.tagged`)."""
    folder = os.environ.get(EVENT_LOG_ENV, "").strip()
    if not folder:
        return {}
    path = Path(folder).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": path.as_uri(),
        "spark.eventLog.compress": "false",
    }


def _partitions(name: str, default: int) -> str:
    return str(whole_number_setting(name, default, "partitions", least=1))


def storage_conf() -> dict[str, str]:
    """Hadoop's S3A settings when the data is in a bucket (``LAKEHOUSE_DATA=s3://...``) or a
    store is named (``LAKEHOUSE_S3_ENDPOINT``), and
    the store's settings (no credentials) in the executors' environment, where bronze's
    Python tasks read landing segments with pyarrow. Credentials stay in each process's
    environment (or its instance role), where S3A, delta-rs and pyarrow look for them."""
    from lakehouse.runtime import objectstore

    raw = os.environ.get("LAKEHOUSE_DATA", "")
    in_bucket = isinstance(objectstore.location(raw) if raw else None, objectstore.ObjectPath)
    if not in_bucket and not os.environ.get("LAKEHOUSE_S3_ENDPOINT"):
        return {}
    conf = objectstore.S3Settings.from_env().spark_conf()
    for name in ("LAKEHOUSE_DATA", *objectstore.STORE_SETTINGS):
        if os.environ.get(name):
            conf[f"spark.executorEnv.{name}"] = os.environ[name]
    return conf


def task_slots(spark: SparkSession) -> int:
    """How many tasks Spark runs at once: ``spark.default.parallelism`` if set, else the cores of
    a ``local[N]`` master, else the shuffle partitions. Read from settings, so it works on a
    Spark Connect session too (which has no SparkContext)."""
    import re

    given = spark.conf.get("spark.default.parallelism", None)
    if given and given.isdigit():
        return int(given)
    local = re.fullmatch(
        r"local(?:\[(\d+|\*)(?:,\d+)?\])?", spark.conf.get("spark.master", "") or ""
    )
    if local:
        cores = local.group(1) or "1"
        return (os.cpu_count() or 1) if cores == "*" else int(cores)
    return int(spark.conf.get("spark.sql.shuffle.partitions", "8") or 8)


def codegen_conf() -> dict[str, str]:
    """``LAKEHOUSE_SPARK_CODEGEN=off``: Spark evaluates expressions without generating and
    compiling code for them. For micro-batches of a few thousand rows, compiling a plan's code
    (about 0.1 s a task, whatever its rows) costs more than running it interpreted; big batches
    want it ``on`` (the default)."""
    value = os.environ.get("LAKEHOUSE_SPARK_CODEGEN", "on")
    if value not in ("on", "off"):
        raise ConfigError(f"LAKEHOUSE_SPARK_CODEGEN must be 'on' or 'off', not {value!r}")
    if value == "on":
        return {}
    return {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


ADAPTIVE_ENV = "LAKEHOUSE_SPARK_ADAPTIVE"
SMALL_BATCH_ENV = "LAKEHOUSE_SPARK_SMALL_BATCH_ROWS"
_ADAPTIVE_KEY = "spark.sql.adaptive.enabled"
# How a small batch is planned: each query one Spark job. Without adaptive execution (which
# runs each shuffle and broadcast as a job of its own), without broadcast joins, planned or
# hinted (a broadcast is collected by a job of its own; the hints are the DataFrame API's, which
# a Spark Connect client sends as hints to resolve), and in one shuffle partition (what adaptive
# execution would have coalesced the shuffles to; a MERGE writes one file).
SMALL_BATCH_CONF = {
    _ADAPTIVE_KEY: "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.optimizer.disableHints": "true",
    "spark.sql.shuffle.partitions": "1",
}


def adaptive_mode() -> str:
    """``LAKEHOUSE_SPARK_ADAPTIVE``: ``auto`` (the default), ``on`` or ``off``.

    Spark's adaptive query execution plans each shuffle and broadcast after the one before it
    has run, as a Spark job of its own. On a batch of a few rows that doubles its jobs and wins
    nothing (there are no partitions to coalesce); on thousands of rows it coalesces a
    shuffle's small partitions. ``auto`` keeps it on the server, and the session building one
    table plans a batch whose input is at most :func:`small_batch_rows` rows with
    :data:`SMALL_BATCH_CONF` (:func:`adaptive_for`); ``on`` and ``off`` hold for every batch."""
    value = os.environ.get(ADAPTIVE_ENV, "auto")
    if value not in ("auto", "on", "off"):
        raise ConfigError(f"{ADAPTIVE_ENV} must be 'auto', 'on' or 'off', not {value!r}")
    return value


def small_batch_rows() -> int:
    """``LAKEHOUSE_SPARK_SMALL_BATCH_ROWS`` (default 1000): the most input rows a table's batch
    may have to be planned as a small batch under ``LAKEHOUSE_SPARK_ADAPTIVE=auto``."""
    return whole_number_setting(SMALL_BATCH_ENV, 1000, "rows")


def adaptive_conf() -> dict[str, str]:
    """The pipeline's server's adaptive execution: off only under ``LAKEHOUSE_SPARK_ADAPTIVE=off``
    (``auto`` turns it off per batch, :func:`adaptive_for`). The readers' server and a job's own
    session keep Spark's default."""
    return {_ADAPTIVE_KEY: "false" if adaptive_mode() == "off" else "true"}


@contextmanager
def adaptive_for(spark: SparkSession, rows: int | None) -> Iterator[None]:
    """Plan the ``with`` block's queries on ``spark`` with :data:`SMALL_BATCH_CONF` when
    ``LAKEHOUSE_SPARK_ADAPTIVE=auto`` and the batch's input is known to be at most
    :func:`small_batch_rows` rows (``rows``; None: not known), and put the session's settings
    back after. ``spark`` must be the session of one thread's table: the settings are the
    session's."""
    if adaptive_mode() != "auto" or rows is None or rows > small_batch_rows():
        yield
        return
    settings = dict(SMALL_BATCH_CONF)
    before = {key: spark.conf.get(key) for key in settings}

    def restore() -> None:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)

    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the batch's own error is the one to tell
            restore()
        raise
    restore()


def is_empty(df: DataFrame) -> bool:
    """Whether ``df`` has no rows, in one Spark job: ``DataFrame.isEmpty`` takes one row the way
    ``take`` does, a job over the first partition and, while none is found, another over four
    times as many, so an empty result (a batch's late records, most often) costs several."""
    return df.limit(1).count() == 0


def session_log(home: Path) -> Path:
    """Where a Spark that a command starts for itself writes its output: its JVM's stdout and
    stderr (Spark's log at ``LAKEHOUSE_SPARK_LOG_LEVEL``, the JVM's own warnings, its Python
    workers' output), appended, each start under a line of its own."""
    return home / "logs" / "spark.log"


def get_session(
    master: str | None = None,
    app_name: str = "lakehouse",
    *,
    log: Path | None = None,
    extra: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the process's SparkSession, creating it with the platform's settings and
    ``extra`` ones (e.g. the metastore's, :func:`lakehouse.runtime.metastore.metastore_conf`);
    with ``log``, a JVM this starts writes its output there instead of the terminal's. Raises
    :class:`~lakehouse.errors.JarsError` before Spark starts if a jar of :func:`jvm_conf` is
    missing, or, under spark-submit, if the submit did not give them."""
    from pyspark.sql import SparkSession

    launched = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit has started the JVM
    if not launched:
        ensure_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder
    submitted = master is None and launched
    conf = spark_conf(master or os.environ.get("LAKEHOUSE_SPARK_MASTER", "local[2]"), app_name)
    conf = merged(conf, extra or {})
    if submitted:
        # Launched by spark-submit: its --master/--name/--driver-memory are the ones to keep.
        for key in ("spark.master", "spark.app.name", "spark.driver.memory"):
            conf.pop(key)
    if launched:
        _check_submitted_jars(conf["spark.jars"])
    elif log is not None and "SPARK_REMOTE" not in os.environ:  # (a Connect session: no JVM)
        _launch_jvm(conf, log)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("LAKEHOUSE_SPARK_LOG_LEVEL", "WARN"))
    return session


def _launch_jvm(conf: dict[str, str], log: Path) -> None:
    """Start the JVM the session will use with its stdout and stderr in ``log``. pyspark starts
    it with the first session, on this process's terminal; started here first, by pyspark's own
    launcher told where its output goes, the session takes it as it is (as under spark-submit).
    Spark's warnings then go to the log from the JVM's first line on, which no log level set
    after the start can do (its start-up lines, `Using Spark's default log4j profile`, the JVM's
    own `WARNING:` lines)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:  # this process's JVM runs already
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        out.write(f"\n--- {conf['spark.app.name']} (pid {os.getpid()}) at {started}\n".encode())
        out.flush()
        gateway = launch_gateway(
            SparkConf(loadDefaults=False).setAll(list(conf.items())),
            popen_kwargs={"stdout": out, "stderr": subprocess.STDOUT},
        )
    SparkContext._ensure_initialized(gateway=gateway)


def _check_submitted_jars(jars: str) -> None:
    """spark-submit started this process's JVM, and its class path was fixed then: the jars
    must have come with the submit (its ``spark.jars`` or ``--jars``). Setting them now would
    reach the executors but not the driver, which would miss Delta's classes."""
    from urllib.parse import urlparse

    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, to read its settings
    given = SparkConf().get("spark.jars") or ""
    names = {Path(urlparse(uri).path).name for uri in given.split(",") if uri}
    missing = [Path(jar).name for jar in jars.split(",") if Path(jar).name not in names]
    if missing:
        raise JarsError(
            [f"spark-submit started this job without the JVM jars {', '.join(missing)}"],
            "submit it with lakehouse.runtime.spark.submit_conf()'s settings, as the Airflow operator "
            "does: `--conf spark.jars=...`",
        )


@contextmanager
def own_session(spark: SparkSession) -> Iterator[SparkSession]:
    """A copy of ``spark`` (its settings, temporary views and functions) that is a session of its
    own from then on, for the ``with`` block, released after: work on it sets its own session
    settings, so threads with one each can run MERGEs side by side. On Spark Connect, a clone of
    the server's session (the same server and driver); in a JVM of this process, a clone of the
    JVM's session on the same SparkContext."""
    from pyspark.sql import SparkSession

    if is_remote(spark):
        # The server makes a client's session at its first request, and clones only one it has.
        spark.conf.get("spark.sql.session.timeZone")
        copy = spark.cloneSession()  # type: ignore[attr-defined]
        try:
            yield copy
        finally:
            with contextlib.suppress(Exception):  # best effort: the server ends it on timeout
                copy.client.release_session()
            copy.client.close()
        return
    jvm_copy = spark._jsparkSession.cloneSession()
    yield SparkSession(spark.sparkContext, jvm_copy)


def is_remote(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# The prefix of the job tag each layer's and each gold table's Spark jobs carry.
JOB_TAG_PREFIX = "lakehouse"


@contextmanager
def tagged(spark: SparkSession, *parts: str) -> Iterator[None]:
    """Tag the Spark jobs this thread runs on ``spark`` in the ``with`` block with
    ``lakehouse:<part>:<part>...`` (a layer and topic, or ``gold`` and a table): Spark's UI, its
    event log and its status API then say what each job was for. Spark Connect keeps a client's
    tags per thread; a job tag may not hold a comma."""
    tag = ":".join((JOB_TAG_PREFIX, *(p.replace(",", "_") for p in parts)))
    try:
        spark.addTag(tag)
        added = True
    except Exception:  # a session that cannot tag runs its jobs untagged
        added = False
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(Exception):
                spark.removeTag(tag)
