"""A stream's columns: the types a contract's fields may have, and a field. Both the contract
model and the Avro schemas a contract names build on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FieldType = Literal["string", "long", "int", "double", "boolean", "timestamp"]


@dataclass(frozen=True)
class Field:
    """One column of a stream: its name, its type and whether it may be null."""

    name: str
    type: FieldType
    nullable: bool = True
