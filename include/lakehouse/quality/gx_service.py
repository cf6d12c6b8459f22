"""The Great Expectations service: one long-lived process, started and stopped with the Spark
server (:mod:`lakehouse.runtime.server`), that validates the pandas-sized batches of every job of the
lakehouse. A job (a thin Spark Connect client, or any other process of this ``LAKEHOUSE_HOME``)
sends the expectations' columns over a Unix socket and gets GX's verdict back, without
importing Great Expectations itself.

Why a process of its own, not Spark's Python workers: importing GX costs seconds of one core,
so it must happen once, not once per job. Spark 4.2 keys its Python daemons by the Spark Connect
session (each session's artifact directory is part of the key): every client session starts a
new daemon with fresh workers, so a daemon that imported GX (``spark.python.daemon.module``)
would import it again for every job, on the critical path of the job's first Python task, and
keep the copy (about 300 MB) until the session expires.

The service imports GX once, as a deployment without GX's optional Spark and SQL extras would:
``pyspark`` and ``sqlalchemy`` are blocked (GX then uses its stand-ins for them), and
``scipy.stats``, ``scipy.spatial`` and ``altair``, which GX imports for expectations and
renderers the contracts do not use, load on first use. It then forks a child per connection:
the child has GX loaded, validates with :func:`lakehouse.quality.verdict.run_suite` (the same
``pandas_frame`` widening, suite and result format as in a job's own process) and exits, so no
job's suite or data outlives it. The parent forks with no thread of its own (GX's import starts
none; jemalloc's background thread is not carried into a child) and never validates.

The socket is ``<home>/spark/gx.sock``, mode 0600: only this user's processes reach it. The wire,
one request per connection:

* request: a 4-byte length and a JSON header (suite name, expectations), then an 8-byte length
  and the batch as an Arrow IPC stream;
* response: an 8-byte length and a JSON document: ``{"outcomes", "engine", "document"}`` or
  ``{"error"}``.

A job whose service does not answer (no server, or the service died) validates in its own
process and says so; the verdict is the same either way, and an error of GX's is raised in the
job's process.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.quality.verdict import Outcome, Remote, ServiceUnavailable, run_suite

if TYPE_CHECKING:
    import pyarrow as pa

    from lakehouse.contracts.model import Expectation
BLOCKED = ("pyspark", "sqlalchemy")
LAZY = ("scipy.stats", "scipy.spatial", "altair")
_HEADER = struct.Struct(">I")
_BODY = struct.Struct(">Q")


def client(path: Path) -> Remote:
    """The client :func:`~lakehouse.quality.verdict.run_suite` sends pandas-sized batches to:
    the service listening at ``path``."""
    return functools.partial(validate, path)


def validate(
    path: Path, name: str, expectations: Sequence[Expectation], batch: pa.Table
) -> tuple[list[Outcome], str, dict[str, Any]]:
    """GX's verdict on ``batch`` from the service at ``path``; ServiceUnavailable if it cannot
    give one."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            for part in _request(name, expectations, batch):
                conn.sendall(part)
            conn.shutdown(socket.SHUT_WR)
            answer = json.loads(_receive(conn))
    except (OSError, EOFError, ValueError) as exc:
        raise ServiceUnavailable(
            f"no answer from the validation service at {path} ({type(exc).__name__}: {exc})"
        ) from None
    if "error" in answer:
        raise ServiceUnavailable(f"the validation service failed: {answer['error']}")
    outcomes = [Outcome(**{**o, "sample": tuple(o["sample"])}) for o in answer["outcomes"]]
    return outcomes, answer["engine"], answer["document"]


# -- the wire ----------------------------------------------------------------------------------
def _request(name: str, expectations: Sequence[Expectation], batch: pa.Table) -> list[Any]:
    """A request's parts, sent one after another (the batch's IPC buffer is not copied)."""
    import pyarrow as pa

    header = json.dumps(
        {"name": name, "expectations": [dataclasses.asdict(e) for e in expectations]}
    ).encode()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_table(batch)
    body = sink.getvalue()
    return [_HEADER.pack(len(header)), header, _BODY.pack(body.size), body]


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"connection closed with {left} of {n} bytes unread")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _receive(conn: socket.socket) -> bytes:
    (size,) = _BODY.unpack(_read_exactly(conn, _BODY.size))
    return _read_exactly(conn, size)


def _expectation(doc: dict[str, Any]) -> Expectation:
    from lakehouse.contracts.model import Expectation

    params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in doc.pop("params"))
    return Expectation(**doc, params=params)


# -- the service -------------------------------------------------------------------------------
def _trim_imports() -> None:
    """Import GX as a pandas-only deployment: without its optional Spark and SQL extras, and
    with the modules it needs only for expectations and renderers we do not use loaded lazily
    (``importlib.util.LazyLoader`` is not thread-safe: the service is single-threaded)."""
    import importlib.abc
    import importlib.util

    for name in BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]  # "not installed" to importers

    class LazyFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            if fullname not in LAZY:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is not None and spec.loader is not None:
                spec.loader = importlib.util.LazyLoader(spec.loader)
            return spec

    sys.meta_path.insert(0, LazyFinder())


def _answer(conn: socket.socket) -> None:
    """Validate one request (in a forked child) and send the verdict, or the error; nothing
    for a connection closed before its request."""
    import pyarrow as pa

    try:
        first = _read_exactly(conn, _HEADER.size)
    except EOFError:
        return  # a connection that only checked the service is up (:func:`answers`)
    try:
        (size,) = _HEADER.unpack(first)
        header = json.loads(_read_exactly(conn, size))
        batch = pa.ipc.open_stream(_receive(conn)).read_all()
        expectations = [_expectation(e) for e in header["expectations"]]
        outcomes, engine, document = run_suite(header["name"], expectations, batch, batch.num_rows)
        payload = json.dumps(
            {
                "outcomes": [dataclasses.asdict(o) for o in outcomes],
                "engine": engine,
                "document": document,
            }
        ).encode()
    except Exception as exc:  # reported to the job, which validates itself
        payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
    conn.sendall(_BODY.pack(len(payload)) + payload)


def serve(path: Path) -> None:
    """Import GX, listen at ``path`` and answer each connection in a forked child, until
    terminated."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    # One core per request, as a Spark task has; and no BLAS thread pool in the forking parent.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _trim_imports()
    import great_expectations  # noqa: F401  (the point of the service)
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    path.unlink(missing_ok=True)  # a dead service's socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped as they exit
    print(f"validation service: listening at {path}", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                _answer(conn)
            except BaseException:  # the job sees the connection close and validates itself
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                # Skip the interpreter's teardown of everything GX loaded.
                os._exit(code)
        conn.close()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
