"""The platform's JVM jars, copied from Maven Central once, at install, and locked.

* Spark's, on top of pyspark's own: Delta Lake and Spark's Avro source. ``include/jvm/pom.xml``
  names them; ``make install`` copies them into the virtualenv (``.venv/jars``). Every session
  and every spark-submit gets them with ``spark.jars`` (:func:`spark_jars_conf`).
* The local Kafka broker's (:mod:`lakehouse.runtime.broker`): ``include/jvm/kafka/pom.xml`` names them;
  ``make install`` copies them into ``.venv/kafka-jars``. They are the broker's class path alone
  (:func:`broker_classpath`), never Spark's: Kafka brings its own Scala and Jackson.
* The Spark server's own code (``include/jvm/server``), compiled from source by ``make install``
  with the JDK's javac against pyspark's jars into ``.venv/lakehouse-server.jar``
  (:func:`server_jar`): nothing to resolve, so nothing to lock.
* The schema registry's (:mod:`lakehouse.runtime.registry`): Apicurio Registry's application,
  one archive (``include/jvm/registry/pom.xml``) that ``make install`` copies into
  ``.venv/registry-dist``, checks, and unpacks into ``.venv/registry`` (:func:`registry_dir`).
* OpenLineage's Spark listener, which a deployment may turn on
  (:func:`lakehouse.runtime.spark.openlineage_conf`): ``include/jvm/openlineage/pom.xml`` names
  its one shaded jar; ``make install`` copies it into ``.venv/openlineage-jars``.
* The tests' Kafka Streams oracle's (``tests/oracle/StreamsOracle.java``, real Kafka Streams in a
  TopologyTestDriver, which the property tests compare the platform's tables with):
  ``tests/oracle/pom.xml`` names them; ``make install`` copies them into ``.venv/oracle-jars``.
  They are the oracle's class path alone (:func:`oracle_classpath`), for the tests.

Nothing is resolved when a job or the broker starts. The ``jars.sha256`` beside each pom locks its
jars: one ``sha256  file`` line per jar (the format of ``sha256sum``).

``python -m lakehouse.runtime.jvm [spark|kafka|registry|openlineage|oracle]`` checks the installed jars against their
lock: every locked jar there with its checksum, no other jar, and, for Spark's, none with the
artifact of a jar in pyspark's own ``jars`` folder (a second copy of a library on the class path).
``--lock`` first rewrites the lock from the jars there (``make jars-lock``, after a deliberate
change of a pom).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import JarsError
from lakehouse.runtime.arguments import Parser
from lakehouse.runtime.config import REPO_ROOT

MANIFEST = REPO_ROOT / "include" / "jvm" / "pom.xml"
LOCK = REPO_ROOT / "include" / "jvm" / "jars.sha256"
KAFKA_MANIFEST = REPO_ROOT / "include" / "jvm" / "kafka" / "pom.xml"
KAFKA_LOCK = REPO_ROOT / "include" / "jvm" / "kafka" / "jars.sha256"
REGISTRY_LOCK = REPO_ROOT / "include" / "jvm" / "registry" / "jars.sha256"
OPENLINEAGE_LOCK = REPO_ROOT / "include" / "jvm" / "openlineage" / "jars.sha256"
ORACLE_MANIFEST = REPO_ROOT / "tests" / "oracle" / "pom.xml"
ORACLE_LOCK = REPO_ROOT / "tests" / "oracle" / "jars.sha256"

_RELOCK = "exclude it in include/jvm/pom.xml, then run `make jars-lock`"


def _reinstall(lock: Path) -> str:
    """What to run when the jars of ``lock`` are not the locked ones (its pom is beside it)."""
    pom = lock.with_name("pom.xml")
    shown = pom.relative_to(REPO_ROOT) if pom.is_relative_to(REPO_ROOT) else pom
    return (
        f"run `make install` to copy the locked jars again; after a change of {shown}, "
        "`make jars-lock`"
    )


def jars_dir() -> Path:
    """Where ``make install`` puts the jars: inside the virtualenv, beside the pyspark they
    extend (``.venv/jars``; ``/usr/local/jars`` in the image)."""
    return Path(sys.prefix) / "jars"


def openlineage_jars_dir() -> Path:
    """Where ``make install`` puts OpenLineage's Spark listener (``.venv/openlineage-jars``)."""
    return Path(sys.prefix) / "openlineage-jars"


def openlineage_jars() -> list[Path]:
    """OpenLineage's Spark listener jar, as locked (for ``spark.jars`` when it is turned on)."""
    return installed(openlineage_jars_dir(), OPENLINEAGE_LOCK)


def kafka_jars_dir() -> Path:
    """Where ``make install`` puts the Kafka broker's jars (``.venv/kafka-jars``)."""
    return Path(sys.prefix) / "kafka-jars"


def registry_dist_dir() -> Path:
    """Where ``make install`` copies the schema registry's archive (``.venv/registry-dist``)."""
    return Path(sys.prefix) / "registry-dist"


def registry_dir() -> Path:
    """Where ``make install`` unpacks it (``.venv/registry``: ``quarkus-run.jar`` and its
    ``lib/``)."""
    return Path(sys.prefix) / "registry"


def oracle_jars_dir() -> Path:
    """Where ``make install`` puts the tests' Kafka Streams oracle's jars (``.venv/oracle-jars``)."""
    return Path(sys.prefix) / "oracle-jars"


SERVER_JAR = "lakehouse-server.jar"


def server_jar() -> Path:
    """The Spark server's own JVM code (``include/jvm/server``: its main class, its credentials,
    the readers' check), which ``make install`` compiles into the virtualenv
    (``.venv/lakehouse-server.jar``). Raises :class:`JarsError` if it is not there."""
    path = Path(sys.prefix) / SERVER_JAR
    if not path.is_file():
        raise JarsError(
            [f"the Spark server's jar {path} is missing"],
            "run `make install` (it compiles include/jvm/server with the JDK's javac)",
        )
    return path


def pyspark_jars_dir() -> Path:
    """pyspark's own jars (``site-packages/pyspark/jars``), found without importing pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise JarsError(["pyspark is not installed"], "run `make install`")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def read_lock(lock: Path | None = None, pattern: str = "*.jar") -> dict[str, str]:
    """``{jar file name: sha256}`` from the lock, in its order (each name matches ``pattern``)."""
    lock = lock or LOCK
    try:
        text = lock.read_text()
    except FileNotFoundError:
        raise JarsError([f"no jar lock at {lock}"], "restore it from git") from None
    locked: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or "/" in name or not fnmatch.fnmatch(name, pattern):
            raise JarsError(
                [f"{lock}:{number}: not `<sha256>  <file>{pattern.lstrip('*')}`: {line!r}"],
                _relock(lock),
            )
        locked[name] = digest.lower()
    if not locked:
        raise JarsError([f"{lock} names no jar"], _relock(lock))
    return locked


def _relock(lock: Path) -> str:
    return _RELOCK if lock == LOCK else "run `make jars-lock`, which rewrites it"


def installed(directory: Path, lock: Path) -> list[Path]:
    """Each jar of ``lock``, in ``directory``. Only checks that they are there (cheap enough
    for every start; :func:`check` reads them)."""
    paths = [directory / name for name in read_lock(lock)]
    missing = [path.name for path in paths if not path.is_file()]
    if missing:
        raise JarsError(
            [f"JVM jars missing from {directory}: {', '.join(missing)}"], _reinstall(lock)
        )
    return paths


# Jars of the lock that must be on the JVM's class path when it starts, not in ``spark.jars``
# (loaded after it has started): Hadoop looks the ``file:`` file system up first, to fetch the
# ``spark.jars`` themselves. PostgreSQL's JDBC driver: the Hive metastore's client (DataNucleus)
# loads it through the class loader the JVM started with.
LAUNCH_ARTIFACTS = ("hadoop-bare-naked-local-fs", "postgresql")


def spark_jars(directory: Path | None = None, lock: Path | None = None) -> list[Path]:
    """The jars for ``spark.jars``: each one of the lock, in the jars folder, but those of
    :data:`LAUNCH_ARTIFACTS`."""
    every = installed(directory or jars_dir(), lock or LOCK)
    return [path for path in every if artifact(path.name) not in LAUNCH_ARTIFACTS]


def launch_classpath(directory: Path | None = None, lock: Path | None = None) -> str:
    """The jars of :data:`LAUNCH_ARTIFACTS`, as the driver's and executors' extra class path."""
    every = installed(directory or jars_dir(), lock or LOCK)
    return os.pathsep.join(
        str(path.absolute()) for path in every if artifact(path.name) in LAUNCH_ARTIFACTS
    )


def spark_jars_conf(directory: Path | None = None, lock: Path | None = None) -> str:
    """``spark.jars``'s value: the jars' absolute paths, comma-separated."""
    return ",".join(str(path.absolute()) for path in spark_jars(directory, lock))


def classpath(directory: Path, lock: Path) -> str:
    """A JVM's class path: the locked jars of ``lock`` in ``directory``, absolute, in the lock's
    order."""
    return os.pathsep.join(str(path.absolute()) for path in installed(directory, lock))


def broker_classpath() -> str:
    """The Kafka broker's class path."""
    return classpath(kafka_jars_dir(), KAFKA_LOCK)


def oracle_classpath() -> str:
    """The tests' Kafka Streams oracle's class path."""
    return classpath(oracle_jars_dir(), ORACLE_LOCK)


def artifact(jar: str) -> str:
    """A jar's artifact: its file name, named the Maven way (``artifact-version[-classifier]``),
    without version and classifier. The version is the last word that starts with a digit after a
    word that does not: ``zstd-jni-1.5.7-7`` and ``hive-exec-2.3.10-core`` are ``zstd-jni`` and
    ``hive-exec``, ``log4j-1.2-api-2.25.4`` is ``log4j-1.2-api``."""
    words = jar.removesuffix(".jar").split("-")
    versions = [
        i for i in range(1, len(words)) if words[i][:1].isdigit() and not words[i - 1][:1].isdigit()
    ]
    return "-".join(words[: versions[-1]] if versions else words)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(
    directory: Path | None = None,
    lock: Path | None = None,
    pyspark_jars: Path | None = None,
    *,
    beside_pyspark: bool = True,
    pattern: str = "*.jar",
) -> list[Path]:
    """Check the installed jars (by default Spark's); return them (in the lock's order) or raise
    :class:`JarsError` naming every problem: a locked jar missing or with another checksum, a jar
    the lock does not name, and, ``beside_pyspark`` (jars on Spark's class path), a jar whose
    artifact pyspark ships too."""
    directory = directory or jars_dir()
    lock = lock or LOCK
    locked = read_lock(lock, pattern)
    present = {path.name: path for path in sorted(directory.glob(pattern))}
    problems: list[str] = []
    remedies: list[str] = []
    missing = [name for name in locked if name not in present]
    if missing:
        problems.append(f"JVM jars missing from {directory}: {', '.join(missing)}")
    for name, expected in locked.items():
        if name in present and (actual := sha256(present[name])) != expected:
            problems.append(f"{present[name]}: sha256 {actual}, the lock says {expected}")
    extra = [name for name in present if name not in locked]
    if extra:
        problems.append(f"jars in {directory} that the lock does not name: {', '.join(extra)}")
    if problems:
        remedies.append(_reinstall(lock))
    if beside_pyspark:
        duplicates = _duplicates_of_pysparks(directory, list(present), pyspark_jars)
        problems += duplicates
        if duplicates:
            remedies.append(_RELOCK)
    if problems:
        raise JarsError(problems, "; ".join(remedies))
    return [present[name] for name in locked]


def _duplicates_of_pysparks(
    directory: Path, names: list[str], pyspark_jars: Path | None = None
) -> list[str]:
    """One problem per jar of ``names`` whose artifact pyspark's jars folder has too."""
    pyspark_jars = pyspark_jars or pyspark_jars_dir()
    theirs = {artifact(path.name): path.name for path in pyspark_jars.glob("*.jar")}
    if not theirs:
        raise JarsError([f"no jars in pyspark's folder {pyspark_jars}"], "run `make install`")
    return [
        f"{directory / name} duplicates pyspark's {theirs[artifact(name)]} "
        f"(artifact {artifact(name)})"
        for name in names
        if artifact(name) in theirs
    ]


def write_lock(
    directory: Path | None = None, lock: Path | None = None, pattern: str = "*.jar"
) -> dict[str, str]:
    """Rewrite the lock from the jars in ``directory`` (after a deliberate change of the pom)."""
    directory = directory or jars_dir()
    lock = lock or LOCK
    jars = sorted(directory.glob(pattern))
    if not jars:
        raise JarsError([f"no jars in {directory} to lock"], "run `make jars-lock`")
    locked = {path.name: sha256(path) for path in jars}
    lock.write_text("".join(f"{digest}  {name}\n" for name, digest in locked.items()))
    return locked


@dataclass(frozen=True)
class _JarSet:
    """One set of jars ``main`` checks: what it is called, where it is installed (looked up
    when checked), its lock, and whether it goes on Spark's class path."""

    label: str
    directory: Callable[[], Path]
    lock: Path
    beside_pyspark: bool
    pattern: str = "*.jar"


# The folders are looked up when a set is checked (by name: a test may replace the function).
_JAR_SETS = {
    "spark": _JarSet("JVM jars", lambda: jars_dir(), LOCK, beside_pyspark=True),
    "kafka": _JarSet(
        "Kafka broker jars", lambda: kafka_jars_dir(), KAFKA_LOCK, beside_pyspark=False
    ),
    "registry": _JarSet(
        "Schema registry archive",
        lambda: registry_dist_dir(),
        REGISTRY_LOCK,
        beside_pyspark=False,
        pattern="*.tar.gz",
    ),
    "oracle": _JarSet(
        "Kafka Streams oracle jars", lambda: oracle_jars_dir(), ORACLE_LOCK, beside_pyspark=False
    ),
    "openlineage": _JarSet(
        "OpenLineage Spark listener jars",
        lambda: openlineage_jars_dir(),
        OPENLINEAGE_LOCK,
        beside_pyspark=True,
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m lakehouse.runtime.jvm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "jars",
        nargs="?",
        choices=tuple(_JAR_SETS),
        default="spark",
        help="Spark's jars (the default), the Kafka broker's, the schema registry's archive or "
        "the tests' Kafka Streams oracle's",
    )
    parser.add_argument("--lock", action="store_true", help="first rewrite their jars.sha256")
    args = parser.parse_args(argv)
    jar_set = _JAR_SETS[args.jars]
    directory, lock = jar_set.directory(), jar_set.lock
    try:
        if args.lock:
            write_lock(directory, lock, jar_set.pattern)
            print(f"wrote {lock}")
        jars = check(
            directory, lock, beside_pyspark=jar_set.beside_pyspark, pattern=jar_set.pattern
        )
    except JarsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    size = sum(path.stat().st_size for path in jars)
    print(
        f"{jar_set.label}: {len(jars)} in {directory} ({size / 1e6:.1f} MB), as locked"
        + ("; none duplicates an artifact of pyspark's" if jar_set.beside_pyspark else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
