"""A Great Expectations validation worker: a child process that imports GX while the job does
its own work, then validates the job's pandas-sized batches.

Importing Great Expectations takes seconds of pure Python (about 4 s of one core here), and a
short-lived layer job does the rest of its work in well under that. In one process the import
is on the job's critical path however it is scheduled: a thread only interleaves it with the
job's own Python under the GIL. In a child process it runs on another core from the job's first
moments (``jobs/run_layer.py`` starts it before reading its contract, and stops it if the layer
has nothing to validate); the job sends the batch (the expectations' columns, as an Arrow IPC
stream) when it is staged and gets the outcomes and GX's result document back.

The child validates with the pandas engine only, so it imports GX as a deployment without
GX's optional Spark and SQL extras would: ``pyspark`` and ``sqlalchemy`` are blocked (GX then
uses its stand-ins for them), and ``scipy.stats``, ``scipy.spatial`` and ``altair``, which GX
imports for expectations and renderers the contracts do not use, load on first use. That
takes the import to about 2.3 s. The import hook lives only in the child and is single-threaded
there (``importlib.util.LazyLoader`` is not thread-safe in Python 3.11).

The parent falls back to validating in its own process whenever the worker cannot answer (it
did not start, died, broke the protocol, or GX failed on the batch), and says so: the verdict is
the same either way, and an error of GX's is raised in the parent.
Nothing but the two processes' private pipes carries the protocol:

* request: a 4-byte length and a JSON header (suite name, expectations), then an 8-byte length
  and the batch as an Arrow IPC stream;
* response: an 8-byte length and a JSON document: ``{"outcomes", "engine", "document"}`` or
  ``{"error"}``.

``LAKEHOUSE_GX_WORKER=0`` turns the worker off (validation in the job's process).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lakehouse.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from lakehouse.contracts import Expectation
    from lakehouse.quality import Outcome

BLOCKED = ("pyspark", "sqlalchemy")
LAZY = ("scipy.stats", "scipy.spatial", "altair")
_HEADER = struct.Struct(">I")
_BODY = struct.Struct(">Q")


class WorkerUnavailable(Exception):
    """The worker cannot answer this request; the caller validates in its own process."""


def enabled() -> bool:
    raw = os.environ.get("LAKEHOUSE_GX_WORKER", "1").strip()
    if raw not in {"0", "1"}:
        raise ConfigError(f"LAKEHOUSE_GX_WORKER must be 0 or 1, not {raw!r}")
    return raw == "1"


class ValidationWorker:
    """The parent's handle on one worker process."""

    def __init__(self) -> None:
        req_read, self._req = os.pipe()
        self._resp, resp_write = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lakehouse.gx_worker", str(req_read), str(resp_write)],
                pass_fds=(req_read, resp_write),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (req_read, resp_write, self._req, self._resp):
                os.close(fd)
            raise
        os.close(req_read)
        os.close(resp_write)
        self._broken: str | None = None
        atexit.register(self.close)

    def validate(
        self, name: str, expectations: Sequence[Expectation], batch: pa.Table
    ) -> tuple[list[Outcome], str, dict[str, Any]]:
        """GX's verdict on ``batch`` from the worker; WorkerUnavailable if it cannot give one."""
        from lakehouse.quality import Outcome

        if self._broken:
            raise WorkerUnavailable(self._broken)
        try:
            for part in _request(name, expectations, batch):
                _send(self._req, part)
            answer = json.loads(_receive(self._resp))
        except (OSError, EOFError, ValueError) as exc:
            self._broken = f"the worker stopped answering ({type(exc).__name__}: {exc})"
            self.close()
            raise WorkerUnavailable(self._broken) from None
        if "error" in answer:
            raise WorkerUnavailable(f"the worker failed: {answer['error']}")
        outcomes = [Outcome(**{**o, "sample": tuple(o["sample"])}) for o in answer["outcomes"]]
        return outcomes, answer["engine"], answer["document"]

    def close(self) -> None:
        """Stop the worker and reap it. Between requests it holds nothing but what it imported,
        so it is terminated, not waited for (it may still be importing GX when a job had
        nothing to validate). A worker whose job dies sees its request pipe close and exits."""
        for attr in ("_req", "_resp"):
            fd = getattr(self, attr)
            if fd >= 0:
                os.close(fd)
                setattr(self, attr, -1)
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait()


_WORKER: ValidationWorker | None = None


def start() -> ValidationWorker | None:
    """Start this process's worker (once); None when ``LAKEHOUSE_GX_WORKER=0`` or when it cannot
    be started (then this process validates, as it says)."""
    global _WORKER
    if _WORKER is None and enabled():
        try:
            _WORKER = ValidationWorker()
        except OSError as exc:
            print(
                f"quality: no validation worker ({exc}); validating in this process",
                file=sys.stderr,
            )
    return _WORKER


def keep(needed: bool) -> ValidationWorker | None:
    """The worker this process keeps: started when ``needed`` (unless turned off), stopped when
    not. A bad ``LAKEHOUSE_GX_WORKER`` raises ConfigError either way."""
    if needed and enabled():
        return start()
    enabled()
    if _WORKER is not None:
        stop()
    return None


def start_early(argv: Sequence[str]) -> None:
    """Start the worker as a process's first act, before it knows whether it will validate
    (the process then settles it with :func:`keep`); not for a dry run or a help request. A bad
    ``LAKEHOUSE_GX_WORKER`` is left for that :func:`keep` to report."""
    if {"--dry-run", "-h", "--help"} & set(argv):
        return
    try:
        keep(True)
    except ConfigError:
        return


def current() -> ValidationWorker | None:
    return _WORKER


def stop() -> None:
    global _WORKER
    if _WORKER is not None:
        _WORKER.close()
        _WORKER = None


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


def _send(fd: int, data: Any) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"pipe closed with {left} of {n} bytes unread")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _receive(fd: int) -> bytes:
    (size,) = _BODY.unpack(_read_exactly(fd, _BODY.size))
    return _read_exactly(fd, size)


def _expectation(doc: dict[str, Any]) -> Expectation:
    from lakehouse.contracts import Expectation

    params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in doc.pop("params"))
    return Expectation(**doc, params=params)


# -- the child ---------------------------------------------------------------------------------
def _trim_imports() -> None:
    """Import GX as a pandas-only deployment: without its optional Spark and SQL extras, and
    with the modules it needs only for expectations and renderers we do not use loaded lazily."""
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


def serve(requests: int, responses: int) -> None:
    """Answer requests until the request pipe closes, then exit."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    _trim_imports()
    import great_expectations  # noqa: F401  (the point of starting early)
    import pyarrow as pa

    from lakehouse.quality import run_suite

    while True:
        try:
            (size,) = _HEADER.unpack(_read_exactly(requests, _HEADER.size))
        except EOFError:
            # Nothing to clean up: skip the interpreter's teardown of everything GX loaded
            # (half a second, which the job would wait for).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        header = json.loads(_read_exactly(requests, size))
        body = _receive(requests)
        try:
            batch = pa.ipc.open_stream(body).read_all()
            expectations = [_expectation(e) for e in header["expectations"]]
            outcomes, engine, document = run_suite(
                header["name"], expectations, batch, batch.num_rows, in_process=True
            )
            answer: dict[str, Any] = {
                "outcomes": [dataclasses.asdict(o) for o in outcomes],
                "engine": engine,
                "document": document,
            }
            payload = json.dumps(answer).encode()
        except Exception as exc:  # reported to the parent, which validates itself
            payload = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
        _send(responses, _BODY.pack(len(payload)) + payload)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
