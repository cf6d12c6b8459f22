"""What one pipeline run is asked to do, beyond its regular micro-batch.

A run triggered from the Airflow UI carries Params (a form); a scheduled run takes their
defaults. They arrive here as a :class:`RunRequest`, which is checked against the topic's
contract before any job starts (bad configuration fails before any data moves), and which each
layer's job receives as a :class:`LayerRequest` on its command line:

* ``layers``: the layers to run (default all three, in pipeline order);
* ``dry_run``: print what each layer would read and write, and change nothing;
* ``full_refresh``: gold tables to rebuild from the whole silver stream;
* ``reprocess_silver_from_version`` / ``reprocess_silver_from_offsets``: decode again the bronze
  records from a bronze version, or from an offset per partition (Kafka's ``--reset-offsets
  --to-offset``); records that went to quarantine and now decode (after a contract fix) join the
  stream, and leave the quarantine;
* ``reprocess_gold_from_version``: rebuild the topic's gold tables as they were after silver
  version ``v - 1``, then read again from ``v`` as the next micro-batch would (after a fix in
  the job, say); both happen in scratch tables, and each table then changes once, by its net
  differences.

A reset also tells the layers above what to recompute: records that silver re-derives are new
arrivals for every gold table of the stream (the pipeline's gold step, and the join DAG, which
the stream's update triggers), and a gold table reprocessed or rebuilt publishes only its true
differences, so the tables that read its changelog take the corrections in the same gold step.
:func:`consequences` says which tables those are.

Imported at DAG parse time: contracts only, no Spark, Delta or Great Expectations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lakehouse.contracts.model import Contract
from lakehouse.errors import ConfigError
from lakehouse.runtime.config import LAYERS, Layer

_OFFSETS = re.compile(r"^\s*\d+\s*:\s*\d+\s*(,\s*\d+\s*:\s*\d+\s*)*$")
OFFSETS_PATTERN = _OFFSETS.pattern


def parse_offsets(text: str, where: str = "offsets") -> dict[int, int]:
    """``"0:120, 1:0"`` -> ``{0: 120, 1: 0}`` (partition: first offset to process again)."""
    if not _OFFSETS.match(text):
        raise ConfigError(
            f"{where}: {text!r} is not a list of partition:offset pairs, e.g. '0:120,1:0'"
        )
    out: dict[int, int] = {}
    for pair in text.split(","):
        p, o = (int(x) for x in pair.split(":"))
        if p in out:
            raise ConfigError(f"{where}: partition {p} is given twice")
        out[p] = o
    return out


def format_offsets(offsets: Mapping[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(offsets.items()))


@dataclass(frozen=True)
class LayerRequest:
    """What one layer's job does besides its micro-batch (see the module docstring)."""

    dry_run: bool = False
    full_refresh: tuple[str, ...] = ()  # gold
    from_version: int | None = None  # silver: a bronze version; gold: a silver version
    from_offsets: Mapping[int, int] | None = None  # silver: partition -> offset
    tables: tuple[str, ...] | None = None  # gold: only these tables (None: all of the topic's)

    def args(self) -> list[str]:
        """The job's command-line flags for this request (see ``jobs/run_layer.py``)."""
        out = ["--dry-run"] if self.dry_run else []
        for name in self.full_refresh:
            out += ["--full-refresh", name]
        if self.from_version is not None:
            out += ["--from-version", str(self.from_version)]
        if self.from_offsets:
            out += ["--from-offsets", format_offsets(self.from_offsets)]
        if self.tables is not None:
            out += ["--tables", ",".join(self.tables)]
        return out

    @property
    def reprocesses(self) -> bool:
        return self.from_version is not None or bool(self.from_offsets)

    def check(self, contract: Contract) -> None:
        """Every table named must be one of the topic's gold tables (the job checks this before
        Spark starts: a name never reaches a path or a predicate unless the contract has it)."""
        names = [t.name for t in contract.tables]
        for flag, given in (("--tables", self.tables or ()), ("--full-refresh", self.full_refresh)):
            for name in given:
                if name not in names:
                    raise ConfigError(
                        f"{flag}: topic {contract.topic!r} has no gold table {name!r}"
                    )


@dataclass(frozen=True)
class RunRequest:
    """The Params of one pipeline run, checked against the topic's contract."""

    layers: tuple[Layer, ...] = LAYERS
    dry_run: bool = False
    full_refresh: tuple[str, ...] = ()
    silver_from_version: int | None = None
    silver_from_offsets: Mapping[int, int] = field(default_factory=dict)
    gold_from_version: int | None = None
    tables: tuple[str, ...] | None = None  # the gold tables of the DAG (None: all the topic's)
    # Asked for with ``lakehouse run``'s flags rather than a DAG run's Params: errors name those.
    flags: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def from_params(
        cls,
        params: Mapping[str, Any],
        contract: Contract,
        tables: Sequence[str] | None = None,
        *,
        flags: bool = False,
    ) -> RunRequest:
        """Read and check a run's Params for a DAG whose gold step builds ``tables`` (default:
        every table of the topic); raises ConfigError naming the Param and the problem. With
        ``flags``, the same keys came from ``lakehouse run``'s options, which errors name."""
        said = _Naming(flags)
        layers = params.get("layers") or list(LAYERS)
        if isinstance(layers, str) or not all(x in LAYERS for x in layers):
            raise ConfigError(f"{said('layers')}: {layers!r}: each must be one of {list(LAYERS)}")
        offsets_text = (params.get("reprocess_silver_from_offsets") or "").strip()
        request = cls(
            layers=tuple(x for x in LAYERS if x in layers),
            dry_run=_flag(params.get("dry_run", False), said("dry_run")),
            full_refresh=_names(params.get("full_refresh"), said("full_refresh")),
            silver_from_version=_version(params, "reprocess_silver_from_version", said),
            silver_from_offsets=(
                parse_offsets(offsets_text, said("reprocess_silver_from_offsets"))
                if offsets_text
                else {}
            ),
            gold_from_version=_version(params, "reprocess_gold_from_version", said),
            tables=None if tables is None else tuple(tables),
            flags=flags,
        )
        request.check(contract)
        return request

    def gold_tables(self, contract: Contract) -> list[str]:
        return [t.name for t in contract.tables if self.tables is None or t.name in self.tables]

    def check(self, contract: Contract) -> None:
        said = _Naming(self.flags)
        names = self.gold_tables(contract)
        for name in self.full_refresh:
            if name not in names:
                raise ConfigError(
                    f"{said('full_refresh')}: {name!r} is not a gold table this "
                    f"{'run' if self.flags else 'DAG'} builds for topic {contract.topic!r} "
                    f"(its tables: {', '.join(names) or 'none'})"
                )
        if self.silver_from_version is not None and self.silver_from_offsets:
            raise ConfigError(
                f"{said('reprocess_silver_from_version', 'reprocess_silver_from_offsets')}: "
                "give one or the other"
            )
        for p in self.silver_from_offsets:
            if p >= contract.partitions:
                raise ConfigError(
                    f"{said('reprocess_silver_from_offsets')}: topic {contract.topic!r} has "
                    f"{contract.partitions} partitions (0..{contract.partitions - 1}), not {p}"
                )
        needs = {
            "silver": self.silver_from_version is not None or bool(self.silver_from_offsets),
            "gold": bool(self.full_refresh) or self.gold_from_version is not None,
        }
        for layer, needed in needs.items():
            if needed and layer not in self.layers:
                raise ConfigError(
                    f"{said()}: a {layer} reprocess or refresh was asked for, but the layer "
                    f"{layer!r} is not among the run's layers {list(self.layers)}"
                )
        if self.gold_from_version is not None:
            both = [n for n in self.full_refresh if n in self.reprocessable(contract)]
            if both:
                raise ConfigError(
                    f"{said()}: {', '.join(both)} would be both fully refreshed and reprocessed "
                    "from a version; choose one"
                )

    def reprocessable(self, contract: Contract) -> list[str]:
        return reprocessable(contract, self.tables)

    def for_layer(self, layer: Layer) -> LayerRequest:
        if layer == "silver":
            return LayerRequest(
                self.dry_run,
                from_version=self.silver_from_version,
                from_offsets=dict(self.silver_from_offsets) or None,
            )
        if layer == "gold":
            return LayerRequest(
                self.dry_run,
                full_refresh=self.full_refresh,
                from_version=self.gold_from_version,
                tables=self.tables,
            )
        return LayerRequest(self.dry_run)

    def describe(self, contract: Contract) -> list[str]:
        """What the run will do, in words (printed by the DAG's first task)."""
        lines = [f"topic {contract.topic}: layers {', '.join(self.layers)}"]
        if self.dry_run:
            lines.append(
                "dry run: every layer prints what it would read and write; no table changes"
            )
        if self.silver_from_version is not None:
            lines.append(
                f"silver {contract.stream}: decode again the bronze records from bronze version "
                f"{self.silver_from_version} on"
            )
        if self.silver_from_offsets:
            lines.append(
                f"silver {contract.stream}: decode again the bronze records from offsets "
                f"{format_offsets(self.silver_from_offsets)} (partition:offset)"
            )
        if self.gold_from_version is not None:
            lines.append(
                f"gold: rebuild {', '.join(self.reprocessable(contract)) or 'no table'} as of "
                f"silver version {self.gold_from_version - 1} and read again from "
                f"{self.gold_from_version}"
            )
        for name in self.full_refresh:
            lines.append(f"gold {name}: full refresh from the whole silver stream")
        lines += consequences(contract, self)
        return lines


def reprocessable(contract: Contract, tables: Sequence[str] | None = None) -> list[str]:
    """The gold tables (of ``tables``; default all) that a reprocess from a silver version puts
    back: those whose only input is the topic's own stream. A table reading another table's
    changelog follows that table's corrections instead; a join has two inputs (refresh it
    fully)."""
    return [
        t.name
        for t in contract.tables
        if (tables is None or t.name in tables) and t.changelog is None and t.join is None
    ]


def joined(contract: Contract) -> list[str]:
    """The gold tables that need another topic's stream: the joins, and the tables reading a
    join's changelog (directly or through others). They live in the topic's join DAG, which is
    scheduled on both topics' streams."""
    joins = [t.name for t in contract.tables if t.join is not None]
    return joins + readers_of(contract, joins)


def own(contract: Contract) -> list[str]:
    """The gold tables the topic's own stream is enough for (its pipeline DAG's gold step)."""
    outside = set(joined(contract))
    return [t.name for t in contract.tables if t.name not in outside]


def readers_of(contract: Contract, names: Sequence[str]) -> list[str]:
    """The tables that read any of ``names``' changelogs, directly or through others."""
    found: list[str] = []
    frontier = set(names)
    while frontier:
        nxt = {t.name for t in contract.tables if t.changelog in frontier} - set(found)
        found += sorted(nxt)
        frontier = nxt
    return found


def consequences(contract: Contract, request: RunRequest) -> list[str]:
    """What the layers above a reset recompute because of it."""
    lines = []
    if request.silver_from_version is not None or request.silver_from_offsets:
        gold = [t.name for t in contract.tables]
        where = (
            "in this run's gold step"
            if "gold" in request.layers
            else "in the next run that includes gold"
        )
        lines.append(
            f"then: the records silver re-derives are new arrivals for "
            f"{', '.join(gold) or 'no table'} ({where}; joins in their own DAG)"
        )
    changed = list(request.full_refresh)
    if request.gold_from_version is not None:
        changed += request.reprocessable(contract)
    readers = [n for n in readers_of(contract, changed) if n not in changed]
    if readers:
        lines.append(
            f"then: {', '.join(readers)} read the changelogs of the tables put back and take "
            "their corrections in this run's gold step"
        )
    return lines


@dataclass(frozen=True)
class _Naming:
    """How an error names what was asked: a DAG run's Params, or ``lakehouse run``'s flags."""

    flags: bool

    def __call__(self, *keys: str) -> str:
        if self.flags:
            return " and ".join("--" + k.replace("_", "-") for k in keys) or "Options"
        if len(keys) == 1:
            return f"Param {keys[0]}"
        return " ".join(["Params", " and ".join(keys)]) if keys else "Params"


def _names(value: Any, said: str) -> tuple[str, ...]:
    """A list Param of table names, without repeats (each is then checked against the DAG's)."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{said}: {value!r} is not a list of table names")
    for item in value:
        if not isinstance(item, str):
            raise ConfigError(f"{said}: {item!r} is not a table name")
    return tuple(dict.fromkeys(value))


def _flag(value: Any, said: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{said}: {value!r} is not true or false")


def _version(params: Mapping[str, Any], key: str, said: _Naming) -> int | None:
    value = params.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{said(key)}: {value!r} is not a table version (an integer >= 0)")
    return value
