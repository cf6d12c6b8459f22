from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from lakehouse import cli
from lakehouse.pipeline import reads
from lakehouse.pipeline.request import RunRequest
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


def test_a_bad_line_stops_the_producer_and_nothing_is_written(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = (
        '{"key": "a", "value": {"location": "Oslo"}}\n'
        '{"key": "b", "value": {"location": "Rome"}}\n'
        '{"key": "c", "value": \n'
        '{"key": "d", "value": {"location": "Lima"}}\n'
    )
    assert _run(monkeypatch, ["produce", "user-locations"], stdin) == 1
    err = capsys.readouterr().err
    assert "error: stdin line 3: not valid JSON" in err
    assert "nothing produced to user-locations" in err
    assert list_segments(settings, "user-locations") == []


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
    reads.render(t, "json", out)
    assert [json.loads(x) for x in out.getvalue().splitlines()] == [
        {"username": "alice", "count": 3, "raw": "base64:/w=="},
        {"username": None, "count": 2, "raw": "ok"},
    ]
    out = io.StringIO()
    reads.render(t, "table", out)
    text = out.getvalue()
    assert "| username | count | raw" in text and "| null     | 2" in text and "(2 rows)" in text


def test_render_prints_decimals_exactly() -> None:
    from decimal import Decimal

    import pyarrow as pa

    amounts = [Decimal("3537.58"), Decimal("0.0000001000"), None]
    all_of = [amounts[:2], [], None]
    t = pa.table(
        {
            "total": pa.array(amounts, pa.decimal128(22, 10)),
            "all": pa.array(all_of, pa.list_(pa.decimal128(22, 10))),
        }
    )
    out = io.StringIO()
    reads.render(t, "json", out)
    assert out.getvalue().splitlines() == [
        '{"total": 3537.5800000000, "all": [3537.5800000000, 0.0000001000]}',
        '{"total": 0.0000001000, "all": []}',
        '{"total": null, "all": null}',
    ]
    out = io.StringIO()
    reads.render(t, "table", out)
    assert out.getvalue().splitlines()[3:6] == [
        "| 3537.5800000000 | [3537.5800000000, 0.0000001000] |",
        "| 0.0000001000    | []                              |",
        "| null            | null                            |",
    ]


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
    from lakehouse.contracts.catalog import Catalog

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
    assert (
        "error: stdin line 1: field 'age': expected an int (a JSON integer), got the string \"thirty\""
        in err
    )
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
    from lakehouse.contracts.catalog import Catalog
    from lakehouse.streams.registry import SchemaRegistry

    (key, value) = SchemaRegistry(settings).register(
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
        lambda spark, _settings, path, *_a, **_k: maintained.append((spark, path)) or _Report(),
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


def test_run_hands_the_layers_the_request_its_flags_ask(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pipeline_calls: dict[str, Any],
) -> None:
    """What `lakehouse run`'s flags ask reaches the layers as a triggered run's Params do."""
    seen = pipeline_calls
    argv = ["run", "--topic", "user-locations", "--reprocess-silver-from-offsets", "0:10"]
    argv += ["--full-refresh", "user_latest_location", "--dry-run"]
    assert _run(monkeypatch, argv) == 0
    assert seen["topics"] == ["user-locations"] and seen["layers"] == ("bronze", "silver", "gold")
    request = seen["requests"]["user-locations"]
    assert request == RunRequest(
        dry_run=True,
        full_refresh=("user_latest_location",),
        reprocess_silver_from_offsets={0: 10},
    )
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
        assert request == RunRequest(layers=("silver",))
    assert capsys.readouterr().out == ""


# -- every table by its name; the command line's habits (issue 58, point 5) ---------------------


def _delta(path: Any, **columns: list[Any]) -> None:
    """A Delta table at ``path`` with ``columns``, written by delta-rs (no Spark)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(path), pa.table(columns), mode="append")


def _json_rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


# Each kind of table the platform writes, by the name `show` takes, with where it lies.
SIDE_TABLES = {
    "bronze.user-locations": lambda s: s.bronze_path("user-locations"),
    "quarantine.bronze.user-locations": lambda s: s.quarantine_path("bronze", "user-locations"),
    "silver.user_locations": lambda s: s.silver_path("user_locations"),
    "quarantine.silver.user_locations": lambda s: s.quarantine_path("silver", "user_locations"),
    "user_latest_location": lambda s: s.gold_path("user_latest_location"),
    "late.checkins_5m": lambda s: s.late_path("checkins_5m"),
    "state.user_sessions": lambda s: s.state_path("user_sessions"),
    "state.user_location_profile__other": lambda s: s.state_path("user_location_profile__other"),
    "quality.ledger": lambda s: s.ledger_path,
    "schemas.registry": lambda s: s.registry_path,
}


def test_every_table_the_platform_writes_has_a_name_show_takes_and_tables_lists(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Quarantine, late, state, the ledger and the registry are shown like any table (a
    quarantine table used to be an unknown table); `lakehouse tables` lists each with its kind,
    version and rows."""
    for n, (name, path) in enumerate(SIDE_TABLES.items()):
        _delta(path(settings), partition=[0, 1], offset=[n, n], what=[name, name])
    assert _run(monkeypatch, ["tables", "--format", "json"]) == 0
    listed = {r["name"]: r for r in _json_rows(capsys.readouterr().out)}
    assert set(listed) == set(SIDE_TABLES)
    assert listed["quarantine.silver.user_locations"] == {
        "name": "quarantine.silver.user_locations",
        "kind": "quarantine",
        "topic": "user-locations",
        "version": 0,
        "rows": 2,
    }
    assert listed["state.user_location_profile__other"]["kind"] == "state"
    assert (listed["quality.ledger"]["kind"], listed["quality.ledger"]["topic"]) == ("ledger", None)
    assert listed["schemas.registry"]["kind"] == "registry"
    for name in SIDE_TABLES:
        assert _run(monkeypatch, ["show", name, "--format", "json"]) == 0, capsys.readouterr()
        rows = _json_rows(capsys.readouterr().out)
        assert [(r["partition"], r["what"]) for r in rows] == [(0, name), (1, name)]
    # A table's other names: gold.<table>, a stream's bare name.
    for alias in ("gold.user_latest_location", "user_locations"):
        assert _run(monkeypatch, ["show", alias, "--format", "json"]) == 0
        assert len(_json_rows(capsys.readouterr().out)) == 2
    # The plain listing: one line per table, the ledger and registry at the end.
    assert _run(monkeypatch, ["tables", "--topic", "user-locations"]) == 0
    out = capsys.readouterr().out
    assert "| name " in out and "| kind " in out and "| version | rows |" in out
    assert (
        "| quarantine.bronze.user-locations   | quarantine | user-locations | 0       | 2    |"
        in out
    )
    assert "quality.ledger" not in out and "(8 rows)" in out


def test_a_kafka_topics_gaps_table_is_shown_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    (contracts / "pay.yaml").write_text(
        "topic: pay\npartitions: 1\nkey: {format: string, name: id}\n"
        "value: {format: json, fields: [{name: amount, type: long}]}\n"
        "stream: {name: pay_stream}\ntables: []\n"
        "kafka: {bootstrap_servers: 'localhost:1', on_data_loss: record}\n"
    )
    lake = Settings.from_env(tmp_path / "home", contracts)
    _delta(lake.gaps_path("pay"), partition=[0], first_offset=[3], last_offset=[9])
    argv = ["--home", str(lake.home), "--contracts", str(contracts)]
    assert _run(monkeypatch, [*argv, "show", "gaps.pay", "--format", "json"]) == 0
    assert _json_rows(capsys.readouterr().out) == [
        {"partition": 0, "first_offset": 3, "last_offset": 9}
    ]
    assert _run(monkeypatch, [*argv, "tables", "--format", "json"]) == 0
    assert [(r["name"], r["kind"]) for r in _json_rows(capsys.readouterr().out)] == [
        ("gaps.pay", "gaps")
    ]


def test_an_unknown_table_is_refused_naming_the_tables_that_exist(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["show", "quarantine.silver.nope"]) == 1
    err = capsys.readouterr().err  # no table yet: the names the pipeline will create
    assert err.startswith(
        "error: unknown table 'quarantine.silver.nope'; known tables: none yet; once the "
        "pipeline runs: bronze.user-locations, quarantine.bronze.user-locations, "
    )
    assert "late.checkins_5m" in err and "quality.ledger" in err
    _delta(settings.late_path("checkins_5m"), offset=[1])
    _delta(settings.quarantine_path("silver", "user_locations"), offset=[1])
    assert _run(monkeypatch, ["changes", "late.nope"]) == 1
    assert capsys.readouterr().err == (
        "error: unknown table 'late.nope'; known tables: late.checkins_5m, "
        "quarantine.silver.user_locations\n"
    )


def test_changes_of_a_table_without_a_changelog_says_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _delta(settings.registry_path, topic=["t"])
    assert _run(monkeypatch, ["changes", "schemas.registry"]) == 1
    assert capsys.readouterr().err == (
        "error: schemas.registry keeps no changelog (its change data feed is off): "
        "`lakehouse show schemas.registry --version N` shows it at any version\n"
    )


def test_a_reader_that_quits_early_ends_the_command_quietly(settings: Settings) -> None:
    """`lakehouse show T | head`: no BrokenPipeError traceback; the exit status a shell shows
    for a program SIGPIPE ended (141), as `cat` gets under `set -o pipefail`."""
    import subprocess
    import sys

    rows = 50_000  # far more than a pipe holds: the command is still writing when head quits
    _delta(settings.bronze_path("user-locations"), partition=[0] * rows, offset=list(range(rows)))
    show = [sys.executable, "-m", "lakehouse.cli", "show", "bronze.user-locations"]
    with subprocess.Popen(show, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # what head does after its lines
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    assert first.startswith(b"+--")
    assert (code, err) == (cli.EXIT_BROKEN_PIPE, "")


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--home", "a", "--home", "b", "tables"], "--home"),
        (["show", "t", "--format", "json", "--format", "table"], "--format"),
        (["show", "t", "--version", "1", "--version", "2"], "--version"),
        (["changes", "t", "--from-version", "1", "--from-version", "2"], "--from-version"),
        (["produce", "t", "--value-schema-id", "1", "--value-schema-id", "2"], "--value-schema-id"),
        (["dq", "--table", "a", "--table", "b"], "--table"),
        (["sample", "--topic", "a", "--topic", "b"], "--topic"),
        (["maintain", "--retention-hours", "1", "--retention-hours", "2"], "--retention-hours"),
        (["restore", "t", "--to", "a", "--to", "b"], "--to"),
        (
            [
                "run",
                *("--reprocess-gold-from-version", "1"),
                *("--reprocess-gold-from-version", "2"),
            ],
            "--reprocess-gold-from-version",
        ),
    ],
)
def test_an_option_given_twice_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], option: str
) -> None:
    """argparse kept the last of the two, silently."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert f"argument {option}: given twice (" in capsys.readouterr().err


def test_no_option_of_any_command_drops_a_value_given_twice() -> None:
    """Every option of every command that takes a value, given twice: refused, or both values
    kept (several --topic or --layer)."""
    import argparse
    import contextlib

    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(cli.COMMANDS)  # each command runs something
    checked = 0
    for command, sub in commands.choices.items():
        positionals = ["x" for a in sub._actions if not a.option_strings and a.nargs is None]
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.dest == "help":
                continue
            value = str(next(iter(action.choices))) if action.choices else "1"
            twice = [*positionals, action.option_strings[0], value, action.option_strings[0], value]
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    args = parser.parse_args([command, *twice])
            except SystemExit as exit_:
                assert exit_.code == 2 and "given twice" in err.getvalue(), (command, err)
            else:
                assert getattr(args, action.dest) == [value, value], (command, action.dest)
            checked += 1
    assert checked > 20


def test_several_topics_and_layers_run_all_of_them(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pipeline_calls: dict[str, Any],
) -> None:
    argv = ["run", "--layer", "gold", "--layer", "bronze", "--topic", "user-profiles"]
    assert _run(monkeypatch, [*argv, "--topic", "user-locations", "--layer", "gold"]) == 0
    assert pipeline_calls["topics"] == ["user-profiles", "user-locations"]
    assert pipeline_calls["layers"] == ("bronze", "gold")  # in pipeline order, each once
    requests = pipeline_calls["requests"]
    assert sorted(requests) == ["user-locations", "user-profiles"]
    assert all(r.layers == ("bronze", "gold") for r in requests.values())
    capsys.readouterr()
    # A reprocess is of one topic.
    argv = ["run", "--topic", "user-profiles", "--topic", "user-locations"]
    assert _run(monkeypatch, [*argv, "--full-refresh", "user_places"]) == 1
    assert capsys.readouterr().err == (
        "error: --full-refresh: name the one topic it is for with --topic (given "
        "user-profiles, user-locations)\n"
    )


@pytest.mark.parametrize(
    ("argv", "rebuild"),
    [
        (["refresh", "user_places"], "refresh"),
        (["restore", "user_places"], "restore"),
        (["show", "user_places", "--at-event-time", "2026-01-01T00:00:00Z"], "at_event_time"),
    ],
)
def test_rebuilds_run_on_the_spark_server_when_it_runs(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    rebuild: str,
) -> None:
    """As `lakehouse run` does: a client of the running server, no JVM of their own."""
    import pyarrow as pa

    from lakehouse.runtime import server

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Spark of its own while the server runs")

    given: list[object] = []

    class Rebuilt:
        def summary(self) -> str:
            return "rebuilt"

    def rebuilt(spark: object, *_args: object, **_kwargs: object) -> object:
        given.append(spark)
        return {"refresh": Rebuilt(), "restore": 0, "at_event_time": pa.table({"x": [1]})}[rebuild]

    monkeypatch.setattr("lakehouse.runtime.spark.get_session", no_spark)
    monkeypatch.setattr(server, "status", lambda _s: server.Status(True, 15999, pid=1))
    monkeypatch.setattr(server, "connect", lambda _s: "the server's session")
    monkeypatch.setattr(f"lakehouse.tables.rebuild.{rebuild}", rebuilt)
    monkeypatch.setattr("lakehouse.storage.read_arrow", lambda *_a, **_k: pa.table({"x": [1]}))
    assert _run(monkeypatch, argv) == 0
    assert given == ["the server's session"]
    assert capsys.readouterr().err == "on the Spark server at sc://localhost:15999\n"


def test_lag_says_its_units(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(monkeypatch, ["sample", "--topic", "user-locations"]) == 0
    capsys.readouterr()
    assert _run(monkeypatch, ["lag", "--topic", "user-locations"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "| topic          | partition | end offset | bronze offset | lag (records) |"
    assert "| user-locations | 0         | 5          | 0             | 5             |" in lines
    assert _run(monkeypatch, ["lag", "--topic", "user-locations", "--layer", "silver"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "| table                 | input                 | input version | read up to version "
        "| lag (versions) |"
    )
    assert "| silver.user_locations | bronze.user-locations | null          | null" in lines[3]


def test_dq_says_the_unit_of_every_figure(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`freshness 44.34` was a number of nothing."""
    from datetime import UTC, datetime

    import pyarrow as pa
    from deltalake import write_deltalake

    from lakehouse.quality.ledger import ledger_schema

    base = {
        "run_id": "r1",
        "validated_at": datetime(2026, 1, 1, tzinfo=UTC),
        "layer": "bronze",
        "table": "user-locations",
        "table_version": 4,
        "published": True,
        "rows": 12,
        "severity": "warn",
        "success": True,
    }
    checks = [
        {"expectation": "freshness", "kind": "freshness", "observed_value": "44.34",
         "unexpected_sample": '["limit 60 s"]'},
        {"expectation": "volume", "kind": "volume", "observed_value": "12",
         "unexpected_sample": '["median of the last 3 batches: 10"]'},
        {"expectation": "small", "kind": "row_count_between", "observed_value": "12"},
        {"expectation": "present", "kind": "not_null", "element_count": 12,
         "unexpected_count": 2, "success": False},
    ]  # fmt: skip
    batch = {
        "kind": "batch",
        "severity": None,
        "success": None,
        "outcome": "published",
        "quarantined": 1,
        "quarantine_reasons": '{"empty line": 1}',
        "gaps": 2,
        "lag": 5,
        "lag_unit": "records",
    }
    rows = [{**dict.fromkeys(ledger_schema().names), **base, **c} for c in [*checks, batch]]
    write_deltalake(str(settings.ledger_path), pa.Table.from_pylist(rows, ledger_schema()))
    assert _run(monkeypatch, ["dq", "--days", "100000"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "bronze.user-locations",
        "  latest run, with data: 2026-01-01 00:00:00 UTC, 12 rows published as version 4, "
        "1 quarantined (1 empty line), 2 offsets missing, 3/4 checks met, last data 44 s ago "
        "(limit 60 s), lag 5 records",
        "    ok   warn       freshness                    44.3 s (limit 60 s)  (failed in 0 of 1 "
        "checked run)",
        "    ok   warn       volume                       12 rows (median of the last 3 batches: "
        "10 rows)  (failed in 0 of 1 checked run)",
        "    ok   warn       small                        12 rows  (failed in 0 of 1 checked run)",
        "    FAIL warn       present                      2 of 12 rows unexpected  (failed in 1 "
        "of 1 checked run)",
        "  last run: 1 batch, 1 published, 0 blocked, 1 quarantined, 0 of 1 checked run met "
        "every check",
    ]
    # Outside the window (14 days by default), nothing.
    assert _run(monkeypatch, ["dq"]) == 0
    assert capsys.readouterr().out.splitlines() == ["no validations recorded"]


def test_dq_shows_the_last_batch_with_data_beside_the_latest_run_and_takes_a_topic(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After runs that found nothing new, a table's latest run is a freshness check alone: the
    last batch that carried data is shown beside it, with its own checks. ``--table`` with a
    topic's name covers every table of the topic, and no other."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa
    from deltalake import write_deltalake

    from lakehouse.quality.ledger import ledger_schema

    t0 = datetime.now(UTC) - timedelta(hours=1)

    def row(run: str, minutes: int, layer: str, table: str, **values: object) -> dict[str, object]:
        return {
            **dict.fromkeys(ledger_schema().names),
            "run_id": run,
            "validated_at": t0 + timedelta(minutes=minutes),
            "layer": layer,
            "table": table,
            "severity": "warn",
            "success": True,
            **values,
        }

    def batch(run: str, minutes: int, layer: str, table: str, n: int) -> dict[str, object]:
        return row(run, minutes, layer, table, kind="batch", severity=None, success=None,
                   outcome="published", rows=n, table_version=1, published=True)  # fmt: skip

    def fresh(run: str, minutes: int, layer: str, table: str, age: int) -> dict[str, object]:
        return row(run, minutes, layer, table, expectation="freshness", kind="freshness",
                   observed_value=str(age), unexpected_sample='["limit 3600 s"]')  # fmt: skip

    rows = [
        batch("r1", 0, "bronze", "user-locations", 5),
        row(
            "r1",
            0,
            "bronze",
            "user-locations",
            expectation="present",
            kind="not_null",
            element_count=5,
            unexpected_count=1,
            success=False,
        ),
        fresh("r2", 30, "bronze", "user-locations", 1800),  # nothing new
        batch("r3", 1, "silver", "user_locations", 5),
        batch("r4", 2, "gold", "user_latest_location", 2),
        batch("r5", 3, "bronze", "user-profiles", 6),
    ]
    write_deltalake(str(settings.ledger_path), pa.Table.from_pylist(rows, ledger_schema()))
    assert _run(monkeypatch, ["dq", "--table", "user-locations"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if not line.startswith(" ")] == [
        "bronze.user-locations",
        "gold.user_latest_location",
        "silver.user_locations",
    ]
    at = [f"{t0 + timedelta(minutes=m):%Y-%m-%d %H:%M:%S} UTC" for m in (0, 30)]
    assert out[:6] == [
        "bronze.user-locations",
        f"  latest run: {at[1]}, no new data, 1/1 checks met, last data 1800 s ago (limit 3600 s)",
        "    ok   warn       freshness                    1800.0 s (limit 3600 s)  (failed in 0 "
        "of 2 checked runs)",
        f"  last batch with data: {at[0]}, 5 rows published as version 1, 0/1 checks met",
        "    FAIL warn       present                      1 of 5 rows unexpected  (failed in 1 of "
        "2 checked runs)",
        "  last 2 runs: 1 batch, 1 published, 0 blocked, 0 quarantined, 1 of 2 checked runs met "
        "every check",
    ]
    assert _run(monkeypatch, ["dq", "--table", "user_latest_location"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "gold.user_latest_location"


def test_a_broken_contract_fails_only_the_commands_that_concern_its_topic(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Beside the shipped contracts, one with a misspelled field: a command about another topic
    works and says what it left out; one about the broken topic, or about every topic, stops
    with the file's error before anything moves."""
    import shutil

    from lakehouse.runtime.config import REPO_ROOT

    contracts = tmp_path / "contracts"
    shutil.copytree(REPO_ROOT / "contracts", contracts)
    (contracts / "refunds.yaml").write_text(
        "topic: refunds\npartitions: 1\nkey: {format: string, name: id}\n"
        "value: {format: json, fields: [{name: amount, type: long}]}\n"
        "stream: {name: refunds}\ntabels: []\n"
    )
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(contracts))
    line = '{"key": "alice", "value": {"location": "Paris"}}\n'
    assert _run(monkeypatch, ["produce", "user-locations"], line) == 0
    err = capsys.readouterr().err
    assert "produced 1 record(s) to user-locations" in err
    assert f"note: left out, its contract does not load: {contracts / 'refunds.yaml'}" in err
    assert "tabels" in err
    assert _run(monkeypatch, ["produce", "refunds"], '{"key": "a", "value": {"amount": 1}}\n') == 1
    assert capsys.readouterr().err == (
        f"error: {contracts / 'refunds.yaml'}: unknown key 'tabels' (did you mean 'tables'?)\n"
    )
    assert _run(monkeypatch, ["run", "--layer", "bronze"]) == 1
    err = capsys.readouterr().err
    assert "1 contract(s) do not load, so `lakehouse run` would leave their topics out" in err
    assert not (tmp_path / "home" / "tables").exists()  # nothing moved
