"""A stream's columns: the types a contract's fields may have, a field, and the one reading of a
timestamp given as ISO-8601 text or epoch milliseconds. The contract model, the Avro schemas a
contract names, the serializers and the landing files' envelopes build on them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from lakehouse.errors import BadRecordError

FieldType = Literal["string", "long", "int", "double", "boolean", "timestamp"]


@dataclass(frozen=True)
class Field:
    """One column of a stream: its name, its type and whether it may be null."""

    name: str
    type: FieldType
    nullable: bool = True


def parse_timestamp(raw: Any, origin: str) -> int | None:
    """Epoch milliseconds or ISO-8601 text (UTC when no offset is given) -> epoch ms."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise BadRecordError(origin, "timestamp must be epoch milliseconds or ISO-8601 text")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise BadRecordError(origin, f"timestamp {raw!r} is not ISO-8601") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return int(dt.timestamp() * 1000)
    raise BadRecordError(origin, "timestamp must be epoch milliseconds or ISO-8601 text")
