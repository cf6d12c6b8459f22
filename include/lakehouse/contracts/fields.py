"""A stream's columns: the types a contract's fields may have, a field, and the one reading of a
timestamp given as ISO-8601 text or epoch milliseconds and of a decimal's digits. The contract
model, the Avro schemas a contract names, the serializers and the landing files' envelopes build
on them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Context, Decimal
from typing import Any, Literal

from lakehouse.errors import BadRecordError

FieldType = Literal["string", "long", "int", "double", "boolean", "timestamp", "decimal"]

# Spark's decimals hold at most 38 digits, and so does every decimal column here.
MAX_DECIMAL_PRECISION = 38
# A decimal written as text (in a JSON string, or a JSON number as silver reads it): plain
# notation, no exponent, so its digits are exactly the value's.
DECIMAL_TEXT = r"-?[0-9]+(\.[0-9]+)?"


@dataclass(frozen=True)
class Field:
    """One column of a stream: its name, its type and whether it may be null. A ``decimal``
    has a precision (digits in all) and a scale (digits after the point), as Avro's decimal
    and Spark's DecimalType do."""

    name: str
    type: FieldType
    nullable: bool = True
    precision: int | None = None
    scale: int | None = None

    @property
    def type_name(self) -> str:
        """The type as contracts and messages write it: ``long``, ``decimal(12,2)``."""
        if self.type == "decimal":
            return f"decimal({self.precision},{self.scale})"
        return self.type


def decimal_digits(value: Decimal) -> tuple[int, int]:
    """(digits before the point, digits after it) of a finite decimal's value: leading zeros
    and trailing fraction zeros do not count, so 012.50 has (2, 1)."""
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int), "a finite decimal"
    significant = "".join(map(str, digits)).lstrip("0")
    if not significant:
        return 0, 0
    exponent += len(significant) - len(significant.rstrip("0"))
    significant = significant.rstrip("0")
    after = max(0, -exponent)
    return max(0, len(significant) + exponent), after


def decimal_problem(value: Decimal, precision: int, scale: int) -> str | None:
    """Why ``value`` is not exactly a decimal(precision, scale), or None: nothing is rounded,
    so a value with more digits after the point than the scale does not fit, and neither does
    one with more than ``precision - scale`` digits before it."""
    before, after = decimal_digits(value)
    if after > scale:
        return f"at most {scale} digit(s) after the point"
    if before > precision - scale:
        return f"at most {precision - scale} digit(s) before the point"
    return None


def at_scale(value: Decimal, scale: int) -> Decimal:
    """A decimal that fits (see :func:`decimal_problem`) written with exactly ``scale`` digits
    after the point: 12.5 at scale 2 is 12.50. Exact for all 38 digits (Python's default
    context would round past 28)."""
    return value.quantize(Decimal(1).scaleb(-scale), context=_DECIMALS)


def unscaled(number: int, scale: int) -> Decimal:
    """The decimal ``number`` * 10^-scale, exactly (Avro's decimal is its unscaled number)."""
    sign, digits, _ = Decimal(number).as_tuple()
    return Decimal((sign, digits, -scale))


_DECIMALS = Context(prec=MAX_DECIMAL_PRECISION)


def timestamp_of(raw: Any) -> datetime:
    """Epoch milliseconds (an int) or ISO-8601 text (UTC when no offset is given) -> an aware
    datetime; ValueError naming the problem otherwise."""
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError("timestamp must be epoch milliseconds or ISO-8601 text")
    if isinstance(raw, int):
        try:
            return datetime.fromtimestamp(raw / 1000, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"timestamp {raw} is out of range (epoch milliseconds)") from None
    try:
        dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"timestamp {raw!r} is not ISO-8601") from None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def parse_timestamp(raw: Any, origin: str) -> int | None:
    """Epoch milliseconds or ISO-8601 text (UTC when no offset is given) -> epoch ms."""
    if raw is None:
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    try:
        dt = timestamp_of(raw)
    except ValueError as exc:
        raise BadRecordError(origin, str(exc)) from None
    return int(dt.timestamp() * 1000)
