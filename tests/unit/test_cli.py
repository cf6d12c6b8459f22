from __future__ import annotations

import io
import json

import pytest

from lakehouse import cli
from lakehouse.config import Settings
from lakehouse.landing import end_offsets, list_segments


def _run(monkeypatch: pytest.MonkeyPatch, argv: list[str], stdin: str = "") -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return cli.main(argv)


def test_produce_reads_json_lines(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = "\n".join(
        json.dumps(r)
        for r in [
            {"key": "alice", "value": {"location": "Paris"}},
            {"key": None, "value": {"location": "Nowhere"}},
            {"key": "bob", "value": None, "timestamp": "2026-01-01T00:00:00Z"},
        ]
    )
    assert _run(monkeypatch, ["produce", "user-locations"], lines + "\n\n") == 0
    assert "produced 3 record(s) to user-locations" in capsys.readouterr().err
    assert sum(end_offsets(settings, "user-locations", 3).values()) == 3


def test_bad_line_stops_but_keeps_what_came_before(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = '{"key": "a", "value": 1}\n{"key": "b", "value": 2}\n{"key": "c", "value": \n{"key": "d", "value": 4}\n'
    assert _run(monkeypatch, ["produce", "user-locations"], stdin) == 1
    err = capsys.readouterr().err
    assert "error: stdin line 3: not valid JSON" in err
    assert "produced 2 record(s)" in err
    values = [
        json.loads(line)["value"]
        for seg in list_segments(settings, "user-locations")
        for line in seg.path.read_text().splitlines()
    ]
    assert sorted(values) == ["1", "2"]


def test_unknown_topic_is_one_clear_error(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["produce", "nope"], '{"key": "a", "value": 1}\n') == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown topic 'nope'; topics with a contract: user-locations"
    assert not settings.landing_root.exists()


def test_unknown_table_is_one_clear_error(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["show", "nope"]) == 1
    assert capsys.readouterr().err.startswith("error: unknown table 'nope'; known tables:")


def test_show_before_any_run_says_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["show", "user_latest_location"]) == 1
    assert "has its pipeline run yet?" in capsys.readouterr().err


def test_sample_produces_the_seed_events_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["sample"]) == 0
    assert _run(monkeypatch, ["sample"]) == 0
    assert "already has data" in capsys.readouterr().err
    records = [
        json.loads(line)
        for seg in list_segments(settings, "user-locations")
        for line in seg.path.read_text().splitlines()
    ]
    assert [(r["key"], json.loads(r["value"])["location"]) for r in records] == cli.SAMPLE_EVENTS


def test_render_table_and_json() -> None:
    import pyarrow as pa

    t = pa.table({"username": ["alice", None], "count": [3, 2], "raw": [b"\xff", b"ok"]})
    out = io.StringIO()
    cli.render(t, "json", out)
    assert [json.loads(x) for x in out.getvalue().splitlines()] == [
        {"username": "alice", "count": 3, "raw": "base64:/w=="},
        {"username": None, "count": 2, "raw": "ok"},
    ]
    out = io.StringIO()
    cli.render(t, "table", out)
    text = out.getvalue()
    assert "| username | count | raw" in text and "| null     | 2" in text and "(2 rows)" in text
