"""The Params of a pipeline run (lakehouse.pipeline.request): read, checked against the contract before
any job starts, handed to a spark-submitted job as one JSON argument, and explained."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import CONFIG_ERROR_EXIT, ConfigError
from lakehouse.pipeline.request import (
    OPTIONS,
    RunRequest,
    joined,
    own,
    parse_offsets,
    readers_of,
    reprocessable,
)
from lakehouse.runtime.config import REPO_ROOT

CATALOG = Catalog.load(REPO_ROOT / "contracts")
LOCATIONS = CATALOG.topic("user-locations")
OWN = own(LOCATIONS)


def test_offsets_are_partition_offset_pairs() -> None:
    assert parse_offsets("0:120, 1:0") == {0: 120, 1: 0}
    with pytest.raises(ConfigError, match="is not a list of partition:offset pairs"):
        parse_offsets("0=120")
    with pytest.raises(ConfigError, match="partition 1 is given twice"):
        parse_offsets("1:5,1:6")


def test_defaults_run_every_layer_and_change_nothing_else() -> None:
    request = RunRequest.from_params({}, LOCATIONS, OWN)
    assert request == RunRequest(tables=tuple(OWN))
    assert request.layers == ("bronze", "silver", "gold")
    assert not request.dry_run and request.full_refresh == ()
    assert not request.reprocesses_silver and request.reprocessed(LOCATIONS) == []
    assert request.describe(LOCATIONS) == ["topic user-locations: layers bronze, silver, gold"]


def test_joins_live_in_their_own_dag() -> None:
    assert joined(LOCATIONS) == [
        "checkins_with_profile",
        "user_location_profile",
        "checkins_near_profile_changes",
    ]
    assert "user_latest_location" in OWN and not set(OWN) & set(joined(LOCATIONS))
    assert joined(CATALOG.topic("user-profiles")) == []
    assert readers_of(LOCATIONS, ["user_latest_location"]) == ["user_moves"]
    # A reprocess from a silver version puts back the tables reading the stream alone.
    assert "user_moves" not in reprocessable(LOCATIONS)
    assert "checkins_with_profile" not in reprocessable(LOCATIONS)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"layers": ["silver", "platinum"]}, "Param layers"),
        ({"layers": "gold"}, "Param layers"),
        ({"dry_run": "yes"}, "Param dry_run: 'yes' is not true or false"),
        ({"full_refresh": ["checkins_with_profile"]}, "is not a gold table this DAG builds"),
        ({"reprocess_gold_from_version": -1}, "is not a table version"),
        ({"reprocess_silver_from_version": True}, "is not a table version"),
        (
            {"reprocess_silver_from_version": 2, "reprocess_silver_from_offsets": "0:1"},
            "give one or the other",
        ),
        ({"reprocess_silver_from_offsets": "7:0"}, "has 3 partitions \\(0..2\\), not 7"),
        (
            {"layers": ["bronze", "gold"], "reprocess_silver_from_version": 3},
            "the layer 'silver' is not among the run's layers",
        ),
        (
            {"full_refresh": ["user_places"], "reprocess_gold_from_version": 4},
            "user_places would be both fully refreshed and reprocessed",
        ),
    ],
)
def test_bad_params_are_refused_naming_the_param(params: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunRequest.from_params(params, LOCATIONS, OWN)


def test_a_reset_says_what_the_layers_above_recompute() -> None:
    request = RunRequest.from_params(
        {"reprocess_silver_from_offsets": "0:10", "full_refresh": ["user_latest_location"]},
        LOCATIONS,
        OWN,
    )
    text = "\n".join(request.describe(LOCATIONS))
    assert "decode again the bronze records from offsets 0:10" in text
    assert "new arrivals for user_latest_location, user_location_counts" in text
    assert "gold user_latest_location: full refresh" in text
    assert "then: user_moves read the changelogs of the tables put back" in text
    assert request.reprocess_silver_from_offsets == {0: 10}
    assert request.full_refresh == ("user_latest_location",)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"dry_run": True, "reprocess_silver_from_offsets": "0:3, 1:9", "layers": ["silver"]},
        {"reprocess_silver_from_version": 4, "layers": ["gold", "silver"]},
        {"full_refresh": ["user_moves", "user_moves"], "reprocess_gold_from_version": 5},
    ],
    ids=repr,
)
def test_the_job_reads_back_the_request_it_is_given(
    params: dict[str, object], layer_job: ModuleType
) -> None:
    """The request reaches a spark-submitted job as one argument, under the Params' names, and
    the job reads the same request back."""
    request = RunRequest.from_params(params, LOCATIONS, OWN)
    argv = ["--topic", "user-locations", "--layer", "gold", f"--request={request.to_json()}"]
    args = layer_job.parser().parse_args(argv)
    assert json.loads(args.request).keys() == {o.name for o in OPTIONS} | {"tables"}
    assert RunRequest.from_json(args.request, LOCATIONS) == request
    # Left out: no request beyond the micro-batch, for every gold table of the topic.
    default = layer_job.parser().parse_args(argv[:4]).request
    assert RunRequest.from_json(default, LOCATIONS) == RunRequest()


@pytest.mark.parametrize(
    ("request_text", "message"),
    [
        ("[1]", "--request: [1] is not a JSON object"),
        ("{'dry_run': true}", "--request: not a JSON object: Expecting property name"),
        ('{"dry_run": true, "from_version": 3}', "--request: unknown key(s) 'from_version'"),
        ('{"tables": "user_places"}', "--request: tables: 'user_places' is not a list"),
        ('{"tables": ["../x"]}', "tables: topic 'user-locations' has no gold table '../x'"),
        ('{"reprocess_gold_from_version": "3"}', "Param reprocess_gold_from_version: '3'"),
        (
            '{"reprocess_silver_from_version": 1, "reprocess_silver_from_offsets": "0:1"}',
            "give one or the other",
        ),
    ],
)
def test_the_job_refuses_a_bad_request_before_spark_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    layer_job: ModuleType,
    request_text: str,
    message: str,
) -> None:
    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("Spark must not start for a bad request")

    monkeypatch.setattr("lakehouse.runtime.spark.get_session", no_spark)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("LAKEHOUSE_CONTRACTS", str(REPO_ROOT / "contracts"))
    argv = ["--topic", "user-locations", "--layer", "gold", "--request", request_text]
    assert layer_job.main(argv) == CONFIG_ERROR_EXIT
    assert message in capsys.readouterr().err
    assert not (tmp_path / "lakehouse").exists()
