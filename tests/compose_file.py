"""docker-compose.yml, the Dockerfile and .env.example as the tests read them (imported by name:
``from compose_file import ...``): the parsed files, each service's command and environment as
compose gives them (:func:`interpolate`: compose's variable substitution from a .env), and a
.env filled in as a user fills it (:func:`filled_env`).

Used by tests/unit/test_compose.py (each service through the platform's start-up checks) and
tests/e2e/test_records_start_runs.py (the stack run for real on this machine, from the same
settings).
"""

from __future__ import annotations

import re
import secrets
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
PLACEHOLDER = "change-me"
# `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `${NAME?error}`
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


# -- docker-compose.yml -----------------------------------------------------------------------
@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def environment(service: dict[str, Any]) -> dict[str, str | None]:
    """A service's environment, whichever of compose's two forms (mapping or list) it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {key: None if value is None else str(value) for key, value in env.items()}


def named_mounts(service: dict[str, Any]) -> dict[str, str]:
    """``{volume name: path in the container}`` for the named volumes a service mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume.get("source"), volume["target"]
        else:
            source, _, rest = volume.partition(":")
            target = rest.split(":")[0]
        if source and not source.startswith((".", "/", "~", "$")):
            mounts[source] = target
    return mounts


def dependencies(service: dict[str, Any]) -> dict[str, str]:
    """``{service: condition}`` of a service's depends_on (list form means service_started)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(arg) for arg in cmd]


def published(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``{host port: (host address or "", container port)}`` of a service's published ports."""
    ports = {}
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports[str(port["published"])] = (port.get("host_ip", ""), str(port["target"]))
        else:
            *address, host, container = str(port).split(":")
            ports[host] = (":".join(address), container.split("/")[0])
    return ports


# -- Dockerfile and .env.example --------------------------------------------------------------
@cache
def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    lines = [
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for parts in (line.strip().split(None, 1) for line in joined.splitlines() if line.strip())
    ]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for instruction, args in dockerfile_instructions():
        if instruction == "ENV":
            env.update(token.split("=", 1) for token in shlex.split(args))
    return env


def env_example() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


def filled_env() -> dict[str, str]:
    """.env.example with every placeholder replaced as its comments say, as a user's .env
    would be: a Fernet key, the lakehouse's access key name, and `openssl rand -hex 32`."""
    from cryptography.fernet import Fernet

    def secret(key: str) -> str:
        if key == "AIRFLOW__CORE__FERNET_KEY":
            return Fernet.generate_key().decode()
        return "lakehouse" if key == "AWS_ACCESS_KEY_ID" else secrets.token_hex(32)

    return {k: secret(k) if v == PLACEHOLDER else v for k, v in env_example().items()}


# -- what compose gives a service -------------------------------------------------------------
def interpolate(node: Any, dotenv: dict[str, str]) -> Any:
    """A parsed compose tree with its variables substituted from ``dotenv`` as compose does;
    a required variable that is unset fails the test with compose's own message."""
    if isinstance(node, dict):
        return {key: interpolate(value, dotenv) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, dotenv) for value in node]
    if not isinstance(node, str):
        return node

    def value(match: re.Match[str]) -> str:
        name, kind, word = match.groups()
        got = dotenv.get(name)
        empty = got is None or (got == "" and kind is not None and kind.startswith(":"))
        if kind and kind.endswith("?") and empty:
            raise AssertionError(f"compose refuses to start: {word}")
        if kind and kind.endswith("-") and empty:
            return word
        return got or ""

    parts = node.split("$$")
    return "$".join(INTERPOLATION.sub(value, part) for part in parts)


def service(name: str, dotenv: dict[str, str]) -> dict[str, Any]:
    """Service ``name`` as compose runs it with ``dotenv`` as its .env."""
    return dict(interpolate(services()[name], dotenv))


def container_env(name: str, dotenv: dict[str, str]) -> dict[str, str]:
    """What a process of service ``name`` finds in its environment: the image's ENV, then the
    service's environment as compose substitutes it."""
    own = {k: v for k, v in environment(service(name, dotenv)).items() if v is not None}
    return {**dockerfile_env(), **own}
