"""The tests' Kafka Streams oracle (imported by name: ``from oracle import StreamsOracle``): real
Kafka Streams, run in a TopologyTestDriver by ``tests/oracle/StreamsOracle.java``, that computes a
table from a history of input records, for the property tests to compare the platform's tables
with.

One JVM serves a whole test run (the ``streams_oracle`` fixture): Java's single-file source
launcher compiles the oracle when it starts, on the class path of its locked jars
(``tests/oracle/pom.xml``, copied into ``.venv/oracle-jars`` by ``make install``), and it then
answers one request per line, each with a topology, a driver and a state folder of its own.

A request is ``{"table": TABLE, "records": [RECORD, ...]}``, a record ``{"input": "left" |
"right", "key": str | None, "value": dict | None, "ts": epoch ms}`` (:func:`left`,
:func:`right`), piped in the order given; TABLE is one of::

    {"kind": "latest"}
    {"kind": "aggregate", "source": "stream" | "table", "group_by": FIELD | None,
     "aggregations": [{"name": str, "fn": FN, "field": FIELD | None}, ...], "window": WINDOW | None}
    {"kind": "join", "type": "stream-table" | "table-table" | "stream-stream",
     "how": "inner" | "left" | "outer", "on": FIELD | None, "within": ms, "grace": ms}
    {"kind": "history", "retention": ms | None}

    FN = count | sum | min | max | avg | count_distinct | earliest | latest | collect
    WINDOW = {"type": "tumbling", "size": ms, "grace": ms}
           | {"type": "hopping", "size": ms, "advance": ms, "grace": ms}
           | {"type": "session", "gap": ms, "grace": ms}

The answer (:class:`Result`) is every record of the output topic in order (``changelog``: a
table's changes, a null value deleting, or a stream's records), the final ``table`` (the changelog
folded by key and window) and, per input record, the positions in the changelog it caused
(``caused``; none: Kafka Streams dropped or skipped it). StreamsOracle.java says what each table
kind and aggregate function is in Kafka Streams' terms. An aggregate's entries named ``__...``
are the oracle's bookkeeping (:func:`public` leaves them out).

A ``history`` request puts each record into a versioned key-value store (KIP-889) with that
history retention (none: every version kept) at its timestamp; its output stream has, per record
with a key, ``{"put": code, "not_put": bool}`` (``not_put``: the store refused it as older than
its stream time minus the retention). The request's ``"probes": [[key, ts], ...]`` are answered
after the records by the store's ``get(key, ts)`` (:attr:`Result.probes`: None, or ``{"value",
"valid_from", "valid_to"}``; Kafka answers None for a time older than the retention too).
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from lakehouse.runtime.config import REPO_ROOT

SOURCE = REPO_ROOT / "tests" / "oracle" / "StreamsOracle.java"

Window = tuple[int, int]


class OracleError(Exception):
    """The oracle refused or failed a request (its message says why), or its JVM is gone."""


def left(key: str | None, value: Mapping[str, Any] | None, ts: int) -> dict[str, Any]:
    """A record of the left input (the table's own topic, or a join's left side)."""
    return {"input": "left", "key": key, "value": value, "ts": ts}


def right(key: str | None, value: Mapping[str, Any] | None, ts: int) -> dict[str, Any]:
    """A record of a join's right input."""
    return {"input": "right", "key": key, "value": value, "ts": ts}


def public(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A value without the oracle's bookkeeping (its entries named ``__...``)."""
    if value is None:
        return None
    return {name: v for name, v in value.items() if not name.startswith("__")}


@dataclass(frozen=True)
class Change:
    """One record of the output topic: a change of the table (``value`` None deletes) or a
    record of a stream; ``cause`` is the position of the input record that produced it."""

    key: str | None
    window: Window | None
    value: dict[str, Any] | None
    ts: int
    cause: int


@dataclass(frozen=True)
class Result:
    """What Kafka Streams made of a history."""

    result: Literal["table", "stream"]
    """What the output topic holds: a table's changes, or a stream's records (a join of a stream)."""
    changelog: list[Change]
    rows: dict[tuple[str | None, Window | None], dict[str, Any]]
    """The final table (the changelog folded by key and window), in key and window order."""
    caused: list[list[int]]
    """Per input record, the positions in :attr:`changelog` it produced."""
    probes: list[dict[str, Any] | None]
    """A ``history`` request's probes answered, in order (other requests: none)."""

    @classmethod
    def from_response(cls, response: Mapping[str, Any]) -> Result:
        return cls(
            result=response["result"],
            changelog=[
                Change(c["key"], _window(c["window"]), c["value"], c["ts"], c["cause"])
                for c in response["changelog"]
            ],
            rows={(row["key"], _window(row["window"])): row["value"] for row in response["table"]},
            caused=response["caused"],
            probes=response.get("probes", []),
        )

    @property
    def dropped(self) -> list[int]:
        """The input records that produced nothing: skipped (a null key, a null value, ...),
        too late, or, in a stream-stream left or outer join, unjoined and waiting for their
        window to close."""
        return [i for i, positions in enumerate(self.caused) if not positions]

    def table(self, *, bookkeeping: bool = False) -> dict[tuple[str | None, Window | None], Any]:
        """The final table, ``{(key, window): value}`` (window None for a table without
        windows), without the aggregates' bookkeeping unless asked."""
        if bookkeeping:
            return dict(self.rows)
        return {where: public(value) for where, value in self.rows.items()}

    def by(self, cause: int) -> list[Change]:
        """The changes input record ``cause`` produced."""
        return [self.changelog[position] for position in self.caused[cause]]


def _window(window: list[int] | None) -> Window | None:
    return None if window is None else (window[0], window[1])


class StreamsOracle:
    """The oracle's JVM, started once (``with StreamsOracle(log) as oracle:`` or :meth:`start`)
    and ended by :meth:`close`; its stderr (Kafka's warnings, the oracle's errors) goes to
    ``log``. Requests are served one at a time, each answered within ``timeout`` seconds (else
    the JVM is ended)."""

    def __init__(self, log: Path, *, timeout: float = 120.0) -> None:
        self.log = log
        self.timeout = timeout
        self._process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._log_file: IO[str] | None = None

    def start(self) -> StreamsOracle:
        """Start the JVM (it compiles the oracle, then waits for requests)."""
        if self._process is not None:
            return self
        from lakehouse.runtime.jvm import oracle_classpath
        from lakehouse.runtime.process import find_java

        java, _major, _home = find_java()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("a")
        self._lines = queue.Queue()
        self._process = subprocess.Popen(
            [java, "-cp", oracle_classpath(), str(SOURCE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            encoding="utf-8",
            bufsize=1,
        )
        assert self._process.stdout is not None
        threading.Thread(
            target=self._read,
            args=(self._process.stdout, self._lines),
            name="streams-oracle",
            daemon=True,
        ).start()
        return self

    @staticmethod
    def _read(stdout: IO[str], lines: queue.Queue[str | None]) -> None:
        """Moves the JVM's answers to ``lines``, then None when its stdout ends."""
        for line in stdout:
            lines.put(line)
        lines.put(None)

    def run(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """One request, its response; :class:`OracleError` if the oracle answers an error."""
        process = self.start()._process
        assert process is not None and process.stdin is not None
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        except BrokenPipeError:
            raise self._ended(process) from None
        try:
            line = self._lines.get(timeout=self.timeout)
        except queue.Empty:
            self.close()
            raise OracleError(
                f"the Kafka Streams oracle did not answer within {self.timeout:.0f} s (ended it)"
                f"{self._tail()}"
            ) from None
        if line is None:
            self._lines.put(None)  # every later request finds it ended too
            raise self._ended(process)
        response: dict[str, Any] = json.loads(line)
        if "error" in response:
            raise OracleError(f"the Kafka Streams oracle refused the request: {response['error']}")
        return response

    def compute(
        self,
        table: Mapping[str, Any],
        records: Sequence[Mapping[str, Any]],
        probes: Sequence[tuple[str, int]] = (),
    ) -> Result:
        """What Kafka Streams makes of ``records`` as ``table`` (a history: and its versions at
        ``probes``)."""
        request = {"table": table, "records": list(records), "probes": [list(p) for p in probes]}
        return Result.from_response(self.run(request))

    def _ended(self, process: subprocess.Popen[str]) -> OracleError:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        return OracleError(
            f"the Kafka Streams oracle has ended (exit code {process.returncode}){self._tail()}"
        )

    def _tail(self) -> str:
        from lakehouse.runtime.process import tail

        if self._log_file is not None:
            self._log_file.flush()
        text = tail(self.log)
        return f"; its log ({self.log}) ends:\n{text}" if text.strip() else f"; its log: {self.log}"

    def close(self, timeout: float = 10.0) -> None:
        """End the JVM: its stdin closes, it ends; killed if it has not after ``timeout`` s."""
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> StreamsOracle:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
