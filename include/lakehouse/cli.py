"""``lakehouse``: the command line, in the habits of kafka-console-producer and ksql.

Every command is ``lakehouse COMMAND ...`` (``lakehouse --help`` lists them, ``lakehouse
COMMAND --help`` gives one's options): ``produce``, ``create-topic`` and ``sample`` write
records; ``run`` runs a micro-batch without Airflow; ``tables``, ``show``, ``changes``, ``lag``,
``dq``, ``report``, ``schemas`` and ``lineage`` read; ``refresh``, ``restore`` and ``maintain`` rebuild and
maintain tables; ``spark``, ``postgres``, ``kafka``, ``registry`` and ``s3`` run the local servers;
``catalog`` keeps the metastore's names; ``airflow`` is Airflow's CLI in the lakehouse's
environment.

Tables are named as :mod:`lakehouse.pipeline.lake` says. An option that takes a value is given
once, except ``--topic`` and ``--layer`` where several make sense (and ``run --full-refresh``).
The CLI only parses, dispatches (:data:`COMMANDS`) and prints; the work is the package's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import LakehouseError
from lakehouse.pipeline import lineage, reads
from lakehouse.pipeline.request import flag_options
from lakehouse.runtime import arguments
from lakehouse.runtime.config import LAYERS, Layer, Settings
from lakehouse.storage.maintenance import DEFAULT_RETENTION_HOURS
from lakehouse.topics import produce


def _several(values: Sequence[str] | None) -> list[str]:
    """An appended option's values, each once, in the order given (none: the option left out)."""
    return list(dict.fromkeys(values or []))


def _several_topics(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topic",
        type=arguments.topic_name,
        action="append",
        metavar="TOPIC",
        help="a topic (repeatable; default: every topic)",
    )


def _several_layers(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--layer", choices=LAYERS, action="append", help=text)


def build_parser() -> argparse.ArgumentParser:
    p = arguments.Parser(prog="lakehouse", description="Streams and tables on a Delta lakehouse.")
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
    for option in flag_options():  # a triggered run's Params, as flags of the same names
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
            when.add_argument(
                "--as-of-event-time",
                help="history tables: each key's version valid at this event time "
                "(or sequence value)",
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
        "--topic", type=arguments.topic_name, help="one topic (default: every shipped sample topic)"
    )
    ss.add_argument(
        "--records",
        type=arguments.count(1),
        help="generate this many random records (default topic: user-locations)",
    )
    ss.add_argument(
        "--value-bytes", type=arguments.count(0), default=0, help="pad values to about this size"
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
    sg = sub.add_parser(
        "lineage",
        help="where tables come from and what reads them (topics, bronze, silver, gold, the dbt "
        "models), each edge with the DAG task that moves data along it; no TABLE: every edge",
    )
    sg.add_argument("table", nargs="?", help="a topic, table, stream or dbt model")
    way = sg.add_mutually_exclusive_group()
    way.add_argument("--upstream", action="store_true", help="only what TABLE is made from")
    way.add_argument("--downstream", action="store_true", help="only what is made from TABLE")
    sg.add_argument("--format", choices=("table", "json"), default="table")
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
    for name, what in (
        ("postgres", "the lakehouse's PostgreSQL (Airflow's metadata database)"),
        ("kafka", "the lakehouse's local Kafka broker (one KRaft node on 127.0.0.1)"),
        ("registry", "the lakehouse's schema registry (Apicurio Registry, Confluent's API)"),
        ("s3", "a local S3 API (moto's server on 127.0.0.1, in memory)"),
    ):
        service = sub.add_parser(name, help=f"{what}: start, stop, status")
        service.add_argument(
            "action", choices=("start", "stop", "status"), nargs="?", default="status"
        )
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
        return loaded.for_command(self.command, self.topics, self.command in EVERY_TOPIC)


Handler = Callable[[argparse.Namespace, _Context], int]


def _layers(values: Sequence[str] | None) -> tuple[Layer, ...]:
    """Several ``--layer``s, in pipeline order (none: the option left out)."""
    return tuple(layer for layer in LAYERS if layer in (values or []))


def _run(args: argparse.Namespace, ctx: _Context) -> int:
    from lakehouse.pipeline.runner import run_command

    asked = {o.name: getattr(args, o.name) for o in flag_options()}
    return run_command(ctx.settings, ctx.catalog, _several(args.topic), _layers(args.layer), asked)


def _maintain(args: argparse.Namespace, ctx: _Context) -> int:
    from lakehouse.pipeline.runner import maintain_command

    return maintain_command(
        ctx.settings,
        ctx.catalog,
        _several(args.topic),
        retention_hours=args.retention_hours,
        compact=not args.no_compact,
        dry_run=args.dry_run,
        ledger=args.ledger,
    )


def _report(args: argparse.Namespace, ctx: _Context) -> int:
    from lakehouse.quality.reports import build_data_docs

    print(f"Data Docs: {build_data_docs(ctx.settings, ctx.catalog)}")
    return 0


def _module(
    module: str, function: str, *args: Callable[[argparse.Namespace], object], catalog: bool = False
) -> Handler:
    """A command whose body is ``function`` of ``lakehouse.<module>``, called with the settings
    (and the catalog), then each of ``args`` applied to the parsed arguments."""

    def handle(a: argparse.Namespace, ctx: _Context) -> int:
        body = getattr(importlib.import_module(f"lakehouse.{module}"), function)
        first = (ctx.settings, ctx.catalog) if catalog else (ctx.settings,)
        return int(body(*first, *(arg(a) for arg in args)))

    return handle


def _pick(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names}


# Every command of build_parser(), by name: what it runs.
COMMANDS: dict[str, Handler] = {
    "produce": lambda a, c: produce.produce(
        c.settings,
        c.catalog.topic(a.topic),
        sys.stdin,
        sys.stderr,
        a.value_schema_id,
        allow_undeclared=a.allow_undeclared_fields,
    ),
    "create-topic": lambda a, c: produce.create_topic(
        c.settings, c.catalog.topic(a.topic), sys.stderr
    ),
    "run": _run,
    "show": lambda a, c: reads.show(
        c.settings, c.catalog, a.table, a.format, **_pick(a, *reads.SHOW_WHEN)
    ),
    "changes": lambda a, c: reads.changes(c.settings, c.catalog, a.table, a.from_version, a.format),
    "tables": lambda a, c: reads.tables(c.settings, c.catalog, _several(a.topic), a.format),
    "refresh": lambda a, c: reads.refresh(c.settings, c.catalog, a.table, a.from_version),
    "restore": lambda a, c: reads.restore(c.settings, c.catalog, a.table, a.to),
    "maintain": _maintain,
    "sample": lambda a, c: produce.produce_sample(
        c.settings, c.catalog, sys.stderr, a.topic, a.records, a.value_bytes, a.seed
    ),
    "schemas": lambda a, c: reads.schemas(c.settings, c.catalog, _several(a.topic), a.check),
    "lag": lambda a, c: reads.lag(
        c.settings, c.catalog, _several(a.topic), a.format, _layers(a.layer) or ("bronze",)
    ),
    "dq": lambda a, c: reads.data_quality(c.settings, a.table, a.last, a.format, a.days),
    "report": _report,
    "lineage": lambda a, c: lineage.print_lineage(
        c.catalog,
        a.table,
        "upstream" if a.upstream else "downstream" if a.downstream else "both",
        a.format,
    ),
    "spark": _module("runtime.server", "main", lambda a: a.action, lambda a: a.only),
    "postgres": _module("runtime.postgres", "main", lambda a: a.action),
    "kafka": _module("runtime.broker", "main", lambda a: a.action),
    "registry": _module("runtime.registry", "main", lambda a: a.action),
    "s3": _module("runtime.s3server", "main", lambda a: a.action),
    "catalog": _module(
        "pipeline.names", "catalog_command", lambda a: a.action, lambda a: a.name, catalog=True
    ),
    "airflow": _module("orchestration.standalone", "airflow_command", lambda a: a.args),
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
