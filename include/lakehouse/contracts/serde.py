"""Serializers: producer input (JSON) to a topic's wire format, as its contract declares it.

Like Confluent's console producers, ``lakehouse produce`` takes keys and values as JSON and
writes them in the topic's format: ``string`` as UTF-8 text, ``json`` as compact JSON text,
``avro`` in the Confluent wire format with the latest schema's id (or one chosen explicitly,
to play an older producer). A value that does not fit the schema is refused here, with the
reason, before anything is written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from lakehouse.contracts.fields import parse_timestamp
from lakehouse.contracts.model import Contract, SchemaVersion
from lakehouse.errors import BadRecordError


def json_text(value: Any, *, ensure_ascii: bool = True, spaced: bool = False) -> str:
    """JSON text of ``value``, compact (or ``spaced`` as json.dumps writes by default), a
    Decimal written as the exact number it is, in plain notation (Python's json writes no
    Decimal, and a float would round it)."""
    comma, colon = (", ", ": ") if spaced else (",", ":")

    def text(v: Any) -> str:
        if isinstance(v, Decimal):
            return format(v, "f")
        if isinstance(v, dict):
            items = (
                f"{json.dumps(str(k), ensure_ascii=ensure_ascii)}{colon}{text(x)}"
                for k, x in v.items()
            )
            return "{" + comma.join(items) + "}"
        if isinstance(v, list | tuple):
            return "[" + comma.join(text(x) for x in v) + "]"
        return json.dumps(v, ensure_ascii=ensure_ascii)

    return text(value)


def _pick(versions: tuple[SchemaVersion, ...], schema_id: int | None, what: str) -> SchemaVersion:
    if schema_id is None:
        return versions[-1]
    for v in versions:
        if v.id == schema_id:
            return v
    known = ", ".join(str(v.id) for v in versions)
    raise BadRecordError(what, f"no schema id {schema_id} in the contract (known: {known})")


class Serializer:
    """Encodes keys and values for one topic."""

    def __init__(self, contract: Contract, value_schema_id: int | None = None) -> None:
        from lakehouse.contracts import avro

        self.contract = contract
        self._value = None
        self._key = None
        if contract.value_format == "avro":
            version = _pick(contract.value_schemas, value_schema_id, f"topic {contract.topic}")
            self._value = (version.id, avro.parse(version.schema, contract.source, "value"))
            self._timestamps = {f.name for f in contract.fields if f.type == "timestamp"}
        elif value_schema_id is not None:
            raise BadRecordError(
                f"topic {contract.topic}", "a schema id applies to Avro values only"
            )
        if contract.key_format == "avro":
            latest = contract.key_schemas[-1]
            self._key = (latest.id, avro.parse(latest.schema, contract.source, "key"))

    def key(self, key: Any, origin: str) -> bytes | None:
        from lakehouse.contracts import avro

        if key is None:
            return None
        fmt = self.contract.key_format
        if fmt == "string":
            if not isinstance(key, str):
                raise BadRecordError(origin, "key must be a string or null")
            return key.encode("utf-8")
        if fmt == "json":
            return json.dumps(key, separators=(",", ":")).encode("utf-8")
        assert self._key is not None
        try:
            return avro.encode(self._key[0], self._key[1], key)
        except (ValueError, TypeError) as exc:
            raise BadRecordError(origin, f"key does not fit its Avro schema: {exc}") from None

    def value(self, value: Any, origin: str) -> bytes | None:
        from lakehouse.contracts import avro

        if value is None:
            return None  # a tombstone
        fmt = self.contract.value_format
        if fmt == "json":
            return json.dumps(value, separators=(",", ":")).encode("utf-8")
        if fmt == "string":
            if not isinstance(value, str):
                raise BadRecordError(origin, "value must be a string or null for this topic")
            return value.encode("utf-8")
        assert self._value is not None
        if not isinstance(value, dict):
            raise BadRecordError(origin, "value must be a JSON object (an Avro record) or null")
        record = {
            k: _timestamp(v, origin, k) if k in self._timestamps else v for k, v in value.items()
        }
        try:
            return avro.encode(self._value[0], self._value[1], record)
        except (ValueError, TypeError, KeyError) as exc:
            raise BadRecordError(
                origin, f"value does not fit Avro schema id {self._value[0]}: {exc}"
            ) from None


def _timestamp(value: Any, origin: str, name: str) -> Any:
    """ISO-8601 text or epoch milliseconds (as the producer reads record timestamps), for an
    Avro timestamp field; datetimes pass as they are."""
    if value is None or isinstance(value, datetime):
        return value
    ms = parse_timestamp(value, f"{origin}: field {name!r}")
    assert ms is not None
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
