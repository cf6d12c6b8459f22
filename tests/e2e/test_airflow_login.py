"""Airflow as `make airflow` runs it: login required, no default password, generated keys.

Starts Airflow's API server (core API and UI) with the lakehouse's environment and checks that
the API refuses requests without a token, that admin/admin does not log in, and that the
password Airflow generated on first start does."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakehouse.airflow_env import airflow_environment
from lakehouse.config import Settings

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(
    url: str, body: dict[str, Any] | None = None, token: str | None = None
) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({} if token is None else {"Authorization": f"Bearer {token}"}),
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def api_server(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, Settings]]:
    env = airflow_environment(settings)
    lakehouse = str(Path(sys.executable).parent / "lakehouse")
    migrate = subprocess.run(
        [lakehouse, "airflow", "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    parse = subprocess.run(
        [lakehouse, "airflow", "dags", "reserialize"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert parse.returncode == 0, parse.stderr[-3000:]
    port = _free_port()
    log = (tmp_path / "api-server.log").open("w")
    server = subprocess.Popen(
        [lakehouse, "airflow", "api-server", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if _call(f"{base}/api/v2/monitor/health")[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(
                    f"API server did not start: {(tmp_path / 'api-server.log').read_text()[-3000:]}"
                )
            time.sleep(1)
        yield base, settings
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_api_needs_a_login_and_only_the_generated_password_works(
    api_server: tuple[str, Settings],
) -> None:
    base, settings = api_server
    assert _call(f"{base}/api/v2/dags")[0] == 401
    assert _call(f"{base}/api/v2/dags", token="not-a-token")[0] in (401, 403)
    for password in ("admin", "airflow", ""):  # no default password logs in
        status, _ = _call(f"{base}/auth/token", {"username": "admin", "password": password})
        assert status in (400, 401), (password, status)

    generated = settings.airflow_home / "simple_auth_manager_passwords.json.generated"
    password = json.loads(generated.read_text())["admin"]
    assert len(password) >= 12
    status, body = _call(f"{base}/auth/token", {"username": "admin", "password": password})
    assert status == 201, body
    token = json.loads(body)["access_token"]
    status, body = _call(f"{base}/api/v2/dags", token=token)
    assert status == 200, body
    assert "pipeline__user-locations" in body
