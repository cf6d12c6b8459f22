"""docker-compose.yml, the Dockerfile and .env.example, without a Docker engine.

The files are parsed, each service's command and environment are taken as compose would give
them (its variables substituted from .env.example, placeholders and all, or from a filled copy)
and run through the platform's own start-up checks: the deployment check every service waits
for, `lakehouse airflow`'s environment, the Spark server's settings and the layer task's
commit-safety check. What the stack relies on besides (one image, one lakehouse home, the data
in the bucket the stack creates, the broker, secrets only from .env) is checked on the parsed
files.

The files are read through tests/compose_file.py, shared with the end-to-end test that runs the
stack on this machine from the same settings (tests/e2e/test_records_start_runs.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

from compose_file import (
    COMPOSE,
    DOCKERFILE,
    ROOT,
    command,
    compose,
    container_env,
    dependencies,
    dockerfile_env,
    dockerfile_instructions,
    env_example,
    environment,
    filled_env,
    interpolate,
    named_mounts,
    published,
    services,
)

DOCKERIGNORE = ROOT / ".dockerignore"
KAFKA_POM = ROOT / "include" / "jvm" / "kafka" / "pom.xml"
# What `make install` installs besides Python packages, each named by the file that locks it.
MAKE_INPUTS = (
    "include/jvm/pom.xml",
    "include/jvm/kafka/pom.xml",
    "include/jvm/openlineage/pom.xml",
    "include/web/package-lock.json",
)
COPY_JARS = "include/jvm/copy-jars.sh"

SERVICES = {
    "postgres",
    "minio",
    "minio-init",
    "kafka",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "config-check",
    "spark-server",
    "spark-readers",
    "schema-registry",
}
SECRET_WORDS = ("PASSWORD", "SECRET", "FERNET", "KEY")
# `${NAME}`, `${NAME:-default}`, `${NAME:?error}` ... (after `$$` escapes are removed)
SUBSTITUTION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
REQUIRED_SUBSTITUTION = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?\?[^}]*\}")
# A pinned official image: no registry or owner prefix, a tag that starts with a version number.
OFFICIAL_PINNED_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._-]*:\d[\w.-]*$")
# Images from their publisher's own repository, each with the form of tag its releases have.
MINIO_RELEASE = re.compile(r"RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ")
PUBLISHER_IMAGES = {
    "quay.io/minio/minio": MINIO_RELEASE,
    "quay.io/minio/mc": MINIO_RELEASE,
    "apache/kafka": re.compile(r"4\.\d+\.\d+"),
    "apicurio/apicurio-registry": re.compile(r"3\.\d+\.\d+"),
}
REGISTRY_POM = ROOT / "include" / "jvm" / "registry" / "pom.xml"
# Where the data lives and how to reach it: the same in every service that runs lakehouse code.
STORE_SETTINGS = (
    "LAKEHOUSE_DATA",
    "LAKEHOUSE_S3_ENDPOINT",
    "LAKEHOUSE_S3_PATH_STYLE",
    "LAKEHOUSE_S3_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
)
# What each service that runs lakehouse code waits for (airflow-init only migrates Airflow's
# database).
STORE_AND_BROKER = {
    "minio": "service_healthy",
    "minio-init": "service_completed_successfully",
    "kafka": "service_healthy",
}
# A shell variable in a script, after compose's `$$` escapes are undone.
SHELL_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


# -- helpers: docker-compose.yml --------------------------------------------------------------
def project_services(prefixes: tuple[str, ...] = ("airflow-", "spark-")) -> dict[str, dict]:
    """The services of the pipeline's side that run lakehouse code (the readers' server, which
    shares none of their settings or secrets, has tests of its own)."""
    return {
        name: svc
        for name, svc in services().items()
        if name.startswith(prefixes) and name != READERS
    }


READERS = "spark-readers"


def option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args else default


def has_healthcheck(service: dict[str, Any]) -> bool:
    check = service.get("healthcheck") or {}
    return bool(check.get("test")) and not check.get("disable", False)


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """Kafka's ``NAME://host:port,...`` as ``{NAME: (host, port)}`` (host "" for every interface)."""
    found = {}
    for item in value.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        found[name] = (host, int(port))
    return found


def script_commands(service: dict[str, Any]) -> list[list[str]]:
    """Each line of the shell script a service runs, split into words, compose's ``$$`` escapes
    undone (so ``$${VAR}`` reads ``${VAR}``, what the shell gets)."""
    lines = (line for text in command(service) for line in text.replace("$$", "$").splitlines())
    return [shlex.split(line) for line in lines if line.strip()]


def expand(word: str, env: dict[str, str | None]) -> str:
    """``word`` with each shell variable replaced by its value in the service's environment (as
    written in the compose file); a variable the service does not set fails the test."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert env.get(name) is not None, f"the script reads ${name}, which the service lacks"
        return str(env[name])

    return SHELL_VARIABLE.sub(value, word)


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


def run_steps() -> list[tuple[int, list[str]]]:
    """Each command of the Dockerfile's RUN instructions (split at ``&&``) as words, with the
    index of its instruction."""
    return [
        (i, shlex.split(part))
        for i, (instruction, args) in enumerate(dockerfile_instructions())
        if instruction == "RUN"
        for part in args.split("&&")
    ]


def make_install_commands() -> list[list[str]]:
    """The commands `make install` runs for the JVM jars and the web assets, as ``make -n``
    prints them (each as words; a line's commands split at ``&&``) when their locks are newer
    than what is installed."""
    touched = [arg for path in MAKE_INPUTS for arg in ("-W", path)]
    done = subprocess.run(
        ["make", "-n", *touched, "install"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.replace("\\\n", " ").splitlines()
    return [
        shlex.split(part)
        for line in lines
        if line.strip() and not line.lstrip().startswith("#")
        for part in line.split("&&")
    ]


def is_secret_name(name: str) -> bool:
    # A variable naming a file (`..._FILE`) holds a path, not the secret itself.
    return any(word in name.upper() for word in SECRET_WORDS) and not name.endswith("_FILE")


# -- docker-compose.yml -----------------------------------------------------------------------
def test_compose_file_parses_into_the_expected_services() -> None:
    assert isinstance(compose(), dict)
    assert set(services()) == SERVICES


def test_every_service_builds_the_project_image_or_pins_a_release() -> None:
    problems = []
    for name, svc in services().items():
        build = svc.get("build")
        image = svc.get("image", "")
        repository, _, tag = image.rpartition(":")
        if build is not None:
            spec = {"context": build} if isinstance(build, str) else build
            dockerfile = ROOT / spec.get("context", ".") / spec.get("dockerfile", "Dockerfile")
            if spec.get("context") != "." or dockerfile.resolve() != DOCKERFILE:
                problems.append(f"{name} builds {spec}, not the project's Dockerfile")
        elif repository in PUBLISHER_IMAGES:
            if not PUBLISHER_IMAGES[repository].fullmatch(tag):
                problems.append(f"{name} uses image {image!r}: pin one of its releases")
        elif not OFFICIAL_PINNED_IMAGE.match(image):
            problems.append(f"{name} uses image {image!r}: pin an official version")
    assert problems == []
    assert services()["postgres"]["image"].startswith("postgres:")
    assert "latest" not in {svc.get("image", "").rpartition(":")[2] for svc in services().values()}


def test_the_broker_image_is_the_kafka_version_of_the_local_broker() -> None:
    """The compose broker and `lakehouse kafka start`'s (from include/jvm/kafka/pom.xml) are the
    same Kafka release, so a topic behaves the same on either."""
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", KAFKA_POM.read_text())
    assert found and found[1].startswith("4.")
    assert services()["kafka"]["image"] == f"apache/kafka:{found[1]}"


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


def test_postgres_api_server_and_spark_server_have_health_checks() -> None:
    for name in ("postgres", "airflow-apiserver", "spark-server", READERS):
        assert has_healthcheck(services()[name]), name


def test_no_two_services_publish_the_same_host_port() -> None:
    published = [port for svc in services().values() for port in host_ports(svc)]
    assert len(published) == len(set(published)), published


def test_lakehouse_volume_is_mounted_at_lakehouse_home_in_every_airflow_and_spark_service() -> None:
    home = dockerfile_env()["LAKEHOUSE_HOME"]
    for name, svc in project_services().items():
        assert named_mounts(svc).get("lakehouse") == home, name
        assert environment(svc).get("LAKEHOUSE_HOME", home) == home, name


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


def test_credentials_reach_scripts_only_through_variables_from_env() -> None:
    """The bucket's set-up script logs in and makes the lakehouse's and the readers' users with
    variables of its service, each one substituted from .env (required when secret): no credential is written in
    the file. MinIO's administrator password reaches MinIO and that script only."""
    init = services()["minio-init"]
    env = environment(init)
    words = []
    for args in script_commands(init):
        if args[:3] == ["mc", "alias", "set"]:
            words += args[5:7]
        if args[:4] == ["mc", "admin", "user", "add"]:
            words += args[5:7]
    # The administrator's login, the lakehouse's user and the readers' user.
    assert len(words) == 6, "expected `mc alias set` and two `mc admin user add` with credentials"
    for word in words:
        variable = SHELL_VARIABLE.fullmatch(word)
        assert variable, f"{word!r} is written in the script, not read from a variable"
        name = variable.group(1) or variable.group(2)
        value = env.get(name) or ""
        assert SUBSTITUTION.match(value), f"{name}={value!r} is not substituted from .env"
        if is_secret_name(name):
            assert REQUIRED_SUBSTITUTION.fullmatch(value), f"{name}={value!r} has a default"
    holders = {
        name for name, svc in services().items() if "MINIO_ROOT_PASSWORD" in substitutions(svc)
    }
    assert holders == {"minio", "minio-init", "config-check"}
    assert "minioadmin" not in COMPOSE.read_text().lower()  # MinIO's well-known default


def test_the_readers_server_holds_none_of_the_pipelines_credentials_or_files(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The readers' container gets the readers' store user only (read-only on the bucket), a
    home volume of its own (its token, the readers' warehouse), and none of the pipeline's
    credentials, tokens, database password or volumes; its Spark gets the readers' keys as its
    S3 credentials."""
    svc = services()[READERS]
    env = environment(svc)
    pipeline_secrets = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "LAKEHOUSE_METASTORE_URL"}
    assert pipeline_secrets.isdisjoint(env), env
    assert not any(key.startswith(("POSTGRES", "MINIO", "AIRFLOW")) for key in env), env
    assert set(named_mounts(svc)) == {"readers-home"}
    assert named_mounts(svc)["readers-home"] == env["LAKEHOUSE_HOME"]
    for key in ("LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID", "LAKEHOUSE_READERS_AWS_SECRET_ACCESS_KEY"):
        assert REQUIRED_SUBSTITUTION.fullmatch(env[key] or ""), key
    from lakehouse.runtime import readers
    from lakehouse.runtime.config import Settings

    dotenv = filled_env()
    for key, value in container_env(READERS, dotenv).items():
        monkeypatch.setenv(key, value)
    settings = Settings.from_env(tmp_path / "readers", ROOT / "contracts")
    given: dict[str, str] = {}
    said = readers.ReadersServer(settings)._s3_credentials(given)
    assert given == {
        "AWS_ACCESS_KEY_ID": dotenv["LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": dotenv["LAKEHOUSE_READERS_AWS_SECRET_ACCESS_KEY"],
    }
    assert "readers' own credentials" in str(said)


def test_minio_init_gives_the_readers_user_reads_of_the_bucket_only() -> None:
    """The policy minio-init attaches to the readers' access key (the JSON its script writes
    to the file it creates the policy from) lists and reads the lakehouse's bucket, nothing
    else: no put, delete or any other action."""
    init = services()["minio-init"]
    env = environment(init)
    commands = [[expand(word, env) for word in args] for args in script_commands(init)]
    key = environment(services()[READERS])["LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID"]
    created = {
        args[5]: args[6] for args in commands if args[:4] == ["mc", "admin", "policy", "create"]
    }
    (attached,) = [
        args[5]
        for args in commands
        if args[:4] == ["mc", "admin", "policy", "attach"] and args[args.index("--user") + 1] == key
    ]
    written = {args[-1]: args[2] for args in commands if args[0] == "printf" and args[-2] == ">"}
    (statement,) = json.loads(written[created[attached]])["Statement"]
    assert statement["Effect"] == "Allow"
    assert set(statement["Action"]) == {"s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"}
    assert set(statement["Resource"]) == {"arn:aws:s3:::lakehouse", "arn:aws:s3:::lakehouse/*"}


# -- the S3 store and the Kafka broker --------------------------------------------------------
def test_every_service_running_lakehouse_code_has_the_same_store_and_broker_settings() -> None:
    from lakehouse.topics.kafka import BOOTSTRAP_ENV

    names = (*STORE_SETTINGS, BOOTSTRAP_ENV)
    settings = {
        name: {key: environment(svc).get(key) for key in names}
        for name, svc in project_services().items()
    }
    assert len({json.dumps(each, sort_keys=True) for each in settings.values()}) == 1, settings
    shared = settings["airflow-scheduler"]
    assert [key for key, value in shared.items() if not value] == []
    data = urlsplit(shared["LAKEHOUSE_DATA"] or "")
    assert data.scheme == "s3" and data.netloc and data.path.strip("/"), "s3://<bucket>/<prefix>"
    assert shared["LAKEHOUSE_S3_PATH_STYLE"] == "true"
    assert shared["LAKEHOUSE_S3_REGION"] == "us-east-1"
    # The home stays a local folder (Airflow's, the Spark server's files).
    for name, svc in project_services().items():
        assert "://" not in (environment(svc).get("LAKEHOUSE_HOME") or ""), name


def test_services_running_lakehouse_code_wait_for_the_store_its_bucket_and_the_broker() -> None:
    for name, svc in project_services().items():
        if name == "airflow-init":
            continue
        deps = dependencies(svc)
        assert {dep: deps.get(dep) for dep in STORE_AND_BROKER} == STORE_AND_BROKER, name
    assert dependencies(services()["minio-init"]) == {"minio": "service_healthy"}
    assert has_healthcheck(services()["minio"]) and has_healthcheck(services()["kafka"])
    assert services()["minio-init"].get("restart") == "no"


def test_the_s3_endpoint_is_the_minio_service_in_the_same_region() -> None:
    shared = environment(services()["airflow-scheduler"])
    endpoint = urlsplit(shared["LAKEHOUSE_S3_ENDPOINT"] or "")
    minio = services()["minio"]
    api_port = option(command(minio), "--address", ":9000").rpartition(":")[2]
    assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "minio", int(api_port))
    assert environment(minio)["MINIO_SITE_REGION"] == shared["LAKEHOUSE_S3_REGION"]
    assert "minio-data" in named_mounts(minio)


def test_the_bucket_in_lakehouse_data_is_the_one_minio_init_creates_and_allows() -> None:
    """minio-init logs in at the services' endpoint, makes the bucket of LAKEHOUSE_DATA, and
    gives the services' access key a policy over that bucket and nothing else."""
    shared = environment(services()["airflow-scheduler"])
    bucket = urlsplit(shared["LAKEHOUSE_DATA"] or "").netloc
    init = services()["minio-init"]
    env = environment(init)
    commands = [[expand(word, env) for word in args] for args in script_commands(init)]
    logins = [args for args in commands if args[:3] == ["mc", "alias", "set"]]
    assert [args[4] for args in logins] == [shared["LAKEHOUSE_S3_ENDPOINT"]]
    alias = logins[0][3]
    made = [args[-1] for args in commands if args[:2] == ["mc", "mb"]]
    assert made == [f"{alias}/{bucket}"]
    users = [args[4:7] for args in commands if args[:4] == ["mc", "admin", "user", "add"]]
    reading = environment(services()[READERS])
    assert users == [
        [alias, shared["AWS_ACCESS_KEY_ID"], shared["AWS_SECRET_ACCESS_KEY"]],
        [
            alias,
            reading["LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID"],
            reading["LAKEHOUSE_READERS_AWS_SECRET_ACCESS_KEY"],
        ],
    ]
    # The policy: the JSON the script writes to the file it creates the policy from, attached
    # to that user.
    created = {
        args[5]: args[6] for args in commands if args[:4] == ["mc", "admin", "policy", "create"]
    }
    attached = [
        args[5]
        for args in commands
        if args[:4] == ["mc", "admin", "policy", "attach"]
        and args[args.index("--user") + 1] == shared["AWS_ACCESS_KEY_ID"]
    ]
    assert len(attached) == 1 and attached[0] in created
    written = {args[-1]: args[2] for args in commands if args[0] == "printf" and args[-2] == ">"}
    policy = json.loads(written[created[attached[0]]])
    resources = {r for statement in policy["Statement"] for r in statement["Resource"]}
    assert resources == {f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"}
    assert {statement["Effect"] for statement in policy["Statement"]} == {"Allow"}


def test_the_broker_runs_with_the_local_brokers_settings() -> None:
    """Each of lakehouse.runtime.broker's settings as the image's KAFKA_* variable: no topic created by a
    client, records kept until deleted, one replica and partition for internal topics. The
    listeners' map has one listener more here (the host's), checked below."""
    from lakehouse.runtime.broker import _SETTINGS as LOCAL_BROKER

    wanted = {
        "KAFKA_" + key.upper().replace(".", "_"): value
        for key, value in LOCAL_BROKER.items()
        if key != "listener.security.protocol.map"
    }
    env = environment(services()["kafka"])
    assert {key: env.get(key) for key in wanted} == wanted
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_LOG_RETENTION_MS"] == "-1"
    assert named_mounts(services()["kafka"]).get("kafka-data") == env["KAFKA_LOG_DIRS"]


def test_services_and_the_host_reach_the_broker_where_it_advertises_itself() -> None:
    from lakehouse.topics.kafka import BOOTSTRAP_ENV

    kafka = services()["kafka"]
    env = environment(kafka)
    bound = listeners(env["KAFKA_LISTENERS"] or "")
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"] or "")
    protocol_map = env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] or ""
    protocols = dict(item.split(":") for item in protocol_map.split(","))
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert set(bound) == set(protocols) and set(advertised) == set(bound) - {controller}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == (
        f"{env['KAFKA_NODE_ID']}@kafka:{bound[controller or ''][1]}"
    )
    # Inside the compose network: the inter-broker listener, at the service's name, is what
    # every service is given as the bootstrap servers and what the health check asks.
    inside = env["KAFKA_INTER_BROKER_LISTENER_NAME"] or ""
    assert advertised[inside] == ("kafka", bound[inside][1])
    for name, svc in project_services().items():
        assert environment(svc)[BOOTSTRAP_ENV] == f"kafka:{bound[inside][1]}", name
    assert f"localhost:{bound[inside][1]}" in kafka["healthcheck"]["test"]
    # From the host: each other listener advertises localhost and a published port that leads
    # to it.
    ports = published(kafka)
    for name, (host, port) in advertised.items():
        if name != inside:
            assert host == "localhost", name
            assert ports[str(port)][1] == str(bound[name][1]), name


# -- each service's start-up, through the platform's own checks --------------------------------
def started_with(name: str) -> list[str]:
    """The lakehouse command a service starts with (for a script, its line that runs one)."""
    args = command(services()[name])
    if args[:1] == ["bash"]:
        lines = [line for line in script_commands(services()[name]) if line[0] == "lakehouse"]
        assert len(lines) == 1, (name, lines)
        return lines[0]
    return args


def start_up(name: str, dotenv: dict[str, str], tmp_path: Path, monkeypatch: Any) -> Any:
    """Run the platform's start-up checks of service ``name`` with its command and environment:
    the deployment check, `lakehouse airflow`'s environment (and, for the scheduler, the layer
    tasks' connection and commit-safety check), or the Spark server's settings. Returns what
    the check made (the Airflow environment, the server's settings) or None."""
    from lakehouse.orchestration.airflow_env import SPARK_CONN_ENV, airflow_environment
    from lakehouse.orchestration.operators import preflight
    from lakehouse.runtime import deployment, objectstore, server
    from lakehouse.runtime.config import Settings

    env = container_env(name, dotenv)
    for key in list(os.environ):
        if key.startswith(("LAKEHOUSE_", "AIRFLOW", "AWS_")):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    objectstore.reset()
    args = started_with(name)
    if args == ["python", "-m", "lakehouse.runtime.deployment"]:
        deployment.check_environment(env)
        return None
    # The container's home is a volume at /lakehouse: here, a folder of the test's.
    settings = Settings.from_env(tmp_path / name, ROOT / "contracts", env["LAKEHOUSE_DATA"])
    if args[:2] == ["lakehouse", "airflow"]:
        made = airflow_environment(settings, base=env)
        connection = json.loads(made[SPARK_CONN_ENV])
        preflight(connection["conn_type"], settings, {})
        return made
    deployment.check_environment(env)
    if args == ["lakehouse", "spark", "run", "--only", "readers"]:
        from lakehouse.runtime import readers

        reading = readers.ReadersServer(settings, catalog_port=server._catalog_port(settings))
        return reading.conf(reading.ports())
    assert args == ["lakehouse", "spark", "run", "--only", "pipeline"], (name, args)
    return server.server_conf(settings, server.port(), server.CATALOG_PORT.value())


def lakehouse_services() -> list[str]:
    return sorted(name for name, svc in services().items() if "build" in svc)


def test_every_service_starts_with_a_filled_env(tmp_path: Path, monkeypatch: Any) -> None:
    """With the placeholders replaced, each service of the project's image passes its start-up
    checks; the scheduler's layer tasks are clients of the Spark server on localhost (the only
    host Spark's client sends the token to without TLS: the scheduler shares the server's network
    namespace), so the data in the bucket has one committing driver and the commit-safety check
    passes; the server listens on its loopback only, in local mode."""
    dotenv = filled_env()
    made = {name: start_up(name, dotenv, tmp_path, monkeypatch) for name in lakehouse_services()}
    assert set(made) == {
        "airflow-apiserver",
        "airflow-dag-processor",
        "airflow-init",
        "airflow-scheduler",
        "airflow-triggerer",
        "config-check",
        "spark-server",
        "spark-readers",
    }
    connection = json.loads(made["airflow-scheduler"]["AIRFLOW_CONN_LAKEHOUSE_SPARK"])
    token = (tmp_path / "airflow-scheduler" / "spark" / "token").read_text().strip()
    assert connection == {
        "conn_type": "spark_connect",
        "host": "localhost",
        "port": 15002,
        "password": token,
    }
    assert services()["airflow-scheduler"]["network_mode"] == "service:spark-server"
    assert dependencies(services()["airflow-scheduler"])["spark-server"] == "service_healthy"
    conf = made["spark-server"]
    listening = {key: conf[key] for key in conf if key.endswith(("binding.address", "bindAddress"))}
    assert set(listening.values()) == {"127.0.0.1"}, listening
    assert conf["spark.master"] == f"local[{dotenv['SPARK_SERVER_CORES']}]"
    # The readers' server shares the Spark server's network namespace: it reads the catalog at
    # the port the Spark server serves it on, on 127.0.0.1 there; its SQL endpoint listens on
    # every interface of that namespace, whose service publishes it on the host's loopback only.
    reading = made[READERS]
    assert services()[READERS]["network_mode"] == "service:spark-server"
    catalog = conf["spark.lakehouse.catalog.port"]
    assert reading["spark.hadoop.hive.metastore.uris"] == f"thrift://127.0.0.1:{catalog}"
    sql_port = reading["spark.hadoop.hive.server2.thrift.port"]
    assert reading["spark.hadoop.hive.server2.thrift.bind.host"] == "0.0.0.0"
    assert published(services()["spark-server"]) == {sql_port: ("127.0.0.1", sql_port)}
    assert {reading[k] for k in reading if k.endswith(("binding.address", "bindAddress"))} == {
        "127.0.0.1"
    }
    # The API server listens on the container's every interface (its port is published on the
    # host's loopback); on one machine `lakehouse airflow` keeps it on 127.0.0.1.
    assert made["airflow-apiserver"]["AIRFLOW__API__HOST"] == "0.0.0.0"
    assert made["airflow-scheduler"]["AIRFLOW__API__HOST"] == "127.0.0.1"
    # What compose gave the tasks' environment wins over `lakehouse airflow`'s defaults.
    scheduler = container_env("airflow-scheduler", dotenv)
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__FERNET_KEY"):
        assert made["airflow-scheduler"][key] == scheduler[key]


def test_every_published_port_leads_to_a_port_its_service_listens_on(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A port published for users reaches what listens in the container: MinIO's API and
    console (its command's options), the broker's listeners, and the API server where
    `lakehouse airflow api-server`'s environment puts it, and the Spark server's SQL endpoint
    where the server's settings put it. The store, the broker (which has no authentication) and
    the SQL endpoint are published on this host's loopback only."""
    from lakehouse.orchestration.standalone import ui_address

    minio_args = command(services()["minio"])
    kafka_env = environment(services()["kafka"])
    api = start_up("airflow-apiserver", filled_env(), tmp_path, monkeypatch)
    # The readers' server listens in the Spark server's network namespace (its ports are that
    # service's).
    spark = start_up(READERS, filled_env(), tmp_path, monkeypatch)
    listening = {
        "minio": {
            option(minio_args, "--address", ":9000").rpartition(":")[2],
            option(minio_args, "--console-address", "").rpartition(":")[2],
        },
        "kafka": {str(port) for _, port in listeners(kafka_env["KAFKA_LISTENERS"] or "").values()},
        "airflow-apiserver": {str(ui_address(api)[1])},
        "spark-server": {spark["spark.hadoop.hive.server2.thrift.port"]},
        # Quarkus's HTTP port, which the service sets.
        "schema-registry": {environment(services()["schema-registry"])["QUARKUS_HTTP_PORT"]},
    }
    targets = {
        name: {target for _, target in published(svc).values()}
        for name, svc in services().items()
        if svc.get("ports")
    }
    assert set(targets) == set(listening)
    for name, ports in targets.items():
        assert ports and ports <= listening[name], (name, ports, listening[name])
    for name in ("minio", "kafka", "spark-server", "schema-registry"):
        assert {address for address, _ in published(services()[name]).values()} == {"127.0.0.1"}


def test_the_compose_registry_is_the_local_ones_release_where_the_services_look_for_it() -> None:
    """The compose registry and `lakehouse registry start`'s (include/jvm/registry/pom.xml) are
    the same Apicurio release with the same default compatibility; every service that runs
    lakehouse code finds it at the service's port and Confluent's API path, as the registry's
    own module names it; it keeps its state in the postgres service's database that
    airflow-init creates, with the database's credentials from .env."""
    from urllib.parse import urlsplit

    from lakehouse.runtime import registry

    found = re.search(r"<apicurio\.version>([^<]+)</apicurio\.version>", REGISTRY_POM.read_text())
    assert found
    svc = services()["schema-registry"]
    assert svc["image"] == f"apicurio/apicurio-registry:{found[1]}"
    env = environment(svc)
    assert env["APICURIO_RULES_GLOBAL_COMPATIBILITY"] == registry.COMPATIBILITY
    assert (env["APICURIO_STORAGE_KIND"], env["APICURIO_STORAGE_SQL_KIND"]) == ("sql", "postgresql")
    database = urlsplit(env["APICURIO_DATASOURCE_URL"].removeprefix("jdbc:"))
    assert (database.hostname, database.port, database.path) == ("postgres", 5432, "/registry")
    assert REQUIRED_SUBSTITUTION.fullmatch(env["APICURIO_DATASOURCE_PASSWORD"])
    dotenv = filled_env()
    made = urlsplit(container_env("airflow-init", dotenv)["LAKEHOUSE_REGISTRY_DATABASE"])
    assert (made.hostname, made.port, made.path) == (database.hostname, database.port, "/registry")
    assert (made.username, made.password) == (
        container_env("schema-registry", dotenv)["APICURIO_DATASOURCE_USERNAME"],
        dotenv["POSTGRES_PASSWORD"],
    )
    assert "create_database(" in " ".join(command(services()["airflow-init"]))
    assert dependencies(svc) == {
        "postgres": "service_healthy",
        "airflow-init": "service_completed_successfully",
    }
    for name, service in project_services().items():
        url = urlsplit(environment(service)["LAKEHOUSE_SCHEMA_REGISTRY_URL"] or "")
        assert (url.hostname, str(url.port), url.path) == (
            "schema-registry",
            env["QUARKUS_HTTP_PORT"],
            registry.API,
        ), name


def test_a_placeholder_left_in_env_stops_every_service_before_it_starts(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """`.env.example` copied as it is: config-check refuses, naming the variables, and every
    other service waits for it to succeed (directly, or through a service that does); each
    service of the project's image refuses by itself too."""
    from lakehouse.errors import ConfigError

    dotenv = env_example()
    with pytest.raises(ConfigError, match=r"AWS_SECRET_ACCESS_KEY.*still hold the placeholder"):
        start_up("config-check", dotenv, tmp_path, monkeypatch)

    def waits_for_check(name: str) -> bool:
        deps = dependencies(services()[name])
        if deps.get("config-check") == "service_completed_successfully":
            return True
        return bool(deps) and all(waits_for_check(dep) for dep in deps)

    assert [
        name for name in services() if name != "config-check" and not waits_for_check(name)
    ] == []
    for name in lakehouse_services():
        with pytest.raises(ConfigError, match="change-me"):
            start_up(name, dotenv, tmp_path, monkeypatch)


def test_a_spark_submit_per_task_is_refused_with_the_data_in_the_bucket(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The topology compose had before: a `spark` connection (a driver of its own per task) with
    the data in the bucket and no multi-driver log store. The layer task's check refuses it
    before anything runs."""
    from lakehouse.errors import ConfigError
    from lakehouse.orchestration.operators import preflight
    from lakehouse.runtime.config import Settings

    env = container_env("airflow-scheduler", filled_env())
    settings = Settings.from_env(tmp_path, ROOT / "contracts", env["LAKEHOUSE_DATA"])
    with pytest.raises(ConfigError, match="run the layer tasks on the Spark server"):
        preflight("spark", settings, {})


def test_every_port_is_published_on_loopback_unless_the_env_opens_the_ui() -> None:
    def addresses(dotenv: dict[str, str]) -> dict[str, set[str]]:
        tree = interpolate(compose(), dotenv)
        return {
            name: {address for address, _ in published(svc).values()}
            for name, svc in tree["services"].items()
            if svc.get("ports")
        }

    dotenv = filled_env()
    assert set().union(*addresses(dotenv).values()) == {"127.0.0.1"}
    opened = addresses({**dotenv, "AIRFLOW_UI_ADDRESS": "0.0.0.0"})
    assert opened.pop("airflow-apiserver") == {"0.0.0.0"}
    assert set().union(*opened.values()) == {"127.0.0.1"}


KAFKA_CONTRACT = """\
topic: payments
partitions: 2
key: {format: string, name: id}
value: {format: json, fields: [{name: amount, type: long}]}
stream: {name: payments}
kafka: {topic: payments-v1}
"""


def test_the_triggerer_gets_each_kafka_topics_connection_to_the_compose_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The triggerer starts through `lakehouse airflow`, which makes each Kafka-sourced topic's
    connection from its contract: with the compose environment, a contract that names no broker
    gets the compose broker, and what compose sets wins over the command's defaults."""
    from lakehouse.orchestration.airflow_env import airflow_environment, kafka_conn_id
    from lakehouse.runtime.config import Settings
    from lakehouse.topics.kafka import BOOTSTRAP_ENV

    triggerer = services()["airflow-triggerer"]
    assert command(triggerer) == ["lakehouse", "airflow", "triggerer"]
    env = {key: value for key, value in environment(triggerer).items() if value is not None}
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "payments.yaml").write_text(KAFKA_CONTRACT)
    monkeypatch.setenv(BOOTSTRAP_ENV, env[BOOTSTRAP_ENV])
    made = airflow_environment(Settings.from_env(tmp_path / "home", contracts), base=env)
    connection = json.loads(made[f"AIRFLOW_CONN_{kafka_conn_id('payments').upper()}"])
    assert connection["conn_type"] == "kafka"
    assert connection["extra"]["bootstrap.servers"] == env[BOOTSTRAP_ENV] == "kafka:9092"
    assert {key: made[key] for key in env} == env


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
    # lakehouse.runtime.config.REPO_ROOT is parents[2] of include/lakehouse/config.py.
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
    """The image is the official Python image of a version the package supports: Spark's
    workers run its interpreter, and SPARK_HOME is the pyspark that pip installs for it. The
    homes are folders of their own, outside the project; the image runs as a non-root user."""
    from packaging.specifiers import SpecifierSet

    instructions = dockerfile_instructions()
    # The image is the last stage; the one before it only installs files for it.
    stages = [args for instruction, args in instructions if instruction == "FROM"]
    found = re.fullmatch(r"python:(\d+\.\d+)-[\w.-]+", stages[-1])
    assert found, f"{stages[-1]}: an official Python image, pinned to a minor version"
    version = found[1]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert version in SpecifierSet(project["requires-python"]), (
        version,
        project["requires-python"],
    )
    env = dockerfile_env()
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == "/usr/local/bin/python"
    assert env["SPARK_HOME"] == f"/usr/local/lib/python{version}/site-packages/pyspark"
    project_dir = dockerfile_copies()["include"].parent
    for key in ("LAKEHOUSE_HOME", "AIRFLOW_HOME"):
        home = PurePosixPath(env[key])
        assert home.is_absolute() and not home.is_relative_to(project_dir), (key, home)
    assert env["LAKEHOUSE_HOME"] != env["AIRFLOW_HOME"]
    users = [args for instruction, args in instructions if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    # The user can write both homes (named volumes mounted on them start out with their owner).
    uid = users[-1].split(":")[0]
    owned = {
        path
        for _, args in run_steps()
        if args[:2] == ["chown", "-R"] and args[2].split(":")[0] == uid
        for path in args[3:]
    }
    assert {env["LAKEHOUSE_HOME"], env["AIRFLOW_HOME"]} <= owned, owned


def test_the_compose_schedulers_hand_off_tasks_as_soon_as_the_local_airflow(
    tmp_path: Path,
) -> None:
    """The scheduler's idle sleep (how late a finished task is noticed) is the same in the
    compose stack as in ``make airflow``'s environment."""
    from lakehouse.orchestration.airflow_env import airflow_environment
    from lakehouse.runtime.config import Settings

    key = "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"
    local = airflow_environment(Settings.from_env(tmp_path, ROOT / "contracts"), {})
    assert environment(services()["airflow-scheduler"])[key] == local[key] == "0.5"


def test_the_image_copies_the_jvm_jars_where_jobs_look_for_them(monkeypatch: Any) -> None:
    """`lakehouse.runtime.jvm` looks for the jars under the interpreter's prefix: /usr/local in
    the image (the official Python image's). The image runs `make install`'s own step for the
    Spark, broker and OpenLineage listener jars (the same script and poms, into the image's folders), with Maven
    installed, before it switches to its non-root user, and the same checks once the package
    is in."""
    from lakehouse.runtime import jvm

    made = make_install_commands()
    # make's copies go where jobs look in the virtualenv (the oracle's jars are the tests').
    folders = {
        jvm.jars_dir().resolve(): jvm.jars_dir,
        jvm.kafka_jars_dir().resolve(): jvm.kafka_jars_dir,
        jvm.openlineage_jars_dir().resolve(): jvm.openlineage_jars_dir,
    }
    copies = [args for args in made if args[0] == COPY_JARS]
    local = {(ROOT / args[1]).resolve(): args[2:] for args in copies}
    assert set(folders) <= set(local), (folders, copies)
    checks = [args[3:] for args in made if args[1:3] == ["-m", "lakehouse.runtime.jvm"]]
    monkeypatch.setattr(sys, "prefix", "/usr/local")
    wanted = {str(where()): local[folder] for folder, where in folders.items()}

    steps = run_steps()
    image_copies = {args[1]: args[2:] for _, args in steps if args[0] == COPY_JARS}
    assert image_copies == wanted
    image_checks = [
        args[3:] for _, args in steps if args[:3] == ["python", "-m", "lakehouse.runtime.jvm"]
    ]
    # Not the oracle's (the tests') nor the schema registry's: compose runs Apicurio's own image.
    assert image_checks == [kind for kind in checks if kind not in (["oracle"], ["registry"])]

    instructions = dockerfile_instructions()
    apt = [i for i, args in steps if args[:2] == ["apt-get", "install"] and "maven" in args]
    copy = [i for i, args in steps if args[0] == COPY_JARS]
    install = [
        i for i, args in steps if args[:2] == ["pip", "install"] and args[-2:] == ["-e", "."]
    ]
    check = [i for i, args in steps if args[:3] == ["python", "-m", "lakehouse.runtime.jvm"]]
    user = [i for i, (instruction, _) in enumerate(instructions) if instruction == "USER"]
    assert apt and copy and install and check and user
    assert apt[0] < copy[0] and max(copy) < min(check) and max(check) < user[-1]
    assert install[0] <= min(check)
    assert "include/jvm" in dockerfile_copies()


def test_the_image_gets_the_data_docs_web_assets_where_reports_look_for_them() -> None:
    """`lakehouse.quality.web_assets.NODE_MODULES` is include/web/node_modules beside the package:
    npm installs the locked files in a stage of their own with `make install`'s own command, the
    image copies them there (never a local install: it is ignored), and checks them."""
    from lakehouse.quality.web_assets import NODE_MODULES

    instructions = dockerfile_instructions()
    stages = [i for i, (instruction, _) in enumerate(instructions) if instruction == "FROM"]
    web = next(i for i in stages if instructions[i][1].endswith(" AS web"))
    assert instructions[web][1].startswith("node:") and web < stages[-1]
    stage = instructions[web : stages[-1]]
    assert any(
        i == "COPY" and "include/web/package.json include/web/package-lock.json" in a
        for i, a in stage
    )
    (npm,) = [args for args in make_install_commands() if args[0] == "npm"]
    assert [shlex.split(a) for i, a in stage if i == "RUN"] == [npm]
    copies = [k for k, (i, a) in enumerate(instructions) if i == "COPY" and "--from=web" in a]
    assert len(copies) == 1
    *_, source, dest = instructions[copies[0]][1].split()
    workdir = [a for i, a in instructions[: copies[0]] if i == "WORKDIR"][-1]
    project = dockerfile_copies()["include"].parent
    assert source == "/web/node_modules"
    assert PurePosixPath(workdir) / dest == project / NODE_MODULES.relative_to(ROOT).as_posix()
    ignored = {line.strip() for line in DOCKERIGNORE.read_text().splitlines()}
    assert str(NODE_MODULES.relative_to(ROOT)) in ignored
    checks = [a for i, a in instructions[stages[-1] :] if i == "RUN"]
    assert any("python -m lakehouse.quality.web_assets" in a for a in checks)


def test_the_spark_server_keeps_the_catalog_in_the_postgres_service(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The server's metastore settings, as its start-up makes them from compose's environment:
    Hive's client connects to the database `metastore` of the postgres service, logged in as
    that service's user, and the server waits for the service to be healthy."""
    import xml.etree.ElementTree as ET

    dotenv = filled_env()
    conf = start_up("spark-server", dotenv, tmp_path, monkeypatch)
    assert conf["spark.sql.catalogImplementation"] == "hive"
    site = Path(conf["spark.driver.extraClassPath"].split(os.pathsep)[-1]) / "hive-site.xml"
    found = {
        p.findtext("name"): p.findtext("value") for p in ET.parse(site).getroot().iter("property")
    }
    postgres = container_env("postgres", dotenv)
    host, port = "postgres", 5432
    assert found["javax.jdo.option.ConnectionURL"] == f"jdbc:postgresql://{host}:{port}/metastore"
    assert found["javax.jdo.option.ConnectionUserName"] == postgres["POSTGRES_USER"]
    assert found["javax.jdo.option.ConnectionPassword"] == postgres["POSTGRES_PASSWORD"]
    assert host in services()
    assert dependencies(services()["spark-server"])[host] == "service_healthy"
    assert (site.stat().st_mode & 0o777) == 0o600


def test_the_image_builds_the_spark_servers_code_where_the_server_looks_for_it() -> None:
    """`lakehouse.runtime.jvm.server_jar` is the interpreter's prefix's lakehouse-server.jar:
    /usr/local in the image. The image has the JDK (javac) and runs make's own build script
    there, after the package (and so pyspark's jars) is installed."""
    from lakehouse.runtime.jvm import SERVER_JAR

    instructions = dockerfile_instructions()
    runs = [k for k, (i, a) in enumerate(instructions) if i == "RUN"]
    build = [k for k in runs if "include/jvm/server/build.sh" in instructions[k][1]]
    assert len(build) == 1
    assert f"/usr/local/{SERVER_JAR}" in instructions[build[0]][1]
    editable = [
        k for k in runs if "pip install --no-cache-dir --no-deps -e ." in instructions[k][1]
    ]
    assert editable and editable[0] < build[0]
    assert any("openjdk-17-jdk-headless" in instructions[k][1] for k in runs)
    assert "include/jvm/server/build.sh" in (ROOT / "Makefile").read_text()


def test_the_compose_tasks_emit_lineage_from_a_thread_as_the_local_airflow(
    tmp_path: Path,
) -> None:
    """OpenLineage's events of the layer and gate tasks read the ledger with delta-rs, which a
    forked child cannot: the compose stack emits them from a thread, as `make airflow` does."""
    from lakehouse.orchestration.airflow_env import airflow_environment
    from lakehouse.runtime.config import Settings

    key = "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD"
    local = airflow_environment(Settings.from_env(tmp_path, ROOT / "contracts"), {})
    for service in ("airflow-scheduler", "airflow-apiserver"):
        assert environment(services()[service])[key] == local[key] == "True"
