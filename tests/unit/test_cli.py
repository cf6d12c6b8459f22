from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from lakehouse import cli
from lakehouse.runtime.config import Settings
from lakehouse.topics import samples
from lakehouse.topics.landing import end_offsets, list_segments


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
    assert (
        err == "error: unknown topic 'nope'; topics with a contract: user-locations, user-profiles"
    )
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
    assert [
        (r["key"], json.loads(r["value"])["location"]) for r in records
    ] == samples.SAMPLE_EVENTS


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


def _values(settings: Settings, topic: str) -> list[tuple[str, bytes | None]]:
    import base64

    out = []
    for seg in list_segments(settings, topic):
        for line in seg.path.read_text().splitlines():
            r = json.loads(line)
            value = r["value"]
            if value is not None:
                value = (
                    base64.b64decode(value)
                    if r.get("valueEncoding") == "base64"
                    else value.encode()
                )
            out.append((r["key"], value))
    return out


def test_produce_encodes_avro_values_with_the_chosen_schema_id(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lakehouse.contracts import avro
    from lakehouse.contracts.model import Catalog

    contract = Catalog.load(settings.contracts_dir).topic("user-profiles")
    line = '{"key": "ann", "value": {"name": "Ann", "age": 30, "updated_at": "2026-01-01T00:00:00Z"}}\n'
    assert _run(monkeypatch, ["produce", "user-profiles"], line) == 0
    assert _run(monkeypatch, ["produce", "user-profiles", "--value-schema-id", "1"], line) == 0
    ((_, old), (_, latest)) = sorted(_values(settings, "user-profiles"), key=lambda kv: kv[1][4])
    assert (old[:5], latest[:5]) == (b"\x00\x00\x00\x00\x01", b"\x00\x00\x00\x00\x02")
    decoder = avro.WireDecoder(
        {v.id: v.schema for v in contract.value_schemas},
        contract.value_schemas[-1].schema,
        contract.fields,
    )
    import pyarrow as pa

    decoded, reasons = decoder.decode(pa.array([old, latest], pa.binary()))
    assert reasons.to_pylist() == [None, None]
    assert [(r["name"], r["age"], r["email"]) for r in decoded.to_pylist()] == [
        ("Ann", 30, None),
        ("Ann", 30, None),
    ]


def test_produce_refuses_a_value_that_does_not_fit_the_avro_schema(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = '{"key": "ann", "value": {"name": "Ann", "age": "thirty", "updated_at": 0}}\n'
    assert _run(monkeypatch, ["produce", "user-profiles"], stdin) == 1
    err = capsys.readouterr().err
    assert "stdin line 1: value does not fit Avro schema id 2" in err
    assert _values(settings, "user-profiles") == []


def test_sample_covers_both_shipped_topics(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["sample"]) == 0
    profiles = _values(settings, "user-profiles")
    assert len(profiles) == len(samples.SAMPLE_PROFILES)
    ids = sorted({v[1:5] for _, v in profiles if v is not None})
    assert ids == [b"\x00\x00\x00\x01", b"\x00\x00\x00\x02"]  # old and new producers


@pytest.mark.integration
def test_schemas_lists_versions_and_checks_contracts(
    spark: Any,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _run(monkeypatch, ["schemas", "--check", "--topic", "user-profiles"]) == 0
    out = capsys.readouterr().out
    assert "user-profiles value [BACKWARD]: no versions yet  -> new version accepted" in out
    from lakehouse.contracts.model import Catalog
    from lakehouse.streams.registry import SchemaRegistry

    (key, value) = SchemaRegistry(settings.registry_path).register(
        Catalog.load(settings.contracts_dir).topic("user-profiles"), spark
    )
    assert _run(monkeypatch, ["schemas", "--check", "--topic", "user-profiles"]) == 0
    out = capsys.readouterr().out
    assert "user-profiles value [BACKWARD]: v1 (avro, " in out and "-> unchanged" in out
    # The listing is the registry table's rows, as registered.
    assert _run(monkeypatch, ["schemas", "--topic", "user-profiles"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"user-profiles key [BACKWARD]: v1 (string, {key.registered_at})",
        f"user-profiles value [BACKWARD]: v1 (avro, {value.registered_at})",
    ]


def test_schemas_ignores_the_version_files_of_the_registry_before_its_table(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = settings.home / "registry" / "user-profiles" / "value" / "v000001.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"topic": "user-profiles", "subject": "value", "version": 1}))
    assert _run(monkeypatch, ["schemas", "--check", "--topic", "user-profiles"]) == 0
    out = capsys.readouterr().out
    assert "user-profiles value [BACKWARD]: no versions yet  -> new version accepted" in out
    assert old.exists()  # left as it was


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["refresh", "silver.user_locations"], "is a silver table; this works on gold tables only"),
        (["restore", "bronze.user-locations"], "is a bronze table; this works on gold tables only"),
        (["show", "user_places", "--at-event-time", "silver.x"], "--at-event-time"),
        (["refresh", "nope"], "unknown table 'nope'"),
        # `lakehouse run`'s requests, checked as a triggered run's Params are
        (
            ["run", "--full-refresh", "user_places"],
            "--full-refresh: name the topic it is for with --topic",
        ),
        (
            ["run", "--reprocess-silver-from-version", "2", "--reprocess-gold-from-version", "3"],
            "--reprocess-silver-from-version, --reprocess-gold-from-version: name the topic",
        ),
        (
            ["run", "--topic", "user-locations", "--full-refresh", "nope"],
            "--full-refresh: 'nope' is not a gold table this run builds for topic",
        ),
        (
            ["run", "--topic", "user-locations", "--reprocess-silver-from-offsets", "0:1; DROP"],
            "--reprocess-silver-from-offsets: '0:1; DROP' is not a list of partition:offset",
        ),
        (
            ["run", "--topic", "user-locations", "--reprocess-silver-from-offsets", "9:0"],
            "--reprocess-silver-from-offsets: topic 'user-locations' has 3 partitions",
        ),
        (
            [
                "run",
                *("--topic", "user-locations", "--reprocess-silver-from-version", "1"),
                *("--reprocess-silver-from-offsets", "0:1"),
            ],
            "--reprocess-silver-from-version and --reprocess-silver-from-offsets: give one",
        ),
        (
            [
                "run",
                *("--topic", "user-locations", "--layer", "bronze"),
                *("--reprocess-silver-from-version", "1"),
            ],
            "the layer 'silver' is not among the run's layers ['bronze']",
        ),
        (
            ["run", "--topic", "user-locations", "--reprocess-gold-from-version", "-1"],
            "--reprocess-gold-from-version: -1 is not a table version",
        ),
    ],
)
def test_bad_arguments_are_refused_before_spark_starts(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("Spark must not start for a bad argument")

    monkeypatch.setattr("lakehouse.runtime.spark.get_session", no_spark)
    assert _run(monkeypatch, argv) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--records", "-1"], "argument --records: -1 is below 1"),
        (["--records", "0"], "argument --records: 0 is below 1"),
        (["--records", "ten"], "argument --records: 'ten' is not a whole number"),
        (["--value-bytes", "-3"], "argument --value-bytes: -3 is below 0"),
    ],
)
def test_sample_refuses_counts_that_are_not_counts(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """A negative count used to produce nothing and succeed."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sample", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_maintain_starts_spark_only_for_tables_that_exist(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lakehouse without tables is done at once; with one, maintenance gets a session and
    that table."""

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("Spark must not start without a table to maintain")

    monkeypatch.setattr("lakehouse.runtime.spark.get_session", no_spark)
    assert _run(monkeypatch, ["maintain"]) == 0
    assert _run(monkeypatch, ["maintain", "--ledger", "--dry-run"]) == 0
    assert capsys.readouterr().out == "no tables to maintain\n" * 2

    log = settings.bronze_path("user-locations") / "_delta_log"
    log.mkdir(parents=True)
    (log / f"{0:020d}.json").write_text("{}\n")
    maintained: list[tuple[object, Path]] = []
    monkeypatch.setattr("lakehouse.runtime.spark.get_session", lambda *_a, **_k: "spark")
    monkeypatch.setattr(
        "lakehouse.pipeline.runner.maintain",
        lambda spark, path, *_a, **_k: maintained.append((spark, path)) or _Report(),
    )
    assert _run(monkeypatch, ["maintain", "--topic", "user-locations"]) == 0
    assert maintained == [("spark", settings.bronze_path("user-locations"))]


class _Report:
    def summary(self) -> str:
        return "maintained"


@pytest.fixture
def pipeline_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `lakehouse run` hands to the pipeline, which is not run (nor is Spark started)."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr("lakehouse.runtime.spark.get_session", lambda *_a, **_k: "spark")
    monkeypatch.setattr("lakehouse.pipeline.runner.run", lambda *_a, **kw: seen.update(kw))
    return seen


def test_run_hands_each_layer_its_part_of_the_request(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pipeline_calls: dict[str, Any],
) -> None:
    """What `lakehouse run`'s flags ask reaches each layer as a triggered run's Params do."""
    seen = pipeline_calls
    argv = ["run", "--topic", "user-locations", "--reprocess-silver-from-offsets", "0:10"]
    argv += ["--full-refresh", "user_latest_location", "--dry-run"]
    assert _run(monkeypatch, argv) == 0
    assert seen["topics"] == ["user-locations"] and seen["layers"] == ("bronze", "silver", "gold")
    request = seen["requests"]["user-locations"]
    assert request.for_layer("silver").args() == ["--dry-run", "--from-offsets", "0:10"]
    assert request.for_layer("gold").args() == [
        "--dry-run",
        "--full-refresh",
        "user_latest_location",
    ]
    assert request.for_layer("bronze").args() == ["--dry-run"]
    out = capsys.readouterr().out
    assert "decode again the bronze records from offsets 0:10" in out
    assert "gold user_latest_location: full refresh from the whole silver stream" in out


def test_a_plain_run_asks_nothing_more_of_any_topic(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pipeline_calls: dict[str, Any],
) -> None:
    assert _run(monkeypatch, ["run", "--layer", "silver"]) == 0
    requests = pipeline_calls["requests"]
    assert sorted(requests) == ["user-locations", "user-profiles"]
    for request in requests.values():
        assert request.layers == ("silver",)
        assert request.for_layer("silver").args() == []
    assert capsys.readouterr().out == ""
