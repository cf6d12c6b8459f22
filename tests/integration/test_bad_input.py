"""The bad-input corpus (``tests/data/bad_input``) through landing -> bronze -> silver -> gold.

One lake, two pipeline runs (the corpus, then one segment delivered again), and then the proof:
nothing crashed, and every input item of ``expected.json`` is where the corpus says it must be,
once: in the silver stream, in the bronze or silver quarantine with its reason and origin, or
skipped and counted as a re-delivery; and every stream record the windowed table takes is
counted in its window or written to the late table with its reason.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from lakehouse.contracts.catalog import Catalog
from lakehouse.pipeline.runner import run
from lakehouse.runtime.config import Settings
from lakehouse.storage.log import commit_metadata
from lakehouse.topics.bronze_table import BATCH_KEY
from lakes import records

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).resolve().parents[1] / "data" / "bad_input"
EXPECTED: dict[str, Any] = json.loads((CORPUS / "expected.json").read_text())
TOPIC, STREAM = EXPECTED["topic"], "bad_input"
LATEST, WINDOWED = "bad_input_latest", "bad_input_per_minute"
ITEMS: list[dict[str, Any]] = EXPECTED["items"]


def _items(outcome: str) -> list[dict[str, Any]]:
    return [i for i in ITEMS if i["outcome"] == outcome]


@dataclass
class Lake:
    settings: Settings
    summaries: list[list[str]]  # the pipeline's summary lines, per run


@pytest.fixture(scope="module")
def lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Lake:
    root = tmp_path_factory.mktemp("bad_input")
    contracts = root / "contracts"
    contracts.mkdir()
    shutil.copy(CORPUS / f"{TOPIC}.yaml", contracts)
    settings = Settings.from_env(root / "home", contracts)
    shutil.copytree(CORPUS / "landing", settings.landing_root)
    catalog = Catalog.load(contracts)

    def run_all() -> list[str]:
        lines: list[str] = []
        run(spark, settings, catalog, echo=lines.append)
        return lines

    first = run_all()
    # A segment delivered again after that run: written anew under its name, as a restarted
    # Connect task does.
    for name in EXPECTED["redeliver_after_first_run"]:
        target = settings.topic_dir(TOPIC) / name
        part = target.with_name(f".{target.name}.tmp")
        shutil.copy(CORPUS / "landing" / "topics" / TOPIC / name, part)
        os.replace(part, target)
    return Lake(settings, [first, run_all()])


def _iso(t: datetime | None) -> str | None:
    if t is None:
        return None
    t = t if t.tzinfo else t.replace(tzinfo=UTC)
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _landed_bytes(item: dict[str, Any]) -> tuple[bytes | None, bytes | None]:
    """Key and value bytes of an item's envelope line, read from the corpus file itself."""
    path = CORPUS / "landing" / "topics" / TOPIC / item["file"]
    envelope = json.loads(path.read_bytes().split(b"\n")[item["line"] - 1])

    def decode(name: str) -> bytes | None:
        text = envelope[name]
        if text is None:
            return None
        if envelope.get(f"{name}Encoding") == "base64":
            return base64.b64decode(text)
        return str(text).encode("utf-8")

    return decode("key"), decode("value")


def test_every_input_item_is_accounted_for_exactly_once(lake: Lake) -> None:
    s = lake.settings
    stream = Counter((r["partition"], r["offset"]) for r in records(s.silver_path(STREAM)))
    silver_bad = [
        (r["partition"], r["offset"]) for r in records(s.quarantine_path("silver", STREAM))
    ]
    bronze_bad = {
        (r["partition"], Path(r["source_file"]).name, r["line"])
        for r in records(s.quarantine_path("bronze", TOPIC))
    }
    duplicates = sum(_batch_summary(c)["duplicates"] for c in _bronze_batches(s))

    def found(item: dict[str, Any]) -> str | None:
        origin = (item["partition"], item["offset"])
        if item["outcome"] == "duplicate":  # counted below; its first delivery is in the stream
            return "duplicate" if stream[origin] == 1 else None
        if (item["partition"], Path(item["file"]).name, item["line"]) in bronze_bad:
            return "bronze_quarantine"
        if origin in silver_bad:
            return "silver_quarantine"
        return "stream" if stream[origin] == 1 else None

    def per_case(outcome: Callable[[dict[str, Any]], str | None]) -> dict[str, list[str | None]]:
        cases: dict[str, list[str | None]] = {}
        for item in ITEMS:
            cases.setdefault(item["case"], []).append(outcome(item))
        return cases

    assert per_case(found) == per_case(lambda item: item["outcome"])
    # Nothing more than the corpus: every table row is one of its items.
    assert max(stream.values()) == 1, "a record is in the stream twice"
    assert (sum(stream.values()), len(silver_bad), len(bronze_bad), duplicates) == tuple(
        len(_items(o)) for o in ("stream", "silver_quarantine", "bronze_quarantine", "duplicate")
    )
    assert len(stream) + len(silver_bad) + len(bronze_bad) + duplicates == len(ITEMS)
    # Bronze holds each readable record once: the stream's and the silver quarantine's.
    bronze = [(r["partition"], r["offset"]) for r in records(s.bronze_path(TOPIC))]
    assert sorted(bronze) == sorted([*stream, *silver_bad])


def _bronze_batches(settings: Settings) -> list[dict[str, Any]]:
    history = DeltaTable(str(settings.bronze_path(TOPIC))).history()
    return [c for c in reversed(history) if commit_metadata(c, BATCH_KEY) is not None]


def _batch_summary(commit: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = commit_metadata(commit, BATCH_KEY)
    return value


def _origin(case: str, outcome: str = "stream") -> tuple[int, int]:
    """(partition, offset) of the one item of a case with that outcome."""
    (item,) = [i for i in _items(outcome) if i["case"] == case]
    return item["partition"], item["offset"]


def test_stream_records_keep_their_values(lake: Lake) -> None:
    stream = {(r["partition"], r["offset"]): r for r in records(lake.settings.silver_path(STREAM))}
    for item in _items("stream"):
        row = stream[(item["partition"], item["offset"])]
        assert (row["user"], row["tombstone"]) == (item["user"], item["tombstone"]), item
        if not item["tombstone"]:
            assert row["page"] == item["page"], item
    # Schema evolution: a field the contract lacks is no column (bronze keeps the bytes); an
    # optional field removed or renamed is null; a required one goes to quarantine (above).
    added, removed, renamed = (
        _origin(c) for c in ("added field", "removed field", "renamed field")
    )
    assert "referrer" not in stream[added] and "qty" not in stream[renamed]
    assert stream[added]["amount"] == 1
    assert stream[removed]["amount"] is None and stream[renamed]["amount"] is None
    bronze = {(r["partition"], r["offset"]): r for r in records(lake.settings.bronze_path(TOPIC))}
    assert b'"referrer": "newsletter"' in bronze[added]["value"]
    assert b'"qty": 4' in bronze[renamed]["value"]
    # No `at` field: the record timestamp stands in as event time.
    no_time = stream[_origin("missing event time, record timestamp used")]
    assert no_time["at"] is None and no_time["event_time"] == no_time["timestamp"]


def test_bronze_quarantine_names_reason_and_origin(lake: Lake) -> None:
    rows = records(lake.settings.quarantine_path("bronze", TOPIC))
    by_origin = {(r["partition"], Path(r["source_file"]).name, r["line"]): r for r in rows}
    assert len(by_origin) == len(rows)
    expected = _items("bronze_quarantine")
    assert len(rows) == len(expected)
    for item in expected:
        row = by_origin[(item["partition"], Path(item["file"]).name, item["line"])]
        assert item["reason"] in row["reason"], (item["case"], row["reason"])
        assert row["topic"] == TOPIC
        if item["line"] is not None:  # a line: where it starts, and its bytes for inspection
            assert row["byte_offset"] is not None and row["raw"] is not None
            data = (CORPUS / "landing" / "topics" / TOPIC / item["file"]).read_bytes()
            assert data[row["byte_offset"] :].startswith(row["raw"]), item["case"]


def test_silver_quarantine_names_reason_and_origin(lake: Lake) -> None:
    rows = records(lake.settings.quarantine_path("silver", STREAM))
    by_origin = {(r["partition"], r["offset"]): r for r in rows}
    assert len(by_origin) == len(rows)
    expected = _items("silver_quarantine")
    assert len(rows) == len(expected)
    for item in expected:
        row = by_origin[(item["partition"], item["offset"])]
        assert item["reason"] in row["reason"], (item["case"], row["reason"])
        # The record as it came, for a fix and a reprocess.
        assert (row["key"], row["value"]) == _landed_bytes(item), item["case"]


def test_redeliveries_land_once_and_are_counted(lake: Lake) -> None:
    per_run = Counter(i["run"] for i in _items("duplicate"))
    batches = _bronze_batches(lake.settings)
    assert [_batch_summary(c).get("duplicates") for c in batches] == [per_run[1], per_run[2]]
    for run_lines, n in zip(lake.summaries, (per_run[1], per_run[2]), strict=True):
        assert any(f"{n} re-delivered skipped" in line for line in run_lines), run_lines
    # The second run read the re-delivered segment only: no bad line was quarantined twice.
    assert _batch_summary(batches[1])["records"] == 0
    assert _batch_summary(batches[1])["quarantined"] == 0
    bronze = [r for r in records(lake.settings.bronze_path(TOPIC)) if r["partition"] == 2]
    assert sorted(r["offset"] for r in bronze) == list(range(8))


def test_offset_gaps_of_unreadable_lines_are_reported(lake: Lake) -> None:
    """Bronze cannot know the offset of a line it cannot read: its position moves past offsets
    that no landed record carries, and the batch reports how many per partition."""
    first = _batch_summary(_bronze_batches(lake.settings)[0])
    landed = [i["offset"] for i in _items("stream") if i["partition"] == 0]
    unreadable = [
        i
        for i in _items("bronze_quarantine")
        if i["partition"] == 0 and i["offset"] is not None and i["offset"] < max(landed)
    ]
    assert first["gaps"] == {"0": len(unreadable)}


def test_latest_table(lake: Lake) -> None:
    """Latest per key in offset order (not file order: carol's offsets come shuffled), erin
    deleted by a tombstone, the null key ignored."""
    rows = records(lake.settings.gold_path(LATEST))
    assert {r["user"]: r["page"] for r in rows} == EXPECTED["latest"]


def test_windowed_table_counts_or_sends_to_late(lake: Lake) -> None:
    s = lake.settings
    windows = [
        {"user": r["user"], "window_start": _iso(r["window_start"]), "clicks": r["clicks"]}
        for r in records(s.gold_path(WINDOWED))
    ]
    assert sorted(windows, key=lambda w: (w["user"], w["window_start"])) == EXPECTED["windows"]

    late = {(r["partition"], r["offset"]): r for r in records(s.late_path(WINDOWED))}
    expected_late = [i for i in _items("stream") if i["gold"] == "late"]
    assert len(late) == len(expected_late)
    for item in expected_late:
        row = late[(item["partition"], item["offset"])]
        assert item["late_reason"] in row["reason"], (item["case"], row["reason"])
        assert (row["user"], row["page"]) == (item["user"], item["page"])
        assert _iso(row["event_time"]) == item["event_time"]

    taken = [i for i in _items("stream") if i["gold"] in ("window", "late")]
    assert all(i["user"] is not None and not i["tombstone"] for i in taken)
    assert sum(w["clicks"] for w in windows) + len(late) == len(taken)
