"""The local S3 API's parts that need no server (lakehouse.runtime.s3server): its port setting, what
status says with no server or a stale record, what a start refuses before it runs anything, and
the probe that tells an S3 API from another server. tests/integration/test_s3_server.py runs one."""

from __future__ import annotations

import http.server
import importlib.util
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse import cli
from lakehouse.errors import ConfigError
from lakehouse.runtime import s3server
from lakehouse.runtime.process import free_port
from lakehouse.runtime.s3server import S3Server, S3ServerError


def test_the_port_is_the_settings_or_19000(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKEHOUSE_S3_PORT", raising=False)
    assert s3server.port() == 19000
    monkeypatch.setenv("LAKEHOUSE_S3_PORT", "19555")
    assert s3server.port() == 19555
    assert s3server.endpoint(19555) == "http://127.0.0.1:19555"
    monkeypatch.setenv("LAKEHOUSE_S3_PORT", "s3")
    with pytest.raises(ConfigError, match=r"LAKEHOUSE_S3_PORT must be a TCP port number"):
        s3server.port()


def test_status_without_a_server_says_how_to_start_one(tmp_path: Path) -> None:
    server = S3Server(tmp_path / "s3")
    status = server.status()
    assert not status.running
    assert status.describe() == (
        f"S3 API (moto): not running; start it with `lakehouse s3 start` ({tmp_path / 's3'})"
    )
    assert server.stop() is False


@pytest.mark.parametrize("record", ["not json", "[1, 2]", '{"pid": "1", "port": 19000}'])
def test_an_unreadable_record_is_no_server(tmp_path: Path, record: str) -> None:
    server = S3Server(tmp_path)
    server.state.write_text(record)
    assert not server.status().running


def test_a_record_of_a_process_gone_is_no_server_and_stop_clears_it(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    server = S3Server(tmp_path)
    server.state.write_text(json.dumps({"pid": int(gone.stdout), "port": 19000}))
    assert not server.status().running
    assert server.stop() is False
    assert not server.state.exists()


def test_a_running_server_is_described_with_its_endpoint(tmp_path: Path) -> None:
    status = s3server.Status(
        True, tmp_path, "http://127.0.0.1:19000", 42, "2026-11-26T10:00:00+0000", tmp_path / "l"
    )
    assert status.describe(already=True) == (
        "S3 API (moto): already running, pid 42, endpoint http://127.0.0.1:19000, since "
        f"2026-11-26T10:00:00+0000; in memory: its buckets go when it stops (log: {tmp_path / 'l'})"
    )


def test_a_taken_port_is_refused_before_anything_runs(tmp_path: Path) -> None:
    server = S3Server(tmp_path / "s3")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(S3ServerError) as caught:
            server.start(port)
    assert str(caught.value) == (
        f"port {port} on 127.0.0.1 is taken by another process: stop it, or choose another port "
        "with LAKEHOUSE_S3_PORT"
    )
    assert not server.state.exists() and not server.log.exists()


def test_without_moto_a_start_says_where_it_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "moto" else find_spec(name, *a),
    )
    with pytest.raises(S3ServerError, match=r"moto is not installed: .*`make install`"):
        S3Server(tmp_path).start(s3server.DEFAULT_PORT)


@pytest.fixture
def web_server() -> Iterator[int]:
    """A web server that is not S3: it answers 200 and a page to every GET."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_only_an_s3_api_lists_buckets(web_server: int) -> None:
    assert not s3server.lists_buckets("127.0.0.1", web_server)
    assert not s3server.lists_buckets("127.0.0.1", free_port())


def test_the_cli_reports_status_and_refuses_other_actions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--home", str(tmp_path), "s3", "status"]) == 1
    assert "S3 API (moto): not running" in capsys.readouterr().out
    assert cli.main(["--home", str(tmp_path), "s3", "stop"]) == 0
    assert capsys.readouterr().out == "S3 API (moto): was not running\n"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["s3", "restart"])
