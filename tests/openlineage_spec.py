"""OpenLineage events checked against OpenLineage's published JSON schemas (tests/openlineage/),
and the lineage graph read back from them.

An event is valid when the whole of it validates against ``OpenLineage.json`` and each of its
facets against the schema its ``_schemaURL`` names, from the spec (Airflow's provider names the
spec's base facets as its own facets' schemas). A facet whose schema the spec does not publish
is an error: nothing passes unchecked. (The provider also ships JSON schemas of its Airflow
facets, without an ``$id``; its own events do not follow them: ``airflow.taskInstance`` lacks the
``pool`` they require. So they are not the oracle here.)
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

SPEC = Path(__file__).parent / "openlineage" / "spec"
ROOT = "https://openlineage.io/spec/2-0-2/OpenLineage.json"


def _registry() -> Registry:
    documents = [json.loads((SPEC / "OpenLineage.json").read_text())]
    documents += [json.loads(p.read_text()) for p in sorted((SPEC / "facets").glob("*.json"))]
    resources = [(d["$id"], Resource.from_contents(d)) for d in documents]
    return Registry().with_resources(resources)


REGISTRY = _registry()


def _facets(event: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every facet of an event, with where it is."""
    for part in ("run", "job"):
        for name, facet in (event.get(part, {}).get("facets") or {}).items():
            yield f"{part}.{name}", facet
    for side, extra in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        for dataset in event.get(side) or []:
            for key in ("facets", extra):
                for name, facet in (dataset.get(key) or {}).items():
                    yield f"{side}[{dataset['name']}].{key}.{name}", facet


def validate(event: Mapping[str, Any], *, known_only: bool = True) -> None:
    """Raise jsonschema's ValidationError (or an AssertionError for a facet whose schema is not
    known) unless ``event`` is a valid OpenLineage event with valid facets. ``known_only``
    False: a facet of a producer's own schema (dbt-ol's ``dbt_version``, say) is checked
    against the spec's base facet only (the event's schema does that)."""
    jsonschema.Draft202012Validator({"$ref": ROOT}, registry=REGISTRY).validate(event)
    for where, facet in _facets(event):
        url = facet.get("_schemaURL", "")
        base = url.partition("#")[0]
        if not known_only and base not in REGISTRY:
            continue
        assert base in REGISTRY, f"{where}: no published schema for {url!r}"
        jsonschema.Draft202012Validator({"$ref": url}, registry=REGISTRY).validate(facet)


def edges(events: list[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """The dataset-to-dataset edges the events' column lineage says: (input, output), each a
    ``namespace/name``."""
    found = set()
    for event in events:
        for output in event.get("outputs") or []:
            target = f"{output['namespace']}/{output['name']}"
            fields = (output.get("facets") or {}).get("columnLineage", {}).get("fields", {})
            for column in fields.values():
                for source in column["inputFields"]:
                    found.add((f"{source['namespace']}/{source['name']}", target))
    return found


class Receiver:
    """An OpenLineage HTTP backend on 127.0.0.1 for a test: every event POSTed to it, in the
    order received (as Marquez's ``/api/v1/lineage`` takes them)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        received = self.events

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(201)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The backend's address, as ``OPENLINEAGE_URL`` takes it (events go to
        ``/api/v1/lineage`` under it)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def transport(self) -> str:
        """The provider's ``[openlineage] transport`` setting that sends events here."""
        port = self.server.server_address[1]
        return json.dumps(
            {"type": "http", "url": f"http://127.0.0.1:{port}", "endpoint": "api/v1/lineage"}
        )

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of(self, job: str, state: str | None = None) -> list[dict[str, Any]]:
        """The events of one job (``<dag>.<task>``), of one type if given."""
        return [
            e
            for e in self.events
            if e.get("job", {}).get("name") == job and state in (None, e.get("eventType"))
        ]
