"""Serializers: producer input (JSON) to a topic's wire format, as its contract declares it.

Like Confluent's console producers, ``lakehouse produce`` takes keys and values as JSON and
writes them in the topic's format: ``string`` as UTF-8 text, ``json`` as compact JSON text,
``avro`` in the Confluent wire format with the latest schema's id (or one chosen explicitly,
to play an older producer).

Every key and every field of a value is checked against its type first, for JSON and Avro
topics alike, and a value that does not fit is refused here, naming the field, what its type
takes and what was given, before anything is written: ``field 'amount': expected a long (a JSON
integer), got the string "12.50"``. What a type takes is what silver reads back exactly:

* ``string`` a JSON string; ``boolean`` true or false;
* ``long`` and ``int`` a JSON integer in the type's range (not 1.5, not "12", not true);
* ``double`` a JSON number;
* ``timestamp`` ISO-8601 text (UTC when it has no offset) or epoch milliseconds; a JSON value
  gets it as ISO-8601 text in UTC;
* ``decimal(p,s)`` a JSON number or a string holding one in plain notation ("12.50"), with at
  most ``s`` digits after the point and ``p - s`` before it (nothing is rounded); a JSON value
  gets it as a number in plain notation with exactly ``s`` digits after the point.

A null, or a missing field, is refused for a field that is not nullable. A field the contract
does not declare is refused too, naming it and the declared field it is closest to (a typo would
otherwise become a null in silver): ``field 'locaton' is not declared ... did you mean
'location'?``. A JSON value may carry such fields when asked (``allow_undeclared``, the
producer's ``--allow-undeclared-fields``, for a producer that evolves ahead of the contract):
they are written as given, and silver ignores them until the contract declares them. An Avro
value never does: its schema has no place for them (a newer producer writes with its own schema
id). Numbers are read exactly (:data:`JSON_NUMBERS`), never through a binary float.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from lakehouse.contracts.fields import (
    DECIMAL_TEXT,
    Field,
    at_scale,
    decimal_problem,
    timestamp_of,
)
from lakehouse.contracts.model import Contract, SchemaVersion
from lakehouse.errors import BadRecordError


def _not_a_json_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# json.loads' options that read numbers exactly: a number with a fraction or an exponent is a
# Decimal, as written, and NaN or Infinity (which Python's json reads, and JSON has not) is
# refused. Producer input is read with them.
JSON_NUMBERS: dict[str, Any] = {"parse_float": Decimal, "parse_constant": _not_a_json_number}


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


class _Mismatch(Exception):
    """A value its type does not take: what the type takes (its phrase) and what was given."""

    def __init__(self, expected: str, value: Any) -> None:
        super().__init__(expected)
        self.expected = expected
        self.got = describe(value)


_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_TAKES = {
    "string": "a string",
    "long": "a long (a JSON integer)",
    "int": "an int (a JSON integer)",
    "double": "a double (a JSON number)",
    "boolean": "a boolean (true or false)",
    "timestamp": "a timestamp (ISO-8601 text or epoch milliseconds)",
}
_DECIMAL_TEXT = re.compile(DECIMAL_TEXT)


def expected(f: Field) -> str:
    """What a field's type takes, as the producer's messages say it."""
    if f.type == "decimal":
        return f"a {f.type_name} (a JSON number, or a string holding one)"
    return _TAKES[f.type]


def describe(value: Any) -> str:
    """A given value as a message names it: ``the string "12.50"``, ``the number 1.5``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return f"the string {text if len(text) <= 80 else text[:79] + '…'}"
    if isinstance(value, int | float | Decimal):
        return f"the number {value}"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return f"{type(value).__name__} {value!r}"


def conform(f: Field, value: Any, *, avro: bool) -> Any:
    """``value`` (not null) as field ``f`` stores it, for an Avro record (``avro``) or a JSON
    value; raises _Mismatch when its type does not take it."""
    kind = f.type
    is_number = isinstance(value, int | float | Decimal) and not isinstance(value, bool)
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind in _RANGES and is_number and isinstance(value, int):
        low, high = _RANGES[kind]
        if not low <= value <= high:
            raise _Mismatch(f"{_TAKES[kind][:-1]} from {low} to {high})", value)
        return value
    if kind == "double" and is_number:
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise _Mismatch("a double (a finite JSON number)", value)
        return value if isinstance(value, int) and not avro else number
    if kind == "timestamp":
        return _timestamp(f, value, avro=avro)
    if kind == "decimal":
        return _decimal(f, value)
    raise _Mismatch(expected(f), value)


def _timestamp(f: Field, value: Any, *, avro: bool) -> Any:
    if isinstance(value, datetime):  # from code (the samples), not from JSON
        instant = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    else:
        try:
            instant = timestamp_of(value)
        except ValueError:
            raise _Mismatch(expected(f), value) from None
    if avro:
        return instant
    # One ISO-8601 form, which Spark's JSON reader takes, whichever form Python read (a week
    # date, say).
    utc = instant.astimezone(UTC).replace(tzinfo=None)
    spec = "milliseconds" if utc.microsecond % 1000 == 0 else "microseconds"
    return utc.isoformat(timespec=spec) + "Z"


def _decimal(f: Field, value: Any) -> Decimal:
    assert f.precision is not None and f.scale is not None
    if isinstance(value, Decimal | int) and not isinstance(value, bool):
        number = Decimal(value)
    elif isinstance(value, float):  # from code: its shortest text is what was meant
        number = Decimal(repr(value))
    elif isinstance(value, str) and _DECIMAL_TEXT.fullmatch(value):
        number = Decimal(value)
    else:
        raise _Mismatch(expected(f), value)
    if not number.is_finite():
        raise _Mismatch(expected(f), value)
    if problem := decimal_problem(number, f.precision, f.scale):
        raise _Mismatch(f"a {f.type_name} ({problem})", value)
    return at_scale(number, f.scale)


def _pick(versions: tuple[SchemaVersion, ...], schema_id: int | None, what: str) -> SchemaVersion:
    if schema_id is None:
        return versions[-1]
    for v in versions:
        if v.id == schema_id:
            return v
    known = ", ".join(str(v.id) for v in versions)
    raise BadRecordError(what, f"no schema id {schema_id} in the contract (known: {known})")


class Serializer:
    """Checks and encodes keys and values for one topic."""

    def __init__(
        self,
        contract: Contract,
        value_schema_id: int | None = None,
        *,
        allow_undeclared: bool = False,
    ) -> None:
        from lakehouse.contracts import avro

        self.contract = contract
        self.allow_undeclared = allow_undeclared
        self._value = None
        self._key = None
        self._fields = contract.fields
        self._defaults: frozenset[str] = frozenset()  # Avro fields a writer may leave out
        self._registered: Callable[[dict[str, Any]], bytes] | None = None
        self._registered_key: Callable[[Any], bytes] | None = None
        if contract.value_registry is not None and value_schema_id is not None:
            raise BadRecordError(
                f"topic {contract.topic}",
                "its values are written through a schema registry, which gives the id",
            )
        if contract.value_format == "avro":
            version = _pick(contract.value_schemas, value_schema_id, f"topic {contract.topic}")
            self._value = (version.id, avro.parse(version.schema, contract.file, "value"))
            # The fields of the schema written with, which an older id may lack.
            self._fields = avro.fields_of(version.schema, contract.file, "value")
            self._defaults = frozenset(
                f["name"] for f in version.schema.get("fields", []) if "default" in f
            )
        elif value_schema_id is not None:
            raise BadRecordError(
                f"topic {contract.topic}", "a schema id applies to Avro values only"
            )
        if contract.key_format == "avro":
            latest = contract.key_schemas[-1]
            self._key = (latest.id, avro.parse(latest.schema, contract.file, "key"))
        self._key_field = Field(contract.key_name, contract.key_type)

    def key(self, key: Any, origin: str) -> bytes | None:
        from lakehouse.contracts import avro

        if key is None:
            return None
        fmt = self.contract.key_format
        try:
            checked = conform(self._key_field, key, avro=fmt in ("avro", "protobuf"))
        except _Mismatch as exc:
            raise BadRecordError(origin, f"key: expected {exc.expected}, got {exc.got}") from None
        if fmt == "string":
            return checked.encode("utf-8")
        if self.contract.key_registry is not None:
            return self._key_through_registry(checked, origin)
        if fmt == "json":
            return json_text(checked).encode("utf-8")
        assert self._key is not None and self._key[0] is not None
        try:
            return avro.encode(self._key[0], self._key[1], checked)
        except (ValueError, TypeError) as exc:
            raise BadRecordError(origin, f"key does not fit its Avro schema: {exc}") from None

    def value(self, value: Any, origin: str) -> bytes | None:
        from lakehouse.contracts import avro

        if value is None:
            return None  # a tombstone
        fmt = self.contract.value_format
        if fmt == "string":
            if not isinstance(value, str):
                raise BadRecordError(origin, "value must be a string or null for this topic")
            return value.encode("utf-8")
        if not isinstance(value, dict):
            what = "an Avro record" if fmt == "avro" else f"the fields of {self.contract.topic}"
            raise BadRecordError(origin, f"value must be a JSON object ({what}) or null")
        record = self._checked(value, origin, avro=fmt == "avro")
        if self.contract.value_registry is not None:
            return self._through_registry(record, origin)
        if fmt == "json":
            return json_text(record).encode("utf-8")
        assert self._value is not None and self._value[0] is not None
        try:
            return avro.encode(self._value[0], self._value[1], record)
        except (ValueError, TypeError, KeyError) as exc:
            raise BadRecordError(
                origin, f"value does not fit Avro schema id {self._value[0]}: {exc}"
            ) from None

    def _key_through_registry(self, key: Any, origin: str) -> bytes:
        """A key as Confluent's own serializer frames it, under ``<topic>-key``
        (:func:`lakehouse.contracts.confluent.key_serializer`)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from confluent_kafka.serialization import SerializationError

        if self._registered_key is None:
            from lakehouse.contracts import confluent

            self._registered_key = confluent.key_serializer(self.contract)
        try:
            return self._registered_key(key)
        except SchemaRegistryError as exc:
            raise BadRecordError(
                origin, f"the schema registry refused the key's schema: {exc}"
            ) from None
        except (SerializationError, ValueError, TypeError) as exc:
            raise BadRecordError(origin, f"key does not fit its schema: {exc}") from None

    def _through_registry(self, record: dict[str, Any], origin: str) -> bytes:
        """A value as Confluent's own serializer frames it: its schema registered under the
        topic's subject (the registry refuses one its compatibility mode breaks), its id in the
        header (:func:`lakehouse.contracts.confluent.serializer`)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from confluent_kafka.serialization import SerializationError

        if self._registered is None:
            from lakehouse.contracts import confluent

            # Decimals written as the exact numbers they are (Python's json writes no Decimal).
            self._registered = confluent.serializer(self.contract, json_encode=json_text)
        try:
            return self._registered(record)
        except SchemaRegistryError as exc:
            raise BadRecordError(
                origin, f"the schema registry refused the value's schema: {exc}"
            ) from None
        except (SerializationError, ValueError, TypeError, KeyError) as exc:
            raise BadRecordError(origin, f"value does not fit its schema: {exc}") from None

    def _checked(self, value: dict[str, Any], origin: str, *, avro: bool) -> dict[str, Any]:
        """The value with each field checked and stored as its type stores it."""
        self._refuse_undeclared(value, origin, avro=avro)
        record = dict(value)
        for f in self._fields:
            given = value.get(f.name)
            if given is not None:
                try:
                    record[f.name] = conform(f, given, avro=avro)
                except _Mismatch as exc:
                    raise BadRecordError(
                        origin, f"field {f.name!r}: expected {exc.expected}, got {exc.got}"
                    ) from None
            elif not f.nullable and not (f.name not in value and f.name in self._defaults):
                got = "null" if f.name in value else "nothing (the field is missing)"
                raise BadRecordError(
                    origin,
                    f"field {f.name!r}: expected {expected(f)}, got {got}; the field is not "
                    "nullable",
                )
        return record

    def _refuse_undeclared(self, value: dict[str, Any], origin: str, *, avro: bool) -> None:
        """A field of ``value`` that the contract (or the Avro schema written with) does not
        declare: refused, unless a JSON value may carry it (``allow_undeclared``)."""
        declared = [f.name for f in self._fields]
        undeclared = [name for name in value if name not in declared]
        if not undeclared or (self.allow_undeclared and not avro):
            return
        name = undeclared[0]
        close = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        if avro:
            where = f"the Avro schema id {self._value[0] if self._value else '?'}"
            remedy = "an Avro value holds its schema's fields only"
        else:
            where = f"the contract of {self.contract.topic} ({self.contract.file})"
            remedy = (
                "--allow-undeclared-fields writes such fields as given, for a producer ahead "
                "of its contract"
            )
        more = f" (and {len(undeclared) - 1} more)" if len(undeclared) > 1 else ""
        raise BadRecordError(
            origin,
            f"field {name!r}{more} is not declared by {where}, whose fields are "
            f"{', '.join(map(repr, declared))}{hint} ({remedy})",
        )
