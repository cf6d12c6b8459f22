"""What the command line prints of the lake (``lakehouse show``, ``changes``, ``tables``,
``lag``, ``dq``, ``schemas``) and the rebuilds it runs (``refresh``, ``restore``): tables
read by their names (:mod:`lakehouse.pipeline.lake`), rendered as a table or as JSON lines."""

from __future__ import annotations

import base64
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO

from lakehouse.contracts.catalog import Catalog
from lakehouse.contracts.model import Contract, TableSpec
from lakehouse.errors import LakehouseError
from lakehouse.pipeline import lake
from lakehouse.runtime import server
from lakehouse.runtime.config import Layer, Settings
from lakehouse.runtime.objectstore import location

if TYPE_CHECKING:
    import pyarrow as pa

# The ways ``show`` takes a table at another time than now (one at most), as its keywords.
SHOW_WHEN = ("version", "as_of", "at_event_time", "as_of_event_time")


def schemas(settings: Settings, catalog: Catalog, topics: Sequence[str], check: bool) -> int:
    """List each topic's (all when ``topics`` is empty) registered key/value schema versions;
    ``check``: would the current contracts be accepted (nothing is registered)?"""
    from lakehouse.contracts import confluent
    from lakehouse.streams.registry import SUBJECTS, SchemaRegistry

    registry = SchemaRegistry(settings)
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    breaks = 0
    for contract in contracts:
        for part in ("key", "value") if check else ():
            source = contract.key_registry if part == "key" else contract.value_registry
            if source is None:
                continue
            if source.listed and not confluent.registry_given(contract, settings, source):
                print(
                    f"{contract.topic} {part}: no schema registry given or running here; the "
                    "ids the contract lists are read"
                )
                continue
            said, broken = _against_the_registry(settings, contract, part)
            print(said)
            breaks += broken
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
    return 1 if breaks else 0


def _against_the_registry(
    settings: Settings, contract: Contract, part: str = "value"
) -> tuple[str, int]:
    """Whether the contract's reader of its value (an Avro reader schema, else its fields) or
    key (an Avro reader schema, else its type) reads every version of its registry subject
    (:func:`lakehouse.contracts.confluent.reader_problems`, :func:`~lakehouse.contracts.
    confluent.key_reader_problems`): the line to print, and how many versions it cannot read."""
    from lakehouse.contracts import confluent

    source = contract.key_registry if part == "key" else contract.value_registry
    assert source is not None
    looked_up = confluent.resolve(contract, settings)
    writers = looked_up.key_writers if part == "key" else looked_up.value_writers
    judge = confluent.key_reader_problems if part == "key" else confluent.reader_problems
    url = confluent.registry_url(contract, settings, source)
    where = f"{contract.topic} {part}: subject {source.subject!r} at {url}"
    if not writers:
        return f"{where}: no version registered yet", 0
    problems = [
        f"schema id {schema_id}: " + "; ".join(found)
        for schema_id, schema in writers.items()
        if (found := judge(contract, schema))
    ]
    ids = ", ".join(str(i) for i in writers)
    if not problems:
        return f"{where}: the reader reads every version (ids {ids})", 0
    return (
        f"{where}: the reader cannot read {len(problems)} of its versions (ids {ids}); "
        "their records would go to quarantine: " + " | ".join(problems),
        len(problems),
    )


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
    as_of_event_time: str | None = None,
) -> int:
    """A table's rows (any table of :mod:`lakehouse.pipeline.lake`), in its order; at a version
    or time, a gold table as of an event time (rebuilt by Spark), or a history table's
    versions valid at an event time (read from the table)."""
    from lakehouse.storage import read_arrow

    t = lake.resolve(settings, catalog, name)
    if as_of_event_time is not None:
        contract, spec = _gold(t)
        from lakehouse.tables import history, kind

        if kind.of(spec) is not history.KIND:
            raise LakehouseError(
                f"--as-of-event-time: {t.name} is a {spec.kind} table, which keeps no versions; "
                "it works on history tables (kind: history). --at-event-time rebuilds any gold "
                "table as of an event time"
            )
        bound: datetime | int
        if history.numbered(contract, spec):
            if not as_of_event_time.lstrip("-").isdigit():
                raise LakehouseError(
                    f"--as-of-event-time: {t.name}'s versions are numbered by "
                    f"{spec.sequence_by} (a long): give a whole number, not {as_of_event_time!r}"
                )
            bound = int(as_of_event_time)
        else:
            bound = _instant(as_of_event_time, "--as-of-event-time")
        table = history.valid_at(read_arrow(t.path), bound)
    elif at_event_time is not None:
        contract, spec = _gold(t)
        when = _instant(at_event_time, "--at-event-time")
        from lakehouse.tables.rebuild import at_event_time as rebuild_at

        spark = server.session(settings, "lakehouse-at-event-time")
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
    spark = server.session(settings, "lakehouse-refresh")
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
    spark = server.session(settings, "lakehouse-restore")
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
