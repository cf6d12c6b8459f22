"""The Params of a pipeline run (lakehouse.pipeline.request): read, checked against the contract before
any job starts, turned into each layer job's flags, and explained."""

from __future__ import annotations

import importlib.util

import pytest

from lakehouse.contracts.catalog import Catalog
from lakehouse.errors import ConfigError
from lakehouse.pipeline.request import (
    LayerRequest,
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


def _job_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("run_layer", REPO_ROOT / "jobs" / "run_layer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_offsets_are_partition_offset_pairs() -> None:
    assert parse_offsets("0:120, 1:0") == {0: 120, 1: 0}
    with pytest.raises(ConfigError, match="is not a list of partition:offset pairs"):
        parse_offsets("0=120")
    with pytest.raises(ConfigError, match="partition 1 is given twice"):
        parse_offsets("1:5,1:6")


def test_defaults_run_every_layer_and_change_nothing_else() -> None:
    request = RunRequest.from_params({}, LOCATIONS, OWN)
    assert request.layers == ("bronze", "silver", "gold")
    assert not request.dry_run and request.full_refresh == ()
    assert [request.for_layer(x).args() for x in request.layers] == [
        [],
        [],
        ["--tables", ",".join(OWN)],
    ]
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
    assert request.for_layer("silver").args() == ["--from-offsets", "0:10"]
    assert request.for_layer("gold").args() == [
        "--full-refresh",
        "user_latest_location",
        "--tables",
        ",".join(OWN),
    ]


def test_the_job_reads_back_the_flags_it_is_given() -> None:
    job = _job_module()
    for layer, request in [
        ("silver", LayerRequest(dry_run=True, from_offsets={0: 3, 1: 9})),
        ("silver", LayerRequest(from_version=4)),
        ("gold", LayerRequest(full_refresh=("a", "b"), from_version=5, tables=("a", "b", "c"))),
    ]:
        argv = ["--topic", "t", "--layer", layer, *request.args()]
        assert job.parse(argv)[1] == request
    with pytest.raises(ConfigError, match="--tables and --full-refresh are for the gold layer"):
        job.parse(["--topic", "t", "--layer", "bronze", "--full-refresh", "a"])
    with pytest.raises(ConfigError, match="give one or the other"):
        job.parse(
            ["--topic", "t", "--layer", "silver", "--from-version", "1", "--from-offsets", "0:1"]
        )
