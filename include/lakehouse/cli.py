"""``lakehouse``: the command line, in the habits of kafka-console-producer and ksql.

Commands::

    lakehouse produce TOPIC [--value-schema-id N] < records.jsonl   (landing files or broker)
    lakehouse create-topic TOPIC   (a Kafka-sourced topic, on its broker)
    lakehouse run [--topic T ...] [--layer bronze|silver|gold ...] [--dry-run]
    lakehouse tables [--topic T ...]   (every table that exists, by the name show takes)
    lakehouse show TABLE [--version N | --as-of TIME | --at-event-time TIME] [--format F]
    lakehouse changes TABLE [--from-version N] [--format table|json]
    lakehouse refresh TABLE [--from-version V] | restore TABLE [--to FOLDER]
    lakehouse lag [--topic T ...] [--layer bronze|silver|gold ...]
    lakehouse maintain [--topic T ...] [--retention-hours H] [--no-compact] [--dry-run]
    lakehouse sample [--topic T] [--records N [--value-bytes B]]   (fixed samples, or N random)
    lakehouse schemas [--topic T ...] [--check]   (registered schema versions; check contracts)
    lakehouse dq [--table T] [--days D] [--last N] | report   (data-quality history; Data Docs)
    lakehouse spark start|run|stop|status|reader   (the Spark server; run: foreground; reader: SQL login)
    lakehouse catalog [list|sync|drop NAME] (table names in the metastore)
    lakehouse postgres start|stop|status    (Airflow's PostgreSQL metadata database)
    lakehouse kafka start|stop|status       (a local single-node Kafka broker, KRaft mode)
    lakehouse s3 start|stop|status          (a local S3 API, moto's server, in memory)
    lakehouse airflow ARGS    (Airflow with the lakehouse's environment)

Tables are named as :mod:`lakehouse.pipeline.lake` says. An option that takes a value is given
once, except ``--topic`` and ``--layer`` where several make sense (and ``run --full-refresh``).
The CLI only parses, dispatches (:data:`COMMANDS`) and prints; the work is the package's.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.errors import BadRecordError, ConfigError, LakehouseError
from lakehouse.pipeline import lake
from lakehouse.runtime import objectstore
from lakehouse.runtime.config import LAYERS, Layer, Settings
from lakehouse.runtime.objectstore import location
from lakehouse.storage import is_table
from lakehouse.storage.maintenance import DEFAULT_RETENTION_HOURS
from lakehouse.topics import kafka
from lakehouse.topics.landing import Producer, Record, record_from_json_line

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from lakehouse.pipeline.request import Option, RunRequest

PRODUCE_CHUNK = 10_000


def produce(
    settings: Settings,
    contract: Contract,
    stream: TextIO,
    err: TextIO,
    value_schema_id: int | None = None,
    *,
    allow_undeclared: bool = False,
) -> int:
    """Produce JSON lines from ``stream``, keys and values checked and encoded in the topic's
    formats (Avro with the latest schema id, or ``value_schema_id``). All or nothing: every line
    is read and checked before any is written, so a bad line (named with its number) writes
    nothing. A value field the contract does not declare is refused unless
    ``allow_undeclared``."""
    from lakehouse.contracts.serde import Serializer

    producer: Producer | kafka.Producer
    if contract.kafka is not None:
        client = kafka.client(settings, contract)
        kafka.check_topic(client, contract)
        producer = kafka.Producer(client, contract.partitions)
    elif contract.landing_format != "envelope":
        raise ConfigError(
            f"topic {contract.topic!r} lands as {contract.landing_format} files (Kafka Connect "
            "writes them); the producer writes envelope segments only"
        )
    else:
        producer = Producer(settings, contract.topic, contract.partitions)
    serializer = Serializer(contract, value_schema_id, allow_undeclared=allow_undeclared)
    records: list[Record] = []
    for n, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            records.append(record_from_json_line(line, f"stdin line {n}", serializer))
        except BadRecordError:
            print(
                f"nothing produced to {contract.topic}: every line is checked before any is "
                "written, and this one is refused:",
                file=err,
            )
            raise
    per_partition: dict[int, int] = {}
    for start in range(0, len(records), PRODUCE_CHUNK):
        for meta in producer.send_batch(records[start : start + PRODUCE_CHUNK]):
            per_partition[meta.partition] = per_partition.get(meta.partition, 0) + 1
    spread = ", ".join(f"p{p}: {n}" for p, n in sorted(per_partition.items())) or "none"
    print(f"produced {len(records)} record(s) to {contract.topic} ({spread})", file=err)
    return 0


def produce_sample(
    settings: Settings,
    catalog: Catalog,
    err: TextIO,
    topic: str | None = None,
    records: int | None = None,
    value_bytes: int = 0,
    seed: int = 0,
) -> int:
    """The shipped topics' fixed samples (once, into empty topics), or ``records`` random ones
    for one topic (default user-locations)."""
    from lakehouse.topics import samples

    if records is not None:
        contract = catalog.topic(topic or "user-locations")
        n = samples.generate(settings, contract, records, value_bytes=value_bytes, seed=seed)
        print(f"produced {n} generated record(s) to {contract.topic}", file=err)
        return 0
    names = [topic] if topic else [t for t in samples.SAMPLE_TOPICS if t in catalog.topics]
    for name in names:
        contract = catalog.topic(name)
        if contract.topic not in samples.SAMPLE_TOPICS:
            raise ConfigError(
                f"topic {name!r} has no sample data; shipped: {samples.SAMPLE_TOPICS}"
            )
        n = samples.produce_seed(settings, contract)
        if n:
            print(f"produced {n} sample record(s) to {contract.topic}", file=err)
        else:
            print(
                f"{contract.topic} already has data under {settings.landing_root}: left as is",
                file=err,
            )
    return 0


def schemas(settings: Settings, catalog: Catalog, topics: Sequence[str], check: bool) -> int:
    """List each topic's (all when ``topics`` is empty) registered key/value schema versions;
    ``check``: would the current contracts be accepted (nothing is registered)?"""
    from lakehouse.streams.registry import SUBJECTS, SchemaRegistry

    registry = SchemaRegistry(settings)
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    for contract in contracts:
        pending = registry.check(contract) if check else {}
        for subject in SUBJECTS:
            versions = registry.versions(contract.topic, subject)
            listing = ", ".join(
                f"v{v.version} ({v.state.format}, {v.registered_at})" for v in versions
            )
            state = ""
            if check:
                state = "  -> new version accepted" if subject in pending else "  -> unchanged"
            print(
                f"{contract.topic} {subject} [{contract.compatibility}]: "
                f"{listing or 'no versions yet'}{state}"
            )
    return 0


# -- rendering --------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def render(table: pa.Table, fmt: str, out: TextIO) -> None:
    """Rows as a table or as JSON lines; a decimal is printed as the exact number it is (a
    JSON number in plain notation, never through a float)."""
    from lakehouse.contracts.serde import json_text

    rows = [{k: _plain(v) for k, v in r.items()} for r in table.to_pylist()]
    if fmt == "json":
        for r in rows:
            out.write(json_text(r, ensure_ascii=False, spaced=True) + "\n")
        return
    names = table.column_names
    cells = [[_cell(r[n]) for n in names] for r in rows]
    widths = [max([len(n), *(len(c[i]) for c in cells)]) for i, n in enumerate(names)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out.write(line + "\n")
    out.write("| " + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)) + " |\n")
    out.write(line + "\n")
    for c in cells:
        out.write("| " + " | ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)) + " |\n")
    out.write(line + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Decimal):
        return format(value, "f")  # str() would write 0.0000001000 as 1.000E-7
    if isinstance(value, list):  # as str() writes a list, its decimals as numbers
        items = (format(v, "f") if isinstance(v, Decimal) else repr(v) for v in value)
        return "[" + ", ".join(items) + "]"
    return str(value)


def _sort(table: pa.Table, first: Sequence[str]) -> pa.Table:
    keys = [c for c in first if c in table.column_names]
    return table.sort_by([(c, "ascending") for c in keys]) if keys else table


def _print_rows(
    rows: list[dict[str, Any]], columns: Sequence[tuple[str, str, pa.DataType]], fmt: str
) -> None:
    """``rows`` rendered in ``fmt``: under their keys as JSON, and in a table under the headers
    of ``columns`` (key, header with its unit, type)."""
    import pyarrow as pa

    table = pa.Table.from_pylist(rows, pa.schema([(key, kind) for key, _, kind in columns]))
    if fmt == "table":
        table = table.rename_columns([header for _, header, _ in columns])
    render(table, fmt, sys.stdout)


def show(
    settings: Settings,
    catalog: Catalog,
    name: str,
    fmt: str,
    version: int | None = None,
    as_of: str | None = None,
    at_event_time: str | None = None,
) -> int:
    """A table's rows (any table of :mod:`lakehouse.pipeline.lake`), in its order; at a version
    or time, or a gold table as of an event time (rebuilt by Spark)."""
    from lakehouse.storage import read_arrow

    t = lake.resolve(settings, catalog, name)
    if at_event_time is not None:
        contract, spec = _gold(t)
        when = _instant(at_event_time, "--at-event-time")
        from lakehouse.tables.rebuild import at_event_time as rebuild_at

        spark = _spark(settings, "lakehouse-at-event-time")
        table = rebuild_at(spark, settings, catalog, contract, spec, when)
    else:
        as_of_time = None if as_of is None else _instant(as_of, "--as-of")
        table = read_arrow(t.path, version, as_of_time)
    if t.kind == "gold":  # its __* columns are aggregation state (an average's sum, count)
        table = table.select([c for c in table.column_names if not c.startswith("__")])
    render(_sort(table, t.order), fmt, sys.stdout)
    return 0


def _instant(text: str, flag: str) -> datetime:
    from lakehouse.contracts.fields import parse_timestamp

    ms = parse_timestamp(int(text) if text.isdigit() else text, flag)
    return datetime.fromtimestamp((ms or 0) / 1000, tz=UTC)


def _gold(t: lake.LakeTable) -> tuple[Contract, TableSpec]:
    if t.kind != "gold" or t.contract is None or t.spec is None:
        raise LakehouseError(f"{t.name} is a {t.kind} table; this works on gold tables only")
    return t.contract, t.spec


def refresh(settings: Settings, catalog: Catalog, name: str, from_version: int | None) -> int:
    from lakehouse.tables.rebuild import refresh as rebuild

    contract, spec = _gold(lake.resolve(settings, catalog, name))
    spark = _spark(settings, "lakehouse-refresh")
    print(rebuild(spark, settings, catalog, contract, spec, from_version).summary())
    return 0


def restore(settings: Settings, catalog: Catalog, name: str, target: str | None) -> int:
    """Rebuild a gold table from its changelog into a new table and compare the two."""
    from lakehouse.storage import read_arrow
    from lakehouse.tables.rebuild import restore as replay

    contract, spec = _gold(lake.resolve(settings, catalog, name))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = location(target, setting="--target") if target else settings.data_root / "restored"
    if not target:
        path = path / f"{spec.name}-{stamp}"
    spark = _spark(settings, "lakehouse-restore")
    rows = replay(spark, settings, contract, spec, path)
    keys = list(contract.table_key_columns(spec))
    real = read_arrow(settings.gold_path(spec.name))
    same = _sort(read_arrow(path), keys).equals(_sort(real, keys))
    print(f"restored {rows} rows of gold {spec.name} from its changelog into {path}")
    print(f"equal to the table: {'yes' if same else 'NO'}")
    return 0 if same else 1


def changes(settings: Settings, catalog: Catalog, name: str, start: int, fmt: str) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc

    from lakehouse.storage import CDF_PROPERTIES, changes_arrow
    from lakehouse.storage.log import load

    target = lake.resolve(settings, catalog, name)
    config = load(target.path).metadata().configuration
    if any(config.get(k) != v for k, v in CDF_PROPERTIES.items()):
        raise LakehouseError(
            f"{target.name} keeps no changelog (its change data feed is off): "
            f"`lakehouse show {target.name} --version N` shows it at any version"
        )
    feed = changes_arrow(target.path, start)
    # Pre-images sort before post-images within a commit, as they happened.
    rank = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}
    ranks = pa.array([rank.get(t, 9) for t in feed.column("_change_type").to_pylist()], pa.int8())
    feed = feed.append_column("_rank", ranks)
    feed = _sort(feed, ["_commit_version", *target.order, "_rank"]).drop_columns(["_rank"])
    if "_commit_timestamp" in feed.column_names:
        feed = feed.set_column(
            feed.column_names.index("_commit_timestamp"),
            "_commit_timestamp",
            pc.cast(feed.column("_commit_timestamp"), pa.timestamp("ms", tz="UTC")),
        )
    render(feed, fmt, sys.stdout)
    return 0


def tables(settings: Settings, catalog: Catalog, topics: Sequence[str], fmt: str) -> int:
    """Every table that exists (of the topics, or all with the ledger and the registry): its
    name as ``show`` takes it, its kind, topic, latest version and rows."""
    import pyarrow as pa

    rows = [
        {
            "name": s.table.name,
            "kind": s.table.kind,
            "topic": s.table.topic,
            "version": s.version,
            "rows": s.rows,
        }
        for s in lake.existing(settings, catalog, topics)
    ]
    columns = [
        ("name", "name", pa.string()),
        ("kind", "kind", pa.string()),
        ("topic", "topic", pa.string()),
        ("version", "version", pa.int64()),
        ("rows", "rows", pa.int64()),
    ]
    _print_rows(rows, columns, fmt)
    return 0


def lag(
    settings: Settings,
    catalog: Catalog,
    topics: Sequence[str],
    fmt: str,
    layers: Sequence[Layer] = ("bronze",),
) -> int:
    """Consumer lag: bronze behind each partition of the topics (all when empty), in records;
    with ``layers`` silver or gold, each such table behind its inputs, in versions."""
    import pyarrow as pa

    from lakehouse.topics.lag import lag as topic_lag

    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    if "bronze" in layers:
        found = topic_lag(settings, contracts)
        partitions = [
            {
                "topic": p.topic,
                "partition": p.partition,
                "end_offset": p.end_offset,
                "bronze_offset": p.bronze_offset,
                "lag": p.lag,
            }
            for p in found.partitions
        ]
        columns = [
            ("topic", "topic", pa.string()),
            ("partition", "partition", pa.int32()),
            ("end_offset", "end offset", pa.int64()),
            ("bronze_offset", "bronze offset", pa.int64()),
            ("lag", "lag (records)", pa.int64()),
        ]
        _print_rows(partitions, columns, fmt)
        if found.ignored:
            print(
                f"files in landing folders that are not segments (not read): "
                f"{len(found.ignored)} file(s)",
                file=sys.stderr,
            )
            for line in found.ignored:
                print(f"  {line}", file=sys.stderr)
    if not {"silver", "gold"} & set(layers):
        return 0
    behind = [
        {
            "table": i.table,
            "input": i.input,
            "input_version": i.latest,
            "consumed_version": i.consumed,
            "lag_versions": i.lag,
        }
        for i in lake.input_lag(settings, catalog, contracts, layers)
    ]
    if fmt == "table" and "bronze" in layers:
        print()  # between the two tables
    columns = [
        ("table", "table", pa.string()),
        ("input", "input", pa.string()),
        ("input_version", "input version", pa.int64()),
        ("consumed_version", "read up to version", pa.int64()),
        ("lag_versions", "lag (versions)", pa.int64()),
    ]
    _print_rows(behind, columns, fmt)
    return 0


def create_topic(settings: Settings, contract: Contract, err: TextIO) -> int:
    """Create a Kafka-sourced topic on its broker with the contract's partition count."""
    client = kafka.client(settings, contract)
    created = kafka.create_topic(client, contract.partitions)
    kafka.check_topic(client, contract)
    state = "created" if created else "already exists"
    print(
        f"Kafka topic {client.topic} at {client.bootstrap_servers}: {state}, "
        f"{contract.partitions} partition(s)",
        file=err,
    )
    return 0


def data_quality(
    settings: Settings, table: str | None, last: int, fmt: str, days: float | None = None
) -> int:
    """Each table's latest run and its trend, from the ledger's newest ``days``; or (json) every
    run in that window, one object each: what the data-quality page draws."""
    if fmt == "json":
        import dataclasses
        import json

        import pyarrow as pa

        from lakehouse.quality.history import DAYS, history

        runs = history(settings, table=table, days=DAYS if days is None else days).runs
        rows = [
            {**dataclasses.asdict(r), "reasons": json.dumps(r.reasons), "failed": list(r.failed)}
            for r in runs
        ]
        render(pa.Table.from_pylist(rows), fmt, sys.stdout)
        return 0
    from lakehouse.quality.reports import print_report

    print_report(settings, table=table, last=last, days=days)
    return 0


def run_requests(
    catalog: Catalog,
    topics: Sequence[str],
    layers: Sequence[Layer],
    asked: Mapping[str, Any] | None = None,
) -> dict[str, RunRequest]:
    """``lakehouse run``'s flags as each topic's run request (every topic when ``topics`` is
    empty, every layer when ``layers`` is), checked as a triggered run's Params are
    (:meth:`RunRequest.from_params`). A reprocess or a refresh names versions, offsets or tables
    of one topic, so it needs one ``--topic``."""
    from lakehouse.pipeline.request import OPTIONS, RunRequest

    asked = dict(asked or {})
    given = [o.name for o in OPTIONS if o.one_topic and asked.get(o.name) not in (None, "", [], ())]
    if given and len(topics) != 1:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        if not topics:
            raise ConfigError(f"{flags}: name the topic it is for with --topic")
        raise ConfigError(
            f"{flags}: name the one topic it is for with --topic (given {', '.join(topics)})"
        )
    params = {"layers": list(layers or LAYERS), **asked}
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    return {c.topic: RunRequest.from_params(params, c, flags=True) for c in contracts}


def _spark(settings: Settings, app_name: str) -> SparkSession:
    """A session on this lakehouse's Spark server when it runs (`lakehouse spark start`): no JVM
    to start. Otherwise a Spark of this process's own, whose log goes to a file
    (:func:`lakehouse.runtime.spark.session_log`), not to the terminal."""
    from lakehouse.runtime import server
    from lakehouse.runtime.spark import get_session, session_log

    status = server.status(settings)
    if status.running:
        print(f"on the Spark server at sc://localhost:{status.port}", file=sys.stderr)
        return server.connect(settings)
    log = session_log(settings.home)
    print(f"in a Spark of its own (its log: {log})", file=sys.stderr)
    return get_session(settings.spark_master, app_name=app_name, log=log)


def metastore_session(settings: Settings) -> SparkSession:
    """A session that keeps names in the lakehouse's metastore: the Spark server's when it runs,
    else a Spark of this process's own opening the metastore itself (the embedded one admits
    one process at a time). Raises :class:`~lakehouse.storage.metastore.CatalogError` when the
    session has no metastore (a server started with ``LAKEHOUSE_METASTORE=none``)."""
    from lakehouse.runtime import metastore as where
    from lakehouse.runtime import server
    from lakehouse.runtime.spark import get_session, session_log
    from lakehouse.storage import metastore

    if server.status(settings).running:
        spark = server.connect(settings)
        if not metastore.uses_metastore(spark):
            raise metastore.CatalogError(
                "the Spark server runs without a metastore (started with "
                f"{where.METASTORE_ENV}=none, or by an older version): restart it with "
                "`lakehouse spark stop` and `lakehouse spark start`"
            )
        return spark
    conf = where.session_conf(settings)
    if not conf:
        raise metastore.CatalogError(
            f"{where.METASTORE_ENV}=none: the lakehouse keeps no catalog of names; unset it to "
            "use the embedded metastore"
        )
    log = session_log(settings.home)
    print(f"in a Spark of its own (its log: {log})", file=sys.stderr)
    return get_session(settings.spark_master, app_name="lakehouse-catalog", log=log, extra=conf)


def catalog_command(settings: Settings, catalog: Catalog, action: str, name: str | None) -> int:
    """``lakehouse catalog list | sync | drop NAME``: the names in the metastore and their
    tables; name every table on storage (a lake older than the catalog gets its names); remove
    one name (the table's files stay)."""
    from lakehouse.storage import metastore

    if action == "drop":
        if not name:
            raise ConfigError("lakehouse catalog drop: name the table, e.g. gold.user_places")
        table = metastore.TableName.parse(name)
        where = metastore.drop(metastore_session(settings), table)
        print(f"dropped {table} from the catalog (its table stays at {where})")
        return 0
    if name:
        raise ConfigError(f"lakehouse catalog {action} takes no name (only drop does)")
    spark = metastore_session(settings)
    if action == "list":
        for entry, at in sorted(metastore.names(spark).items(), key=lambda e: str(e[0])):
            print(f"{entry}  {at}")
        return 0
    on_storage = [t.path for t in lake.tables(settings, catalog) if is_table(t.path)]
    for done in metastore.sync(spark, settings, on_storage):
        print(f"{done.done:<10}  {done.name}  {done.path}")
    stale = [
        f"{table} ({where})"
        for table, where in sorted(metastore.names(spark).items(), key=lambda e: str(e[0]))
        if where is None or not any(metastore.same_location(where, p) for p in on_storage)
    ]
    if stale:
        print(
            f"note: {len(stale)} name(s) are of no table of this lake's contracts, and are kept: "
            + ", ".join(stale)
            + " (`lakehouse catalog drop NAME` removes one)"
        )
    return 0


def run_pipeline(
    settings: Settings,
    catalog: Catalog,
    topics: Sequence[str],
    layers: Sequence[Layer],
    asked: Mapping[str, Any] | None = None,
) -> int:
    """One micro-batch of the given layers and topics (each: all when empty), plus what the
    flags ask (``asked``: the keys of a triggered run's Params). Every request is checked
    before Spark starts."""
    from lakehouse.pipeline.runner import run

    requests = run_requests(catalog, topics, layers, asked)
    if any(v for v in (asked or {}).values()):
        for name, request in requests.items():
            for line in request.describe(catalog.topic(name)):
                print(line)
    # The requests above are checked before Spark is set up.
    objectstore.check_reachable(settings.data_root)  # before a JVM starts, not after
    spark = _spark(settings, "lakehouse-run")
    run(spark, settings, catalog, topics=topics, layers=layers or LAYERS, requests=requests)
    return 0


def run_airflow(settings: Settings, args: list[str]) -> int:
    """The airflow command line with this lakehouse's environment; ``standalone`` is `make
    airflow`'s Airflow (:mod:`lakehouse.orchestration.standalone`), whose metadata database
    the commands after it use. Every command but ``standalone`` says on stderr which database
    it uses, unless ``LAKEHOUSE_AIRFLOW_DB`` chose it."""
    from lakehouse.orchestration.airflow_env import (
        DB_ENV,
        airflow_environment,
        describe_database,
        record_database,
    )

    env = airflow_environment(settings)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    if args == ["standalone"]:  # `make airflow`: said when ready, stopped whole on Ctrl-C
        from lakehouse.orchestration.standalone import run_standalone

        record_database(settings, os.environ)
        print(describe_database(settings, os.environ), flush=True)
        return run_standalone(airflow, env)
    if not os.environ.get(DB_ENV):
        print(describe_database(settings, os.environ), file=sys.stderr, flush=True)
    os.execve(airflow, [airflow, *args], env)
    return 0  # pragma: no cover - execve does not return


# -- options -----------------------------------------------------------------------------------


def _topic_option(text: str) -> str:
    """``--topic``: one topic. Empty is refused: left to mean "every topic", an unset variable
    in ``--topic "$TOPIC"`` would act on all of them."""
    if not text:
        raise argparse.ArgumentTypeError("empty topic name (leave --topic out for every topic)")
    return text


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse


class _Once(argparse.Action):
    """An option that takes one value, given at most once. argparse's own keeps the last of
    several silently (``--format json --format table``); a second one is refused instead."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None:
            given: set[str] = namespace.__dict__.setdefault("_given", set())
            if self.dest in given:
                first = getattr(namespace, self.dest)
                parser.error(
                    f"argument {'/'.join(self.option_strings)}: given twice ({first!r}, then "
                    f"{values!r}); give it once"
                )
            given.add(self.dest)
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """The command line's parser: an option that takes a value is given once (:class:`_Once`),
    unless it says it combines (``action="append"``: several ``--topic`` or ``--layer``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _Once)
        self.register("action", "store", _Once)


def _several(values: Sequence[str] | None) -> list[str]:
    """An appended option's values, each once, in the order given (none: the option left out)."""
    return list(dict.fromkeys(values or []))


def _several_topics(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topic",
        type=_topic_option,
        action="append",
        metavar="TOPIC",
        help="a topic (repeatable; default: every topic)",
    )


def _several_layers(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--layer", choices=LAYERS, action="append", help=text)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lakehouse", description="Streams and tables on a Delta lakehouse.")
    p.add_argument(
        "--home", help="lakehouse root (default: $LAKEHOUSE_HOME or .lakehouse in the checkout)"
    )
    p.add_argument(
        "--contracts", help="contracts folder (default: $LAKEHOUSE_CONTRACTS or contracts/)"
    )
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("produce", help="append JSON-line records from stdin to a topic")
    sp.add_argument("topic")
    sp.add_argument(
        "--value-schema-id",
        type=int,
        help="Avro topics: encode values with this schema id (default: the latest)",
    )
    sp.add_argument(
        "--allow-undeclared-fields",
        action="store_true",
        help="JSON values: write fields the contract does not declare as given (for a producer "
        "ahead of its contract; silver ignores them until the contract declares them) instead "
        "of refusing the line",
    )

    st = sub.add_parser(
        "create-topic", help="create a Kafka-sourced topic on its broker (contract's partitions)"
    )
    st.add_argument("topic")

    sr = sub.add_parser("run", help="run one micro-batch of the pipeline, without Airflow")
    _several_topics(sr)
    _several_layers(sr, "a layer to run (repeatable; default: all three)")
    for option in _run_options():  # a triggered run's Params, as flags of the same names
        sr.add_argument(
            "--" + option.name.replace("_", "-"),
            dest=option.name,
            help=option.help + (" (needs --topic)" if option.one_topic else ""),
            **option.flag or {},
        )

    names = "a table's name as `lakehouse tables` lists it (e.g. user_places, silver.<stream>)"
    for name, helptext in (
        ("show", "print a table's rows"),
        ("changes", "print a table's changelog"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("table", help=names)
        if name == "show":
            when = s.add_mutually_exclusive_group()
            when.add_argument("--version", type=int, help="time travel to a table version")
            when.add_argument("--as-of", help="time travel to a time (ISO-8601 or epoch ms)")
            when.add_argument(
                "--at-event-time",
                help="gold: rebuild the table from the events with event time <= this",
            )
        else:
            s.add_argument("--from-version", type=int, default=0)
        s.add_argument("--format", choices=("table", "json"), default="table")

    sn = sub.add_parser(
        "tables", help="every table that exists: its name for show, kind, version and rows"
    )
    _several_topics(sn)
    sn.add_argument("--format", choices=("table", "json"), default="table")

    sf = sub.add_parser(
        "refresh", help="rebuild a gold table from its input (keeps history; changelog = diff)"
    )
    sf.add_argument("table")
    sf.add_argument(
        "--from-version",
        type=int,
        help="reprocess: put the table back to before this input version; the next run "
        "re-reads from there",
    )
    so = sub.add_parser("restore", help="rebuild a gold table from its changelog alone")
    so.add_argument("table")
    so.add_argument("--to", help="the new table's folder (default: <home>/restored/<table>-<time>)")

    sm = sub.add_parser(
        "maintain", help="compact, vacuum (consumer-aware), checkpoint and clean table logs"
    )
    _several_topics(sm)
    sm.add_argument("--retention-hours", type=float, default=DEFAULT_RETENTION_HOURS)
    sm.add_argument("--no-compact", action="store_true")
    sm.add_argument("--dry-run", action="store_true", help="report what vacuum would delete")
    sm.add_argument(
        "--ledger",
        action="store_true",
        help="the data-quality results ledger instead of the topics' tables",
    )

    ss = sub.add_parser(
        "sample", help="produce the seed's example events (once), or --records N random ones"
    )
    ss.add_argument(
        "--topic", type=_topic_option, help="one topic (default: every shipped sample topic)"
    )
    ss.add_argument(
        "--records",
        type=_count(1),
        help="generate this many random records (default topic: user-locations)",
    )
    ss.add_argument(
        "--value-bytes", type=_count(0), default=0, help="pad values to about this size"
    )
    ss.add_argument("--seed", type=int, default=0)

    sc = sub.add_parser(
        "schemas", help="registered schema versions per topic; --check tests the contracts"
    )
    _several_topics(sc)
    sc.add_argument("--check", action="store_true", help="check the contracts against the registry")

    sl = sub.add_parser(
        "lag",
        help="consumer lag: per partition, the topic's end offset, bronze's and the lag in "
        "records; with --layer silver/gold, each table's lag behind its inputs in versions",
    )
    _several_topics(sl)
    _several_layers(sl, "the consumers of this layer (repeatable; default: bronze)")
    sl.add_argument("--format", choices=("table", "json"), default="table")
    sq = sub.add_parser(
        "dq",
        help="data quality per table (ledger): the latest run and the last batch with data, "
        "each with its checks, and the trend",
    )
    sq.add_argument(
        "--table",
        help="a topic (every table of it), a stream, a gold table, or layer.name",
    )
    sq.add_argument("--last", type=int, default=10, help="runs per table in the trend")
    sq.add_argument(
        "--days",
        type=float,
        default=None,
        help="how far back the ledger is read (default 14 days, as the data-quality page)",
    )
    sq.add_argument("--format", choices=("table", "json"), default="table")
    sub.add_parser("report", help="rebuild the Data Docs (HTML) from the saved validations")
    sk = sub.add_parser(
        "spark",
        help="the long-lived Spark server that jobs run on, and the readers' server beside it "
        "(Spark Connect and the SQL endpoint for tools): start, run (in the foreground), stop, "
        "status; reader: print the readers' credential and addresses (docs/sql.md)",
    )
    sk.add_argument(
        "action",
        choices=("start", "run", "stop", "status", "reader"),
        nargs="?",
        default="status",
    )
    sk.add_argument(
        "--only",
        choices=("pipeline", "readers"),
        help="start or run one of the two servers (a deployment that runs each in a container "
        "of its own: the readers' server then finds the catalog at LAKEHOUSE_CATALOG_PORT)",
    )
    sg = sub.add_parser(
        "postgres",
        help="the lakehouse's PostgreSQL (Airflow's metadata database): start, stop, status",
    )
    sg.add_argument("action", choices=("start", "stop", "status"), nargs="?", default="status")
    sb = sub.add_parser(
        "kafka",
        help="the lakehouse's local Kafka broker (one KRaft node on 127.0.0.1): start, stop, status",
    )
    sb.add_argument("action", choices=("start", "stop", "status"), nargs="?", default="status")
    s3 = sub.add_parser(
        "s3",
        help="a local S3 API (moto's server on 127.0.0.1, in memory): start, stop, status",
    )
    s3.add_argument("action", choices=("start", "stop", "status"), nargs="?", default="status")
    sd = sub.add_parser(
        "catalog",
        help="table names in the metastore: list them, sync (name every table on storage), "
        "drop NAME (the name only; the table stays)",
    )
    sd.add_argument("action", choices=("list", "sync", "drop"), nargs="?", default="list")
    sd.add_argument("name", nargs="?", help="drop: the name, e.g. gold.user_places")
    sa = sub.add_parser("airflow", help="run the airflow CLI with the lakehouse's environment")
    sa.add_argument("args", nargs=argparse.REMAINDER)
    return p


# -- commands ----------------------------------------------------------------------------------


# Commands that act on every topic when no --topic names some: a contract that does not load
# stops them before anything moves (they would leave its topic out).
EVERY_TOPIC = frozenset({"run", "maintain", "schemas", "lag", "tables", "sample", "catalog"})


@dataclass
class _Context:
    """What a command works on: the settings, and the contracts, loaded when first asked for
    (the service commands run without them). A contract that does not load fails the commands
    that concern its topic (named with --topic, or every topic) with its error; the others go on
    without it, saying so on stderr."""

    settings: Settings
    command: str = ""
    topics: tuple[str, ...] = ()

    @cached_property
    def catalog(self) -> Catalog:
        loaded = Catalog.load_each(self.settings.contracts_dir)
        for topic in self.topics:
            loaded.topic(topic)  # its own contract's error, if it has one
        if loaded.errors and not self.topics and self.command in EVERY_TOPIC:
            raise ConfigError(
                f"{len(loaded.errors)} contract(s) do not load, so `lakehouse {self.command}` "
                "would leave their topics out: "
                + "; ".join(str(e) for e in loaded.errors.values())
                + " (fix them, or name the topics to act on with --topic)"
            )
        for error in loaded.errors.values():
            print(f"note: left out, its contract does not load: {error}", file=sys.stderr)
        return loaded.catalog


Handler = Callable[[argparse.Namespace, _Context], int]


def _layers(values: Sequence[str] | None) -> tuple[Layer, ...]:
    """Several ``--layer``s, in pipeline order (none: the option left out)."""
    return tuple(layer for layer in LAYERS if layer in (values or []))


def _produce(args: argparse.Namespace, ctx: _Context) -> int:
    topic = ctx.catalog.topic(args.topic)
    return produce(
        ctx.settings,
        topic,
        sys.stdin,
        sys.stderr,
        args.value_schema_id,
        allow_undeclared=args.allow_undeclared_fields,
    )


def _run_options() -> list[Option]:
    """What a run can ask that ``lakehouse run`` has a flag for (the layers: ``--layer``)."""
    from lakehouse.pipeline.request import OPTIONS

    return [o for o in OPTIONS if o.flag is not None]


def _run(args: argparse.Namespace, ctx: _Context) -> int:
    asked = {o.name: getattr(args, o.name) for o in _run_options()}
    return run_pipeline(ctx.settings, ctx.catalog, _several(args.topic), _layers(args.layer), asked)


def _show(args: argparse.Namespace, ctx: _Context) -> int:
    return show(
        ctx.settings,
        ctx.catalog,
        args.table,
        args.format,
        args.version,
        args.as_of,
        args.at_event_time,
    )


def _maintain(args: argparse.Namespace, ctx: _Context) -> int:
    from lakehouse.pipeline.runner import maintain_topics, maintained_tables

    settings, topics = ctx.settings, _several(args.topic)
    # An unknown topic is refused, and a lakehouse without tables done, before Spark starts.
    if not maintained_tables(settings, ctx.catalog, topics=topics, ledger=args.ledger):
        print("no tables to maintain")
        return 0
    maintain_topics(
        _spark(settings, "lakehouse-maintain"),
        settings,
        ctx.catalog,
        topics=topics,
        retention_hours=args.retention_hours,
        compact=not args.no_compact,
        dry_run=args.dry_run,
        ledger=args.ledger,
    )
    return 0


def _report(args: argparse.Namespace, ctx: _Context) -> int:
    from lakehouse.quality.reports import build_data_docs

    print(f"Data Docs: {build_data_docs(ctx.settings, ctx.catalog)}")
    return 0


def server_main(settings: Settings, action: str, *, only: str | None) -> int:
    """``lakehouse spark ACTION [--only pipeline|readers]``."""
    from lakehouse.runtime import server

    return server.main(settings, action, only=only)


def _service(module: str) -> Handler:
    """``lakehouse spark|postgres|kafka|s3 start|stop|status``: the service's own ``main``."""

    def handle(args: argparse.Namespace, ctx: _Context) -> int:
        service = importlib.import_module(f"lakehouse.runtime.{module}")
        return int(service.main(ctx.settings, args.action))

    return handle


# Every command of build_parser(), by name: what it runs.
COMMANDS: dict[str, Handler] = {
    "produce": _produce,
    "create-topic": lambda a, c: create_topic(c.settings, c.catalog.topic(a.topic), sys.stderr),
    "run": _run,
    "show": _show,
    "changes": lambda a, c: changes(c.settings, c.catalog, a.table, a.from_version, a.format),
    "tables": lambda a, c: tables(c.settings, c.catalog, _several(a.topic), a.format),
    "refresh": lambda a, c: refresh(c.settings, c.catalog, a.table, a.from_version),
    "restore": lambda a, c: restore(c.settings, c.catalog, a.table, a.to),
    "maintain": _maintain,
    "sample": lambda a, c: produce_sample(
        c.settings, c.catalog, sys.stderr, a.topic, a.records, a.value_bytes, a.seed
    ),
    "schemas": lambda a, c: schemas(c.settings, c.catalog, _several(a.topic), a.check),
    "lag": lambda a, c: lag(
        c.settings, c.catalog, _several(a.topic), a.format, _layers(a.layer) or ("bronze",)
    ),
    "dq": lambda a, c: data_quality(c.settings, a.table, a.last, a.format, a.days),
    "report": _report,
    "spark": lambda a, c: server_main(c.settings, a.action, only=a.only),
    "postgres": _service("postgres"),
    "kafka": _service("broker"),
    "s3": _service("s3server"),
    "catalog": lambda a, c: catalog_command(c.settings, c.catalog, a.action, a.name),
    "airflow": lambda a, c: run_airflow(c.settings, a.args),
}

# What a shell reports for a program that SIGPIPE ended (128 + 13), as `cat` and `seq` are
# when their reader quits early.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            named = getattr(args, "topic", None)
            topics = tuple([named] if isinstance(named, str) else named or ())
            context = _Context(Settings.from_env(args.home, args.contracts), args.command, topics)
            code = COMMANDS[args.command](args, context)
            sys.stdout.flush()  # a reader that is gone shows here, not at the interpreter's exit
            return code
        except LakehouseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    except BrokenPipeError:
        # The reader quit (`lakehouse show T | head`): stop quietly, as Unix tools do. Python
        # would flush stdout once more at exit and print that failure: stdout becomes
        # /dev/null first.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    raise SystemExit(main())
