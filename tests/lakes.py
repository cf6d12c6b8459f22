"""Helpers the test modules share (imported by name: ``from lakes import ...``): the test S3
API's description, and a lakehouse's settings on local files or in the test bucket."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from lakehouse.runtime.config import REPO_ROOT, Settings

S3_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Store:
    """The test session's S3 API: its endpoint, a bucket made for the tests, and ``env``, what a
    lakehouse process needs in its environment to use them (the session's ``spark`` fixture
    exports it when the run has tests marked ``s3``: a JVM reads its environment once)."""

    endpoint: str
    bucket: str
    root: Path
    pid: int

    @property
    def env(self) -> dict[str, str]:
        return {
            "LAKEHOUSE_S3_ENDPOINT": self.endpoint,
            "LAKEHOUSE_S3_PATH_STYLE": "true",
            "LAKEHOUSE_S3_REGION": S3_REGION,
            # moto checks no credentials; S3 clients still sign every request with some.
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }


# A fixture parametrized with these runs its tests on local files and, marked ``s3``, on the
# test S3 API: the same tests, the same assertions (`make test-s3` runs the S3 ones alone).
STORAGES = ["local", pytest.param("s3", marks=pytest.mark.s3)]


def lake_settings(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The body of a ``settings`` fixture parametrized with :data:`STORAGES`: a fresh lakehouse
    with the shipped contracts, its data under the home or under a prefix of its own in the
    test bucket (``LAKEHOUSE_DATA``), set in this process's environment for the test."""
    from lakehouse.runtime import objectstore

    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
    if request.param == "s3":
        request.getfixturevalue("spark")  # started with the store's settings
        store: S3Store = request.getfixturevalue("s3_server")
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("LAKEHOUSE_DATA", f"s3://{store.bucket}/{tmp_path.name}")
    objectstore.reset()
    request.addfinalizer(objectstore.reset)
    return Settings.from_env()
