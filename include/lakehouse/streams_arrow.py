"""Silver's Arrow path: clean batches decoded in Python, without the JVM.

Spark's ``from_json`` (see :mod:`lakehouse.streams`) decodes anything and explains every record
that does not fit, but each row crosses from the JVM to Python to be written: most of a big
silver build went there. Most batches are clean, though, and for those pyarrow's JSON reader
(strict: a type that does not match, a repeated name, an invalid surrogate or byte is an error,
never a silent coercion) gives the same typed rows directly from the bronze files.

The rule is all or nothing, per batch: this path either accepts every record of the batch or
says why it cannot (:class:`Unclean`), and the caller then decodes the whole batch the careful
way, which quarantines the bad records with their reasons. Values are accepted only where both
decoders are known to agree (tests compare them record by record); anything else, from a
number in a string field to a blank before the brace, a NaN, a duplicate field or a timestamp
without its zone, counts as unclean. Being wrong here costs speed, never data.

Avro values and keys go through the decoder Spark's own path runs in its Python workers
(:class:`lakehouse.avro.WireDecoder`): the same bytes give the same rows; here a record it cannot
decode makes the batch unclean instead of getting a reason.

Pure Arrow; imports neither deltalake nor pyspark, so it runs in Spark's forked Python workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from lakehouse.contracts import Contract

TOMBSTONE = "tombstone"
EVENT_TIME = "event_time"
BRONZE_COLUMNS = ["key", "value", "partition", "offset", "timestamp"]
# Rows decoded at a time: a bronze file can hold millions; the writer buffers row groups.
CHUNK_ROWS = 65_536
_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    # Read as text, then parsed here: the reader's own timestamp parsing is looser than Spark's.
    "timestamp": pa.string(),
}
# The one timestamp form accepted here: ISO-8601 with a 'T', up to microseconds and an explicit
# zone. Spark reads it the same whatever the session time zone; other forms go the careful way.
_ISO_INSTANT = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$"
# A long event time is epoch milliseconds; in microseconds (a timestamp) it must fit an int64.
MAX_EVENT_MILLIS = (2**63 - 1) // 1000


class Unclean(Exception):
    """A record of the batch is not one this path decodes exactly as Spark would."""


def spec(contract: Contract) -> dict[str, Any] | None:
    """What the tasks need of a contract (JSON-able), or None when this path does not decode
    its formats: JSON, text or Avro values with text or Avro keys (JSON keys go to Spark)."""
    if contract.key_format == "json":
        return None
    event = None
    if contract.event_time is not None:
        event = [contract.event_time, contract.field(contract.event_time).type]
    out: dict[str, Any] = {
        "key_name": contract.key_name,
        "value_format": contract.value_format,
        "fields": [[f.name, f.type, f.nullable] for f in contract.fields],
        "event_time": event,
        # A field called event_time is the event time itself: no separate column then.
        "event_time_column": contract.event_time != EVENT_TIME,
    }
    # Avro goes through the very decoder Spark's path runs in its Python workers (see
    # lakehouse.avro): the schemas it needs, by id, and the latest (the reader's).
    if contract.value_format == "avro":
        out["value_avro"] = _avro_schemas(contract.value_schemas)
    if contract.key_format == "avro":
        out["key_avro"] = _avro_schemas(contract.key_schemas)
    return out


def _avro_schemas(versions: Sequence[Any]) -> dict[str, Any]:
    return {"writers": [[v.id, v.schema] for v in versions], "reader": versions[-1].schema}


# Avro decoders by their spec: a task decodes many chunks with the same schemas.
_WIRE_DECODERS: dict[str, Any] = {}


def _wire_decoder(schemas: Mapping[str, Any], fields: Sequence[Sequence[Any]]) -> Any:
    import json

    from lakehouse.avro import WireDecoder
    from lakehouse.contracts import Field

    cache_key = json.dumps([schemas, fields], sort_keys=True)
    decoder = _WIRE_DECODERS.get(cache_key)
    if decoder is None:
        writers = {int(i): schema for i, schema in schemas["writers"]}
        typed = [Field(name, kind, nullable) for name, kind, nullable in fields]
        decoder = WireDecoder(writers, schemas["reader"], typed)
        _WIRE_DECODERS[cache_key] = decoder
    return decoder


def _no_reason(reasons: pa.Array) -> None:
    """Avro decoding gives a reason for each record it could not decode: any is unclean."""
    if reasons.null_count != len(reasons):
        raise Unclean(str(reasons.drop_null()[0].as_py()))


def _text(arr: pa.Array, what: str) -> pa.Array:
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        raise Unclean(f"a {what} is not valid UTF-8") from None


def _all(mask: pa.Array) -> bool:
    return len(mask) == 0 or bool(pc.all(mask).as_py())


def _any(mask: pa.Array) -> bool:
    return len(mask) > 0 and bool(pc.any(mask).as_py())


def _parse_objects(text: pa.Array, fields: Sequence[Sequence[Any]]) -> pa.Table:
    """One JSON object per value, typed strictly by the fields; unknown names are ignored."""
    schema = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind, _ in fields])
    if len(text) == 0:  # the reader refuses empty input
        return schema.empty_table()
    if not (_all(pc.starts_with(text, "{")) and _all(pc.ends_with(text, "}"))):
        raise Unclean("a value is not a bare JSON object (blank around it, or not an object)")
    # One value per line: each value and a '\n' after it, in one buffer (Arrow's join writes
    # them one after another). No document can run on from one line into the next: it would
    # have to go on after a closing '}' (where JSON allows no '{') or inside a string (where
    # JSON allows no raw line break). So N lines giving N rows means one row per value.
    lines = pc.binary_join_element_wise(text, "", "\n")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[
        lines.offset : lines.offset + len(lines) + 1
    ]
    data = lines.buffers()[2][int(offsets[0]) : int(offsets[-1])]
    view = np.frombuffer(data, dtype=np.uint8)
    if np.count_nonzero(view == 10) != len(text) or (view == 13).any():
        raise Unclean("a value spans several lines")
    try:
        parsed = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data))),
            parse_options=pj.ParseOptions(
                explicit_schema=schema,
                unexpected_field_behavior="ignore",
                newlines_in_values=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise Unclean(f"a value does not decode strictly: {str(exc)[:200]}") from None
    if parsed.num_rows != len(text):
        raise Unclean("a value holds more than one JSON document")
    return parsed


def _typed(column: pa.ChunkedArray | pa.Array, kind: str, name: str) -> pa.Array:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if kind == "double":
        values = arr.drop_null()
        if len(values) and not _all(pc.is_finite(values)):
            raise Unclean(f"field {name!r} holds NaN or an infinity")
    if kind == "timestamp":
        present = arr.drop_null()
        if not _all(pc.match_substring_regex(present, _ISO_INSTANT)):
            raise Unclean(f"field {name!r} has a timestamp in a form not decoded here")
        try:
            return arr.cast(pa.timestamp("us", tz="UTC"))
        except pa.ArrowInvalid:
            raise Unclean(f"field {name!r} has an invalid timestamp") from None
    return arr


def _spread(values: pa.Array, tombstone: np.ndarray) -> pa.Array:
    """Values of the non-tombstone rows back in place among all rows, null at tombstones."""
    if not tombstone.any():
        return values
    index = np.cumsum(~tombstone) - 1
    return values.take(pa.array(index, mask=tombstone))


def decode(rows: pa.Table, spec: Mapping[str, Any]) -> pa.Table:
    """Bronze rows (``BRONZE_COLUMNS``) -> silver rows, or :class:`Unclean`."""
    value = rows.column("value").combine_chunks()
    tombstone = value.is_null().to_numpy(zero_copy_only=False)
    fields = spec["fields"]
    columns: dict[str, pa.Array] = {}
    if spec["value_format"] == "avro":
        decoded, reasons = _wire_decoder(spec["value_avro"], fields).decode(value)
        _no_reason(reasons)
        # A tombstone is a null row: flattening gives its fields nulls.
        for (name, _, nullable), arr in zip(fields, decoded.flatten(), strict=True):
            if not nullable and arr.filter(pa.array(~tombstone)).null_count:
                raise Unclean(f"required field {name!r} is missing or null")
            columns[name] = arr
        return _assemble(rows, spec, columns, tombstone)
    present = value.filter(pa.array(~tombstone)) if tombstone.any() else value
    text = _text(present, "value")
    if spec["value_format"] == "json":
        parsed = _parse_objects(text, fields)
        for name, kind, nullable in fields:
            arr = _typed(parsed.column(name), kind, name)
            if not nullable and arr.null_count:
                raise Unclean(f"required field {name!r} is missing or null")
            columns[name] = _spread(arr, tombstone)
    else:
        columns[fields[0][0]] = _spread(text, tombstone)
    return _assemble(rows, spec, columns, tombstone)


def _assemble(
    rows: pa.Table, spec: Mapping[str, Any], columns: dict[str, pa.Array], tombstone: np.ndarray
) -> pa.Table:
    """The silver rows: the key, the value's fields, then the stream's own columns."""
    raw_key = rows.column("key").combine_chunks()
    if "key_avro" in spec:
        key, reasons = _wire_decoder(spec["key_avro"], ()).decode_key(raw_key)
        _no_reason(reasons)
    else:
        key = _text(raw_key, "key")
    timestamp = rows.column("timestamp")
    out: dict[str, Any] = {spec["key_name"]: key, **columns}
    out[TOMBSTONE] = pa.array(tombstone)
    out["partition"] = rows.column("partition")
    out["offset"] = rows.column("offset")
    out["timestamp"] = timestamp
    if spec["event_time_column"]:
        out[EVENT_TIME] = _event_time(spec, columns, timestamp, tombstone)
    return pa.table(out)


def _event_time(
    spec: Mapping[str, Any],
    columns: Mapping[str, pa.Array],
    timestamp: pa.ChunkedArray,
    tombstone: np.ndarray,
) -> pa.ChunkedArray | pa.Array:
    """The declared event-time field, else (absent, null, or a tombstone) the record timestamp."""
    if spec["event_time"] is None:
        return timestamp
    name, kind = spec["event_time"]
    value = columns[name]
    if kind == "long":
        millis = value.drop_null()
        in_range = pc.and_(
            pc.greater_equal(millis, -MAX_EVENT_MILLIS), pc.less_equal(millis, MAX_EVENT_MILLIS)
        )
        if not _all(in_range):
            raise Unclean(f"event-time field {name!r} is out of range")
        value = pc.multiply(value, 1000).cast(pa.timestamp("us", tz="UTC"))
    stamp = timestamp.combine_chunks().cast(pa.timestamp("us", tz="UTC"))
    return pc.if_else(pa.array(tombstone), stamp, pc.coalesce(value, stamp))


def read_bronze(path: str) -> Iterator[pa.Table]:
    """A bronze data file's rows, a chunk at a time."""
    file = pq.ParquetFile(path)
    for batch in file.iter_batches(batch_size=CHUNK_ROWS, columns=BRONZE_COLUMNS):
        yield pa.Table.from_batches([batch])


def task(item: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> Iterator[pa.Table]:
    """Decode one bronze file (a work item of :func:`lakehouse.storage.tasks.stage_with_tasks`);
    emit its counts, or why it is unclean. Runs in a Spark task or in the driver."""
    rows = tombstones = 0
    try:
        for chunk in read_bronze(item["path"]):
            out = decode(chunk, item["spec"])
            rows += out.num_rows
            tombstones += int(pc.sum(out.column(TOMBSTONE)).as_py() or 0)
            yield out
    except Unclean as exc:
        emit({"path": item["path"], "unclean": str(exc)})
        return
    emit({"path": item["path"], "rows": rows, "tombstones": tombstones})
