"""The lakehouse's own PostgreSQL: Airflow's metadata database for `make airflow` and the end to
end tests (a real database, so the LocalExecutor runs independent tasks side by side).

    lakehouse postgres start | stop | status

It is a cluster of Debian's PostgreSQL server programs (package ``postgresql``; ``make postgres``
installs it), made by ``initdb`` under ``<home>/postgres/``: ``data/`` (the cluster),
``postgres.log`` (the server's log) and ``password`` (the role ``lakehouse``'s password,
generated on the first start, mode 0600, outside the repository).

* It listens on 127.0.0.1 only, on ``LAKEHOUSE_POSTGRES_PORT`` (default 15432, away from a
  system PostgreSQL on 5432), and has no Unix socket: every client comes over TCP.
* Every connection authenticates with a password (scram-sha-256). The role ``lakehouse`` owns
  the cluster and the database ``airflow``.
* ``initdb`` and ``postgres`` refuse to run as root (a database superuser can make the server
  run programs, as its operating system user). Started by root, the server programs run as the
  unprivileged user ``postgres`` that Debian's package creates: ``data/`` and ``postgres.log``
  belong to it, and every folder above ``<home>/postgres`` must let it through.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import port_setting, private_file, tail
from lakehouse.runtime.service import LocalServer, Port

PORT_ENV = "LAKEHOUSE_POSTGRES_PORT"
DEFAULT_PORT = 15432
PACKAGE = "postgresql"  # Debian's
SERVER_USER = "postgres"  # Debian's package creates it; the server runs as it under root
ROLE = "lakehouse"
AIRFLOW_DATABASE = "airflow"
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 60


class PostgresError(LakehouseError):
    """The cluster could not be made, started, stopped or reached."""


def port() -> int:
    """The port a start listens on (``LAKEHOUSE_POSTGRES_PORT``, default 15432); anything but a
    port number is a ConfigError naming the variable."""
    return port_setting(PORT_ENV, DEFAULT_PORT)


def bindir() -> Path:
    """The folder of the server programs: ``pg_ctl``'s on PATH, else the newest of Debian's
    ``/usr/lib/postgresql/<version>/bin`` (Debian puts only wrappers on PATH)."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    installed = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")]
    numbered = [p for p in installed if p.parent.name.isdigit()]
    if numbered:
        return max(numbered, key=lambda p: int(p.parent.name))
    raise PostgresError(
        "PostgreSQL's server programs (initdb, pg_ctl) are not installed: install Debian's "
        f"package '{PACKAGE}' (`make postgres` does, as root; or sudo apt-get install {PACKAGE})"
    )


@dataclass(frozen=True)
class Status:
    """What ``lakehouse postgres status`` reports."""

    running: bool
    port: int | None = None
    pid: int | None = None
    log: Path | None = None

    def describe(self, *, already: bool = False) -> str:
        if not self.running:
            return "PostgreSQL: not running; start it with `lakehouse postgres start`"
        return (
            f"PostgreSQL: {'already ' if already else ''}running, pid {self.pid}, "
            f"{LOOPBACK}:{self.port}, role {ROLE} (log: {self.log})"
        )


class Cluster(LocalServer[Status]):
    """A cluster kept in ``root`` (``<home>/postgres`` for a lakehouse: :meth:`of`). Its server
    is started and stopped by ``pg_ctl`` and keeps its own record, ``data/postmaster.pid``."""

    NAME = "PostgreSQL"
    COMMAND = "postgres"
    PORTS = (Port("port", PORT_ENV, DEFAULT_PORT),)
    LOG = "postgres.log"
    START_TIMEOUT_S = START_TIMEOUT_S
    ERROR = PostgresError

    @classmethod
    def of(cls, settings: Settings) -> Cluster:
        return cls(settings.home / "postgres")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def password_file(self) -> Path:
        return self.root / "password"

    # -- state -------------------------------------------------------------------------------
    def password(self, *, create: bool = False) -> str:
        """The role's password, from ``password``; with ``create``, generated there first if
        missing (mode 0600, written whole before it is visible)."""
        path = self.password_file
        if not create and not path.is_file():
            raise PostgresError(
                f"no PostgreSQL password at {path}: start the cluster with "
                "`lakehouse postgres start`"
            )
        # URL-safe: it goes into Airflow's database URL.
        return private_file(path, lambda: secrets.token_urlsafe(32)).strip()

    def record(self) -> dict[str, object]:
        """The server's own record, ``postmaster.pid``: its pid and port."""
        try:
            lines = (self.data / "postmaster.pid").read_text(encoding="utf-8").splitlines()
            return {"pid": int(lines[0]), "port": int(lines[3])}
        except (OSError, ValueError, IndexError):
            return {}

    def make_status(self, record: Mapping[str, object] | None) -> Status:
        if record is None:
            return Status(False)
        return Status(True, int(str(record["port"])), int(str(record["pid"])), self.log)

    def url(self, database: str = AIRFLOW_DATABASE) -> str:
        """SQLAlchemy's URL of ``database`` on the running cluster (psycopg 3, which Airflow
        prefers when it is installed)."""
        current = self.status()
        if not current.running:
            raise PostgresError(
                f"the PostgreSQL cluster at {self.root} is not running: start it with "
                "`lakehouse postgres start` (make airflow does)"
            )
        return f"postgresql+psycopg://{ROLE}:{self.password()}@{LOOPBACK}:{current.port}/{database}"

    # -- life cycle --------------------------------------------------------------------------
    def prepare(self, ports: Mapping[str, int]) -> None:
        """Make the cluster on first use."""
        if not (self.data / "PG_VERSION").is_file():
            self._init()
        self._prepare_log()

    def _run(self, ports: Mapping[str, int], timeout: float) -> Status:
        """``pg_ctl start``, which returns once the server answers; then the database
        ``airflow``."""
        at = ports["port"]
        proc = self._run_program(
            "pg_ctl",
            "start",
            "--wait",
            f"--timeout={int(timeout)}",
            f"--pgdata={self.data}",
            f"--log={self.log}",
            f"--options=-p {at}",
        )
        if proc.returncode != 0:
            raise PostgresError(
                f"PostgreSQL did not start on port {at}: {proc.stdout.strip()}\n"
                f"its log ({self.log}) ends with:\n{tail(self.log)}"
            )
        self.create_database(AIRFLOW_DATABASE)
        return self.status()

    def stop(self, *, timeout: float | None = None) -> bool:
        """Stop the server (its sessions are ended, its work is kept); False if none ran."""
        if not self.status().running:
            return False
        proc = self._run_program("pg_ctl", "stop", "--wait", "--mode=fast", f"--pgdata={self.data}")
        if proc.returncode != 0:
            raise PostgresError(f"pg_ctl stop failed: {proc.stdout.strip()}")
        return True

    def create_database(self, name: str) -> None:
        """Create database ``name``, owned by the role, unless it exists."""
        current = self.status()
        if not current.running or current.port is None:
            raise PostgresError(
                f"the PostgreSQL cluster at {self.root} is not running: start it with "
                "`lakehouse postgres start` (make airflow does)"
            )
        create_database(name, host=LOOPBACK, port=current.port, user=ROLE, password=self.password())

    # -- helpers -----------------------------------------------------------------------------
    def _init(self) -> None:
        password = self.password(create=True)
        self.root.chmod(0o711 if _as_root() else 0o700)
        if _as_root():
            _check_reachable(self.root)
        if self.data.exists():
            shutil.rmtree(self.data)  # a cluster initdb left unfinished
        self.data.mkdir(mode=0o700)
        # initdb reads the password from a file the server's user can read: the role's own
        # file, or a copy of it for that user, deleted right after.
        pwfile = self.password_file
        if _as_root():
            pwfile = self.root / ".initdb-password"
            pwfile.write_text(password, encoding="ascii")
            pwfile.chmod(0o600)
            _give_to_server_user(self.data, pwfile)
        try:
            proc = self._run_program(
                "initdb",
                f"--pgdata={self.data}",
                f"--username={ROLE}",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--no-locale",
            )
        finally:
            if pwfile != self.password_file:
                pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise PostgresError(f"initdb failed for {self.data}:\n{proc.stdout[-3000:]}")
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                "\n# The lakehouse's: TCP on the loopback address only, no Unix socket.\n"
                f"listen_addresses = '{LOOPBACK}'\n"
                "unix_socket_directories = ''\n"
            )

    def _prepare_log(self) -> None:
        self.log.touch(mode=0o600)
        if _as_root():
            _give_to_server_user(self.log)

    def _run_program(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(bindir() / program), *args]
        if _as_root():
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        return subprocess.run(
            command,
            cwd=self.root,  # a folder the server's user may enter
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=START_TIMEOUT_S + 60,
            check=False,
        )


def _as_root() -> bool:
    return os.geteuid() == 0


def _server_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresError(
            f"PostgreSQL's server refuses to run as root, and the user '{SERVER_USER}' it would "
            f"run as does not exist: install Debian's package '{PACKAGE}' (it creates the "
            "user; `make postgres` does), or run as an unprivileged user"
        ) from None


def _give_to_server_user(*paths: Path) -> None:
    user = _server_user()
    for path in paths:
        os.chown(path, user.pw_uid, user.pw_gid)


def _check_reachable(folder: Path) -> None:
    """As root: every folder down to ``folder`` lets the server's user through."""
    user = _server_user()
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for path in [*reversed(folder.parents), folder]:
        st = path.stat()
        if st.st_uid == user.pw_uid:
            bit = 0o100
        elif st.st_gid in groups:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            raise PostgresError(
                f"PostgreSQL's server runs as the user '{SERVER_USER}' (it refuses root), and "
                f"that user cannot enter {path} (mode {st.st_mode & 0o777:o}): keep the "
                "lakehouse (LAKEHOUSE_HOME) under folders it may enter, or run as an "
                "unprivileged user"
            )


def main(settings: Settings, action: str) -> int:
    """``lakehouse postgres start | stop | status`` (status: exit code 1 when it is down)."""
    return Cluster.of(settings).main(action)


def create_database(name: str, *, host: str, port: int, user: str, password: str) -> None:
    """Create database ``name`` on the PostgreSQL server at ``host:port`` unless it exists,
    logged in as ``user`` (to the server's ``postgres`` database). ``name`` must be a plain
    identifier: anything else is a ConfigError."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise ConfigError(f"invalid database name {name!r}: lower-case letters, digits, '_'")
    import psycopg

    with psycopg.connect(
        host=host,
        port=port,
        user=user,
        password=password,
        dbname="postgres",
        autocommit=True,
        connect_timeout=10,
    ) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        conn.execute(f"CREATE DATABASE {name}")  # checked above: a plain identifier
