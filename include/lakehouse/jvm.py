"""The JVM jars Spark is given on top of pyspark's own: Delta Lake and Spark's Avro source.

``include/jvm/pom.xml`` names them; ``make install`` copies them from Maven Central into the
virtualenv (``.venv/jars``) once and runs this module's check. Every session and every
spark-submit gets them with ``spark.jars`` (:func:`spark_jars_conf`); nothing is resolved when a
job starts. ``include/jvm/jars.sha256`` locks them: one ``sha256  file`` line per jar (the format
of ``sha256sum``).

``python -m lakehouse.jvm`` checks the installed jars against the lock: every locked jar there
with its checksum, no other jar, and none with the artifact of a jar in pyspark's own ``jars``
folder (a second copy of a library on the class path). ``--lock`` first rewrites the lock from the
jars there (``make jars-lock``, after a deliberate change of the pom).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from lakehouse.config import REPO_ROOT
from lakehouse.errors import JarsError

MANIFEST = REPO_ROOT / "include" / "jvm" / "pom.xml"
LOCK = REPO_ROOT / "include" / "jvm" / "jars.sha256"

_REINSTALL = (
    "run `make install` to copy the locked jars again; after a change of include/jvm/pom.xml, "
    "`make jars-lock`"
)
_RELOCK = "exclude it in include/jvm/pom.xml, then run `make jars-lock`"


def jars_dir() -> Path:
    """Where ``make install`` puts the jars: inside the virtualenv, beside the pyspark they
    extend (``.venv/jars``; ``/usr/local/jars`` in the image)."""
    return Path(sys.prefix) / "jars"


def pyspark_jars_dir() -> Path:
    """pyspark's own jars (``site-packages/pyspark/jars``), found without importing pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise JarsError(["pyspark is not installed"], "run `make install`")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def read_lock(lock: Path | None = None) -> dict[str, str]:
    """``{jar file name: sha256}`` from the lock, in its order."""
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
        if not sep or len(digest) != 64 or "/" in name or not name.endswith(".jar"):
            raise JarsError([f"{lock}:{number}: not `<sha256>  <file>.jar`: {line!r}"], _RELOCK)
        locked[name] = digest.lower()
    if not locked:
        raise JarsError([f"{lock} names no jar"], _RELOCK)
    return locked


def spark_jars(directory: Path | None = None, lock: Path | None = None) -> list[Path]:
    """The jars for ``spark.jars``: each one of the lock, in the jars folder. Only checks that
    they are there (cheap enough for every session's start; :func:`check` reads them)."""
    directory = directory or jars_dir()
    paths = [directory / name for name in read_lock(lock)]
    missing = [path.name for path in paths if not path.is_file()]
    if missing:
        raise JarsError([f"JVM jars missing from {directory}: {', '.join(missing)}"], _REINSTALL)
    return paths


def spark_jars_conf(directory: Path | None = None, lock: Path | None = None) -> str:
    """``spark.jars``'s value: the jars' absolute paths, comma-separated."""
    return ",".join(str(path.absolute()) for path in spark_jars(directory, lock))


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
    directory: Path | None = None, lock: Path | None = None, pyspark_jars: Path | None = None
) -> list[Path]:
    """Check the installed jars; return them (in the lock's order) or raise :class:`JarsError`
    naming every problem: a locked jar missing or with another checksum, a jar the lock does not
    name, a jar whose artifact pyspark ships too."""
    directory = directory or jars_dir()
    pyspark_jars = pyspark_jars or pyspark_jars_dir()
    locked = read_lock(lock)
    present = {path.name: path for path in sorted(directory.glob("*.jar"))}
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
        remedies.append(_REINSTALL)
    theirs = {artifact(path.name): path.name for path in pyspark_jars.glob("*.jar")}
    if not theirs:
        raise JarsError([f"no jars in pyspark's folder {pyspark_jars}"], "run `make install`")
    duplicates = [name for name in present if artifact(name) in theirs]
    for name in duplicates:
        problems.append(
            f"{directory / name} duplicates pyspark's {theirs[artifact(name)]} "
            f"(artifact {artifact(name)})"
        )
    if duplicates:
        remedies.append(_RELOCK)
    if problems:
        raise JarsError(problems, "; ".join(remedies))
    return [present[name] for name in locked]


def write_lock(directory: Path | None = None, lock: Path | None = None) -> dict[str, str]:
    """Rewrite the lock from the jars in ``directory`` (after a deliberate change of the pom)."""
    directory = directory or jars_dir()
    lock = lock or LOCK
    jars = sorted(directory.glob("*.jar"))
    if not jars:
        raise JarsError([f"no jars in {directory} to lock"], "run `make jars-lock`")
    locked = {path.name: sha256(path) for path in jars}
    lock.write_text("".join(f"{digest}  {name}\n" for name, digest in locked.items()))
    return locked


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lakehouse.jvm", description=__doc__)
    parser.add_argument("--lock", action="store_true", help=f"first rewrite {LOCK.name}")
    args = parser.parse_args(argv)
    try:
        if args.lock:
            write_lock()
            print(f"wrote {LOCK}")
        jars = check()
    except JarsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    size = sum(path.stat().st_size for path in jars)
    print(
        f"JVM jars: {len(jars)} in {jars_dir()} ({size / 1e6:.1f} MB), as locked; "
        "none duplicates an artifact of pyspark's"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
