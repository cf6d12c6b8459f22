"""Airflow as `make airflow` runs it: login required, no default password, generated keys.

Starts Airflow's API server (core API and UI) with the lakehouse's environment and checks that
the API refuses requests without a token, that admin/admin does not log in, and that the
password Airflow generated on first start does; that the UI shows nothing without a login (its
pages are a static shell whose every piece of data comes from APIs that refuse), and that only
tokens signed with the generated key are accepted."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from airflow_stack import clean_environment

from lakehouse.orchestration.airflow_env import airflow_secrets
from lakehouse.runtime.config import REPO_ROOT, Settings
from lakehouse.runtime.process import free_port

pytestmark = pytest.mark.e2e


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None  # a redirect is the answer looked at, not followed


_OPENER = urllib.request.build_opener(_NoRedirect)


def _call(
    url: str,
    body: dict[str, Any] | None = None,
    token: str | None = None,
    cookie: str | None = None,
) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if cookie is not None:
        headers["Cookie"] = f"_token={cookie}"  # the UI's session cookie
    request = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(), headers=headers
    )
    try:
        with _OPENER.open(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location") or exc.read().decode()


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Settings]]:
    tmp_path = tmp_path_factory.mktemp("login")
    settings = Settings.from_env(tmp_path / "lakehouse", REPO_ROOT / "contracts")
    env = clean_environment(settings)
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
    port = free_port()
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


def _admin_token(base: str, settings: Settings) -> str:
    generated = settings.airflow_home / "simple_auth_manager_passwords.json.generated"
    password = json.loads(generated.read_text())["admin"]
    status, body = _call(f"{base}/auth/token", {"username": "admin", "password": password})
    assert status == 201, body
    return str(json.loads(body)["access_token"])


def test_the_ui_shows_nothing_without_a_login(api_server: tuple[str, Settings]) -> None:
    """The UI's pages are a static shell; what they show comes from the UI's own API (/ui), the
    REST API and, for tasks, the execution API (connections and variables): each refuses a
    request without a valid token, in a header or in the UI's cookie, and the UI's login
    entry point leads to the login page."""
    base, settings = api_server
    for path in (
        "/ui/config",
        "/ui/dags",
        "/ui/auth/menus",
        "/api/v2/dags/pipeline__user-locations/dagRuns",
        "/api/v2/connections",
        "/api/v2/variables",
        "/execution/connections/lakehouse_spark",
        "/execution/variables/anything",
    ):
        assert _call(base + path)[0] == 401, path
        assert _call(base + path, cookie="not-a-token")[0] in (401, 403), path
    assert _call(f"{base}/api/v2/auth/login") == (307, "/auth/login")
    for username, password in (("airflow", "airflow"), ("admin", "airflow"), ("airflow", "admin")):
        for login in ("/auth/token", "/auth/token/cli"):
            status, _ = _call(base + login, {"username": username, "password": password})
            assert status in (400, 401), (login, username, password, status)
    token = _admin_token(base, settings)
    assert _call(f"{base}/ui/dags", cookie=token)[0] == 200
    # The configuration (with the keys) is not exposed, not even to an admin.
    status, body = _call(f"{base}/api/v2/config", token=token)
    assert status == 403
    assert [k for k, v in airflow_secrets(settings.airflow_home).items() if v in body] == []


def test_only_tokens_signed_with_the_generated_key_are_accepted(
    api_server: tuple[str, Settings],
) -> None:
    """An admin token's own claims, signed again: with the generated key the server accepts
    them, with any other key (well-known defaults, a random one) or unsigned it does not."""
    base, settings = api_server
    token = _admin_token(base, settings)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["sub"] == "admin"
    algorithm = jwt.get_unverified_header(token)["alg"]
    key = airflow_secrets(settings.airflow_home)["jwt_secret"]
    assert len(key.encode()) >= 64  # HS512's minimum key size
    signed = jwt.encode(claims, key, algorithm=algorithm)
    assert _call(f"{base}/api/v2/dags", token=signed)[0] == 200
    forged = [
        jwt.encode(claims, other, algorithm=algorithm)
        for other in ("airflow" * 10, "secret" * 11, "changeme" * 8, secrets.token_urlsafe(64))
    ]
    forged.append(jwt.encode(claims, None, algorithm="none"))
    for token in forged:
        assert _call(f"{base}/api/v2/dags", token=token)[0] in (401, 403)
        assert _call(f"{base}/ui/dags", cookie=token)[0] in (401, 403)
