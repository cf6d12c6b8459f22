"""The object store going away under a layer job (issue 30, point 3). The lakehouse's data is in a
bucket of the test S3 API (``LAKEHOUSE_DATA=s3://...``, moto's server), which its jobs reach
through a TCP proxy of the test's own (:class:`Proxy`): the test cuts it (its listener and every
open connection closed, so a client's connections are reset and new ones refused, as when a
store goes away) and restores it on the same port. moto keeps everything in memory, so the store
itself is never stopped; the test watches the bucket through moto's own endpoint, past the proxy.

* **Gone in the middle of bronze's commit, then back**: records are produced to the landing
  topic in the bucket, ``lakehouse run --topic T --layer bronze`` starts (its own local Spark,
  the proxy as ``LAKEHOUSE_S3_ENDPOINT``), and the proxy is cut once data files of the new batch
  are under the table's prefix while the log has no commit adding them (in later rounds, a
  random moment up to :data:`WINDOW_S` after that, which can fall after the commit too). Two
  outages: :data:`CUT_S` seconds with S3A's default retries, which outlast it here (the run
  succeeds; the test accepts a failure too, and prints which happened); and one that lasts
  until the run gives up, with S3A's retries lowered in a ``core-site.xml`` given to the job
  (``HADOOP_CONF_DIR``; at the defaults a run whose store is gone fails after about 160 s
  here). Either way the run must end, a failure saying which connection failed, and a success
  only with its batch committed; the log holds no stray or partial commit, the rerun
  succeeds, every version of bronze holds whole batches (each round's records, all or none),
  bronze holds each produced record once, and its quarantine each damaged line once.
* **Gone before the run starts**: the run fails with the platform's message that the bucket
  cannot be reached, naming the bucket and the endpoint, and writes nothing.

Size: ``LAKEHOUSE_RELIABILITY_KILLS`` cuts per outage (``lakes.KILLS``; at most 10);
``LAKEHOUSE_RELIABILITY_SEED`` replays the cut moments.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from faults import KILLS, SEED, Job, Lake, run_id, start_job

from lakehouse.runtime import objectstore
from lakehouse.runtime.objectstore import ObjectPath
from lakehouse.topics.landing import Producer, Record, segment_name
from lakes import S3_REGION, S3Store

ROUNDS = min(KILLS, 10)
TOPIC = "payments"
PARTITIONS = 3
RECORDS = 5_000  # good records produced before each round, besides the damaged segment's
CUT_S = 5.0  # how long the short outage lasts
# After the batch's first data file, the log's commit followed within 0.5-0.8 s here: the later
# rounds cut at a random moment of this long, which may fall after the commit.
WINDOW_S = 1.0
# A run whose store went away must have ended by then: S3A's default retries of a store that
# stays away took about 160 s here (delta-rs's reads gave up after their 10 retries in 2 s).
END_BOUND_S = 300.0
# S3A's retries lowered for the outage that lasts until the run gives up: one attempt in the AWS
# SDK (default 5), one retry by S3A (default 7, with exponential back-off from 500 ms).
FEW_RETRIES = {
    "fs.s3a.attempts.maximum": "1",
    "fs.s3a.retry.limit": "1",
    "fs.s3a.retry.interval": "100ms",
}
BAD_LINE = b"\x00 not a record \xff"
CONTRACT = f"""\
topic: {TOPIC}
description: Payments, for the object store's fault tests.
partitions: {PARTITIONS}
key: {{format: string, name: payer}}
value: {{format: json, fields: [{{name: amount, type: long, nullable: true}}]}}
stream: {{name: {TOPIC}_stream}}
"""
_COMMIT = re.compile(r"/_delta_log/(\d{20})\.json$")
# What a table's log may hold: commits, their checksums, checkpoints; and a checksum's temporary
# file (Delta writes ``.<version>.crc.<uuid>.tmp``, then renames it), left when the store went
# away in between, which Delta ignores. Not a commit's: Delta's S3 log store puts those whole.
_LOG_ENTRY = re.compile(
    r"/_delta_log/(\d{20}\.(json|crc)|\d{20}\.checkpoint\..*|_last_checkpoint"
    r"|\.\d{20}\.crc\.[0-9a-f-]{36}\.tmp)$"
)
# What a client says of a connection to a store that went away: S3A (the AWS SDK for Java),
# delta-rs and pyarrow (the AWS SDK for C++).
_CONNECTION_FAILED = re.compile(
    r"Connection refused|Connection reset|Could not connect to server|failed to respond"
)

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.integration,  # Spark, Java and the S3 API: not part of `make unit`
    pytest.mark.s3,
    # make reliability's and make test-s3's, not CI's short rounds (too long at one cut).
    pytest.mark.heavy,
    pytest.mark.timeout(600 + ROUNDS * 900),
]


# -- the proxy -----------------------------------------------------------------------------------


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream``: bytes piped both ways, a thread per
    direction of each connection. :meth:`cut` closes the listener and every open connection;
    :meth:`restore` listens again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0  # the system's pick at the first restore()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        """Listen (again) on the proxy's port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = int(listener.getsockname()[1])
        with self._lock:
            assert self._listener is None, "the proxy is listening already"
            self._listener = listener
        self._start(self._accept, listener)

    def cut(self) -> int:
        """Close the listener and every open connection at once; returns how many were open."""
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._open = self._open, set()
        if listener is not None:
            _close(listener)  # shut down first: that wakes the thread blocked in accept()
        for conn in connections:
            # No lingering: the peer gets a reset, as from a host that went away.
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            _close(conn)
        return len(connections) // 2

    def close(self) -> None:
        """Cut, and wait for every thread of the proxy to end."""
        self.cut()
        for thread in self._threads:
            thread.join(timeout=10)
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"threads of the proxy outlive it: {alive}"

    def refuses(self) -> bool:
        """Whether a connection to the proxy's port is refused now."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
        except ConnectionRefusedError:
            return True
        return False

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _close(client)
                    _close(upstream)
                    return
                self._open |= {client, upstream}
            ended = [0]  # directions of the connection that have ended
            self._start(self._pipe, client, upstream, ended)
            self._start(self._pipe, upstream, client, ended)

    def _pipe(self, source: socket.socket, sink: socket.socket, ended: list[int]) -> None:
        failed = False
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)  # the half-close, passed on
        except OSError:
            failed = True  # reset by a peer, or cut
        with self._lock:
            ended[0] += 1
            done = failed or ended[0] == 2
            if done:
                self._open -= {source, sink}
        if done:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


# -- a lakehouse in the bucket -------------------------------------------------------------------


@dataclass
class Bucket:
    """A lakehouse whose data is under a prefix of the test bucket: this process produces to it
    and reads it through moto's own endpoint; its jobs reach it through the proxy."""

    lake: Lake
    store: S3Store
    proxy: Proxy
    data: ObjectPath
    client: Any  # boto3's S3 client on moto's own endpoint
    jobs: list[Job] = field(default_factory=list)

    def start(self, batch: int, env: Mapping[str, str] | None = None) -> Job:
        """`lakehouse run` of bronze (a Spark of its own) as the run of ``batch``, with the
        proxy as its store's endpoint, and ``env``."""
        store = {
            **self.store.env,
            "LAKEHOUSE_S3_ENDPOINT": self.proxy.endpoint,
            "LAKEHOUSE_DATA": str(self.data),
            # The tests' settings for small micro-batches (tests/conftest.py), which a task's
            # environment leaves out with this process's other LAKEHOUSE_ variables.
            "LAKEHOUSE_SHUFFLE_PARTITIONS": "1",
            "LAKEHOUSE_SPARK_CODEGEN": "off",
        }
        job = start_job(
            self.lake,
            "bronze",
            run_id(batch),
            client=True,
            topic=TOPIC,
            env={**store, **(env or {})},
        )
        self.jobs.append(job)  # killed at the test's end if it still runs
        return job

    def run(self, batch: int, env: Mapping[str, str] | None = None) -> float:
        """Run bronze (:meth:`start`) to its end; it must succeed. Returns its duration (s)."""
        job = self.start(batch, env)
        code = job.wait()
        assert code == 0, f"bronze exited with {code}:\n{job.tail()}"
        return job.elapsed()

    def keys(self, under: ObjectPath) -> set[str]:
        """Every key under a location, listed through moto's own endpoint."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=under.bucket, Prefix=under.key + "/"
        )
        return {o["Key"] for page in pages for o in page.get("Contents", [])}


@pytest.fixture
def bucket(s3_server: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bucket]:
    """A fresh lakehouse (the contract :data:`CONTRACT`) whose data is under a prefix of its own
    in the test bucket, and a proxy in front of the store for its jobs."""
    import boto3

    root = tmp_path / "lake"
    (root / "contracts").mkdir(parents=True)
    (root / "contracts" / f"{TOPIC}.yaml").write_text(CONTRACT)
    (root / "logs").mkdir()
    data = ObjectPath("s3", s3_server.bucket, f"s3-faults/{tmp_path.name}")
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LAKEHOUSE_DATA", str(data))
    objectstore.reset()
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        region_name=S3_REGION,
        aws_access_key_id=s3_server.env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=s3_server.env["AWS_SECRET_ACCESS_KEY"],
    )
    proxy = Proxy(("127.0.0.1", int(s3_server.endpoint.rsplit(":", 1)[1])))
    proxy.restore()
    bucket = Bucket(Lake(root), s3_server, proxy, data, client)
    try:
        yield bucket
    finally:
        for job in bucket.jobs:
            job.kill()
        proxy.close()
        objectstore.reset()


@dataclass
class Produced:
    """What was produced before each round: the (partition, offset) of its good records, and the
    segment holding its damaged line."""

    batches: list[set[tuple[int, int]]] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)

    def send(self, lake: Lake) -> None:
        """:data:`RECORDS` keyed records (a few keyless, a few tombstones), then a segment with a
        damaged line between two good records (for bronze's quarantine)."""
        batch = len(self.batches)
        records = [
            Record(
                None if n % 50 == 0 else f"payer-{n % 97}".encode(),
                None if n % 40 == 0 else json.dumps({"amount": batch * RECORDS + n}).encode(),
            )
            for n in range(RECORDS)
        ]
        producer = Producer(lake.settings, TOPIC, PARTITIONS)
        sent = {(m.partition, m.offset) for m in producer.send_batch(records)}
        partition = batch % PARTITIONS

        def damaged(start: int) -> tuple[bytes, int]:
            def line(offset: int) -> bytes:
                envelope = {"offset": offset, "timestamp": 0, "key": "p", "value": "{}"}
                return json.dumps(envelope).encode()

            return line(start) + b"\n" + BAD_LINE + b"\n" + line(start + 1) + b"\n", 2

        start = producer.write_segment(partition, damaged)
        sent |= {(partition, start), (partition, start + 1)}
        assert len(sent) == RECORDS + 2
        self.batches.append(sent)
        self.damaged.append(segment_name(TOPIC, partition, start))

    @property
    def records(self) -> set[tuple[int, int]]:
        return set().union(*self.batches)


# -- the bucket, read back -----------------------------------------------------------------------


def _commits(keys: set[str]) -> set[int]:
    return {int(m.group(1)) for k in keys if (m := _COMMIT.search(k))}


def _data_files(keys: set[str]) -> set[str]:
    return {k for k in keys if k.endswith(".parquet") and "/_delta_log/" not in k}


def log_leftovers(keys: set[str]) -> list[str]:
    """What a table's ``_delta_log`` holds besides commits, checksums, checkpoints (and S3A's
    markers of folders)."""
    log = (k for k in keys if "/_delta_log/" in k and not k.endswith("/"))
    return sorted(k for k in log if not _LOG_ENTRY.search(k))


def bronze_problems(path: ObjectPath, produced: Produced) -> list[str]:
    """Each batch committed once, in order; every version holds whole batches only (batch ``b``
    exactly the records of round ``b``, each once); the last every produced record once."""
    from deltalake import DeltaTable

    from lakehouse.storage import read_arrow
    from lakehouse.storage.log import commit_metadata
    from lakehouse.topics.bronze_table import BATCH_KEY

    table = DeltaTable(str(path), storage_options=objectstore.storage_options(path))
    committed = sorted(
        (int(c["version"]), int(b["batch_id"]))
        for c in table.history()
        if (b := commit_metadata(c, BATCH_KEY)) is not None
    )
    problems = []
    if [b for _, b in committed] != list(range(len(produced.batches))):
        problems.append(f"batches committed (version, batch): {committed}")
    for version in range(table.version() + 1):
        rows = read_arrow(path, version).select(["_batch_id", "partition", "offset"]).to_pylist()
        held: dict[int, Counter[tuple[int, int]]] = {}
        for r in rows:
            held.setdefault(r["_batch_id"], Counter())[(r["partition"], r["offset"])] += 1
        want = [b for v, b in committed if v <= version]
        if sorted(held) != want:
            problems.append(f"version {version} holds batches {sorted(held)}, expected {want}")
        for b, records in held.items():
            if b >= len(produced.batches) or records != Counter(produced.batches[b]):
                problems.append(
                    f"version {version}: batch {b} holds {records.total()} records "
                    f"({len(records)} distinct), not those of round {b}, each once"
                )
    rows = read_arrow(path).select(["partition", "offset"]).to_pylist()
    distinct = {(r["partition"], r["offset"]) for r in rows}
    if len(rows) != len(produced.records) or distinct != produced.records:
        problems.append(
            f"bronze holds {len(rows)} records, {len(distinct)} distinct; "
            f"{len(produced.records)} were produced"
        )
    return problems


def quarantine_problems(path: ObjectPath, produced: Produced) -> list[str]:
    """Bronze's quarantine holds each round's damaged line once, in that round's batch, and
    nothing else."""
    from lakehouse.storage import read_arrow

    rows = read_arrow(path).to_pylist()
    got = Counter((r["_batch_id"], Path(r["source_file"]).name, r["raw"]) for r in rows)
    want = Counter((b, name, BAD_LINE) for b, name in enumerate(produced.damaged))
    if got != want:
        return [f"the quarantine holds {sorted(got.items())}, expected {sorted(want.items())}"]
    return []


def orphans(bucket: Bucket, path: ObjectPath) -> set[str]:
    """The data files under a table's prefix that no commit adds (left by a write that did not
    commit: VACUUM's)."""
    keys = bucket.keys(path)
    added = set()
    for key in sorted(k for k in keys if _COMMIT.search(k)):
        body = bucket.client.get_object(Bucket=path.bucket, Key=key)["Body"].read()
        for line in body.decode().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                added.add(f"{path.key}/{action['add']['path']}")
    return _data_files(keys) - added


def _error(job: Job) -> str:
    """What the job said last about its failure: its ``error:`` line, or the last line naming
    an exception."""
    lines = [
        line.strip()
        for line in job.output().splitlines()
        if re.match(r"^(error: |\S*(Error|Exception)\b)", line.strip())
    ]
    return lines[-1][:300] if lines else "(no error line)"


def _cause(job: Job) -> str | None:
    """The first line of the job's output that says a connection to the store failed."""
    for line in job.output().splitlines():
        if _CONNECTION_FAILED.search(line):
            return line.strip().removeprefix("Caused by:").removeprefix(":").strip()[:400]
    return None


# -- the store gone in the middle of a commit ----------------------------------------------------


@dataclass(frozen=True)
class Outage:
    name: str
    hold_s: float | None  # how long the store stays away; None: until the run has ended
    hadoop: Mapping[str, str]  # Hadoop settings the job is given (core-site.xml)


OUTAGES = [
    Outage("for-seconds", CUT_S, {}),
    Outage("until-the-run-gives-up", None, FEW_RETRIES),
]


@dataclass(frozen=True)
class Moment:
    """Where the run was when the proxy was cut."""

    at: float  # seconds into the run
    data_files: int  # of the new batch, under the table's prefix
    commit: int  # the version of the commit that adds them


def wait_for_the_commit(job: Job, bucket: Bucket, path: ObjectPath, delay: float) -> Moment | None:
    """Wait (while the job runs) until data files of a new batch are under the table's prefix and
    the log has no commit adding them, then ``delay`` seconds more; None if the job ended first,
    or committed before data files were seen."""
    before = bucket.keys(path)
    # Version 0 only creates the table: a data commit comes after it.
    pending = max(_commits(before), default=0) + 1
    while job.running():
        keys = bucket.keys(path)
        if pending in _commits(keys):
            return None
        if new := _data_files(keys) - _data_files(before):
            time.sleep(delay)
            return Moment(job.elapsed(), len(new), pending) if job.running() else None
        time.sleep(0.05)
    return None


def _hadoop_conf(folder: Path, settings: Mapping[str, str]) -> dict[str, str]:
    """A job's environment giving its JVM these Hadoop settings: a ``core-site.xml`` in
    ``HADOOP_CONF_DIR``, which Spark's launcher puts on the class path (the platform sets no
    S3A retry setting, so they apply)."""
    if not settings:
        return {}
    folder.mkdir(exist_ok=True)
    properties = "".join(
        f"<property><name>{k}</name><value>{v}</value></property>" for k, v in settings.items()
    )
    (folder / "core-site.xml").write_text(f"<configuration>{properties}</configuration>\n")
    return {"HADOOP_CONF_DIR": str(folder)}


@pytest.mark.parametrize("outage", OUTAGES, ids=lambda o: o.name)
def test_store_gone_mid_commit_then_back_and_rerun(
    bucket: Bucket, outage: Outage, tmp_path: Path
) -> None:
    """Each round: a batch produced, bronze's run started, its store cut under its commit and
    restored (:data:`OUTAGES`); the run must end, then the rerun succeeds, bronze holds whole
    batches in every version and every record once, and the quarantine each bad line once."""
    rng = random.Random(f"{SEED} {outage.name}")
    lake, produced = bucket.lake, Produced()
    path = lake.settings.bronze_path(TOPIC)
    assert isinstance(path, ObjectPath)
    env = _hadoop_conf(tmp_path / "hadoop", outage.hadoop)
    how = f"for {outage.hold_s:.0f} s" if outage.hold_s else "until the run has ended"
    s3a = dict(outage.hadoop) or "S3A's defaults"
    log = [f"seed {SEED}: {ROUNDS} cut(s) of the store under bronze's commit, {how}; {s3a}"]
    cuts, tries, outcomes = 0, 0, Counter[str]()
    try:
        while cuts < ROUNDS:
            tries += 1
            assert tries <= 3 * ROUNDS, "the cuts kept missing bronze's commit\n" + "\n".join(log)
            produced.send(lake)
            batch = len(produced.batches) - 1
            job = bucket.start(batch, env)
            delay = 0.0 if cuts == 0 else rng.uniform(0, WINDOW_S)
            moment = wait_for_the_commit(job, bucket, path, delay)
            if moment is None:
                code = job.wait()
                log.append(f"batch {batch}: the run ended before the cut (exit {code})")
                assert code == 0, job.tail()
                continue
            reset = bucket.proxy.cut()
            cut_at = time.monotonic()
            assert bucket.proxy.refuses()
            landed = moment.commit in _commits(bucket.keys(path))
            if outage.hold_s is None:
                job.wait(timeout=END_BOUND_S)
            else:
                time.sleep(outage.hold_s)
            bucket.proxy.restore()
            code = job.wait(timeout=END_BOUND_S)
            took = time.monotonic() - cut_at
            keys = bucket.keys(path)
            committed = moment.commit in _commits(keys)
            cuts += 1
            outcomes["succeeded" if code == 0 else "failed"] += 1
            log.append(
                f"batch {batch}: cut {delay:.2f} s after its first data file ({moment.at:.1f} s "
                f"into the run, {moment.data_files} data file(s) written, {reset} connection(s) "
                f"reset), commit {moment.commit} {'in' if landed else 'not in'} the log; the run "
                f"{'succeeded' if code == 0 else f'failed (exit {code})'} {took:.1f} s after the "
                f"cut, commit {moment.commit} {'in' if committed else 'not in'} the log"
                + ("" if code == 0 else f": {_error(job)}\n   cause: {_cause(job)}")
            )
            context = f"{job.tail()}\n" + "\n".join(log)
            if code == 0:
                assert committed, f"the run succeeded without committing its batch:\n{context}"
            else:
                assert _cause(job), f"the run failed without naming the connection:\n{context}"
            if outage.hold_s is None and not landed:
                assert code != 0, f"the run outlived its store:\n{context}"
            assert log_leftovers(keys) == [], context
            log.append(f"   the rerun: done in {bucket.run(batch, env):.1f} s")
            problems = bronze_problems(path, produced)
            assert problems == [], "\n".join(problems + log)
    finally:
        print("\n".join(log))
    quarantine = lake.settings.quarantine_path("bronze", TOPIC)
    assert isinstance(quarantine, ObjectPath)
    problems = quarantine_problems(quarantine, produced)
    assert problems == [], "\n".join(problems + log)
    print(
        f"bronze: {len(produced.records)} records, whole in every version; runs cut: "
        f"{dict(outcomes)}; {len(orphans(bucket, path))} uncommitted data files left"
    )


# -- the store gone before the run ---------------------------------------------------------------


def test_store_gone_before_the_run_fails_it_and_writes_nothing(bucket: Bucket) -> None:
    """The proxy is cut before bronze's run starts: the run fails with the platform's message
    naming the bucket and the endpoint (checked before any data moves), and the bucket holds
    what it held, the landing files."""
    Produced().send(bucket.lake)
    before = bucket.keys(bucket.data)
    bucket.proxy.cut()
    job = bucket.start(0)
    code = job.wait(timeout=END_BOUND_S)
    took, error = job.elapsed(), _error(job)
    print(f"the run failed {took:.1f} s after it started: {error}")
    assert code == 1, job.tail()
    # A JVM's start (20 s here under load) and one refused connection: nothing waits out a
    # client's retries (S3A's, for a store that stays away, took about 160 s here).
    assert took < 120, job.tail()
    assert error.startswith(f"error: LAKEHOUSE_DATA={bucket.data}: the bucket "), job.tail()
    assert f"{bucket.data.bucket!r} cannot be reached at {bucket.proxy.endpoint}:" in error
    assert bucket.keys(bucket.data) == before
    assert before and all(k.startswith(f"{bucket.data.key}/landing/") for k in before), before
