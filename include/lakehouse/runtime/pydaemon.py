"""The Spark server's Python daemon: Spark's own (``pyspark.daemon``, which forks a Connect
session's Python workers), quitting once it has had no worker for ``LAKEHOUSE_SPARK_PYTHON_IDLE``
seconds. Spark runs it as ``python -m lakehouse.runtime.pydaemon`` (the server's
``spark.python.daemon.module``); see :mod:`lakehouse.runtime.server` for why."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

PYTHON_IDLE_ENV, DEFAULT_PYTHON_IDLE_S = "LAKEHOUSE_SPARK_PYTHON_IDLE", 60


def python_daemon() -> None:
    """Spark's Python daemon (``pyspark.daemon``, which forks a session's Python workers), run by
    the server for each session (``spark.python.daemon.module``), that quits once it has had no
    worker for ``LAKEHOUSE_SPARK_PYTHON_IDLE`` seconds.

    Spark would keep it until the server stops. It ends a session's idle workers itself, a
    minute after the session's last Python task; a session that wants workers after its daemon
    quit gets a new daemon (Spark restarts a daemon it cannot reach, with a WARN line in the
    server's log). The daemon decides only when its wait for work has ended empty-handed, never
    between taking a connection and forking its worker."""
    import select
    import types

    import pyspark.daemon

    idle = float(os.environ.get(PYTHON_IDLE_ENV, DEFAULT_PYTHON_IDLE_S))

    class QuitWhenIdle:
        """The daemon's poll of its listening socket and its stdin, which ends the daemon (by
        ``SystemExit``: its own shutdown runs) when the wait found nothing to do, it has no
        worker, and nothing has come for ``idle`` seconds."""

        def __init__(self) -> None:
            self._poll = select.poll()
            self._busy = time.monotonic()

        def register(self, fd: FileDescriptorLike, events: int) -> None:
            self._poll.register(fd, events)

        def unregister(self, fd: FileDescriptorLike) -> None:
            self._poll.unregister(fd)

        def poll(self, timeout: int) -> list[tuple[int, int]]:
            ready = self._poll.poll(timeout)
            if ready or _has_children():
                self._busy = time.monotonic()
            elif time.monotonic() - self._busy >= idle:
                raise SystemExit(0)
            return ready

    # The daemon finds select.poll in its module's globals: it gets this one.
    selector = types.ModuleType("select")
    selector.__dict__.update(vars(select), poll=QuitWhenIdle)
    pyspark.daemon.select = selector
    pyspark.daemon.manager()


def _has_children() -> bool:
    """Whether this process has a child alive (the daemon's children are its workers; it ignores
    SIGCHLD, so the kernel reaps the ones that end)."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


if __name__ == "__main__":  # as Spark's Python daemon
    python_daemon()
