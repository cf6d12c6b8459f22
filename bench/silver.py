"""Silver parse benchmark: bronze Delta table -> typed silver stream, JSON and Avro values.

    python bench/silver.py [--records 10000000] [--formats json,avro]

Input (prepared once, not timed): per format, ``--records`` generated check-ins over 12
partitions (key = username; value = location, note, visits, score, about 300 bytes as JSON; the
same record in Avro, Confluent-framed, schema given inline in the contract; one record in a
thousand is a tombstone), written as landing segments and ingested by ``bronze.ingest``. The
bronze tables are the shared input of both paths. Each path runs in its own process:

* ours: ``silver.build`` on ``local[2]``: Spark decodes the bronze change feed (``from_json``,
  or ``mapInArrow`` for Confluent-framed Avro) and delta-spark appends the stream. The session
  is started and warmed on a tiny topic of the same format first; the figure is the silver job
  itself.
* peer: the same typed rows (key as text, value fields, tombstone flag, partition, offset,
  timestamp, event time) computed plainly, without a JVM, and appended by ``write_deltalake`` in
  one commit. JSON: ``polars.scan_delta`` of the bronze table, ``str.json_decode`` to the typed
  struct, polars' streaming engine (capped to the same 2 threads). Avro: the bronze snapshot's
  pyarrow dataset (``deltalake``), each value decoded by fastavro's ``schemaless_reader`` after
  its 5-byte Confluent header, in a pool of 2 processes (fastavro is single-threaded; Spark runs
  2 tasks). The peer does not diagnose or quarantine bad records (the input has none).

Figures: records/s per core, both paths divided by the same 2 cores (ours runs ``local[2]``,
the peer is capped to 2 threads / processes); wall seconds; peak RSS of each worker's process
tree (JVM and Python workers, or the peer's pool). Both silver tables are checked to hold the
same rows (count, tombstones, sums of visits and offsets). Goal from the issue: at least 200K
JSON records/s per core. ``--workdir`` keeps the prepared bronze tables for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, report, run_worker, tree_peak_rss_mib

CORES = 2
PARTITIONS = 12
WARM_RECORDS = 1000
ROUND_RECORDS = 1_000_000  # generated per round; one landing segment per partition per round
TOMBSTONE_EVERY = 1000
VALUE_BYTES = 300
JSON_GOAL = 200_000  # records/s per core
FORMATS = ("json", "avro")
TOPICS = {"json": "bench-silver-json", "avro": "bench-silver-avro"}
FIELDS = (("location", "string"), ("note", "string"), ("visits", "long"), ("score", "double"))
AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "CheckIn",
    "namespace": "bench",
    "fields": [
        {"name": "location", "type": ["null", "string"], "default": None},
        {"name": "note", "type": "string"},
        {"name": "visits", "type": "long"},
        {"name": "score", "type": "double"},
    ],
}
AVRO_SCHEMA_ID = 1
CITIES = ("Paris", "Sydney", "Rome", "Lima", "Berlin", "Oslo", "Lagos", "Quito", "Hanoi", "Austin")
WORDS = ("checked", "in", "near", "the", "river", "station", "cafe", "market", "with", "friends")


def _stream(topic: str) -> str:
    return topic.replace("-", "_")


def _contract(topic: str, fmt: str) -> str:
    if fmt == "json":
        fields = ", ".join(f"{{name: {n}, type: {t}}}" for n, t in FIELDS)
        value = f"{{format: json, fields: [{fields}]}}"
    else:
        schema = json.dumps(AVRO_SCHEMA)
        value = f"{{format: avro, schemas: [{{id: {AVRO_SCHEMA_ID}, schema: {schema}}}]}}"
    return (
        f"topic: {topic}\n"
        f"partitions: {PARTITIONS}\n"
        "key: {format: string, name: username}\n"
        f"value: {value}\n"
        f"stream: {{name: {_stream(topic)}}}\n"
    )


def _topics(fmt: str) -> tuple[str, str]:
    """(measured topic, warm-up topic) of a format."""
    return TOPICS[fmt], TOPICS[fmt] + "-warm"


def _settings(work: Path) -> Any:
    from lakehouse.runtime.config import Settings

    return Settings.from_env(work / "home", work / "contracts")


# -- preparation (not timed) ---------------------------------------------------------------------


def _joined_bytes(arr: Any) -> bytes:
    """The bytes of an Arrow string array's values, back to back."""
    import numpy as np

    arr = arr.combine_chunks() if hasattr(arr, "combine_chunks") else arr
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)
    first, last = int(offsets[arr.offset]), int(offsets[arr.offset + len(arr)])
    return arr.buffers()[2].to_pybytes()[first:last]


def _render(user: Any, ts: Any, value: Any, start: int) -> tuple[bytes, int]:
    """Envelope lines (see lakehouse.topics.landing) for one segment, offsets from ``start``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(user)
    offsets = pa.array(np.arange(start, start + n)).cast(pa.string())
    lines = pc.binary_join_element_wise(
        '{"offset":', offsets, ',"timestamp":', ts,
        ',"timestampType":"CreateTime","key":"', user, '","value":', value, "}\n", "",
    )  # fmt: skip
    return _joined_bytes(lines), n


def generate(settings: Any, topic: str, fmt: str, records: int, seed: int = 0) -> None:
    """Produce ``records`` check-ins to ``topic`` as landing segments (vectorised for JSON; Avro
    values are encoded record by record with the project's encoder)."""
    import base64
    import functools

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from lakehouse.contracts import avro
    from lakehouse.topics.landing import Producer, default_partition

    rng = np.random.default_rng(seed)
    pool = max(100, min(100_000, records // 20))
    names = np.array([f"user-{i:06d}" for i in range(pool)], dtype=object)
    part_of_user = np.array([default_partition(n.encode(), PARTITIONS) for n in names])
    # Notes of random words, each value padded to about VALUE_BYTES bytes.
    note_len = VALUE_BYTES - 60
    notes = np.array(
        [
            " ".join(rng.choice(WORDS, note_len // 4))[:note_len].ljust(note_len, "x")
            for _ in range(1000)
        ],
        dtype=object,
    )
    cities = np.array(CITIES, dtype=object)
    parsed = avro.parse(AVRO_SCHEMA, "bench", "") if fmt == "avro" else None
    producer = Producer(settings, topic, PARTITIONS)
    written = 0
    while written < records:
        n = min(ROUND_RECORDS, records - written)
        user_idx = rng.integers(0, pool, n)
        city = cities[rng.integers(0, len(CITIES), n)]
        note = notes[rng.integers(0, len(notes), n)]
        visits = rng.integers(0, 1_000_000, n)
        score = np.round(rng.random(n) * 100, 2)
        tomb = (written + np.arange(n)) % TOMBSTONE_EVERY == TOMBSTONE_EVERY - 1
        if parsed is None:
            text = pc.binary_join_element_wise(
                '"{\\"location\\":\\"', pa.array(city, pa.string()),
                '\\",\\"note\\":\\"', pa.array(note, pa.string()),
                '\\",\\"visits\\":', pa.array(visits).cast(pa.string()),
                ',\\"score\\":', pa.array(score).cast(pa.string()), '}"', "",
            )  # fmt: skip
        else:
            encoded = [
                base64.b64encode(
                    avro.encode(
                        AVRO_SCHEMA_ID,
                        parsed,
                        {"location": c, "note": t, "visits": v, "score": s},
                    )
                ).decode("ascii")
                for c, t, v, s in zip(
                    city.tolist(), note.tolist(), visits.tolist(), score.tolist(), strict=True
                )
            ]
            text = pc.binary_join_element_wise(
                '"', pa.array(encoded, pa.string()), '","valueEncoding":"base64"', ""
            )
        value = pc.if_else(pa.array(tomb), pa.scalar("null"), text)
        ts = pa.array(1_700_000_000_000 + (written + np.arange(n)) * 10).cast(pa.string())
        user = pa.array(names[user_idx], pa.string())
        parts = part_of_user[user_idx]
        for p in range(PARTITIONS):
            sel = pa.array(np.flatnonzero(parts == p))
            if len(sel):
                columns = (user.take(sel), ts.take(sel), value.take(sel))
                producer.write_segment(p, functools.partial(_render, *columns))
        written += n


def worker_prepare(work: Path, records: int, formats: list[str]) -> dict[str, Any]:
    """Landing segments and bronze tables of each format's topics (already prepared ones are
    kept); the landing files are deleted once ingested."""
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.runtime.spark import get_session
    from lakehouse.topics import bronze

    contracts = work / "contracts"
    contracts.mkdir(parents=True, exist_ok=True)
    done_file = work / "prepared.json"
    done: dict[str, int] = json.loads(done_file.read_text()) if done_file.exists() else {}
    settings = _settings(work)
    todo: list[tuple[str, str, int]] = []
    for fmt in formats:
        topic, warm = _topics(fmt)
        for name, n in ((topic, records), (warm, WARM_RECORDS)):
            if done.get(name) == n:
                continue
            for stale in (
                settings.topic_dir(name),
                settings.bronze_path(name),
                settings.quarantine_path("bronze", name),
            ):
                shutil.rmtree(stale, ignore_errors=True)
            (contracts / f"{name}.yaml").write_text(_contract(name, fmt))
            todo.append((name, fmt, n))
    timings: dict[str, Any] = {}
    if not todo:
        return timings
    spark = get_session(f"local[{CORES}]", app_name="bench-silver-prepare")
    catalog = Catalog.load(contracts)
    for name, fmt, n in todo:
        started = time.perf_counter()
        generate(settings, name, fmt, n)
        generated = time.perf_counter() - started
        started = time.perf_counter()
        result = bronze.ingest(spark, settings, catalog.topic(name))
        ingested = time.perf_counter() - started
        if result.records != n or result.quarantined:
            raise RuntimeError(f"bronze {name}: {result.records} of {n} records landed: {result}")
        shutil.rmtree(settings.topic_dir(name))
        done[name] = n
        done_file.write_text(json.dumps(done))
        timings[name] = {"generate_s": round(generated, 1), "bronze_s": round(ingested, 1)}
    spark.stop()
    return timings


# -- ours ----------------------------------------------------------------------------------------


def worker_ours(work: Path, fmt: str) -> dict[str, Any]:
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.runtime.spark import get_session
    from lakehouse.streams import silver

    settings = _settings(work)
    catalog = Catalog.load(settings.contracts_dir)
    topic, warm = _topics(fmt)
    spark = get_session(f"local[{CORES}]", app_name=f"bench-silver-{fmt}")
    started = time.perf_counter()
    silver.build(spark, settings, catalog.topic(warm))
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    result = silver.build(spark, settings, catalog.topic(topic))
    elapsed = time.perf_counter() - started
    peak = tree_peak_rss_mib()
    spark.stop()
    return {
        "seconds": elapsed,
        "records": result.records,
        "quarantined": result.quarantined,
        "warmup": warmup,
        "peak_mib": peak,
    }


# -- peer ----------------------------------------------------------------------------------------


def _peer_columns(batch: Any, decoded: Any) -> Any:
    """The silver stream's columns from a bronze batch and its decoded values (a struct)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = [batch.column("key").cast(pa.string())]
    names = ["username"]
    for name, _ in FIELDS:
        arrays.append(pc.struct_field(decoded, name))
        names.append(name)
    arrays += [pc.is_null(batch.column("value"))]
    names += ["tombstone"]
    for name in ("partition", "offset", "timestamp"):
        arrays.append(batch.column(name))
        names.append(name)
    arrays.append(batch.column("timestamp"))
    names.append("event_time")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _peer_json(bronze: Path) -> Iterator[Any]:
    """Batches of the decoded stream, by polars' streaming engine over the bronze snapshot
    (``scan_delta``: delta-rs lists the files, polars reads them)."""
    import polars as pl

    kinds = {"string": pl.Utf8, "long": pl.Int64, "double": pl.Float64}
    dtype = pl.Struct({name: kinds[kind] for name, kind in FIELDS})
    frame = pl.scan_delta(str(bronze)).select(
        pl.col("key").cast(pl.Utf8).alias("username"),
        pl.col("value").cast(pl.Utf8).str.json_decode(dtype).alias("_v"),
        pl.col("value").is_null().alias("tombstone"),
        "partition",
        "offset",
        "timestamp",
        pl.col("timestamp").alias("event_time"),
    )
    frame = frame.unnest("_v").select(
        "username", *(n for n, _ in FIELDS), "tombstone", "partition", "offset", "timestamp",
        "event_time",
    )  # fmt: skip

    for df in frame.collect_batches(engine="streaming"):
        yield from df.to_arrow().to_batches()


_DECODER: Any = None


def _avro_init() -> None:
    import fastavro

    global _DECODER
    _DECODER = fastavro.parse_schema(AVRO_SCHEMA)


def _avro_decode(values: Any) -> Any:
    """Confluent-framed Avro values -> a struct array (null for a tombstone)."""
    import io

    import pyarrow as pa
    from fastavro import schemaless_reader

    kinds = {"string": pa.string(), "long": pa.int64(), "double": pa.float64()}
    rows = [
        None if raw is None else schemaless_reader(io.BytesIO(raw[5:]), _DECODER, None)
        for raw in values.to_pylist()
    ]
    return pa.array(rows, pa.struct([(name, kinds[kind]) for name, kind in FIELDS]))


def _peer_avro(bronze: Path, pool: Any) -> Iterator[Any]:
    """Batches of the decoded stream: bronze batches decoded by the pool, in order, a few in
    flight at a time (memory stays bounded)."""
    from deltalake import DeltaTable

    dataset = DeltaTable(str(bronze)).to_pyarrow_dataset()
    columns = ["key", "value", "partition", "offset", "timestamp"]
    pending: deque[tuple[Any, Any]] = deque()
    for batch in dataset.to_batches(columns=columns, batch_size=65_536):
        pending.append((batch, pool.submit(_avro_decode, batch.column("value"))))
        if len(pending) > 2 * CORES:
            done, future = pending.popleft()
            yield _peer_columns(done, future.result())
    while pending:
        done, future = pending.popleft()
        yield _peer_columns(done, future.result())


def worker_peer(work: Path, fmt: str) -> dict[str, Any]:
    os.environ["POLARS_MAX_THREADS"] = str(CORES)  # before polars is imported
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import polars  # noqa: F401  (imported before the clock starts, like ours' pyspark)
    import pyarrow as pa
    from deltalake import write_deltalake

    settings = _settings(work)
    bronze = settings.bronze_path(TOPICS[fmt])
    out = work / f"peer_{fmt}"
    pool = None
    if fmt == "avro":
        pool = ProcessPoolExecutor(
            CORES, mp_context=multiprocessing.get_context("spawn"), initializer=_avro_init
        )
        for f in [pool.submit(_avro_decode, pa.array([None], pa.binary())) for _ in range(CORES)]:
            f.result()  # the workers are up (as ours' Spark session is): not timed
    records = 0

    def counted(batches: Iterator[Any]) -> Iterator[Any]:
        nonlocal records
        for b in batches:
            records += b.num_rows
            yield b

    started = time.perf_counter()
    gen = _peer_json(bronze) if fmt == "json" else _peer_avro(bronze, pool)
    gen = counted(gen)
    head = next(gen)  # the reader's schema is the first batch's
    reader = pa.RecordBatchReader.from_batches(head.schema, _chain(head, gen))
    write_deltalake(str(out), reader, mode="append")
    elapsed = time.perf_counter() - started
    peak = tree_peak_rss_mib()  # the pool's processes included while they live
    if pool is not None:
        pool.shutdown()
    return {"seconds": elapsed, "records": records, "peak_mib": peak}


def _chain(head: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield head
    yield from rest


# -- checks and report ---------------------------------------------------------------------------


def table_facts(path: Path) -> dict[str, Any]:
    """Row count, tombstones and a checksum of a silver-shaped table, read with deltalake."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = (
        DeltaTable(str(path))
        .to_pyarrow_dataset()
        .to_table(columns=["tombstone", "visits", "offset"])
    )
    return {
        "rows": table.num_rows,
        "tombstones": pc.sum(table.column("tombstone")).as_py(),
        "visits": pc.sum(table.column("visits")).as_py(),
        "offsets": pc.sum(table.column("offset")).as_py(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--formats", default=",".join(FORMATS), help="json,avro (default)")
    parser.add_argument("--workdir", type=Path, help="keep (and reuse) the prepared input here")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, work, *rest = args.worker
        if kind == "prepare":
            out = worker_prepare(Path(work), int(rest[0]), rest[1].split(","))
        else:
            out = {"ours": worker_ours, "peer": worker_peer}[kind](Path(work), rest[0])
        print(json.dumps(out))
        return
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or set(formats) - set(FORMATS):
        parser.error(f"--formats: choose from {','.join(FORMATS)}")
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-silver-"))).resolve()
    script = Path(__file__)
    n = args.records
    try:
        started = time.perf_counter()
        prep = run_worker(
            script, "--worker", "prepare", str(work), str(n), ",".join(formats), timeout=6 * 3600
        )
        for topic, t in prep.items():
            print(
                f"(prepared {topic}: generated in {t['generate_s']} s, bronze in {t['bronze_s']} s)"
            )
        print(f"(preparation {time.perf_counter() - started:.1f} s, not counted)")
        settings = _settings(work)
        figures: list[Figure] = []
        context: dict[str, Any] = {
            "records": n,
            "cores": CORES,
            "partitions": PARTITIONS,
            "value_bytes": VALUE_BYTES,
            "tombstone_every": TOMBSTONE_EVERY,
            "formats": formats,
        }
        notes: list[str] = []
        for fmt in formats:
            topic = TOPICS[fmt]
            stale = [settings.registry_path, work / f"peer_{fmt}"]
            for name in _topics(fmt):  # the warm-up must decode its topic again too
                stale += [
                    settings.silver_path(_stream(name)),
                    settings.quarantine_path("silver", _stream(name)),
                ]
            for path in stale:
                shutil.rmtree(path, ignore_errors=True)
            ours = run_worker(script, "--worker", "ours", str(work), fmt)
            peer = run_worker(script, "--worker", "peer", str(work), fmt)
            if not ours["records"] == peer["records"] == n or ours["quarantined"]:
                raise SystemExit(
                    f"silver {fmt}: row counts differ: ours {ours}, peer {peer}, n={n}"
                )
            mine = table_facts(settings.silver_path(_stream(topic)))
            theirs = table_facts(work / f"peer_{fmt}")
            if mine != theirs or mine["rows"] != n:
                raise SystemExit(f"silver {fmt}: tables differ: ours {mine}, peer {theirs}")
            peer_name = "polars json_decode+deltalake" if fmt == "json" else "fastavro+deltalake"
            figures += [
                Figure(
                    f"silver.{fmt}.records_per_s_per_core",
                    n / ours["seconds"] / CORES,
                    "records/s/core",
                    peer_name,
                    n / peer["seconds"] / CORES,
                ),
                Figure(
                    f"silver.{fmt}.wall_time",
                    ours["seconds"],
                    "s",
                    peer_name,
                    peer["seconds"],
                    higher_is_better=False,
                ),
                Figure(
                    f"silver.{fmt}.peak_memory",
                    ours["peak_mib"],
                    "MiB",
                    peer_name,
                    peer["peak_mib"],
                    higher_is_better=False,
                ),
            ]
            context[f"{fmt}_warmup_s"] = round(ours["warmup"], 1)
            notes.append(
                f"(silver {fmt}: Spark session warm-up build of {WARM_RECORDS} records: "
                f"{ours['warmup']:.1f} s, not counted)"
            )
            if fmt == "json":
                rate = n / ours["seconds"] / CORES
                verdict = "met" if rate >= JSON_GOAL else "NOT met"
                context["json_goal_met"] = rate >= JSON_GOAL
                notes.append(
                    f"JSON goal >= {JSON_GOAL} records/s/core: {verdict} ({rate:,.0f} records/s/core)"
                )
        report(figures, "silver", context)
        for line in notes:
            print(line)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
