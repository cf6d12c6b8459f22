"""The lakehouse's schema registry (``lakehouse registry``, :mod:`lakehouse.runtime.registry`):
Apicurio Registry started and stopped by the project's own command, spoken to by Confluent's
own client (``confluent_kafka.schema_registry``) as a producer's serializer speaks to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse.runtime import registry
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import alive, free_port
from sockets import descendants, listeners

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "Profile", "fields": [{"name": "name", "type": "string"}]}
# A field with a default: a reader with v2 reads what v1 wrote (BACKWARD).
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}],
}
# A field without one: a reader with it cannot read what v2 wrote.
BREAKS = {**V2, "fields": [*V2["fields"], {"name": "age", "type": "int"}]}


def _lakehouse(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", *args],
        env={**os.environ, "LAKEHOUSE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("registry") / "lakehouse"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(registry.PORT_ENV, str(free_port()))
        try:
            yield root
        finally:
            _lakehouse(root, "registry", "stop")


def _config(url: str) -> str:
    with urllib.request.urlopen(f"{url}/config", timeout=10) as response:
        return str(json.loads(response.read())["compatibilityLevel"])


def test_the_registry_serves_confluents_api_on_the_loopback_and_refuses_a_breaking_schema(
    home: Path,
) -> None:
    """Started by `lakehouse registry start`, the registry listens on 127.0.0.1 alone (its
    management port too) and answers Confluent's client: a schema gets an id, a compatible
    version a second one, and one a BACKWARD reader cannot use is refused with a 409 that
    names the field; ids and versions survive a restart, as the compatibility set through the
    API does."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    started = _lakehouse(home, "registry", "start")
    assert started.returncode == 0, started.stderr[-3000:]
    assert "Schema registry: running" in started.stdout
    settings = Settings.from_env(home=home)
    url = registry.url(settings)
    assert url == f"http://127.0.0.1:{os.environ[registry.PORT_ENV]}{registry.API}"
    pid = registry.Registry.of(settings).record()["pid"]
    assert isinstance(pid, int)
    found = listeners({pid, *descendants(pid)})
    assert len({f.port for f in found}) >= 2, found  # the API and the management interface
    assert {f.address for f in found} == {"127.0.0.1"}, [str(f) for f in found]
    assert _config(url) == "BACKWARD"  # Confluent's default

    client = SchemaRegistryClient({"url": url})
    first = client.register_schema("profiles-value", Schema(json.dumps(V1), "AVRO"))
    second = client.register_schema("profiles-value", Schema(json.dumps(V2), "AVRO"))
    assert first != second
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("profiles-value", Schema(json.dumps(BREAKS), "AVRO"))
    assert refused.value.http_status_code == 409
    assert "age" in str(refused.value)
    client.set_compatibility("other-value", "NONE")
    req = urllib.request.Request(
        f"{url}/config",
        data=b'{"compatibility": "FULL"}',
        method="PUT",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    urllib.request.urlopen(req, timeout=10).close()

    assert _lakehouse(home, "registry", "stop").returncode == 0
    assert not alive(pid)
    again = _lakehouse(home, "registry", "start")
    assert again.returncode == 0, again.stderr[-3000:]
    client = SchemaRegistryClient({"url": registry.url(settings)})
    assert client.get_versions("profiles-value") == [1, 2]
    assert client.get_latest_version("profiles-value").schema_id == second
    assert json.loads(client.get_schema(first).schema_str) == V1
    assert client.get_compatibility("other-value") == "NONE"
    assert _config(url) == "FULL"  # the API's setting outranks the default set at start


def test_status_and_stop_say_when_it_is_not_running(tmp_path: Path) -> None:
    """Down, status exits 1 and says how to start it; stop says it was not running; a client
    asking for its URL gets the same sentence."""
    status = _lakehouse(tmp_path, "registry", "status")
    assert status.returncode == 1
    assert "not running" in status.stdout and "lakehouse registry start" in status.stdout
    stopped = _lakehouse(tmp_path, "registry", "stop")
    assert stopped.returncode == 0 and "was not running" in stopped.stdout
    with pytest.raises(registry.RegistryError, match="lakehouse registry start"):
        registry.url(Settings.from_env(home=tmp_path))
