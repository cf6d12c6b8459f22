"""Write the bad-input corpus: landing segment files of topic ``bad-input`` in the project's
envelope format (see :mod:`lakehouse.topics.landing`), ``expected.json`` (the outcome every input item
must have) and ``README.md`` (the same, for people).

    .venv/bin/python tests/data/bad_input/make_corpus.py

The output is committed; ``tests/integration/test_bad_input.py`` reads the committed files, so a
change here shows up as a diff of the corpus. The script depends on the standard library only.

An *input item* is one line of a segment file (one record, well formed or not), or a whole file
when the file itself is the problem (zero bytes). Each has exactly one outcome:

* ``stream``: the record is in the silver stream once; for the windowed table it is then counted
  in its ``window``, written to the ``late`` table with a reason, or ``ignored`` (a null key or a
  tombstone: Kafka Streams' aggregations skip those);
* ``bronze_quarantine`` / ``silver_quarantine``: a row of that quarantine table with the reason;
* ``duplicate``: a re-delivery of an offset bronze already has, skipped and counted.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import EllipsisType
from typing import Any

HERE = Path(__file__).resolve().parent
TOPIC = "bad-input"
LANDING = HERE / "landing"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
MAX_RECORD_BYTES = 2048  # landing.max_record_bytes in bad-input.yaml


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_ms(t: datetime) -> int:
    return int((t - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(milliseconds=1))


def click(
    when: datetime | str | EllipsisType | None, page: Any, amount: Any = 1, **more: Any
) -> bytes:
    """A value as the contract wants it (``at`` is its event time); ``...`` leaves a field out."""
    body: dict[str, Any] = {
        "at": iso(when) if isinstance(when, datetime) else when,
        "page": page,
        "amount": amount,
        **more,
    }
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def envelope(
    offset: int | None, key: bytes | None, value: bytes | None, timestamp: datetime | None
) -> bytes:
    """One envelope line (without its newline); bytes that are not UTF-8 go as base64."""
    line: dict[str, Any] = {}
    if offset is not None:
        line["offset"] = offset
    line["timestamp"] = None if timestamp is None else epoch_ms(timestamp)
    line["timestampType"] = "CreateTime"
    for name, data in (("key", key), ("value", value)):
        if data is None:
            line[name] = None
            continue
        try:
            line[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            line[name] = base64.b64encode(data).decode("ascii")
            line[f"{name}Encoding"] = "base64"
    return json.dumps(line, separators=(",", ":")).encode()


@dataclass
class Item:
    """One input item and the outcome it must have."""

    case: str
    outcome: str  # stream | bronze_quarantine | silver_quarantine | duplicate
    reason: str | None = None  # a substring of the quarantine reason
    offset: int | None = None
    user: str | None = None
    page: str | None = None
    tombstone: bool = False
    event_time: datetime | None = None  # the event time windows use (stream records)
    gold: str | None = None  # window | late | ignored (stream records)
    late_reason: str | None = None  # a substring of the late table's reason
    run: int = 1  # the pipeline run it lands before (2: delivered again after the first run)
    # Where it is: set when the item is added to a segment.
    partition: int = -1
    file: str = ""
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "event_time"}
        out["event_time"] = None if self.event_time is None else iso(self.event_time)
        return out


@dataclass
class SegmentFile:
    partition: int
    start_offset: int
    suffix: str = ".json"
    lines: list[bytes] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    newline_at_end: bool = True

    @property
    def name(self) -> str:
        return f"{TOPIC}+{self.partition}+{self.start_offset:010d}{self.suffix}"

    @property
    def path(self) -> str:
        return f"partition={self.partition}/{self.name}"

    def add(self, raw: bytes, item: Item) -> None:
        self.lines.append(raw)
        item.partition, item.file, item.line = self.partition, self.path, len(self.lines)
        self.items.append(item)

    def record(
        self, item: Item, key: bytes | None, value: bytes | None, ts: datetime | None
    ) -> None:
        """A well-formed envelope at ``item.offset``."""
        self.add(envelope(item.offset, key, value, ts), item)

    def data(self) -> bytes:
        text = b"\n".join(self.lines)
        return text + b"\n" if self.lines and self.newline_at_end else text


def stream(
    case: str, offset: int, user: str | None, page: str, t: datetime | None, **kw: Any
) -> Item:
    gold = kw.pop("gold", "window" if user is not None else "ignored")
    return Item(case, "stream", offset=offset, user=user, page=page, event_time=t, gold=gold, **kw)


def silver_bad(case: str, offset: int, reason: str, user: str | None = "alice") -> Item:
    return Item(case, "silver_quarantine", reason=reason, offset=offset, user=user)


def bronze_bad(case: str, reason: str, offset: int | None = None) -> Item:
    return Item(case, "bronze_quarantine", reason=reason, offset=offset)


# -- partition 0: envelope lines and files that cannot be read (bronze quarantine) -------------


def partition_0() -> list[SegmentFile]:
    a = SegmentFile(0, 0)
    user = b"paula"

    def good(case: str, offset: int, page: str, seconds: float) -> None:
        item = stream(case, offset, "paula", page, at(seconds))
        a.record(item, user, click(at(seconds), page), at(seconds))

    good("baseline", 0, "p0-first", 1)
    a.add(b"this line is not JSON", bronze_bad("malformed JSON (envelope line)", "not JSON", 1))
    a.add(
        b'{"offset":2,"timestamp":null,"key":"pa\xffula","value":"{}"}',
        bronze_bad("invalid UTF-8 (envelope line)", "invalid UTF-8 at byte", 2),
    )
    a.add(
        b'[3,"paula","{}"]',
        bronze_bad("not an envelope object", "line is JSON but not a record envelope object", 3),
    )
    a.add(
        b'{"timestamp":1767225604000,"key":"paula","value":"{\\"page\\":\\"x\\"}"}',
        bronze_bad("missing offset", "missing or invalid 'offset'", 4),
    )
    a.add(
        b'{"offset":5,"timestamp":1767225605000,"key":"paula","value":"%%%","valueEncoding":"base64"}',
        bronze_bad("invalid base64", "value is not valid base64", 5),
    )
    big = click(at(6), "x" * 3000)
    a.record(bronze_bad("oversized record", "oversized record", 6), user, big, at(6))
    a.add(b"", bronze_bad("empty line", "empty line", 7))
    # Under the limit as a record (key + value), over it as an envelope line: JSON escapes each
    # quote of the value again, so the line is ~1.5x the record. It lands.
    near = 'say "hi" ' * 160
    item = stream("record near the size limit", 8, "paula", near, at(8))
    value = click(at(8), near)
    assert len(user) + len(value) <= MAX_RECORD_BYTES < len(envelope(8, user, value, at(8)))
    a.record(item, user, value, at(8))
    good("good lines after bad ones", 9, "p0-after-bad", 9)

    # A file cut off in the middle of its last line (a crashed writer): the lines before land.
    cut = SegmentFile(0, 10, newline_at_end=False)
    item = stream("truncated file", 10, "paula", "p0-before-cut", at(10))
    cut.record(item, user, click(at(10), "p0-before-cut"), at(10))
    whole = envelope(11, user, click(at(11), "p0-cut"), at(11))
    cut.add(whole[: len(whole) // 2], bronze_bad("truncated file", "truncated line", 11))

    empty = SegmentFile(0, 12)  # zero bytes: the file is the input item
    empty.items.append(
        Item("zero-byte file", "bronze_quarantine", reason="empty segment file (zero bytes)")
    )
    empty.items[0].partition, empty.items[0].file = 0, empty.path
    return [a, cut, empty]


# -- partition 1: records that do not decode by the contract, and edge cases that do -----------


def partition_1() -> list[SegmentFile]:
    s = SegmentFile(1, 0)
    alice, erin = b"alice", b"erin"
    t = at(20)
    s.record(stream("baseline", 0, "alice", "home", t), alice, click(t, "home"), t)
    rows: list[tuple[Item, bytes | None, bytes | None]] = [
        (
            silver_bad("malformed JSON (value)", 1, "value is not valid JSON"),
            alice,
            b'{"at": "2026-01-01T00:00:21Z", "page": "cart"',
        ),
        (
            silver_bad("wrong types", 2, "field 'amount' should be a long, found a JSON string"),
            alice,
            click(t, "cart", "three"),
        ),
        (
            silver_bad("wrong types", 3, "field 'page' should be a string, found a JSON bigint"),
            alice,
            click(t, 42),
        ),
        (
            silver_bad("wrong types", 4, "field 'at' is not a valid timestamp: yesterday"),
            alice,
            click("yesterday", "cart"),
        ),
        (
            silver_bad("missing fields", 5, "required field 'page' is missing or null"),
            alice,
            click(t, ...),
        ),
        (
            silver_bad("missing fields", 6, "required field 'page' is missing or null"),
            alice,
            click(t, None),
        ),
        (stream("null key", 7, None, "anonymous", at(27)), None, click(at(27), "anonymous")),
        (stream("tombstone", 8, "erin", "erin-page", at(28)), erin, click(at(28), "erin-page")),
        (
            stream("tombstone", 9, "erin", "", at(29), tombstone=True, gold="ignored"),
            erin,
            None,
        ),
        (
            silver_bad("invalid UTF-8 (value)", 10, "value is not valid UTF-8"),
            alice,
            b'{"page": "caf\xe9"}',  # Latin-1, not UTF-8
        ),
        (
            silver_bad("invalid UTF-8 (key)", 11, "key is not valid UTF-8", user=None),
            b"al\xc3\x28ce",
            click(t, "cart"),
        ),
        (silver_bad("JSON null value", 12, "value is a JSON null, not an object"), alice, b"null"),
        (
            silver_bad("JSON array value", 13, "value is a JSON array, not an object"),
            alice,
            b'["home", 1]',
        ),
        (silver_bad("empty value", 14, "value is not valid JSON"), alice, b""),
        (
            stream("added field", 15, "alice", "added", at(35)),
            alice,
            click(at(35), "added", referrer="newsletter"),
        ),
        (
            stream("removed field", 16, "alice", "removed", at(36)),
            alice,
            click(at(36), "removed", ...),
        ),
        (
            silver_bad("removed field", 17, "required field 'page' is missing or null"),
            alice,
            click(at(37), ..., 3),
        ),
        (
            silver_bad("renamed field", 18, "required field 'page' is missing or null"),
            alice,
            click(at(38), ..., page_name="renamed"),
        ),
        (
            stream("renamed field", 19, "alice", "renamed", at(39)),
            alice,
            click(at(39), "renamed", ..., qty=4),
        ),
    ]
    for offset, (item, key, value) in enumerate(rows, start=1):
        assert item.offset == offset
        s.record(item, key, value, t if item.event_time is None else item.event_time)
    # No `at`: the record timestamp is the event time.
    item = stream("missing event time, record timestamp used", 20, "alice", "no-field", at(50))
    s.record(item, alice, click(..., "no-field"), at(50))
    return [s]


# -- partition 2: re-deliveries and out-of-order offsets ---------------------------------------

REDELIVERED = "re-delivered three times"


def redelivery(of: SegmentFile, path: str, run: int) -> list[Item]:
    """The items of ``of`` delivered again as the file ``path``: each one a duplicate."""
    items = []
    for line, original in enumerate(of.items, start=1):
        dup = Item(REDELIVERED, "duplicate", offset=original.offset, user=original.user, run=run)
        dup.partition, dup.file, dup.line = of.partition, path, line
        items.append(dup)
    return items


def partition_2() -> tuple[list[SegmentFile], SegmentFile]:
    """The files, and the one that is delivered once more after the first run."""
    first = SegmentFile(2, 0)
    for offset in range(4):
        t = at(60 + 5 * offset)
        first.record(
            stream(REDELIVERED, offset, "bob", f"r{offset}", t), b"bob", click(t, f"r{offset}"), t
        )
    # The same records delivered again in the same run, compressed (a restarted Connect task).
    again = SegmentFile(2, 0, ".json.gz", list(first.lines))
    again.items = redelivery(first, again.path, run=1)
    shuffled = SegmentFile(2, 4)
    for offset in (7, 5, 4, 6):  # offsets out of order within the file
        t = at(80 + offset)
        item = stream("out-of-order offsets", offset, "carol", f"o{offset}", t)
        shuffled.record(item, b"carol", click(t, f"o{offset}"), t)
    return [first, again, shuffled], first


# -- partition 3: event time and windows (tumbling 1m, grace 30s) ------------------------------


def _closed(start_min: float, stream_time: datetime) -> str:
    s = T0 + timedelta(minutes=start_min)
    return (
        f"window [{iso(s)}, {iso(s + timedelta(minutes=1))}) closed at stream time "
        f"{iso(stream_time)}; grace 30s"
    )


def partition_3() -> list[SegmentFile]:
    s = SegmentFile(3, 0)
    future = at(10) + DAY
    before_epoch = datetime(1969, 12, 31, 23, 59, tzinfo=UTC)

    def late(case: str, offset: int, t: datetime | None, reason: str) -> Item:
        return stream(case, offset, "win", f"w{offset}", t, gold="late", late_reason=reason)

    plan: list[tuple[Item, datetime | None]] = [  # the item (its event time) and the timestamp
        (stream("in time", 0, "win", "w0", at(120)), at(120)),
        (stream("in time", 1, "win", "w1", at(160)), at(160)),
        (stream("in time", 2, "win", "w2", at(240)), at(240)),
        (late("late beyond grace", 3, at(170), _closed(2, at(240))), at(170)),
        (stream("late within grace", 4, "win", "w4", at(225)), at(225)),
        (late("no event time (no `at`, no record timestamp)", 5, None, "no event time"), None),
        (late("event time before the epoch", 6, before_epoch, "event time before 1970"), at(250)),
        (stream("event time a day in the future", 7, "win", "w7", future), at(260)),
        (late("in time, after the future record", 8, at(300), _closed(5, future)), at(300)),
    ]
    for item, ts in plan:
        when = ... if item.event_time is None else item.event_time
        s.record(item, b"win", click(when, item.page), ts)
    return [s]


# -- expectations derived from the items -------------------------------------------------------


def expected_latest(items: list[Item]) -> dict[str, str]:
    latest: dict[str, str] = {}
    for i in sorted(items, key=lambda i: (i.partition, i.offset or 0)):
        if i.outcome != "stream" or i.user is None:
            continue
        if i.tombstone:
            latest.pop(i.user, None)
        else:
            assert i.page is not None
            latest[i.user] = i.page
    return latest


def expected_windows(items: list[Item]) -> list[dict[str, Any]]:
    counts: dict[tuple[str, datetime], int] = {}
    for i in items:
        if i.outcome == "stream" and i.gold == "window":
            assert i.user is not None and i.event_time is not None
            start = i.event_time.replace(second=0, microsecond=0)
            counts[(i.user, start)] = counts.get((i.user, start), 0) + 1
    return [
        {"user": u, "window_start": iso(s), "clicks": n} for (u, s), n in sorted(counts.items())
    ]


def readme(items: list[Item], redeliver: list[str]) -> str:
    def where(i: Item) -> str:
        line = "" if i.line is None else f":{i.line}"
        offset = "" if i.offset is None else f" (offset {i.offset})"
        again = ", again after the first run" if i.run > 1 else ""
        return f"`{i.file}{line}`{offset}{again}"

    def outcome(i: Item) -> str:
        if i.outcome == "stream":
            gold = {
                "window": "counted in its window",
                "late": f"late table: `{i.late_reason}`",
                "ignored": "ignored by the tables (Kafka Streams semantics)",
            }[i.gold or "ignored"]
            return f"silver stream; {gold}"
        if i.outcome == "duplicate":
            return "skipped as a re-delivery, counted in the bronze batch's `duplicates`"
        return f"{i.outcome.replace('_', ' ')}: `{i.reason}`"

    rows = "\n".join(f"| {i.case} | {where(i)} | {outcome(i)} |" for i in items)
    again = ", ".join(f"`{r}`" for r in redeliver)
    return f"""\
# Bad-input corpus

Landing segment files of topic `bad-input` with every kind of bad input a topic can bring. The
contract, `bad-input.yaml`: envelope format, four partitions, records of at most
{MAX_RECORD_BYTES} bytes of key, value and headers, the event time in the value's `at` field or
else the record timestamp, a latest table and a windowed table `bad_input_per_minute` (tumbling
1m, grace 30s).

`tests/integration/test_bad_input.py` lands the files, runs bronze, silver and gold over them,
and checks that nothing crashes and every input item is accounted for: in the silver stream
once, in the bronze or silver quarantine with its reason and origin (file, line and byte offset
for bronze; partition and offset for silver), or skipped as a counted re-delivery; and, for the
windowed table, counted in its window or in the late table with its reason. An input item is
one line of a segment file, or a whole file when the file is the problem; "offset" below is the
offset the record has (or, for a line bronze cannot read, would have) in its partition.

Generated by `make_corpus.py` (standard library only), which also writes `expected.json`, the
machine-readable form of the table below; edit the script, not the files, and run

    .venv/bin/python tests/data/bad_input/make_corpus.py

- Partition 0: envelope lines and files bronze cannot read (bronze quarantine).
- Partition 1: records that do not decode by the contract (silver quarantine), and the edge
  cases that do: null key, tombstone, added, removed and renamed fields.
- Partition 2: re-delivery (the segment, a gzip copy of it, and the segment again after the
  first run: {again}) and offsets out of order within a file.
- Partition 3: event time: late beyond and within grace, none, before the epoch, a day in the
  future (counted in its window; being the stream time from then on, as in Kafka Streams, it
  closes the windows of the in-time record after it, which goes to the late table).

| case | where | expected outcome |
|---|---|---|
{rows}
"""


def _one_per_line(doc: dict[str, Any]) -> str:
    """JSON with one list element per line: small, and a changed item is a one-line diff."""
    parts = []
    for name, value in doc.items():
        if isinstance(value, list):
            inner = ",\n".join(f"  {json.dumps(v)}" for v in value)
            parts.append(f" {json.dumps(name)}: [\n{inner}\n ]")
        else:
            parts.append(f" {json.dumps(name)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> None:
    p2, once_more = partition_2()
    files = [*partition_0(), *partition_1(), *p2, *partition_3()]
    items = [i for f in files for i in f.items] + redelivery(once_more, once_more.path, run=2)
    if LANDING.exists():
        shutil.rmtree(LANDING)
    for f in files:
        path = LANDING / "topics" / TOPIC / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        data = f.data()
        path.write_bytes(gzip.compress(data, mtime=0) if f.suffix.endswith(".gz") else data)
    redeliver = [once_more.path]
    expected = {
        "topic": TOPIC,
        "redeliver_after_first_run": redeliver,
        "latest": expected_latest(items),
        "windows": expected_windows(items),
        "items": [i.to_json() for i in items],
    }
    (HERE / "expected.json").write_text(_one_per_line(expected))
    (HERE / "README.md").write_text(readme(items, redeliver))


if __name__ == "__main__":
    main()
