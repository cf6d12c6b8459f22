"""The one place a SparkSession is built. Jobs and tests receive it; nothing builds its own."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lakehouse import jvm
from lakehouse.errors import ConfigError, JarsError
from lakehouse.runtime import ensure_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# The driver JVM's options: ``LAKEHOUSE_DRIVER_JAVA_OPTIONS`` replaces them whole when set
# (empty: none). Otherwise the JVM starts with
#
# * the JIT's compilers: the quick C1 alone for a process that runs one micro-batch and exits
#   (a layer job under Airflow, `lakehouse run`), both tiers (C1, then the optimising C2) for a
#   long-lived session. C2 spends seconds of CPU optimising code for a long run; on two cores
#   that CPU is taken from a short job, which then starts slower (bench/jvm_start.py), while a
#   long run goes faster with it (bench/end_to_end.py). ``LAKEHOUSE_JVM_COMPILER=c1|c2`` decides
#   for every process (e.g. ``c2`` for a backfill of millions of records through Airflow);
# * ``-XX:SharedArchiveFile=<class archive>``, when `lakehouse spark-archive` has written one
#   (make does): Spark's classes mapped ready-parsed instead of loaded from the jars. The JVM
#   checks the archive against itself and its class path and ignores one that does not fit.
#
# In local mode the executors live in the driver's JVM, so these cover the whole job.
JAVA_OPTIONS_ENV = "LAKEHOUSE_DRIVER_JAVA_OPTIONS"
COMPILER_ENV = "LAKEHOUSE_JVM_COMPILER"

# Delta Lake in every session: its SQL (DESCRIBE HISTORY, `delta.`<path>``, ...) and its catalog
# over Spark's own, for format("delta") and Delta tables by name. The classes are in the jars of
# :func:`jvm_conf`.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def class_archive() -> Path:
    """Where this interpreter's Spark class archive lives: inside the virtualenv, since it
    belongs to the jars installed there. The JVM records each jar's size and time in the archive
    and ignores the archive, with a warning, once a jar or the JVM itself has changed."""
    return Path(sys.prefix) / "var" / "lakehouse" / "spark-classes.jsa"


def driver_java_options(*, short_lived: bool) -> str:
    """The options the driver JVM of a job starts with (see :data:`JAVA_OPTIONS_ENV`);
    ``short_lived``: the process runs one micro-batch and exits."""
    given = os.environ.get(JAVA_OPTIONS_ENV)
    if given is not None:
        return given.strip()
    compiler = os.environ.get(COMPILER_ENV, "").strip().lower() or ("c1" if short_lived else "c2")
    if compiler not in ("c1", "c2"):
        raise ConfigError(f"{COMPILER_ENV}={compiler!r}: expected c1 or c2")
    options = ["-XX:TieredStopAtLevel=1"] if compiler == "c1" else []
    archive = class_archive()
    if archive.is_file():
        options.append(f"-XX:SharedArchiveFile={archive}")
    return " ".join(options)


def jvm_conf() -> dict[str, str]:
    """The JVM jars beyond pyspark's (Delta Lake, Spark's Avro source), installed once by
    ``make install`` (:mod:`lakehouse.jvm`), as ``spark.jars``, and Delta's settings
    (:data:`DELTA_CONF`). Raises :class:`~lakehouse.errors.JarsError` if a jar is missing."""
    return {"spark.jars": jvm.spark_jars_conf(), **DELTA_CONF}


def submit_conf(*, short_lived: bool = True, jvm_options: bool = True) -> dict[str, str]:
    """The settings a ``spark-submit`` of a job passes beyond its master: the interpreter the
    driver and executors run (the one with `lakehouse`), the jars and Delta's settings
    (:func:`jvm_conf`), and, with ``jvm_options``, the driver JVM's options (a layer job runs one
    micro-batch: ``short_lived``)."""
    conf = {
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        **jvm_conf(),
    }
    options = driver_java_options(short_lived=short_lived) if jvm_options else ""
    if options:
        conf["spark.driver.extraJavaOptions"] = options
    return conf


def conf_args(conf: dict[str, str]) -> list[str]:
    """``conf`` as spark-submit's command-line flags."""
    return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]


def spark_conf(
    master: str, app_name: str, *, short_lived: bool = False, jvm_options: bool = True
) -> dict[str, str]:
    """Settings every job runs with, whatever the master (``jvm_options``: with the driver
    JVM's start-up options; see :func:`driver_java_options`)."""
    return {
        "spark.master": master,
        "spark.app.name": app_name,
        # Event times and offsets are compared across machines: always UTC.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": os.environ.get("LAKEHOUSE_SHUFFLE_PARTITIONS", "8"),
        # delta-spark reads a table's log state in this many partitions (default 50): for the
        # small logs of micro-batch tables, 50 tasks cost more than the work.
        "spark.databricks.delta.snapshotPartitions": os.environ.get(
            "LAKEHOUSE_SHUFFLE_PARTITIONS", "8"
        ),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        **codegen_conf(),
        # Executors must run the project's interpreter, which has the `lakehouse` package.
        **submit_conf(short_lived=short_lived, jvm_options=jvm_options),
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
    }


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


def get_session(
    master: str | None = None, app_name: str = "lakehouse", *, short_lived: bool = False
) -> SparkSession:
    """Return the process's SparkSession, creating it with the platform's settings;
    ``short_lived``: this process runs one micro-batch and exits (the JVM's JIT is chosen for
    that, see :func:`driver_java_options`). Raises :class:`~lakehouse.errors.JarsError` before
    Spark starts if a jar of :func:`jvm_conf` is missing, or, under spark-submit, if the submit
    did not give them."""
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
    conf = spark_conf(
        master or os.environ.get("LAKEHOUSE_SPARK_MASTER", "local[2]"),
        app_name,
        short_lived=short_lived,
        jvm_options=not submitted,  # spark-submit has started the JVM with its own
    )
    if submitted:
        # Launched by spark-submit: its --master/--name/--driver-memory are the ones to keep.
        for key in ("spark.master", "spark.app.name", "spark.driver.memory"):
            conf.pop(key)
    if launched:
        _check_submitted_jars(conf["spark.jars"])
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("LAKEHOUSE_SPARK_LOG_LEVEL", "WARN"))
    return session


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
            "submit it with lakehouse.spark.submit_conf()'s settings, as the Airflow operator "
            "does: `--conf spark.jars=...`",
        )


class LazySession:
    """Stands in for a SparkSession that is started only when something first uses it.

    A command that may find nothing to do (``lakehouse maintain`` on a lakehouse without
    tables) does not pay the seconds a SparkContext takes to start. Every attribute is the
    started session's; :meth:`stop` stops it only if it was started."""

    def __init__(self, start: Callable[[], SparkSession]) -> None:
        self._start = start
        self._session: SparkSession | None = None

    @property
    def started(self) -> bool:
        return self._session is not None

    def session(self) -> SparkSession:
        if self._session is None:
            self._session = self._start()
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session(), name)

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()


def lazy_session(
    master: str | None = None, app_name: str = "lakehouse", *, short_lived: bool = False
) -> SparkSession:
    """:func:`get_session`, called when the session is first used (:class:`LazySession`)."""
    lazy = LazySession(lambda: get_session(master, app_name, short_lived=short_lived))
    return cast("SparkSession", lazy)


def build_class_archive(records: int = 2000) -> Path:
    """Write this interpreter's Spark class archive (:func:`class_archive`): run the shipped
    sample pipeline once, every layer of every sample topic, in a scratch lakehouse with a JVM
    that records the classes it loads and writes them out when it exits. Returns the archive's
    path; raises ``RuntimeError`` with the workload's output if no archive came out of it."""
    import subprocess
    import tempfile

    from lakehouse.config import REPO_ROOT

    archive = class_archive()
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    ensure_java()
    with tempfile.TemporaryDirectory(prefix="lakehouse-archive-") as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
        env |= {
            "LAKEHOUSE_HOME": str(Path(scratch) / "lakehouse"),
            "LAKEHOUSE_CONTRACTS": str(REPO_ROOT / "contracts"),
            JAVA_OPTIONS_ENV: f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial}",
        }
        cli = [sys.executable, "-m", "lakehouse.cli"]
        output = []
        for args in (["sample", "--records", str(records)], ["run"]):
            done = subprocess.run(
                [*cli, *args], env=env, capture_output=True, text=True, check=False
            )
            output.append(done.stdout + done.stderr)
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                raise RuntimeError(f"lakehouse {args[0]} failed:\n{_failure(output[-1])}")
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no class archive:\n{output[-1][-3000:]}")
    partial.replace(archive)
    return archive


def _failure(output: str) -> str:
    """What a failed command printed, shortened: its error lines (not a JVM stack's frames),
    then its last lines."""
    errors = [
        line
        for line in output.splitlines()
        if ("Error" in line or "Exception" in line) and not line.lstrip().startswith("at ")
    ]
    return "\n".join(errors[:20]) + "\n...\n" + output[-2000:]


def python_zips() -> list[Path]:
    """The zips Spark puts first on its Python processes' path (``SPARK_HOME/python/lib``: pyspark
    and py4j), for the pyspark installed beside this interpreter."""
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))


def compile_python_zip(path: Path) -> bool:
    """Add this interpreter's bytecode to a zip of Python sources; ``False`` if it already has it.

    Every Python process Spark starts (the daemon of each kind of Python work: tasks, a data
    source's planning and its commit) imports pyspark from ``pyspark.zip``, and Python cannot
    cache bytecode for a zip: it compiled pyspark's modules again in each of them, about a second
    of CPU per process here. Python's zip importer uses a ``.pyc`` beside a ``.py`` in the zip
    when its magic number is this interpreter's and its hash matches the source (checked
    hash-based pycs, PEP 552), else it compiles the source as before: a zip compiled for another
    Python, or whose source changed, still works. Sources are kept byte for byte; the new zip
    replaces the old one in one rename (a new file: the old may be hard-linked into a package
    cache)."""
    import importlib.util
    import marshal
    import zipfile

    magic = importlib.util.MAGIC_NUMBER
    with zipfile.ZipFile(path) as zin:
        names = set(zin.namelist())
        sources = [n for n in names if n.endswith(".py")]
        if all(n + "c" in names for n in sources) and all(
            zin.read(n + "c")[:4] == magic for n in sources[:1]
        ):
            return False
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zout:
                for info in zin.infolist():
                    if info.filename.endswith(".pyc"):
                        continue  # stale bytecode of another interpreter: replaced below
                    data = zin.read(info)
                    zout.writestr(info, data)
                    if not info.filename.endswith(".py"):
                        continue
                    code = compile(data, info.filename, "exec", dont_inherit=True)
                    flags = 0b11  # hash-based, checked against the source
                    header = magic + flags.to_bytes(4, "little") + importlib.util.source_hash(data)
                    # Stored, not deflated: the point is a fast import.
                    pyc = zipfile.ZipInfo(info.filename + "c", info.date_time)
                    zout.writestr(pyc, header + marshal.dumps(code), zipfile.ZIP_STORED)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
    return True
