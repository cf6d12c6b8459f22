"""A topic's gold tables are built side by side (lakehouse.tables.gold.build_side_by_side):
at once up to the parallelism, a changelog reader after its source, a failure kept to its
table and those that read it."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from lakehouse.errors import ConfigError, InputFailedError, QualityGateError, TablesFailedError
from lakehouse.tables.gold import build_side_by_side, parallelism


def _spec(name: str, changelog: str | None = None) -> Any:
    return SimpleNamespace(name=name, changelog=changelog)


def test_tables_are_built_at_once_up_to_the_parallelism() -> None:
    # Each build waits for the other two: one after another, the barrier would break.
    together = threading.Barrier(3, timeout=30)

    def build(spec: Any) -> str:
        together.wait()
        return f"built {spec.name}"

    results, failures = build_side_by_side([_spec("a"), _spec("b"), _spec("c")], build, 3)
    assert failures == {}
    assert results == {"a": "built a", "b": "built b", "c": "built c"}


def test_one_at_a_time_with_a_parallelism_of_one() -> None:
    lock = threading.Lock()
    running: list[str] = []
    most = 0

    def build(spec: Any) -> str:
        nonlocal most
        with lock:
            running.append(spec.name)
            most = max(most, len(running))
        threading.Event().wait(0.05)
        with lock:
            running.remove(spec.name)
        return spec.name

    results, _ = build_side_by_side([_spec(n) for n in "abcd"], build, 1)
    assert sorted(results) == ["a", "b", "c", "d"]
    assert most == 1


def test_a_changelog_reader_starts_once_its_source_is_done() -> None:
    events: list[str] = []
    lock = threading.Lock()

    def build(spec: Any) -> str:
        with lock:
            events.append(f"start {spec.name}")
        with lock:
            events.append(f"end {spec.name}")
        return spec.name

    specs = [_spec("moves", changelog="latest"), _spec("latest"), _spec("counts")]
    results, failures = build_side_by_side(specs, build, 3)
    assert failures == {}
    assert set(results) == {"moves", "latest", "counts"}
    assert events.index("start moves") > events.index("end latest")


def test_a_failed_table_leaves_the_others_and_holds_back_its_readers() -> None:
    failed = QualityGateError("gold", "latest", ["unique_user (unique user): 1 of 2 rows"])

    def build(spec: Any) -> str:
        if spec.name == "latest":
            raise failed
        return spec.name

    specs = [_spec("latest"), _spec("counts"), _spec("moves", changelog="latest")]
    results, failures = build_side_by_side(specs, build, 2)
    assert results == {"counts": "counts"}
    assert failures["latest"] is failed
    held = failures["moves"]
    assert isinstance(held, InputFailedError)
    assert held.upstream == "latest"
    assert "gold table moves was not built" in str(held)
    # Only quality gates held them back: a retry would fail again.
    error = TablesFailedError("gold", failures, list(results))
    assert error.quality_only
    assert str(error).startswith("2 gold tables failed (the other 1 committed): latest: ")


def test_the_last_table_to_fail_holds_back_its_reader_too() -> None:
    """The reader is held back in the pass after its source failed, with nothing else left."""

    def build(spec: Any) -> str:
        if spec.name == "latest":
            raise OSError("disk full")
        return spec.name

    specs = [_spec("latest"), _spec("moves", changelog="latest")]
    results, failures = build_side_by_side(specs, build, 2)
    assert results == {}
    assert isinstance(failures["latest"], OSError)
    assert isinstance(failures["moves"], InputFailedError)


def test_an_error_that_is_not_a_gate_can_be_retried() -> None:
    failures: dict[str, Exception] = {
        "latest": QualityGateError("gold", "latest", ["x"]),
        "counts": OSError("disk full"),
    }
    assert not TablesFailedError("gold", failures, []).quality_only


def test_the_parallelism_is_a_whole_number_of_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKEHOUSE_GOLD_PARALLELISM", raising=False)
    assert parallelism() == 4
    monkeypatch.setenv("LAKEHOUSE_GOLD_PARALLELISM", "1")
    assert parallelism() == 1
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("LAKEHOUSE_GOLD_PARALLELISM", bad)
        with pytest.raises(ConfigError, match="LAKEHOUSE_GOLD_PARALLELISM must be a whole"):
            parallelism()
