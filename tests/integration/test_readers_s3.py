"""The readers' server with the data in a bucket, on an S3 API that checks credentials and
policies (moto's server with its IAM enforcement on): the pipeline writes with a user allowed
everything on the bucket, the readers' server holds only a user allowed to list and read it
(``LAKEHOUSE_READERS_AWS_*``). The readers read gold by name; their writes are refused; and the
store itself refuses those credentials any change, whatever program uses them: the layer under
the readers' file system and SQL check. Every object of the lake and every catalog entry is
unchanged after the attacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lakehouse.runtime import readers, server
from lakehouse.runtime.config import Settings
from lakehouse.runtime.process import answers, free_port
from lakes import DEMO_TABLES, S3_REGION, shipped_topic
from readers_corpus import GOLD, corpus, refused

pytestmark = [pytest.mark.integration, pytest.mark.s3]

BUCKET = "lake"
# IAM calls that make the two users, their keys and policies: moto checks every request after.
SETUP_ACTIONS = 6
READ_ONLY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"],
            "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
        }
    ],
}
ALL_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


@dataclass(frozen=True)
class Keys:
    access: str
    secret: str


@dataclass(frozen=True)
class Store:
    endpoint: str
    pipeline: Keys
    reader: Keys

    def client(self, keys: Keys) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=S3_REGION,
            aws_access_key_id=keys.access,
            aws_secret_access_key=keys.secret,
        )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """moto's server on a free port with IAM enforcement: the first calls make the pipeline's
    and the readers' users, every call after is checked against their policies."""
    import boto3

    port = free_port()
    log = tmp_path_factory.mktemp("iam-s3") / "moto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "--host", "127.0.0.1", "--port", str(port)],
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_ACTIONS)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not answers("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name=S3_REGION,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        made = {}
        for user, policy in (("pipeline", ALL_POLICY), ("reader", READ_ONLY_POLICY)):
            iam.create_user(UserName=user)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            iam.put_user_policy(UserName=user, PolicyName=user, PolicyDocument=json.dumps(policy))
            made[user] = Keys(key["AccessKeyId"], key["SecretAccessKey"])
        checked = Store(endpoint, made["pipeline"], made["reader"])
        checked.client(checked.pipeline).create_bucket(Bucket=BUCKET)
        yield checked
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, store: Store) -> Iterator[Settings]:
    """The JSON topic through every layer into the bucket, on the pipeline's server; the readers'
    server with the readers' keys."""
    root = tmp_path_factory.mktemp("readers-s3")
    contracts = shipped_topic(root / "contracts", "user-locations", DEMO_TABLES)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "LAKEHOUSE_HOME": str(root / "lakehouse"),
            "LAKEHOUSE_CONTRACTS": str(contracts),
            "LAKEHOUSE_DATA": f"s3://{BUCKET}/data",
            "LAKEHOUSE_S3_ENDPOINT": store.endpoint,
            "LAKEHOUSE_S3_PATH_STYLE": "true",
            "LAKEHOUSE_S3_REGION": S3_REGION,
            "AWS_ACCESS_KEY_ID": store.pipeline.access,
            "AWS_SECRET_ACCESS_KEY": store.pipeline.secret,
            "LAKEHOUSE_READERS_AWS_ACCESS_KEY_ID": store.reader.access,
            "LAKEHOUSE_READERS_AWS_SECRET_ACCESS_KEY": store.reader.secret,
            server.PORT_ENV: str(free_port()),
            readers.PORT_ENV: str(free_port()),
            readers.SQL_PORT_ENV: str(free_port()),
        }.items():
            mp.setenv(name, value)
        mp.delenv("LAKEHOUSE_METASTORE", raising=False)
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        settings = Settings.from_env()
        _lakehouse("sample", "--topic", "user-locations")
        server.start(settings)
        try:
            _lakehouse("run", "--topic", "user-locations")
            yield settings
        finally:
            server.stop(settings)


def _lakehouse(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != server.TOKEN_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "lakehouse.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _objects(store: Store) -> dict[str, tuple[int, str]]:
    listed = store.client(store.pipeline).get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {o["Key"]: (o["Size"], o["ETag"]) for page in listed for o in page.get("Contents", [])}


def _sql(reader: server.Reader, statements: dict[str, str]) -> dict[str, str | None]:
    from pyhive import hive

    out: dict[str, str | None] = {}
    with hive.connect(
        host=reader.host,
        port=reader.port,
        username=reader.user,
        password=reader.password,
        auth="CUSTOM",
    ) as conn:
        cursor = conn.cursor()
        for label, statement in statements.items():
            try:
                cursor.execute(statement)
                rows = cursor.fetchall() if cursor.description else []
                out[label] = str(rows) if rows else None
            except Exception as e:  # PyHive's OperationalError, with the server's message
                out[label] = f"error: {e}"
    return out


def _java_environment(pid: int) -> bytes:
    """The environment of the readers' JVM, among ``pid``'s descendants."""
    todo, found = [pid], []
    while todo:
        parent = todo.pop()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    child = int(stat.parent.name)
                    todo.append(child)
                    if os.readlink(f"/proc/{child}/exe").endswith("/java"):
                        found.append(child)
            except (OSError, ValueError):
                continue
    assert found, "the readers' JVM"
    return Path(f"/proc/{found[0]}/environ").read_bytes()


def test_readers_read_the_bucket_and_cannot_change_it(lake: Settings, store: Store) -> None:
    """The readers' server holds the readers' keys and not the pipeline's; it reads gold by
    name; every statement of the hostile corpus is refused; the store refuses the readers' keys
    a put and a delete of the lake's objects; the lake's objects and names are what they
    were."""
    status = readers.of(lake).status()
    assert status.s3 is not None and "readers' own credentials" in status.s3
    environment = _java_environment(int(str(status.pid)))
    assert f"AWS_ACCESS_KEY_ID={store.reader.access}".encode() in environment
    assert store.pipeline.access.encode() not in environment
    assert store.pipeline.secret.encode() not in environment

    reader = server.reader(lake)
    before = _objects(store)
    names = _lakehouse("catalog", "list").stdout
    assert _sql(reader, {"read": f"SELECT username, location FROM {GOLD} ORDER BY username"}) == {
        "read": str([("alice", "Berlin"), ("bob", "Lima")])
    }
    assert _sql(
        reader,
        {
            "schema": "CREATE SCHEMA IF NOT EXISTS mine",
            "table": "CREATE TABLE IF NOT EXISTS mine.p (a INT) USING parquet",
        },
    ) == {"schema": None, "table": None}
    # The whole hostile corpus, its locations in the bucket: each refused.
    statements = corpus(lake)
    outcome = _sql(reader, statements)
    assert {k: refused(k, v) for k, v in outcome.items()} == dict.fromkeys(statements, True), {
        k: str(v)[:300] for k, v in outcome.items() if not refused(k, v)
    }

    from botocore.exceptions import ClientError

    readers_keys = store.client(store.reader)
    log = next(key for key in before if "/_delta_log/" in key)
    with pytest.raises(ClientError, match="AccessDenied"):
        readers_keys.put_object(Bucket=BUCKET, Key=log, Body=b"{}")
    with pytest.raises(ClientError, match="AccessDenied"):
        readers_keys.delete_object(Bucket=BUCKET, Key=log)
    assert readers_keys.get_object(Bucket=BUCKET, Key=log)["Body"].read()  # it reads

    assert _objects(store) == before
    assert _lakehouse("catalog", "list").stdout == names
