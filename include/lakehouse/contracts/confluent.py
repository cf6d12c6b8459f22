"""Writers' schemas from a Confluent-compatible schema registry, for values written through one.

A producer's serializer (Confluent's ``AvroSerializer``, ``JSONSerializer`` or
``ProtobufSerializer``) registers its schema under the topic's subject and frames each record
with the id the registry gave it. A contract whose value says ``registry:`` lists no id: the job
that decodes the topic (silver) asks the registry for every version of the subject, in the
value's format, when it starts, and decodes each record by its id: Avro into the contract's
reader schema (:mod:`lakehouse.contracts.avro`), JSON validated against its writer's JSON
Schema (:mod:`lakehouse.streams.decode`), Protobuf parsed with its writer's descriptors
(:mod:`lakehouse.contracts.protobuf`; a version's imports come from its references). A record whose id is not a version of the subject goes to
quarantine with that reason; a registry that does not answer fails the batch before anything
is written. The subject's compatibility mode is looked up with its versions: a changed reader
schema it would refuse is refused before any data moves (:mod:`lakehouse.streams.registry`).

Where the registry is: the contract's ``value.registry.url``, else ``LAKEHOUSE_SCHEMA_REGISTRY_URL``,
else the registry ``lakehouse registry start`` runs (:mod:`lakehouse.runtime.registry`). Its
credentials are the deployment's, never the contract's: ``LAKEHOUSE_SCHEMA_REGISTRY_USER_INFO``
(``user:password``, as Confluent's clients take ``basic.auth.user.info``).

Requests go out from the driver only: the subject's version list and its compatibility (one
or two) per batch, and one per version never seen before by this process (a version's schema
never changes, so it is kept).
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lakehouse.contracts.model import Contract, RegistrySource, SchemaVersion
from lakehouse.errors import ConfigError, LakehouseError
from lakehouse.runtime.config import Settings

URL_ENV = "LAKEHOUSE_SCHEMA_REGISTRY_URL"
USER_INFO_ENV = "LAKEHOUSE_SCHEMA_REGISTRY_USER_INFO"
TIMEOUT_S = 10.0
_URL = re.compile(r"https?://[^/?#@\s]+(/[^?#@\s]*)?")
_MEDIA = "application/vnd.schemaregistry.v1+json"

# (registry URL, subject, version) -> (schema id, schema type, schema text, references: the
# (import name, subject, version) of each schema it imports): versions are immutable in a
# Confluent registry, so each is asked for once per process.
Reference = tuple[str, str, int]
_versions: dict[tuple[str, str, int], tuple[int, str, str, tuple[Reference, ...]]] = {}


class SchemaRegistryUnavailableError(LakehouseError):
    """The schema registry did not answer as Confluent's API does; nothing was written."""


def valid_url(url: str) -> bool:
    """Whether ``url`` is a registry's URL as this module takes it: http(s), a host, a path,
    no credentials, query or fragment."""
    return _URL.fullmatch(url) is not None


def registry_url(
    contract: Contract, settings: Settings, source: RegistrySource | None = None
) -> str:
    """Where the registry of ``contract``'s value (or of ``source``: its key's) is (see the
    module's docstring)."""
    source = source or contract.value_registry or contract.key_registry
    if source is None:
        raise ValueError(f"topic {contract.topic!r} does not read through a registry")
    if source.url:
        return source.url.rstrip("/")
    given = os.environ.get(URL_ENV, "").strip()
    if given:
        if not valid_url(given):
            raise ConfigError(
                f"{URL_ENV}={given!r}: give the registry's URL, http(s)://host[:port][/path], "
                "with no credentials (set them in " + USER_INFO_ENV + ")"
            )
        return given.rstrip("/")
    from lakehouse.runtime import registry

    try:
        return registry.url(settings)
    except registry.RegistryError as exc:
        raise SchemaRegistryUnavailableError(
            f"{contract.file}: topic {contract.topic!r} reads its values through a schema "
            f"registry, and none is given (value.registry.url, or {URL_ENV}) or running here: "
            f"{exc}"
        ) from None


def _get(url: str, path: str) -> Any:
    """One GET of Confluent's API; None for a 404 (no such subject or version)."""
    request = urllib.request.Request(f"{url}{path}", headers={"Accept": _MEDIA})
    user_info = os.environ.get(USER_INFO_ENV, "")
    if user_info:
        token = base64.b64encode(user_info.encode()).decode("ascii")
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        hint = f" (check {USER_INFO_ENV})" if exc.code in {401, 403} else ""
        raise SchemaRegistryUnavailableError(
            f"the schema registry at {url} answered GET {path} with HTTP {exc.code}{hint}; "
            "nothing was written"
        ) from None
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        raise SchemaRegistryUnavailableError(
            f"the schema registry at {url} cannot be reached (GET {path}: {exc}); nothing was "
            "written"
        ) from None


def subject_versions(
    url: str, subject: str
) -> list[tuple[int, int, str, str, tuple[Reference, ...]]]:
    """Every version of ``subject``: (version, schema id, schema type, schema text, references),
    oldest first; empty when the subject has none yet."""
    quoted = urllib.parse.quote(subject, safe="")
    numbers = _get(url, f"/subjects/{quoted}/versions")
    if numbers is None:
        return []
    if not isinstance(numbers, list) or not all(isinstance(n, int) for n in numbers):
        raise SchemaRegistryUnavailableError(
            f"the schema registry at {url} listed the versions of {subject!r} as {numbers!r}, "
            "not as numbers"
        )
    out = []
    for number in sorted(numbers):
        found = _version(url, subject, number)
        if found is not None:  # else deleted between the two requests
            out.append((number, *found))
    return out


def _version(
    url: str, subject: str, number: int
) -> tuple[int, str, str, tuple[Reference, ...]] | None:
    key = (url, subject, number)
    if key not in _versions:
        quoted = urllib.parse.quote(subject, safe="")
        found = _get(url, f"/subjects/{quoted}/versions/{number}")
        if found is None:
            return None
        references = tuple(
            (str(r["name"]), str(r["subject"]), int(r["version"]))
            for r in found.get("references") or ()
        )
        _versions[key] = (
            int(found["id"]),
            str(found.get("schemaType") or "AVRO"),
            str(found["schema"]),
            references,
        )
    return _versions[key]


def _imports(url: str, references: tuple[Reference, ...], depth: int = 0) -> dict[str, str]:
    """The schemas a version imports, and theirs, by import name (each first seen wins)."""
    out: dict[str, str] = {}
    for name, subject, number in references:
        found = _version(url, subject, number)
        if found is None or depth > 20:
            raise SchemaRegistryUnavailableError(
                f"the schema registry at {url} has no version {number} of {subject!r}, which "
                f"a registered schema imports as {name!r}"
            )
        for deeper, text in _imports(url, found[3], depth + 1).items():
            out.setdefault(deeper, text)
        out.setdefault(name, found[2])
    return out


def resolve(contract: Contract, settings: Settings) -> Contract:
    """``contract`` with its writer schemas looked up in the registry, for its value and its
    key where they are written through one: the versions of each subject in its format (Avro,
    JSON Schema or Protobuf), oldest first, then an Avro reader schema without an id. A contract
    that lists its ids is returned as it is; one that lists them and names a registry too reads
    the registry's and its own where a registry is given or runs, else its own alone (its
    ``value_registry`` then None). Raises SchemaRegistryUnavailableError when the registry
    cannot say."""
    source = contract.value_registry
    if (
        source is not None
        and source.listed
        and not source.looked_up
        and not registry_given(contract, settings, source)
    ):
        # Ids listed, and no registry given or running: those ids alone, as if listed only.
        contract = replace(contract, value_registry=None)
        source = None
    if source is not None and not source.looked_up:
        writers, looked_up = _looked_up(contract, settings, source, contract.value_format)
        if source.listed:
            where = f"{registry_url(contract, settings, source)} subject {source.subject!r}"
            writers = _with_listed(contract, writers, where)
        versions = tuple(SchemaVersion(id=i, schema=s) for i, s in writers.items())
        if contract.value_format == "avro":
            versions += (replace(contract.value_schemas[-1], id=None),)
        contract = replace(contract, value_schemas=versions, value_registry=looked_up)
    if (source := contract.key_registry) is not None:
        writers, looked_up = _looked_up(contract, settings, source, contract.key_format)
        versions = tuple(SchemaVersion(id=i, schema=s) for i, s in writers.items())
        if contract.key_format == "avro":
            versions += (replace(contract.key_schemas[-1], id=None),)
        contract = replace(contract, key_schemas=versions, key_registry=looked_up)
    return contract


def registry_given(contract: Contract, settings: Settings, source: RegistrySource) -> bool:
    """Whether a registry is given for ``source`` (its URL, ``LAKEHOUSE_SCHEMA_REGISTRY_URL``) or
    runs here (``lakehouse registry start``)."""
    if source.url or os.environ.get(URL_ENV, "").strip():
        return True
    from lakehouse.runtime import registry

    try:
        registry.url(settings)
    except registry.RegistryError:
        return False
    return True


def _with_listed(contract: Contract, writers: dict[int, Any], where: str) -> dict[int, Any]:
    """The registry's writers and the contract's listed ids it lacks (records written before it
    or without it); an id both know must be the same schema (Avro's parsing canonical form),
    else ConfigError: which schema an id means cannot be guessed."""
    from fastavro.schema import parse_schema, to_parsing_canonical_form

    def form(schema: Any) -> str:
        return str(to_parsing_canonical_form(parse_schema(schema, _write_hint=False)))

    out = dict(writers)
    for version in contract.value_schemas:
        if version.id is None:
            continue
        theirs = writers.get(version.id)
        if theirs is None:
            out[version.id] = version.schema
        elif form(theirs) != form(version.schema):
            raise ConfigError(
                f"{contract.file}: value.schemas lists schema id {version.id}"
                f"{f' ({version.file})' if version.file else ''}, but the schema registry at "
                f"{where} has id {version.id} as another schema; list the registry's ids, or "
                "remove the listed one"
            )
    return dict(sorted(out.items()))


def _looked_up(
    contract: Contract, settings: Settings, source: RegistrySource, fmt: str
) -> tuple[dict[int, Any], RegistrySource]:
    """The writer schemas of ``source``'s subject in format ``fmt`` by id, and ``source`` as
    looked up (with the subject's compatibility mode)."""
    url = registry_url(contract, settings, source)
    kind_wanted = _KINDS[fmt]
    writers: dict[int, Any] = {}
    for number, schema_id, kind, text, references in subject_versions(url, source.subject):
        if kind.upper() != kind_wanted or schema_id in writers:
            continue  # another format: its records are quarantined as of an unknown id
        where = f"{url} subject {source.subject!r} version {number}"
        if kind_wanted == "PROTOBUF":
            descriptors = _protobuf_writer(text, _imports(url, references), where)
            if descriptors is not None:
                writers[schema_id] = descriptors
            continue
        try:
            schema = json.loads(text)
        except ValueError:
            schema = text  # a bare name such as "string"
        if _readable(schema, kind_wanted, where):
            writers[schema_id] = schema
    mode = subject_compatibility(url, source.subject)
    return writers, replace(source, looked_up=True, compatibility=mode)


def subject_compatibility(url: str, subject: str) -> str:
    """The compatibility mode the registry applies to ``subject``: its own, else the global
    one (Confluent's default, BACKWARD, when neither says)."""
    quoted = urllib.parse.quote(subject, safe="")
    for path in (f"/config/{quoted}", "/config"):
        said = _get(url, path)
        if isinstance(said, dict):
            level = said.get("compatibilityLevel") or said.get("compatibility")
            if isinstance(level, str) and level:
                return level.upper()
    return "BACKWARD"


_KINDS = {"avro": "AVRO", "json": "JSON", "protobuf": "PROTOBUF"}


def _protobuf_writer(text: str, imports: dict[str, str], where: str) -> str | None:
    """A Protobuf version's descriptor set (what the workers decode its records with, in
    base64), or None when it cannot be made: that version is left out, and its records are
    quarantined as of an unknown id."""
    from lakehouse.contracts import protobuf

    try:
        return protobuf.descriptor_set(protobuf.file_proto("writer.proto", text, imports))
    except protobuf.ProtobufSchemaError as exc:
        import sys

        print(f"{where}: not readable as Protobuf: {exc}", file=sys.stderr)
        return None


def _readable(schema: Any, kind: str, where: str) -> bool:
    """Whether this platform can read with ``schema`` (not one with references to others, say);
    a version it cannot is left out, and its records are quarantined as of an unknown id."""
    if kind == "JSON":
        from jsonschema import SchemaError, validators

        try:
            validators.validator_for(schema).check_schema(schema)
        except (SchemaError, TypeError, AttributeError):
            return False
        return isinstance(schema, dict)
    from lakehouse.contracts import avro

    try:
        avro.parse(schema, where, "schema")
    except (LakehouseError, ValueError, TypeError, KeyError):
        return False
    return True


# The JSON kinds a value of each field type may be written as (what the JSON steps read).
_READS = {
    "string": {"string"},
    "timestamp": {"string"},
    "long": {"integer"},
    "int": {"integer"},
    "double": {"number", "integer"},
    "boolean": {"boolean"},
    "decimal": {"number", "integer", "string"},
}


def reader_problems(contract: Contract, writer: Any) -> list[str]:
    """What the contract's reader cannot read of one writer schema of its subject: Avro's
    schema resolution for an Avro value; for JSON Schema or Protobuf, a required field the
    writer lacks or a field the writer gives a kind the field's type does not read (each such
    record would go to quarantine)."""
    from lakehouse.contracts import avro

    if contract.value_format == "avro":
        return avro.check_compatibility("BACKWARD", contract.value_schemas[-1].schema, [writer])
    if contract.value_format == "protobuf":
        from lakehouse.contracts import protobuf

        given = protobuf.field_kinds(writer)
    else:
        properties = writer.get("properties", {}) if isinstance(writer, dict) else {}
        given = {}
        for name, spec in properties.items():
            kinds = spec.get("type") if isinstance(spec, dict) else None
            kinds = [kinds] if isinstance(kinds, str) else kinds or []
            given[name] = "|".join(sorted(k for k in kinds if k != "null")) or "any"
    problems = []
    for f in contract.fields:
        kind = given.get(f.name)
        if kind is None:
            if not f.nullable:
                problems.append(f"the writer has no field {f.name!r}, which is required")
            continue
        if kind != "any" and not set(kind.split("|")) <= _READS[f.type]:
            problems.append(f"field {f.name!r} is written as {kind}, which a {f.type} cannot read")
    return problems


def json_schema(contract: Contract) -> dict[str, Any]:
    """The JSON Schema a producer of ``contract``'s JSON values registers: an object with the
    contract's fields as properties (a nullable one may be null or left out) and no others."""
    kinds: dict[str, dict[str, Any]] = {
        "string": {"type": "string"},
        "long": {"type": "integer"},
        "int": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
        "double": {"type": "number"},
        "boolean": {"type": "boolean"},
        "timestamp": {"type": "string", "format": "date-time"},
        "decimal": {"type": ["number", "string"]},
    }
    properties: dict[str, Any] = {}
    for f in contract.fields:
        kind = dict(kinds[f.type])
        if f.nullable:
            kind["type"] = [
                *(kind["type"] if isinstance(kind["type"], list) else [kind["type"]]),
                "null",
            ]
        properties[f.name] = kind
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": contract.stream,
        "type": "object",
        "properties": properties,
        "required": [f.name for f in contract.fields if not f.nullable],
        "additionalProperties": False,
    }


def serializer(
    contract: Contract, json_encode: Callable[[Any], str] = json.dumps
) -> Callable[[dict[str, Any]], bytes]:
    """Confluent's own serializer for ``contract``'s values (``AvroSerializer`` with the reader
    schema, ``JSONSerializer`` with :func:`json_schema`), against the registry its jobs read the
    ids from, registering under the contract's subject naming strategy (the registry refuses a
    schema its compatibility mode breaks). ``json_encode`` writes a JSON value's text."""
    from confluent_kafka.schema_registry import (
        record_subject_name_strategy,
        topic_record_subject_name_strategy,
        topic_subject_name_strategy,
    )
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    source = contract.value_registry
    assert source is not None
    strategy = {
        "topic": topic_subject_name_strategy,
        "record": record_subject_name_strategy,
        "topic-record": topic_record_subject_name_strategy,
    }[source.strategy]
    settings = {"auto.register.schemas": True, "subject.name.strategy": strategy}
    client = _client(contract, source)
    serialize: Any
    if contract.value_format == "json":
        serialize = JSONSerializer(
            json.dumps(json_schema(contract)), client, conf=settings, json_encode=json_encode
        )
    elif contract.value_format == "protobuf":
        from lakehouse.contracts import protobuf

        message = protobuf.contract_message(contract)
        framing = ProtobufSerializer(
            message, client, conf={**settings, "use.deprecated.format": False}
        )
        serialize = lambda record, ctx: framing(protobuf.message_of(message, record), ctx)  # noqa: E731
    else:
        serialize = AvroSerializer(
            client, json.dumps(contract.value_schemas[-1].schema), conf=settings
        )
    context = SerializationContext(_kafka_topic(contract), MessageField.VALUE)
    return lambda record: serialize(record, context)


def key_serializer(contract: Contract) -> Callable[[Any], bytes]:
    """Confluent's own serializer for ``contract``'s keys, registering under ``<topic>-key``:
    ``AvroSerializer`` with the key's reader schema, ``JSONSerializer`` with
    :func:`key_json_schema`, ``ProtobufSerializer`` with a message whose one field is the key."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    source = contract.key_registry
    assert source is not None
    client, settings = _client(contract, source), {"auto.register.schemas": True}
    serialize: Any
    if contract.key_format == "json":
        serialize = JSONSerializer(json.dumps(key_json_schema(contract)), client, conf=settings)
    elif contract.key_format == "protobuf":
        from lakehouse.contracts import protobuf

        message = protobuf.contract_message(contract, "key")
        framing = ProtobufSerializer(
            message, client, conf={**settings, "use.deprecated.format": False}
        )
        name = contract.key_name
        serialize = lambda key, ctx: framing(protobuf.message_of(message, {name: key}), ctx)  # noqa: E731
    else:
        serialize = AvroSerializer(
            client, json.dumps(contract.key_schemas[-1].schema), conf=settings
        )
    context = SerializationContext(_kafka_topic(contract), MessageField.KEY)
    return lambda key: serialize(key, context)


_KEY_KINDS = {
    "string": "string",
    "long": "integer",
    "int": "integer",
    "double": "number",
    "boolean": "boolean",
}


def key_json_schema(contract: Contract) -> dict[str, Any]:
    """The JSON Schema a producer of ``contract``'s JSON keys registers: one scalar of the
    key's type."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"{contract.stream}-key",
        "type": _KEY_KINDS[contract.key_type],
    }


def key_reader_problems(contract: Contract, writer: Any) -> list[str]:
    """What the contract's key cannot read of one writer schema of its key subject: Avro's
    schema resolution for an Avro key (its reader schema); a JSON Schema or Protobuf key
    written as a kind the key's type does not read (each such record would go to
    quarantine)."""
    from lakehouse.contracts import avro

    if contract.key_format == "avro":
        return avro.check_compatibility("BACKWARD", contract.key_schemas[-1].schema, [writer])
    if contract.key_format == "protobuf":
        from lakehouse.contracts import protobuf

        kinds = protobuf.field_kinds(writer)
        name = protobuf.key_field_of(kinds, contract.key_name)
        if name is None:
            return [
                f"the key message has no field {contract.key_name!r}, nor only one field "
                f"(it has {', '.join(kinds) or 'none'})"
            ]
        kind = kinds[name]
    else:
        given = writer.get("type") if isinstance(writer, dict) else None
        listed = [given] if isinstance(given, str) else list(given or [])
        kind = "|".join(sorted(k for k in listed if k != "null")) or "any"
    if kind != "any" and not set(kind.split("|")) <= _READS[contract.key_type]:
        return [f"the key is written as {kind}, which a {contract.key_type} key cannot read"]
    return []


def _kafka_topic(contract: Contract) -> str:
    return contract.kafka.topic if contract.kafka is not None else contract.topic


def _client(contract: Contract, source: RegistrySource) -> Any:
    """Confluent's registry client for ``source``, with the deployment's credentials."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf: dict[str, Any] = {"url": registry_url(contract, Settings.from_env(), source)}
    user_info = os.environ.get(USER_INFO_ENV, "")
    if user_info:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)
