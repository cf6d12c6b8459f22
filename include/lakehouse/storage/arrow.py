"""Arrow type plumbing between delta-rs and Spark (pyarrow only: safe on executors)."""

from __future__ import annotations

import pyarrow as pa


def plain_type(t: pa.DataType) -> pa.DataType:
    """delta-rs hands out view, large and unsigned types that Spark's Arrow bridge refuses."""
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        return pa.int64()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        item = t.value_field
        return pa.list_(pa.field(item.name, plain_type(item.type), item.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, plain_type(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(plain_type(t.key_type), plain_type(t.item_type))
    return t


def plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, plain_type(f.type), f.nullable) for f in schema])


def normalize_table(table: pa.Table) -> pa.Table:
    """Plain types, with the change feed's commit time in UTC."""
    fields = []
    for f in table.schema:
        t = plain_type(f.type)
        if f.name == "_commit_timestamp" and pa.types.is_timestamp(t) and t.tz is None:
            t = pa.timestamp(t.unit, tz="UTC")
        fields.append(pa.field(f.name, t, f.nullable))
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)
