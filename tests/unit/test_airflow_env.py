"""The Airflow environment's generated secrets: made once per lakehouse, private, never shipped."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from lakehouse.airflow_env import SECRETS_FILE, airflow_environment, airflow_secrets
from lakehouse.config import REPO_ROOT, Settings
from lakehouse.errors import ConfigError
from lakehouse.postgres import PostgresError


def test_secrets_are_generated_once_private_and_per_lakehouse(tmp_path: Path) -> None:
    first = airflow_secrets(tmp_path / "a")
    assert airflow_secrets(tmp_path / "a") == first  # stable across calls
    other = airflow_secrets(tmp_path / "b")
    assert all(first[k] != other[k] for k in first)  # each lakehouse has its own
    Fernet(first["fernet_key"].encode())  # a valid Fernet key
    assert len(first["secret_key"]) >= 32 and len(first["jwt_secret"]) >= 32
    mode = stat.S_IMODE((tmp_path / "a" / SECRETS_FILE).stat().st_mode)
    assert mode == 0o600
    assert [p.name for p in (tmp_path / "a").iterdir()] == [SECRETS_FILE]  # no temp file left


def test_environment_requires_login_with_generated_keys(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    env = airflow_environment(settings, base={})
    secrets = airflow_secrets(settings.airflow_home)
    assert env["AIRFLOW__CORE__FERNET_KEY"] == secrets["fernet_key"]
    assert env["AIRFLOW__API__SECRET_KEY"] == secrets["secret_key"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == secrets["jwt_secret"]
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    # What the user set wins.
    assert (
        airflow_environment(settings, base={"AIRFLOW__CORE__FERNET_KEY": "mine"})[
            "AIRFLOW__CORE__FERNET_KEY"
        ]
        == "mine"
    )


def test_no_secret_is_committed() -> None:
    """No secrets file, generated password file or Airflow config is tracked by git."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert tracked, "not a git checkout"
    names = {Path(p).name for p in tracked}
    assert not names & {SECRETS_FILE, "simple_auth_manager_passwords.json.generated", "airflow.cfg"}


def test_metadata_database_choice_is_checked(tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", REPO_ROOT / "contracts")
    with pytest.raises(ConfigError, match="LAKEHOUSE_AIRFLOW_DB must be one of sqlite, postgres"):
        airflow_environment(settings, base={"LAKEHOUSE_AIRFLOW_DB": "mysql"})
    # PostgreSQL is used only when its cluster runs: no silent fallback to SQLite.
    with pytest.raises(PostgresError, match="not running: start it with `lakehouse postgres"):
        airflow_environment(settings, base={"LAKEHOUSE_AIRFLOW_DB": "postgres"})
