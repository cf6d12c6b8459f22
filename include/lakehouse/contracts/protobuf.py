"""Protobuf keys and values in Confluent's wire format: the writers' schemas as descriptors, the
records as the JSON the stream's key and fields are read from, and the contract's key and fields
as messages.

A Protobuf record written through a schema registry (Confluent's ``ProtobufSerializer``) is
magic byte 0, the writer schema's 4-byte id, the message's indexes in its file (zigzag varints:
a count, then an index per nesting level; a lone 0 for the file's first message), then the
message. The registry holds a version's schema as ``.proto`` text or, as Confluent's Python
serializer registers it, a base64 ``FileDescriptorProto``; :func:`descriptor_set` turns either
(with the files it imports) into a serialized ``FileDescriptorSet``, which is what the workers
decode with (:class:`WireDecoder`).

A message is read by field name into the contract's fields: proto3 semantics, so a scalar
without presence that the writer left out reads as its default (0, "", false), a field with
presence (``optional``, a message) left out reads as null, an enum as its name, bytes as
base64, ``google.protobuf.Timestamp`` as RFC 3339 text and the wrapper types as their value.
A key is a message too (Confluent's serializer takes nothing else): its field named as the
contract's key, else its only field, is the key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor
    from google.protobuf.descriptor_pb2 import FileDescriptorProto
    from google.protobuf.message import Message

    from lakehouse.contracts.model import Contract

_WRAPPERS = {
    f"google.protobuf.{n}Value"
    for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}


class ProtobufSchemaError(ValueError):
    """A registered Protobuf schema this platform cannot turn into descriptors."""


def file_proto(name: str, text: str, imports: Mapping[str, str] = {}) -> list[FileDescriptorProto]:
    """The ``FileDescriptorProto`` of a registered schema ``text`` named ``name`` (base64
    descriptors, or ``.proto`` text compiled by protoc), after those of the files it imports
    (``imports``: name -> text, themselves registered schemas). Protobuf's well-known types
    need no text."""
    from google.protobuf import descriptor_pb2

    found = _base64_proto(text)
    if found is not None:
        found.name = found.name or name
        deps: list[FileDescriptorProto] = []
        for dep_name, dep_text in imports.items():
            deps.extend(p for p in file_proto(dep_name, dep_text) if p.name not in _names(deps))
        return [*deps, found]
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="lakehouse-proto-") as folder:
        root = Path(folder)
        compiled = descriptor_pb2.FileDescriptorSet()  # imports registered as descriptors
        for file_name, file_text in {**imports, name: text}.items():
            as_proto = _base64_proto(file_text)
            if as_proto is not None:
                as_proto.name = as_proto.name or file_name
                compiled.file.append(as_proto)
                continue
            path = root / file_name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(file_text, encoding="utf-8")
        given = []
        if compiled.file:
            (root / "imports.pb").write_bytes(compiled.SerializeToString())
            given = [f"--descriptor_set_in={root / 'imports.pb'}"]
        out = root / "set.pb"
        code = protoc.main(
            [
                "protoc",
                f"-I{root}",
                f"-I{include}",
                *given,
                f"--descriptor_set_out={out}",
                "--include_imports",
                name,
            ]
        )
        if code != 0 or not out.exists():
            raise ProtobufSchemaError(f"protoc cannot compile {name!r} (exit {code})")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return list(files.file)


def _names(files: Sequence[FileDescriptorProto]) -> set[str]:
    return {f.name for f in files}


def _base64_proto(text: str) -> FileDescriptorProto | None:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    stripped = text.strip()
    if not stripped or any(c.isspace() for c in stripped):
        return None  # .proto text has spaces; base64 has none
    try:
        raw = base64.b64decode(stripped, validate=True)
        found = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None
    return found if found.message_type else None


def descriptor_set(files: Sequence[FileDescriptorProto]) -> str:
    """``files`` (dependencies first, the writer's file last) as one serialized
    ``FileDescriptorSet`` in base64 (a writer schema kept as text, as ``schemas.registry``
    keeps the others), checked to load into a descriptor pool."""
    from google.protobuf import descriptor_pb2

    out = descriptor_pb2.FileDescriptorSet()
    out.file.extend(files)
    data = base64.b64encode(out.SerializeToString()).decode("ascii")
    _pool_file(data)  # raises when the files do not make a whole
    return data


def _pool_file(data: str) -> Any:
    """The writer's file of a :func:`descriptor_set`, loaded into a pool of its own (the
    well-known types it imports taken from protobuf's own)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(data)).file
    pool = descriptor_pool.DescriptorPool()
    have = {f.name for f in files}
    for f in files:
        for dep in f.dependency:
            if dep not in have:
                _add_well_known(pool, dep)
                have.add(dep)
        try:
            pool.Add(f)
        except (TypeError, ValueError) as exc:
            raise ProtobufSchemaError(f"{f.name}: {exc}") from None
    return pool.FindFileByName(files[-1].name)


def _add_well_known(pool: Any, name: str) -> None:
    from google.protobuf import descriptor_pb2, descriptor_pool

    try:
        known = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        import importlib

        module = "google.protobuf." + Path(name).stem + "_pb2"
        try:
            importlib.import_module(module)
            known = descriptor_pool.Default().FindFileByName(name)
        except (ImportError, KeyError):
            raise ProtobufSchemaError(
                f"the schema imports {name!r}, which the registry did not give as a reference"
            ) from None
    for dep in known.dependencies:
        _add_well_known(pool, dep.name)
    proto = descriptor_pb2.FileDescriptorProto()
    known.CopyToProto(proto)
    with contextlib.suppress(TypeError, ValueError):  # already there through another import
        pool.Add(proto)


def _zigzag(data: bytes, at: int) -> tuple[int, int]:
    """A zigzag varint of ``data`` at ``at``: (value, the position after it)."""
    shift = value = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("the message indexes end early")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return (value >> 1) ^ -(value & 1), at


def message_indexes(data: bytes, at: int) -> tuple[list[int], int]:
    """The message indexes of a framed record from ``at`` (after the id), and where the message
    starts."""
    count, at = _zigzag(data, at)
    if count == 0:
        return [0], at
    if count < 0 or count > 100:
        raise ValueError(f"the message indexes give {count} levels")
    out = []
    for _ in range(count):
        index, at = _zigzag(data, at)
        out.append(index)
    return out, at


class WireDecoder:
    """Decodes framed Protobuf values into the JSON text of the message's fields (a worker's,
    made from the writers' :func:`descriptor_set` by Confluent id). ``known`` says which ids
    exist, for the reason of an unknown one; ``part`` names what is decoded in a reason; with
    ``key_field``, a key: the JSON of that field (or of the message's only one)."""

    def __init__(
        self,
        writers: Mapping[int, str],
        known: str,
        part: str = "value",
        key_field: str | None = None,
    ) -> None:
        from google.protobuf import message_factory

        self._files = {i: _pool_file(data) for i, data in writers.items()}
        self._known = known
        self._part = part
        self._key_field = key_field
        self._classes: dict[tuple[int, tuple[int, ...]], Any] = {}
        self._factory = message_factory

    def _class(self, schema_id: int, indexes: list[int]) -> Any:
        key = (schema_id, tuple(indexes))
        if key not in self._classes:
            found = self._files[schema_id]
            types = found.message_types_by_name
            descriptor: Descriptor | None = None
            for level, index in enumerate(indexes):
                choices = (
                    list(types.values()) if descriptor is None else list(descriptor.nested_types)
                )
                if not 0 <= index < len(choices):
                    where = "the file" if level == 0 else descriptor.full_name  # type: ignore[union-attr]
                    raise LookupError(
                        f"message index {index} is not a message of {where} "
                        f"(schema id {schema_id} has {len(choices)})"
                    )
                descriptor = choices[index]
            self._classes[key] = self._factory.GetMessageClass(descriptor)
        return self._classes[key]

    def decode(self, raw: bytes) -> tuple[bytes | None, str | None]:
        """(the message's fields as JSON text, None), or (None, why it cannot be read); a
        key's: the JSON of its field."""
        from google.protobuf.message import DecodeError

        from lakehouse.contracts.avro import wire_header

        part = self._part
        # The header, then at least the message indexes' one byte.
        schema_id, problem = wire_header(raw, part, "Protobuf", least=6)
        if schema_id is None:
            return None, problem
        if schema_id not in self._files:
            return None, f"unknown Protobuf schema id {schema_id} ({self._known})"
        try:
            indexes, at = message_indexes(raw, 5)
            message = self._class(schema_id, indexes).FromString(raw[at:])
        except (ValueError, LookupError) as exc:
            return None, f"{part} is not a message of Protobuf schema id {schema_id}: {exc}"
        except DecodeError as exc:
            return None, f"{part} does not parse as Protobuf schema id {schema_id}: {exc}"
        fields = plain(message)
        if self._key_field is None:
            return json.dumps(fields).encode(), None
        name = key_field_of(fields, self._key_field)
        if name is None:
            return None, (
                f"key message {message.DESCRIPTOR.full_name} (schema id {schema_id}) has no "
                f"field {self._key_field!r}, nor only one field"
            )
        return json.dumps(fields[name]).encode(), None


def key_field_of(fields: Mapping[str, Any], name: str) -> str | None:
    """The field of a key message that is the key: the one named as the contract's key, else
    the message's only field (None: neither)."""
    if name in fields:
        return name
    return next(iter(fields)) if len(fields) == 1 else None


def plain(message: Message) -> dict[str, Any]:
    """A message's fields by name as JSON values (see the module's docstring)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _repeated(field):
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                entry = field.message_type.fields_by_name["value"]
                out[field.name] = {str(k): _one(entry, v) for k, v in value.items()}
            else:
                out[field.name] = [_one(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _one(field, value)
    return out


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _one(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        name = field.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return value.ToJsonString()
        if name in _WRAPPERS:
            return _one(field.message_type.fields_by_name["value"], value.value)
        return plain(value)
    if field.enum_type is not None:
        named = field.enum_type.values_by_number.get(value)
        return value if named is None else named.name
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


# What a scalar of each Protobuf type reads as in JSON (any other, an integer type: "integer").
_KIND_OF_TYPE = {
    "TYPE_STRING": "string",
    "TYPE_BYTES": "string",
    "TYPE_ENUM": "string",
    "TYPE_BOOL": "boolean",
    "TYPE_DOUBLE": "number",
    "TYPE_FLOAT": "number",
}


def field_kinds(writer: str) -> dict[str, str]:
    """The JSON kind each field of a writer's first message reads as (``string``, ``integer``,
    ``number``, ``boolean``, ``object`` or ``array``; see :func:`plain`), by name."""
    found = _pool_file(writer)
    if not found.message_types_by_name:
        return {}
    message = next(iter(found.message_types_by_name.values()))
    out = {}
    for field in message.fields:
        if _repeated(field):
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            out[field.name] = "object" if is_map else "array"
        else:
            out[field.name] = _kind(field)
    return out


def _kind(field: Any) -> str:
    if field.message_type is not None:
        name = field.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return "string"
        if name in _WRAPPERS:
            return _kind(field.message_type.fields_by_name["value"])
        return "object"
    from google.protobuf.descriptor import FieldDescriptor

    for name, kind in _KIND_OF_TYPE.items():
        if field.type == getattr(FieldDescriptor, name):
            return kind
    return "integer"


# The contract's field types as proto3 fields (a timestamp as google.protobuf.Timestamp, a
# decimal as its text).
_TYPES = {
    "string": "TYPE_STRING",
    "long": "TYPE_INT64",
    "int": "TYPE_INT32",
    "double": "TYPE_DOUBLE",
    "boolean": "TYPE_BOOL",
    "decimal": "TYPE_STRING",
}


def contract_file(contract: Contract, part: str = "value") -> FileDescriptorProto:
    """The proto3 file a producer of ``contract``'s Protobuf values registers: one message
    named after the stream, the contract's fields numbered in order, a nullable one
    ``optional`` (a left-out value reads as null, not as its default). A key's (``part``
    ``key``): one message, ``<Stream>Key``, whose one field is the key."""
    from google.protobuf import descriptor_pb2

    from lakehouse.contracts.model import Field

    FieldProto = descriptor_pb2.FieldDescriptorProto
    stem = "".join(p.capitalize() for p in contract.stream.replace("-", "_").split("_"))
    fields = contract.fields
    name = f"{contract.stream}.proto"
    if part == "key":
        fields = (Field(contract.key_name, contract.key_type, nullable=False),)
        stem, name = f"{stem}Key", f"{contract.stream}_key.proto"
    out = descriptor_pb2.FileDescriptorProto(
        name=name, package=f"lakehouse.{contract.stream}", syntax="proto3"
    )
    message = out.message_type.add(name=stem or "Value")
    for number, f in enumerate(fields, start=1):
        field = message.field.add(name=f.name, number=number, label=FieldProto.LABEL_OPTIONAL)
        if f.type == "timestamp":
            field.type = FieldProto.TYPE_MESSAGE
            field.type_name = ".google.protobuf.Timestamp"
            if "google/protobuf/timestamp.proto" not in out.dependency:
                out.dependency.append("google/protobuf/timestamp.proto")
        else:
            field.type = getattr(FieldProto, _TYPES[f.type])
            if f.nullable:
                field.proto3_optional = True
                field.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{f.name}")
    return out


def contract_message(contract: Contract, part: str = "value") -> Any:
    """The message class of :func:`contract_file` (what Confluent's ``ProtobufSerializer``
    takes)."""
    from google.protobuf import message_factory

    proto = contract_file(contract, part)
    found = _pool_file(descriptor_set([proto]))
    return message_factory.GetMessageClass(found.message_types_by_name[proto.message_type[0].name])


def message_of(cls: Any, record: Mapping[str, Any]) -> Any:
    """``record`` (the contract's fields by name) as a message of ``cls``: a timestamp given as
    a datetime or RFC 3339 text, a decimal as its text; None leaves a field out."""
    from datetime import datetime

    message = cls()
    for field in cls.DESCRIPTOR.fields:
        value = record.get(field.name)
        if value is None:
            continue
        if field.message_type is not None:  # a Timestamp
            stamp = getattr(message, field.name)
            if isinstance(value, datetime):
                stamp.FromDatetime(value)
            else:
                stamp.FromJsonString(str(value))
        elif field.type == field.TYPE_STRING:
            setattr(message, field.name, str(value))
        else:
            setattr(message, field.name, value)
    return message
