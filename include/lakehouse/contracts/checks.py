"""The checks across a contract: rules that no one key of the document decides alone (names
that collide, fields a table or an expectation names, Avro versions that must follow each other,
a join's other side), each problem a ContractError naming the file, the path inside it and what
is wrong. :mod:`~lakehouse.contracts.catalog` runs them as it reads a contract, and across the
contracts of a folder.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from lakehouse.contracts.model import (
    BRONZE_COLUMNS,
    HISTORY_COLUMNS,
    NUMERIC_TYPES,
    SQL_LITERAL_WORDS,
    STREAM_METADATA_COLUMNS,
    SUBTRACTABLE,
    WINDOW_LATE_COLUMNS,
    Contract,
    Expectation,
    TableSpec,
)
from lakehouse.errors import ContractError
from lakehouse.runtime.config import IDENTIFIER, IDENTIFIER_RULE


def check_contract(c: Contract) -> None:
    """Rules across the document: names must not collide, fields must exist and fit."""
    if c.topic in {".", ".."}:
        raise ContractError(c.file, "topic", "'.' and '..' are not legal topic names")
    columns = list(c.columns)
    for i, name in enumerate(columns):
        where = "key.name" if i == 0 else f"value.fields[{i - 1}].name"
        if c.value_format == "string" and i == 1:
            where = "value.name"
        elif c.value_format == "avro" and i > 0:
            latest = (
                "value.reader"
                if c.value_registry and not c.value_registry.listed
                else f"value.schemas[{len(c.value_schemas) - 1}]"
            )
            where = f"{latest}.fields[{i - 1}].name"
        if not IDENTIFIER.fullmatch(name):  # Avro field names reach here unchecked
            raise ContractError(c.file, where, f"invalid column name {name!r}: {IDENTIFIER_RULE}")
        if name in SQL_LITERAL_WORDS:
            raise ContractError(c.file, where, _literal_word(name))
        reserved = name in STREAM_METADATA_COLUMNS
        if name == "event_time" and c.event_time == "event_time":
            reserved = False  # the event-time field may itself be called event_time
        if reserved:
            raise ContractError(
                c.file,
                where,
                f"{name!r} is reserved for stream metadata {STREAM_METADATA_COLUMNS}",
            )
        if name in columns[:i]:
            raise ContractError(c.file, where, f"column {name!r} is declared twice")
    if c.event_time is not None:
        try:
            et = c.field(c.event_time)
        except KeyError:
            raise ContractError(
                c.file, "event_time", f"no value field named {c.event_time!r}"
            ) from None
        allowed = ("timestamp",) if et.name == "event_time" else ("timestamp", "long")
        if et.type not in allowed:
            raise ContractError(
                c.file,
                "event_time",
                f"field {et.name!r} is {et.type_name}; event time must be "
                + " or ".join(f"a {t}" for t in allowed)
                + (" (epoch milliseconds)" if "long" in allowed else ""),
            )
    if c.value_format == "avro" or c.key_format == "avro":
        _check_schema_chain(c)
    _check_tables(c)
    _check_expectations(c)


def _literal_word(name: str) -> str:
    return (
        f"{name!r} cannot name a column: delta-rs's SQL reads s.{name} as a value, so the "
        "table's merge predicates would fail"
    )


def _check_schema_chain(c: Contract) -> None:
    """The listed Avro versions must follow each other under the topic's compatibility mode."""
    from lakehouse.contracts import avro

    for part, versions in (("key", c.key_schemas), ("value", c.value_schemas)):
        for i in range(1, len(versions)):
            try:
                problems = avro.check_compatibility(
                    c.compatibility, versions[i].schema, [v.schema for v in versions[:i]]
                )
            except ValueError as exc:  # Apache's parser is stricter than fastavro's
                raise ContractError(c.file, f"{part}.schemas[{i}]", str(exc)) from None
            if problems:
                raise ContractError(
                    c.file,
                    f"{part}.schemas[{i}]",
                    f"schema id {versions[i].id} breaks {c.compatibility} compatibility: "
                    + "; ".join(problems),
                )


def _check_tables(c: Contract) -> None:
    seen: set[str] = set()
    for ti, t in enumerate(c.tables):
        at = f"tables[{ti}]"
        if t.name in seen:
            raise ContractError(c.file, f"{at}.name", f"table {t.name!r} declared twice")
        if t.changelog is not None:
            _check_changelog_input(c, t, seen, at)
        seen.add(t.name)
        stream = c.input(t)
        values = [f.name for f in stream.fields]
        if t.group_by is not None and t.group_by not in values:
            raise ContractError(c.file, f"{at}.group_by", f"no value field named {t.group_by!r}")
        if t.group_by is not None and stream.field(t.group_by).type == "decimal":
            raise ContractError(
                c.file,
                f"{at}.group_by",
                f"cannot re-key by {t.group_by!r} of type {stream.field(t.group_by).type_name}: "
                "a key is a string, long, int, double, boolean or timestamp",
            )
        if t.window is not None:
            _check_window(c, t, at)
        if t.kind == "history":
            _check_history(c, t, at)
            continue
        if t.join is not None:
            if t.join.on is not None and t.join.on not in values:
                raise ContractError(
                    c.file, f"{at}.join.on_field", f"no value field named {t.join.on!r}"
                )
            for name in c.table_columns(t):
                if len(name) > 128:  # the prefix's pattern has no length limit
                    raise ContractError(
                        c.file,
                        f"{at}.join.prefix",
                        f"column {name!r} would be longer than 128 characters",
                    )
            continue
        if t.read_as == "table":
            for ai, a in enumerate(t.aggregations):
                if a.fn not in SUBTRACTABLE:
                    raise ContractError(
                        c.file,
                        f"{at}.aggregations[{ai}].fn",
                        f"'{a.fn}' cannot aggregate a table: when a key's value changes the "
                        "old value must be taken back, and only "
                        + ", ".join(sorted(SUBTRACTABLE))
                        + " can do that (as with Kafka Streams' KGroupedTable)",
                    )
        out_names: set[str] = set(c.table_key_columns(t))
        for ai, a in enumerate(t.aggregations):
            where = f"{at}.aggregations[{ai}]"
            if a.name in out_names or a.name.startswith("__"):
                raise ContractError(c.file, f"{where}.name", f"column {a.name!r} already exists")
            if a.name in SQL_LITERAL_WORDS:
                raise ContractError(c.file, f"{where}.name", _literal_word(a.name))
            out_names.add(a.name)
            if a.fn == "count" and a.field is None:
                continue
            if a.field is None:
                raise ContractError(c.file, where, f"'{a.fn}' needs a 'field' to aggregate")
            if a.field not in values:
                raise ContractError(c.file, f"{where}.field", f"no value field named {a.field!r}")
            f = stream.field(a.field)
            if a.fn in {"sum", "avg"} and f.type not in NUMERIC_TYPES:
                raise ContractError(
                    c.file, f"{where}.field", f"cannot {a.fn} {a.field!r} of type {f.type_name}"
                )


def _check_changelog_input(c: Contract, t: TableSpec, earlier: set[str], at: str) -> None:
    """A table read as a stream must be an earlier, plainly keyed table of the same contract."""
    name = t.changelog
    if name not in earlier:
        raise ContractError(
            c.file,
            f"{at}.changelog",
            f"no earlier table named {name!r} in this contract (a changelog source must be "
            "declared before the tables that read it)",
        )
    src = c.table(name or "")
    if src.kind not in ("latest", "aggregate"):
        raise ContractError(
            c.file,
            f"{at}.changelog",
            f"{name!r} is a {src.kind} table; only latest and plain aggregate tables can be read "
            "as a stream",
        )
    if any(a.fn == "collect" for a in src.aggregations):
        raise ContractError(
            c.file,
            f"{at}.changelog",
            f"{name!r} has a 'collect' column (a list), which a stream cannot carry",
        )


def claim_names(c: Contract, owners: dict[str, str]) -> None:
    """Record the names ``c`` takes (its stream, its tables) in ``owners``; a name another
    contract took first is an error of ``c``."""
    for kind, name in [("stream", c.stream), *(("table", t.name) for t in c.tables)]:
        if name in owners:
            raise ContractError(c.file, kind, f"name {name!r} is already used by {owners[name]}")
    owners.update({name: c.file for name in [c.stream, *(t.name for t in c.tables)]})


def check_join(topics: Mapping[str, Contract], c: Contract, t: TableSpec, at: str) -> None:
    """A join's other side (looked up in ``topics``, by topic) must exist, have the fields
    taken, and a key of the matching type."""
    j = t.join
    assert j is not None
    other = topics.get(j.other)
    if other is None:
        raise ContractError(
            c.file, f"{at}.with", f"no contract for topic {j.other!r} (known: {list(topics)})"
        )
    if j.table is not None:
        versions = next((s for s in other.tables if s.name == j.table), None)
        if versions is None or versions.kind != "history":
            raise ContractError(
                c.file,
                f"{at}.table",
                f"topic {j.other!r} has no history table named {j.table!r}"
                + (f" ({j.table!r} is a {versions.kind} table)" if versions else ""),
            )
        if versions.sequence_by is not None and other.field(versions.sequence_by).type == "long":
            raise ContractError(
                c.file,
                f"{at}.table",
                f"{j.table!r} orders its versions by {versions.sequence_by!r}, a long, which an "
                "event time cannot be compared with: join a history table by event time or by a "
                "timestamp sequence_by",
            )
    known = [f.name for f in other.fields]
    for fi, name in enumerate(j.fields):
        if name not in known:
            raise ContractError(
                c.file, f"{at}.fields[{fi}]", f"topic {j.other!r} has no value field {name!r}"
            )
    mine = c.key_type if j.on is None else c.field(j.on).type
    if mine != other.key_type:
        raise ContractError(
            c.file,
            f"{at}.on_field" if j.on else at,
            f"{j.on or c.key_name!r} is {mine} but topic {j.other!r} is keyed by {other.key_type}",
        )
    if j.type == "stream-stream" and j.how == "left":
        raise ContractError(
            c.file,
            f"{at}.how",
            "a stream-stream join is inner only: Kafka emits a left join's unmatched events once "
            "their window has closed, which needs a grace period not declared here",
        )
    if j.type == "stream-stream" and not j.prefix:
        raise ContractError(
            c.file,
            f"{at}.prefix",
            "a stream-stream join needs a prefix: both sides have partition, offset and event_time",
        )
    columns = c.table_columns(t)
    for name in columns:
        if columns.count(name) > 1:
            raise ContractError(
                c.file,
                f"{at}.fields",
                f"column {name!r} would appear twice in {t.name!r}; set a 'prefix' for the "
                "columns taken from the other side",
            )


def _check_history(c: Contract, t: TableSpec, at: str) -> None:
    """A history table's ordering field and tracked fields are the stream's, and its version
    columns are free."""
    stream = c.input(t)
    values = {f.name: f for f in stream.fields}
    if t.sequence_by is not None:
        f = values.get(t.sequence_by)
        if f is None:
            raise ContractError(
                c.file, f"{at}.sequence_by", f"no value field named {t.sequence_by!r}"
            )
        if f.type not in ("timestamp", "long"):
            raise ContractError(
                c.file,
                f"{at}.sequence_by",
                f"{t.sequence_by!r} is of type {f.type_name}: versions are ordered by a timestamp "
                "or a long",
            )
    if t.retention_ms is not None and t.sequence_by and values[t.sequence_by].type == "long":
        raise ContractError(
            c.file,
            f"{at}.history_retention",
            f"a history retention is a duration, and {t.sequence_by!r} is a long: versions "
            "ordered by a long have no retention (every record is placed)",
        )
    for fi, name in enumerate(t.track):
        if name not in values:
            raise ContractError(c.file, f"{at}.track[{fi}]", f"no value field named {name!r}")
    taken = sorted(set(HISTORY_COLUMNS) & {*values, stream.key_name})
    if taken:
        raise ContractError(
            c.file,
            at,
            f"value field(s) {taken} would collide with the version columns "
            f"{list(HISTORY_COLUMNS)}",
        )


def _check_window(c: Contract, t: TableSpec, at: str) -> None:
    w = t.window
    assert w is not None
    if t.read_as != "stream":
        raise ContractError(
            c.file,
            f"{at}.window",
            "windows aggregate a stream; a table source cannot be windowed (as in Kafka Streams, "
            "where only KGroupedStream has windowedBy)",
        )
    if w.type == "hopping" and w.advance_ms > w.size_ms:
        raise ContractError(
            c.file,
            f"{at}.window.advance",
            "a hopping window cannot advance by more than its size",
        )
    taken = {*WINDOW_LATE_COLUMNS} & {f.name for f in c.input(t).fields}
    if taken:
        raise ContractError(
            c.file,
            f"{at}.window",
            f"value field(s) {sorted(taken)} would collide with the window and late-record "
            f"columns {list(WINDOW_LATE_COLUMNS)}",
        )


def _no_quarantine(e: Expectation) -> str | None:
    """Why an expectation cannot quarantine rows, if it cannot."""
    if e.layer == "bronze":
        return (
            "bronze is the topic itself and keeps every record: quarantine on silver, where "
            "values have types"
        )
    if e.layer == "gold":
        return "gold tables have no quarantine (a table row is an aggregate, not a record)"
    if e.expect in ("unique", "row_count_between"):
        return f"{e.expect} judges the batch, not a row, so it has no rows to quarantine"
    return None


def _check_expectations(c: Contract) -> None:
    """Each expectation must name a column of its layer (and, on gold, one of the tables)."""
    volume = c.quality.volume
    if volume is not None and volume.min_history > volume.history:
        raise ContractError(
            c.file,
            "quality.volume.min_history",
            f"{volume.min_history} is more than the {volume.history} batches of history kept: "
            "the check could never run",
        )
    index: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    for e in c.expectations:
        i = index.get(e.layer, 0)
        index[e.layer] = i + 1
        where = f"expectations.{e.layer}[{i}]"
        if (e.layer, e.name) in seen:
            raise ContractError(
                c.file, f"{where}.name", f"expectation {e.name!r} is declared twice"
            )
        seen.add((e.layer, e.name))
        if e.layer == "gold":
            if e.table is None:
                raise ContractError(c.file, where, "a gold expectation must name its 'table'")
            try:
                available = c.table_columns(c.table(e.table))
            except KeyError:
                raise ContractError(
                    c.file, f"{where}.table", f"no table named {e.table!r} in this contract"
                ) from None
        else:
            if e.table is not None:
                raise ContractError(c.file, f"{where}.table", "only gold expectations name a table")
            available = (
                BRONZE_COLUMNS
                if e.layer == "bronze"
                else (*c.columns, "partition", "offset", "timestamp", "event_time")
            )
        if e.column is not None and e.column not in available:
            raise ContractError(
                c.file,
                f"{where}.column",
                f"no column {e.column!r} in {e.layer} (columns: {', '.join(available)})",
            )
        if e.severity == "quarantine" and (why := _no_quarantine(e)):
            raise ContractError(c.file, f"{where}.severity", f"{why}: use warn or fail")
        lo, hi = e.param("min"), e.param("max")
        numbers = (lo, hi, *(e.param("values") or ()))
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise ContractError(
                c.file, where, "min, max and values must be finite numbers (not .nan or .inf)"
            )
        if lo is not None and hi is not None and lo > hi:
            raise ContractError(c.file, f"{where}.min", f"min {lo} is greater than max {hi}")
        if e.expect == "match_regex":
            try:
                re.compile(e.param("pattern"))
            except re.error as exc:
                raise ContractError(
                    c.file, f"{where}.pattern", f"not a valid regular expression: {exc}"
                ) from None
