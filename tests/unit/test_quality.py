"""Quality gates without Spark: compiling a contract's expectations (GX suite, Delta CHECK
constraint), GX's verdict on small Arrow batches for every kind, the contract's refusals,
freshness, and the ledger's round trip."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from textwrap import dedent
from typing import Any

import pyarrow as pa
import pytest

from lakehouse.contracts.catalog import load_contract
from lakehouse.contracts.model import Expectation
from lakehouse.errors import ContractError
from lakehouse.quality.expectations import check_constraint, gx_expectation
from lakehouse.quality.gate import freshness_outcome, volume_outcome
from lakehouse.quality.ledger import RunInfo, ledger_rows, read_ledger, save_result, write_ledger
from lakehouse.quality.verdict import Outcome, Verdict, pandas_frame, run_suite
from lakehouse.runtime.config import Settings


def _e(expect: str, severity: str = "warn", column: str | None = "x", **params: Any) -> Expectation:
    return Expectation(
        layer="silver",
        name=f"{expect}_check",
        expect=expect,
        severity=severity,  # type: ignore[arg-type]
        column=None if expect == "row_count_between" else column,
        params=tuple(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(params.items())
        ),
    )


# (expectation, column values, expected success, expected unexpected values)
CASES = [
    (_e("not_null"), [1, None, 3], False, [None]),
    (_e("not_null"), [1, 2], True, []),
    (_e("unique"), [1, 2, 2], False, [2, 2]),
    (_e("between", min=0, max=10), [0, 10, 11, None], False, [11]),
    (_e("between", min=0), [0, 99], True, []),
    (_e("in_set", values=["a", "b"]), ["a", "c", None], False, ["c"]),
    (_e("match_regex", pattern="^[a-z]+@[a-z]+$"), ["me@x", "nope"], False, ["nope"]),
    (_e("length_between", min=2, max=3), ["ab", "abcd", "a"], False, ["abcd", "a"]),
    (_e("row_count_between", min=1, max=2), [1, 2, 3], False, None),
    (_e("row_count_between", max=5), [1, 2, 3], True, None),
]


@pytest.mark.parametrize(("exp", "values", "success", "unexpected"), CASES)
def test_each_kind_compiles_to_gx_and_judges_a_batch(
    exp: Expectation, values: list[Any], success: bool, unexpected: list[Any] | None
) -> None:
    outcomes, engine, result = run_suite("silver.t", [exp], pa.table({"x": values}), len(values))
    (o,) = outcomes
    assert engine == "pandas"
    assert (o.expectation, o.kind, o.severity, o.success) == (
        exp.name,
        exp.expect,
        exp.severity,
        success,
    )
    if unexpected is None:  # a table-level check observes a value
        assert o.observed == len(values)
    else:
        assert o.unexpected_count == len(unexpected)
        assert sorted(o.sample, key=str) == sorted(unexpected, key=str)
    assert result["suite_name"] == "silver.t"
    assert result["success"] is success


def test_narrow_numbers_reach_gx_widened_and_judged_the_same() -> None:
    """GX's pandas engine compares 64-bit columns vectorized and anything else row by row in
    Python: the frame it gets has every narrower integer and float widened, values unchanged."""
    types = {
        "i8": pa.int8(), "i16": pa.int16(), "i32": pa.int32(), "u32": pa.uint32(),
        "f32": pa.float32(), "i64": pa.int64(), "s": pa.string(),
    }  # fmt: skip
    values = {
        "i8": [-128, 0, None], "i16": [-5, 7, 2], "i32": [0, 11, 12], "u32": [0, 4294967295, 1],
        "f32": [0.5, -1.25, None], "i64": [1, 2, 3], "s": ["a", None, "c"],
    }  # fmt: skip
    table = pa.table({c: pa.array(v, types[c]) for c, v in values.items()})
    frame = pandas_frame(table)
    wide = {"i8": "float64", "f32": "float64", "s": "object"}  # nulls: pandas' NaN / None
    assert {c: str(t) for c, t in frame.dtypes.items()} == {c: wide.get(c, "int64") for c in values}
    assert pa.Table.from_pandas(frame).cast(table.schema).equals(table)
    partition = _e("between", "fail", "x", min=0, max=11)
    outcomes, _, _ = run_suite(
        "bronze.t", [partition], pa.table({"x": pa.array([0, 11, 12, 5, -1], pa.int32())}), 5
    )
    assert (outcomes[0].success, outcomes[0].unexpected_count) == (False, 2)
    assert sorted(outcomes[0].sample) == [-1, 12]


def test_gx_expectation_carries_the_contract_names_in_meta() -> None:
    compiled = gx_expectation(_e("in_set", severity="fail", values=["a"]))
    assert type(compiled).__name__ == "ExpectColumnValuesToBeInSet"
    assert compiled.meta == {"name": "in_set_check", "kind": "in_set", "severity": "fail"}
    assert compiled.column == "x" and list(compiled.value_set) == ["a"]


@pytest.mark.parametrize(
    ("exp", "sql"),
    [
        (_e("not_null", "fail"), "x IS NOT NULL"),
        (_e("between", "fail", min=0, max=5), "x IS NULL OR (x >= 0 AND x <= 5)"),
        (_e("between", "fail", max=5.5), "x IS NULL OR (x <= 5.5)"),
        (
            _e("in_set", "fail", values=["a", "it's"]),
            "x IS NULL OR x IN ('a', concat('it', chr(39), 's'))",
        ),
        (
            _e("length_between", "fail", min=1),
            "x IS NULL OR (character_length(x) >= 1)",
        ),
        # Not constraints: other severities, regexes (engines differ), batch-level kinds.
        (_e("not_null", "warn"), None),
        (_e("not_null", "quarantine"), None),
        (_e("match_regex", "fail", pattern="a"), None),
        (_e("unique", "fail"), None),
        (_e("row_count_between", "fail", max=1), None),
    ],
)
def test_fail_row_checks_become_delta_check_constraints(exp: Expectation, sql: str | None) -> None:
    assert check_constraint(exp) == sql


def test_outcome_describes_what_was_seen() -> None:
    rows = Outcome("amount_range", "between", "fail", False, "amount", None, 10, 2, (500, 900))
    assert (
        rows.describe() == "amount_range (between amount): 2 of 10 rows unexpected, e.g. 500, 900"
    )
    count = Outcome("small", "row_count_between", "fail", False, observed=7)
    assert count.describe() == "small (row_count_between): observed 7 rows"


def test_freshness_compares_the_last_commit_with_the_interval(tmp_path: Path) -> None:
    contract = load_contract(_contract(tmp_path, "quality: {freshness: 10m}\n"))
    now = datetime.now(UTC)
    fresh = freshness_outcome(contract, now - timedelta(minutes=1))
    stale = freshness_outcome(contract, now - timedelta(minutes=11))
    assert fresh is not None and fresh.success and fresh.severity == "warn"
    assert stale is not None and not stale.success and 659 < stale.observed < 700
    empty = freshness_outcome(contract, None)
    assert empty is not None and not empty.success
    plain = load_contract(_contract(tmp_path, ""))
    assert freshness_outcome(plain, now) is None and plain.quality.volume is None


def test_volume_settings_are_read_with_defaults(tmp_path: Path) -> None:
    c = load_contract(_contract(tmp_path, "quality: {volume: {factor: 4}}\n"))
    assert c.quality.volume is not None
    assert (c.quality.volume.factor, c.quality.volume.history, c.quality.volume.min_history) == (
        4,
        20,
        5,
    )


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (
            "expectations:\n  bronze:\n    - {name: k, expect: not_null, column: key, "
            "severity: quarantine}\n",
            "bronze is the topic itself",
        ),
        (
            "expectations:\n  silver:\n    - {name: u, expect: unique, column: id, "
            "severity: quarantine}\n",
            "unique judges the batch, not a row",
        ),
        (
            "expectations:\n  silver:\n    - {name: r, expect: match_regex, column: id, "
            "pattern: '[', severity: warn}\n",
            "not a valid regular expression",
        ),
        ("quality: {volume: {history: 3, min_history: 4}}\n", "could never run"),
        ("quality: {freshness: soon}\n", "soon"),
        ("quality: {volume: {factor: 1}}\n", "factor"),
    ],
)
def test_contract_refuses_checks_that_cannot_work(tmp_path: Path, block: str, problem: str) -> None:
    with pytest.raises(ContractError) as refused:
        load_contract(_contract(tmp_path, block))
    assert problem in str(refused.value)


def test_ledger_round_trip_and_saved_result(spark: Any, tmp_path: Path) -> None:
    settings = Settings.from_env(tmp_path / "home", tmp_path)
    exp = _e("in_set", values=["a"])
    outcomes, engine, result = run_suite("silver.t", [exp], pa.table({"x": ["a", "b"]}), 2)
    verdict = Verdict("silver", "t", outcomes, 2, engine, result)
    run = RunInfo(dag_id="pipeline__t", dag_run_id="manual__1")
    write_ledger(
        spark,
        settings,
        ledger_rows(run, verdict, table_version=4, published=True, lineage={"versions": [1, 2]}),
    )
    (row,) = read_ledger(settings, "t").to_pylist()
    assert row["run_id"] == run.run_id and row["dag_run_id"] == "manual__1"
    assert (row["layer"], row["table"], row["table_version"], row["published"]) == (
        "silver",
        "t",
        4,
        True,
    )
    assert (row["expectation"], row["success"], row["unexpected_count"]) == (
        "in_set_check",
        False,
        1,
    )
    assert json.loads(row["unexpected_sample"]) == ["b"]
    assert json.loads(row["source"]) == {"versions": [1, 2]}
    assert read_ledger(settings, "other").num_rows == 0
    saved = save_result(settings, verdict, run)
    assert saved is not None and saved.parent == settings.validations_root / "silver.t"
    document = json.loads(saved.read_text())
    assert document["dag_run_id"] == "manual__1" and document["result"]["success"] is False


def _contract(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(
        dedent(
            """\
            topic: t
            key: {format: string, name: id}
            value:
              format: json
              fields:
                - {name: amount, type: long}
            stream: {name: t_stream}
            """
        )
        + extra
    )
    return path


def test_volume_warns_far_from_the_median_once_there_is_history(tmp_path: Path) -> None:
    c = load_contract(
        _contract(tmp_path, "quality: {volume: {factor: 3, history: 4, min_history: 2}}\n")
    )

    def ok(rows: int, past: list[int]) -> bool:
        outcome = volume_outcome(c, rows, past)
        assert outcome is not None and outcome.observed == rows
        return outcome.success

    assert ok(1000, [10])  # not enough history yet: no judgement
    assert ok(29, [10, 10])
    assert not ok(31, [10, 10])
    assert not ok(3, [10, 10])  # a third of the median is too few
    # Only the last `history` batches count: the median of [10, 10, 10, 10] is 10, not 100.
    assert not ok(100, [100, 100, 100, 10, 10, 10, 10])


def test_a_bad_engine_threshold_is_a_clear_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lakehouse.errors import ConfigError
    from lakehouse.quality.expectations import pandas_max_rows

    monkeypatch.setenv("LAKEHOUSE_GX_PANDAS_MAX_ROWS", "lots")
    with pytest.raises(ConfigError, match="LAKEHOUSE_GX_PANDAS_MAX_ROWS must be a whole number"):
        pandas_max_rows()
