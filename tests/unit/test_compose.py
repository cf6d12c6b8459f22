"""Static checks of docker-compose.yml, the Dockerfile and .env.example.

No Docker engine is needed: the files are parsed, and what the stack relies on at run time (one
image, one lakehouse root at one path, a reachable Spark master, secrets only from .env) is
checked on the parsed text.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERIGNORE = ROOT / ".dockerignore"

SERVICES = {
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "spark-master",
    "spark-worker-1",
    "spark-worker-2",
}
SECRET_WORDS = ("PASSWORD", "SECRET", "FERNET", "KEY")
# `${NAME}`, `${NAME:-default}`, `${NAME:?error}` ... (after `$$` escapes are removed)
SUBSTITUTION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
REQUIRED_SUBSTITUTION = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?\?[^}]*\}")
# A pinned official image: no registry or owner prefix, a tag that starts with a version number.
OFFICIAL_PINNED_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._-]*:\d[\w.-]*$")


# -- helpers: docker-compose.yml --------------------------------------------------------------
@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def project_services(prefixes: tuple[str, ...] = ("airflow-", "spark-")) -> dict[str, dict]:
    return {name: svc for name, svc in services().items() if name.startswith(prefixes)}


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


def option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args else default


def has_healthcheck(service: dict[str, Any]) -> bool:
    check = service.get("healthcheck") or {}
    return bool(check.get("test")) and not check.get("disable", False)


def host_ports(service: dict[str, Any]) -> list[str]:
    ports = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports.append(str(port.get("published")))
        elif ":" in str(port):
            ports.append(str(port).split(":")[-2])
    return ports


def strings(node: Any) -> list[str]:
    """Every string value in a parsed YAML tree (comments are not interpolated, so not here)."""
    if isinstance(node, dict):
        return [text for value in node.values() for text in strings(value)]
    if isinstance(node, list):
        return [text for value in node for text in strings(value)]
    return [node] if isinstance(node, str) else []


def substitutions(node: Any) -> set[str]:
    return {name for text in strings(node) for name in SUBSTITUTION.findall(text.replace("$$", ""))}


# -- helpers: Dockerfile and .env.example -----------------------------------------------------
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


def dockerfile_copies() -> dict[str, PurePosixPath]:
    """``{source in the repo: absolute path in the image}`` for every COPY from the context."""
    copied: dict[str, PurePosixPath] = {}
    workdir = PurePosixPath("/")
    for instruction, args in dockerfile_instructions():
        if instruction == "WORKDIR":
            workdir = workdir / args
        if instruction != "COPY" or "--from=" in args:
            continue
        *sources, dest = [token for token in shlex.split(args) if not token.startswith("--")]
        target = workdir / dest
        for source in sources:
            into_dir = (ROOT / source).is_file() and (dest.endswith("/") or len(sources) > 1)
            copied[source.rstrip("/")] = target / PurePosixPath(source).name if into_dir else target
    return copied


def env_example() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    )
    return {key.strip(): value.strip() for key, value in pairs}


def is_secret_name(name: str) -> bool:
    # A variable naming a file (`..._FILE`) holds a path, not the secret itself.
    return any(word in name.upper() for word in SECRET_WORDS) and not name.endswith("_FILE")


# -- docker-compose.yml -----------------------------------------------------------------------
def test_compose_file_parses_into_the_expected_services() -> None:
    assert isinstance(compose(), dict)
    assert set(services()) == SERVICES


def test_every_service_builds_the_project_image_or_pins_an_official_one() -> None:
    problems = []
    for name, svc in services().items():
        build = svc.get("build")
        if build is not None:
            spec = {"context": build} if isinstance(build, str) else build
            dockerfile = ROOT / spec.get("context", ".") / spec.get("dockerfile", "Dockerfile")
            if spec.get("context") != "." or dockerfile.resolve() != DOCKERFILE:
                problems.append(f"{name} builds {spec}, not the project's Dockerfile")
        elif not OFFICIAL_PINNED_IMAGE.match(svc.get("image", "")):
            problems.append(f"{name} uses image {svc.get('image')!r}: pin an official version")
    assert problems == []
    assert services()["postgres"]["image"].startswith("postgres:")


def test_every_named_volume_is_declared() -> None:
    declared = set(compose().get("volumes") or {})
    used = {vol: name for name, svc in services().items() for vol in named_mounts(svc)}
    assert {vol for vol in used if vol not in declared} == set()
    assert "lakehouse" in declared


def test_depends_on_names_existing_services_with_health_checks_where_needed() -> None:
    problems = []
    for name, svc in services().items():
        for dep, condition in dependencies(svc).items():
            if dep not in services():
                problems.append(f"{name} depends on unknown service {dep}")
            elif condition == "service_healthy" and not has_healthcheck(services()[dep]):
                problems.append(f"{name} waits for {dep} to be healthy, which has no healthcheck")
    assert problems == []
    assert dependencies(services()["airflow-scheduler"])["airflow-init"] == (
        "service_completed_successfully"
    )


def test_postgres_api_server_and_spark_master_have_health_checks() -> None:
    for name in ("postgres", "airflow-apiserver", "spark-master"):
        assert has_healthcheck(services()[name]), name


def test_no_two_services_publish_the_same_host_port() -> None:
    published = [port for svc in services().values() for port in host_ports(svc)]
    assert len(published) == len(set(published)), published


def test_lakehouse_volume_is_mounted_at_lakehouse_home_in_every_airflow_and_spark_service() -> None:
    home = dockerfile_env()["LAKEHOUSE_HOME"]
    for name, svc in project_services().items():
        assert named_mounts(svc).get("lakehouse") == home, name
        assert environment(svc).get("LAKEHOUSE_HOME", home) == home, name


def test_spark_workers_point_at_the_master_service_and_port() -> None:
    master = command(services()["spark-master"])
    assert "org.apache.spark.deploy.master.Master" in master
    url = f"spark://spark-master:{option(master, '--port', '7077')}"
    workers = project_services(("spark-worker-",))
    assert len(workers) >= 2
    for name, svc in workers.items():
        assert "org.apache.spark.deploy.worker.Worker" in command(svc), name
        assert url in command(svc), name
        assert "spark-master" in dependencies(svc), name


def test_airflow_spark_connection_points_at_the_master() -> None:
    master_url = (
        f"spark://spark-master:{option(command(services()['spark-master']), '--port', '7077')}"
    )
    for name, svc in project_services(("airflow-",)).items():
        conn = json.loads(environment(svc)["AIRFLOW_CONN_LAKEHOUSE_SPARK"] or "{}")
        assert (conn["conn_type"], f"{conn['host']}:{conn['port']}") == ("spark", master_url), name


def test_secrets_are_required_substitutions_never_literals() -> None:
    literals = []
    for name, svc in services().items():
        for key, value in environment(svc).items():
            if (
                value is not None
                and is_secret_name(key)
                and not REQUIRED_SUBSTITUTION.fullmatch(value)
            ):
                literals.append(f"{name}: {key}={value}")
            # A password inside a URL (scheme://user:password@host) counts too.
            for password in re.findall(r"://[^/@:\s]*:([^@\s]*)@", value or ""):
                if not REQUIRED_SUBSTITUTION.fullmatch(password):
                    literals.append(f"{name}: {key} has a literal password in its URL")
    assert literals == []


def test_every_substitution_is_listed_in_env_example_and_vice_versa() -> None:
    used = substitutions(compose())
    listed = set(env_example())
    assert used - listed == set(), "add these to .env.example"
    assert listed - used == set(), "unused in docker-compose.yml"


def test_env_example_holds_placeholders_not_secrets() -> None:
    secrets = {key: value for key, value in env_example().items() if is_secret_name(key)}
    assert secrets, "expected the compose file's secrets in .env.example"
    assert {key for key, value in secrets.items() if value != "change-me"} == set()


# -- Dockerfile -------------------------------------------------------------------------------
def test_dockerfile_copies_only_sources_that_exist_and_are_not_ignored() -> None:
    copied = dockerfile_copies()
    assert {"requirements.lock", "pyproject.toml", "include", "dags", "jobs", "contracts"} <= set(
        copied
    )
    assert [source for source in copied if not (ROOT / source).exists()] == []
    ignored = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()}
    assert set(copied) & ignored == set()
    assert {".env", ".venv", ".git"} <= ignored


def test_dags_jobs_and_contracts_sit_beside_the_package_in_the_image() -> None:
    # lakehouse.config.REPO_ROOT is parents[2] of include/lakehouse/config.py.
    copied = dockerfile_copies()
    project = copied["include"].parent
    assert {copied[folder].parent for folder in ("dags", "jobs", "contracts")} == {project}
    wanted = {
        "AIRFLOW__CORE__DAGS_FOLDER": str(copied["dags"]),
        "LAKEHOUSE_CONTRACTS": str(copied["contracts"]),
    }
    for key, path in wanted.items():
        assert dockerfile_env()[key] == path, key
        for name, svc in project_services().items():
            assert environment(svc).get(key, path) == path, (name, key)


def test_dockerfile_sets_the_shared_paths_and_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim-bookworm")
    env = dockerfile_env()
    assert env["LAKEHOUSE_HOME"] == "/lakehouse"
    assert env["AIRFLOW_HOME"] == "/opt/airflow"
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == "/usr/local/bin/python"
    # pip puts pyspark (and its bin/spark-class) in the base image's site-packages.
    assert env["SPARK_HOME"] == "/usr/local/lib/python3.11/site-packages/pyspark"
    users = [args for instruction, args in instructions if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}


def test_spark_services_run_spark_class_from_the_image() -> None:
    for name, svc in project_services(("spark-",)).items():
        assert command(svc)[0] == "/usr/local/bin/spark-class", name


def test_the_compose_schedulers_hand_off_tasks_as_soon_as_the_local_airflow(
    tmp_path: Path,
) -> None:
    """The scheduler's idle sleep (how late a finished task is noticed) is the same in the
    compose stack as in ``make airflow``'s environment."""
    from lakehouse.airflow_env import airflow_environment
    from lakehouse.config import Settings

    key = "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"
    local = airflow_environment(Settings.from_env(tmp_path, ROOT / "contracts"), {})
    assert environment(services()["airflow-scheduler"])[key] == local[key] == "0.5"


def test_the_image_copies_the_jvm_jars_where_jobs_look_for_them() -> None:
    """`lakehouse.jvm.jars_dir` is the interpreter's prefix's ``jars``: /usr/local/jars in the
    image. Maven is installed, the jars are copied there by make's own step (before the image
    switches to its non-root user), and checked against the lock once the package is in."""
    instructions = dockerfile_instructions()
    runs = [i for i, (instruction, _) in enumerate(instructions) if instruction == "RUN"]
    apt = [i for i in runs if "apt-get install" in instructions[i][1]]
    copy = [i for i in runs if "include/jvm/copy-jars.sh /usr/local/jars" in instructions[i][1]]
    install = [i for i in runs if "pip install --no-cache-dir --no-deps -e ." in instructions[i][1]]
    check = [i for i in runs if "python -m lakehouse.jvm" in instructions[i][1]]
    user = [i for i, (instruction, _) in enumerate(instructions) if instruction == "USER"]
    assert apt and " maven" in instructions[apt[0]][1]
    assert len(copy) == 1 and len(check) == 1 and install and user
    assert apt[0] < copy[0] < check[0] < user[-1]
    assert install[0] <= check[0]
    assert "include/jvm" in dockerfile_copies()
    assert "include/jvm/copy-jars.sh $(JARS)" in (ROOT / "Makefile").read_text()
    # The broker's jars beside them, where lakehouse.jvm.kafka_jars_dir looks, checked too.
    broker = "include/jvm/copy-jars.sh /usr/local/kafka-jars include/jvm/kafka/pom.xml"
    assert broker in instructions[copy[0]][1]
    assert "python -m lakehouse.jvm kafka" in instructions[check[0]][1]
