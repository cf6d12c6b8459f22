"""``lakehouse``: the command line, in the habits of kafka-console-producer and ksql.

Commands::

    lakehouse produce TOPIC [--value-schema-id N] < records.jsonl   (landing files or broker)
    lakehouse create-topic TOPIC   (a Kafka-sourced topic, on its broker)
    lakehouse run [--topic T] [--layer bronze|silver|gold]
    lakehouse show TABLE [--version N | --as-of TIME] [--format table|json]
    lakehouse changes TABLE [--from-version N] [--format table|json]
    lakehouse lag [--topic T]
    lakehouse maintain [--topic T] [--retention-hours H] [--no-compact] [--dry-run]
    lakehouse sample [--topic T] [--records N [--value-bytes B]]   (fixed samples, or N random)
    lakehouse schemas [--topic T] [--check]   (registered schema versions; check contracts)
    lakehouse spark start|run|stop|status   (the Spark server jobs run on; run: foreground)
    lakehouse postgres start|stop|status    (Airflow's PostgreSQL metadata database)
    lakehouse kafka start|stop|status       (a local single-node Kafka broker, KRaft mode)
    lakehouse s3 start|stop|status          (a local S3 API, moto's server, in memory)
    lakehouse airflow ARGS    (Airflow with the lakehouse's environment)
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from lakehouse.contracts.model import Catalog, Contract, TableSpec
from lakehouse.errors import BadRecordError, ConfigError, LakehouseError
from lakehouse.runtime import objectstore
from lakehouse.runtime.config import LAYERS, Layer, Settings
from lakehouse.runtime.objectstore import Location, location
from lakehouse.storage.maintenance import DEFAULT_RETENTION_HOURS
from lakehouse.topics import kafka
from lakehouse.topics.landing import Producer, Record, record_from_json_line

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from lakehouse.pipeline.request import RunRequest

PRODUCE_CHUNK = 10_000


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[tuple[int, str]]]:
    chunk: list[tuple[int, str]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        chunk.append((n, line))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def produce(
    settings: Settings,
    contract: Contract,
    stream: TextIO,
    err: TextIO,
    value_schema_id: int | None = None,
) -> int:
    """Produce JSON lines from ``stream``, keys and values encoded in the topic's formats (Avro
    with the latest schema id, or ``value_schema_id``); stop at the first bad line, keeping what
    went before."""
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
    serializer = Serializer(contract, value_schema_id)
    total = 0
    per_partition: dict[int, int] = {}
    try:
        for chunk in _chunks(stream, PRODUCE_CHUNK):
            records: list[Record] = []
            failure: BadRecordError | None = None
            for n, line in chunk:
                try:
                    records.append(record_from_json_line(line, f"stdin line {n}", serializer))
                except BadRecordError as exc:
                    failure = exc
                    break
            # Records before the bad line are produced, so nothing already accepted is lost.
            for meta in producer.send_batch(records):
                per_partition[meta.partition] = per_partition.get(meta.partition, 0) + 1
            total += len(records)
            if failure is not None:
                raise failure
    finally:
        spread = ", ".join(f"p{p}: {n}" for p, n in sorted(per_partition.items())) or "none"
        print(f"produced {total} record(s) to {contract.topic} ({spread})", file=err)
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


def schemas(settings: Settings, catalog: Catalog, topic: str | None, check: bool) -> int:
    """List each topic's registered key/value schema versions; ``check``: would the current
    contracts be accepted (nothing is registered)?"""
    from lakehouse.streams.registry import SUBJECTS, SchemaRegistry

    registry = SchemaRegistry(settings.registry_path)
    contracts = [catalog.topic(topic)] if topic else list(catalog)
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
    rows = [{k: _plain(v) for k, v in r.items()} for r in table.to_pylist()]
    if fmt == "json":
        for r in rows:
            out.write(json.dumps(r, ensure_ascii=False) + "\n")
        return
    names = table.column_names
    cells = [["null" if r[n] is None else str(r[n]) for n in names] for r in rows]
    widths = [max([len(n), *(len(c[i]) for c in cells)]) for i, n in enumerate(names)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out.write(line + "\n")
    out.write("| " + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)) + " |\n")
    out.write(line + "\n")
    for c in cells:
        out.write("| " + " | ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)) + " |\n")
    out.write(line + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _sort(table: pa.Table, first: Sequence[str]) -> pa.Table:
    keys = [c for c in first if c in table.column_names]
    return table.sort_by([(c, "ascending") for c in keys]) if keys else table


def _table_path(settings: Settings, catalog: Catalog, name: str) -> tuple[Location, list[str]]:
    if name.startswith("late."):  # a windowed table's late records
        bare = name.removeprefix("late.")
        _, _, contract = catalog.resolve_table(bare)
        return settings.late_path(bare), ["partition", "offset"]
    layer, bare, contract = catalog.resolve_table(name)
    if layer == "gold":
        return settings.gold_path(bare), list(contract.table_key_columns(contract.table(bare)))
    if layer == "silver":
        return settings.silver_path(bare), ["partition", "offset"]
    return settings.bronze_path(bare), ["partition", "offset"]


def show(
    settings: Settings,
    catalog: Catalog,
    name: str,
    fmt: str,
    version: int | None = None,
    as_of: str | None = None,
    at_event_time: str | None = None,
) -> int:
    from lakehouse.storage import read_arrow

    path, order = _table_path(settings, catalog, name)
    if at_event_time is not None:
        table = _at_event_time(settings, catalog, name, _instant(at_event_time, "--at-event-time"))
    else:
        when = None if as_of is None else _instant(as_of, "--as-of")
        table = read_arrow(path, version, when)
    # Columns named __* are aggregation state (e.g. an average's sum and count), not results.
    table = table.select([c for c in table.column_names if not c.startswith("__")])
    render(_sort(table, order), fmt, sys.stdout)
    return 0


def _instant(text: str, flag: str) -> datetime:
    from lakehouse.contracts.fields import parse_timestamp

    ms = parse_timestamp(int(text) if text.isdigit() else text, flag)
    return datetime.fromtimestamp((ms or 0) / 1000, tz=UTC)


def _gold(catalog: Catalog, name: str) -> tuple[Contract, TableSpec]:
    layer, bare, contract = catalog.resolve_table(name)
    if layer != "gold":
        raise LakehouseError(f"{name} is a {layer} table; this works on gold tables only")
    return contract, contract.table(bare)


def _at_event_time(settings: Settings, catalog: Catalog, name: str, when: datetime) -> pa.Table:
    from lakehouse.runtime.spark import get_session
    from lakehouse.tables.rebuild import at_event_time

    contract, spec = _gold(catalog, name)
    spark = get_session(settings.spark_master, app_name="lakehouse-at-event-time")
    return at_event_time(spark, settings, catalog, contract, spec, when)


def refresh(settings: Settings, catalog: Catalog, name: str, from_version: int | None) -> int:
    from lakehouse.runtime.spark import get_session
    from lakehouse.tables.rebuild import refresh as rebuild

    contract, spec = _gold(catalog, name)
    spark = get_session(settings.spark_master, app_name="lakehouse-refresh")
    print(rebuild(spark, settings, catalog, contract, spec, from_version).summary())
    return 0


def restore(settings: Settings, catalog: Catalog, name: str, target: str | None) -> int:
    """Rebuild a gold table from its changelog into a new table and compare the two."""
    from lakehouse.runtime.spark import get_session
    from lakehouse.storage import read_arrow
    from lakehouse.tables.rebuild import restore as replay

    contract, spec = _gold(catalog, name)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = location(target, setting="--target") if target else settings.data_root / "restored"
    if not target:
        path = path / f"{spec.name}-{stamp}"
    spark = get_session(settings.spark_master, app_name="lakehouse-restore")
    rows = replay(spark, settings, contract, spec, path)
    keys = list(contract.table_key_columns(spec))
    same = _sort(read_arrow(path), keys).equals(_sort(read_arrow(settings.gold_path(name)), keys))
    print(f"restored {rows} rows of gold {name} from its changelog into {path}")
    print(f"equal to the table: {'yes' if same else 'NO'}")
    return 0 if same else 1


def changes(settings: Settings, catalog: Catalog, name: str, start: int, fmt: str) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc

    from lakehouse.storage import changes_arrow

    path, order = _table_path(settings, catalog, name)
    feed = changes_arrow(path, start)
    # Pre-images sort before post-images within a commit, as they happened.
    rank = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}
    ranks = pa.array([rank.get(t, 9) for t in feed.column("_change_type").to_pylist()], pa.int8())
    feed = feed.append_column("_rank", ranks)
    feed = _sort(feed, ["_commit_version", *order, "_rank"]).drop_columns(["_rank"])
    if "_commit_timestamp" in feed.column_names:
        feed = feed.set_column(
            feed.column_names.index("_commit_timestamp"),
            "_commit_timestamp",
            pc.cast(feed.column("_commit_timestamp"), pa.timestamp("ms", tz="UTC")),
        )
    render(feed, fmt, sys.stdout)
    return 0


def lag(settings: Settings, catalog: Catalog, topic: str | None, fmt: str) -> int:
    """Kafka's consumer lag, for bronze as the consumer of the landing topic partitions."""
    import pyarrow as pa

    from lakehouse.storage.store import latest_metadata
    from lakehouse.topics.bronze import POSITION_KEY, Position
    from lakehouse.topics.landing import end_offsets, survey

    rows = []
    ignored: list[str] = []
    for c in [catalog.topic(topic)] if topic else list(catalog):
        if c.kafka is not None:
            marks = kafka.offsets(kafka.client(settings, c), c.partitions)
            ends = {p: end for p, (_, end) in marks.items()}
        else:
            ends = end_offsets(settings, c.topic, c.partitions, c.landing_format)
            root = settings.topic_dir(c.topic)
            ignored.extend(f"{c.topic}: {i.describe(root)}" for i in survey(settings, c.topic)[1])
        committed = Position.from_json(
            latest_metadata(settings.bronze_path(c.topic), POSITION_KEY)
        ).next
        for p in sorted(set(ends) | set(committed)):
            end, done = ends.get(p, 0), committed.get(p, 0)
            rows.append(
                {
                    "topic": c.topic,
                    "partition": p,
                    "end_offset": end,
                    "bronze_offset": done,
                    "lag": max(0, end - done),
                }
            )
    schema = pa.schema(
        [("topic", pa.string()), ("partition", pa.int32()), ("end_offset", pa.int64()),
         ("bronze_offset", pa.int64()), ("lag", pa.int64())]
    )  # fmt: skip
    render(pa.Table.from_pylist(rows, schema), fmt, sys.stdout)
    if ignored:
        print(
            f"files in landing folders that are not segments (not read): {len(ignored)}",
            file=sys.stderr,
        )
        for line in ignored:
            print(f"  {line}", file=sys.stderr)
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


def data_quality(settings: Settings, table: str | None, last: int, fmt: str) -> int:
    """The ledger's latest validation per table with its trend, or (json) the ledger's rows."""
    if fmt == "json":
        from lakehouse.quality.ledger import read_ledger

        render(read_ledger(settings, table), fmt, sys.stdout)
        return 0
    from lakehouse.quality.reports import print_report

    print_report(settings, table=table, last=last)
    return 0


RUN_REQUEST_FLAGS = (
    "full_refresh",
    "reprocess_silver_from_version",
    "reprocess_silver_from_offsets",
    "reprocess_gold_from_version",
)


def run_requests(
    catalog: Catalog,
    topic: str | None,
    layer: Layer | None,
    asked: Mapping[str, Any] | None = None,
) -> dict[str, RunRequest]:
    """``lakehouse run``'s flags as each topic's run request, checked as a triggered run's
    Params are (:meth:`RunRequest.from_params`). A reprocess or a refresh names versions, offsets
    or tables of one topic, so it needs ``--topic``."""
    from lakehouse.pipeline.request import RunRequest

    asked = dict(asked or {})
    given = [k for k in RUN_REQUEST_FLAGS if asked.get(k) not in (None, "", [], ())]
    if given and not topic:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(f"{flags}: name the topic it is for with --topic")
    params = {"layers": [layer] if layer else list(LAYERS), **asked}
    contracts = [catalog.topic(topic)] if topic else list(catalog)
    return {c.topic: RunRequest.from_params(params, c, flags=True) for c in contracts}


def _spark(settings: Settings, app_name: str) -> SparkSession:
    """A session on this lakehouse's Spark server when it runs (`lakehouse spark start`): no JVM
    to start. Otherwise a Spark of this process's own."""
    from lakehouse.runtime import server
    from lakehouse.runtime.spark import get_session

    status = server.status(settings)
    if status.running:
        print(f"on the Spark server at sc://localhost:{status.port}", file=sys.stderr)
        return server.connect(settings)
    return get_session(settings.spark_master, app_name=app_name)


def run_pipeline(
    settings: Settings,
    catalog: Catalog,
    topic: str | None,
    layer: Layer | None,
    asked: Mapping[str, Any] | None = None,
) -> int:
    """One micro-batch of the given layers and topics, plus what the flags ask (``asked``: the
    keys of a triggered run's Params). Every request is checked before Spark starts."""
    from lakehouse.pipeline.runner import run

    requests = run_requests(catalog, topic, layer, asked)
    if any(v for v in (asked or {}).values()):
        for name, request in requests.items():
            for line in request.describe(catalog.topic(name)):
                print(line)
    layers: tuple[Layer, ...] = (layer,) if layer else LAYERS
    # The requests above are checked before Spark is set up.
    objectstore.check_reachable(settings.data_root)  # before a JVM starts, not after
    spark = _spark(settings, "lakehouse-run")
    run(spark, settings, catalog, topics=[topic] if topic else [], layers=layers, requests=requests)
    return 0


def run_airflow(settings: Settings, args: list[str]) -> int:
    from lakehouse.orchestration.airflow_env import airflow_environment

    env = airflow_environment(settings)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    os.execve(airflow, [airflow, *args], env)
    return 0  # pragma: no cover - execve does not return


# -- entry point -------------------------------------------------------------------------------


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lakehouse", description="Streams and tables on a Delta lakehouse."
    )
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

    st = sub.add_parser(
        "create-topic", help="create a Kafka-sourced topic on its broker (contract's partitions)"
    )
    st.add_argument("topic")

    sr = sub.add_parser("run", help="run one micro-batch of the pipeline, without Airflow")
    sr.add_argument("--topic", type=_topic_option)
    sr.add_argument("--layer", choices=LAYERS)
    sr.add_argument(
        "--dry-run", action="store_true", help="print what each layer would read and write"
    )
    sr.add_argument(
        "--full-refresh", action="append", metavar="TABLE",
        help="gold: rebuild this table from the whole stream (repeatable; needs --topic)",
    )  # fmt: skip
    for flag, kind, metavar, text in (
        ("silver-from-version", int, "V", "silver: decode again the bronze records from bronze "
         "version V"),
        ("silver-from-offsets", str, "P:O,...", "silver: decode again from these offsets, e.g. "
         "0:120,1:0"),
        ("gold-from-version", int, "V", "gold: rebuild as of silver version V-1 and read again "
         "from V"),
    ):  # fmt: skip
        sr.add_argument(
            f"--reprocess-{flag}", type=kind, metavar=metavar, help=f"{text} (needs --topic)"
        )

    for name, helptext in (
        ("show", "print a table's rows"),
        ("changes", "print a table's changelog"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("table", help="gold table name, silver.<stream> or bronze.<topic>")
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
    sm.add_argument("--topic", type=_topic_option)
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
    sc.add_argument("--topic", type=_topic_option)
    sc.add_argument("--check", action="store_true", help="check the contracts against the registry")

    sl = sub.add_parser(
        "lag", help="per partition: the topic's end offset (landing or broker), bronze's, lag"
    )
    sl.add_argument("--topic", type=_topic_option)
    sl.add_argument("--format", choices=("table", "json"), default="table")
    sq = sub.add_parser("dq", help="data quality: latest results and trends per table (ledger)")
    sq.add_argument("--table", help="one table: topic, stream or gold table name")
    sq.add_argument("--last", type=int, default=10, help="validations per table in the trend")
    sq.add_argument("--format", choices=("table", "json"), default="table")
    sub.add_parser("report", help="rebuild the Data Docs (HTML) from the saved validations")
    sk = sub.add_parser(
        "spark",
        help="the long-lived Spark server (Spark Connect) that jobs run on: start, run (in the "
        "foreground), stop, status",
    )
    sk.add_argument(
        "action", choices=("start", "run", "stop", "status"), nargs="?", default="status"
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
    sa = sub.add_parser("airflow", help="run the airflow CLI with the lakehouse's environment")
    sa.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env(args.home, args.contracts)
        if args.command == "airflow":
            return run_airflow(settings, args.args)
        if args.command == "spark":
            from lakehouse.runtime import server

            return server.main(settings, args.action)
        if args.command == "postgres":
            from lakehouse.runtime import postgres

            return postgres.main(settings, args.action)
        if args.command == "kafka":
            from lakehouse.runtime import broker

            return broker.main(settings, args.action)
        if args.command == "s3":
            from lakehouse.runtime import s3server

            return s3server.main(settings, args.action)
        catalog = Catalog.load(settings.contracts_dir)
        if args.command == "produce":
            return produce(
                settings, catalog.topic(args.topic), sys.stdin, sys.stderr, args.value_schema_id
            )
        if args.command == "create-topic":
            return create_topic(settings, catalog.topic(args.topic), sys.stderr)
        if args.command == "run":
            asked = {"dry_run": args.dry_run, **{k: getattr(args, k) for k in RUN_REQUEST_FLAGS}}
            return run_pipeline(
                settings, catalog, args.topic, cast(Layer | None, args.layer), asked
            )
        if args.command == "show":
            return show(
                settings,
                catalog,
                args.table,
                args.format,
                args.version,
                args.as_of,
                args.at_event_time,
            )
        if args.command == "refresh":
            return refresh(settings, catalog, args.table, args.from_version)
        if args.command == "restore":
            return restore(settings, catalog, args.table, args.to)
        if args.command == "changes":
            return changes(settings, catalog, args.table, args.from_version, args.format)
        if args.command == "maintain":
            from lakehouse.pipeline.runner import maintain_topics, maintained_tables

            topics = [args.topic] if args.topic else []
            # An unknown topic is refused, and a lakehouse without tables done, before Spark
            # starts.
            if not maintained_tables(settings, catalog, topics=topics, ledger=args.ledger):
                print("no tables to maintain")
                return 0
            maintain_topics(
                _spark(settings, "lakehouse-maintain"),
                settings,
                catalog,
                topics=topics,
                retention_hours=args.retention_hours,
                compact=not args.no_compact,
                dry_run=args.dry_run,
                ledger=args.ledger,
            )
            return 0
        if args.command == "sample":
            return produce_sample(
                settings, catalog, sys.stderr, args.topic, args.records, args.value_bytes, args.seed
            )
        if args.command == "schemas":
            return schemas(settings, catalog, args.topic, args.check)
        if args.command == "lag":
            return lag(settings, catalog, args.topic, args.format)
        if args.command == "dq":
            return data_quality(settings, args.table, args.last, args.format)
        if args.command == "report":
            from lakehouse.quality.reports import build_data_docs

            print(f"Data Docs: {build_data_docs(settings, catalog)}")
            return 0
    except LakehouseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


if __name__ == "__main__":
    raise SystemExit(main())
