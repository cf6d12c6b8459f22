"""What one pipeline run is asked to do, beyond its regular micro-batch: one request, under
one name per thing asked, from the trigger form to the job.

A run triggered from the Airflow UI carries Params (a form); a scheduled run takes their
defaults; ``lakehouse run`` takes the same as flags (each Param's name with dashes). They become
a :class:`RunRequest`, checked against the topic's contract by :meth:`RunRequest.check` before
any job starts (bad configuration fails before any data moves), and every layer's job receives
that same request: in the task's own process, or as one JSON argument of a spark-submitted job
(:meth:`RunRequest.to_json`, read back by :meth:`RunRequest.from_json`, which checks it again
because it came from outside the process). :data:`OPTIONS` lists what a run can ask:

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

A new thing to ask is a field of :class:`RunRequest` and an :class:`Option` of the same name
here, and a Param of the DAGs (:mod:`lakehouse.orchestration.dags`); the command line, the job's
argument and the checks of its value's shape follow from the option.

A reset also tells the layers above what to recompute: records that silver re-derives are new
arrivals for every gold table of the stream (the pipeline's gold step, and the join DAG, which
the stream's update triggers), and a gold table reprocessed or rebuilt publishes only its true
differences, so the tables that read its changelog take the corrections in the same gold step.
:func:`consequences` says which tables those are.

Imported at DAG parse time: contracts only, no Spark, Delta or Great Expectations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.contracts.model import Contract
from lakehouse.errors import ConfigError
from lakehouse.runtime.config import LAYERS, Layer

if TYPE_CHECKING:
    from lakehouse.contracts.catalog import Catalog

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
    """``{0: 120, 1: 0}`` -> ``"0:120,1:0"``, the form :func:`parse_offsets` reads."""
    return ",".join(f"{p}:{o}" for p, o in sorted(offsets.items()))


@dataclass(frozen=True)
class RunRequest:
    """What one pipeline run of a topic asks for, checked against the topic's contract. Each
    field but ``tables`` is an :class:`Option` of the same name (a Param, a flag of ``lakehouse
    run`` and a key of the job's argument); ``tables`` are the gold tables of the DAG the run
    belongs to (None: every gold table of the topic).

    Made by :meth:`from_params` (or :meth:`from_json`), which check it: the layers' jobs trust
    a request and check nothing of it again."""

    layers: tuple[Layer, ...] = LAYERS
    dry_run: bool = False
    full_refresh: tuple[str, ...] = ()
    reprocess_silver_from_version: int | None = None
    reprocess_silver_from_offsets: Mapping[int, int] = field(default_factory=dict)
    reprocess_gold_from_version: int | None = None
    tables: tuple[str, ...] | None = None

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
        every table of the topic); keys that are no :data:`OPTIONS` (the run DAG's ``topics``)
        are left to their readers. Raises ConfigError naming the Param and the problem. With
        ``flags``, the same keys came from ``lakehouse run``'s options, which errors name."""
        said = _Naming(flags)
        request = cls(
            **{o.name: o.read(params.get(o.name), said(o.name)) for o in OPTIONS},
            tables=None if tables is None else tuple(tables),
        )
        request.check(contract, flags=flags)
        return request

    def to_json(self) -> str:
        """The request as the one argument of a spark-submitted job: an object of its Params
        (as the trigger form holds them) and ``tables``."""
        params = {o.name: o.write(getattr(self, o.name)) for o in OPTIONS}
        tables = None if self.tables is None else list(self.tables)
        return json.dumps({**params, "tables": tables}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, contract: Contract, where: str = "--request") -> RunRequest:
        """The request :meth:`to_json` wrote, read and checked as a run's Params are; ``where``
        names the argument in errors."""
        try:
            given = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not a JSON object: {exc}") from None
        if not isinstance(given, dict):
            raise ConfigError(f"{where}: {given!r} is not a JSON object")
        known = {o.name for o in OPTIONS} | {"tables"}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; a request has "
                f"{', '.join(sorted(known))}"
            )
        tables = given.get("tables")
        return cls.from_params(
            given, contract, None if tables is None else _names(tables, f"{where}: tables")
        )

    def gold_tables(self, contract: Contract) -> list[str]:
        """The topic's gold tables this request's DAG builds, in declaration order."""
        return [t.name for t in contract.tables if self.tables is None or t.name in self.tables]

    def check(self, contract: Contract, *, flags: bool = False) -> None:
        """Check the request against the topic's contract (the one place it is checked): every
        table named is one of the topic's gold tables, the request's DAG builds each table to
        refresh, a partition exists, and what is asked together fits. Raises ConfigError naming
        the Params (with ``flags``, ``lakehouse run``'s flags) and the problem."""
        said = _Naming(flags)
        topic_tables = [t.name for t in contract.tables]
        for name in self.tables or ():
            if name not in topic_tables:
                raise ConfigError(f"tables: topic {contract.topic!r} has no gold table {name!r}")
        names = self.gold_tables(contract)
        for name in self.full_refresh:
            if name not in names:
                raise ConfigError(
                    f"{said('full_refresh')}: {name!r} is not a gold table this "
                    f"{'run' if flags else 'DAG'} builds for topic {contract.topic!r} "
                    f"(its tables: {', '.join(names) or 'none'})"
                )
        if self.reprocess_silver_from_version is not None and self.reprocess_silver_from_offsets:
            raise ConfigError(
                f"{said('reprocess_silver_from_version', 'reprocess_silver_from_offsets')}: "
                "give one or the other"
            )
        for p in self.reprocess_silver_from_offsets:
            if p >= contract.partitions:
                raise ConfigError(
                    f"{said('reprocess_silver_from_offsets')}: topic {contract.topic!r} has "
                    f"{contract.partitions} partitions (0..{contract.partitions - 1}), not {p}"
                )
        needs = {
            "silver": self.reprocesses_silver,
            "gold": bool(self.full_refresh) or self.reprocess_gold_from_version is not None,
        }
        for layer, needed in needs.items():
            if needed and layer not in self.layers:
                raise ConfigError(
                    f"{said()}: a {layer} reprocess or refresh was asked for, but the layer "
                    f"{layer!r} is not among the run's layers {list(self.layers)}"
                )
        if self.reprocess_gold_from_version is not None:
            both = [n for n in self.full_refresh if n in self.reprocessable(contract)]
            if both:
                raise ConfigError(
                    f"{said()}: {', '.join(both)} would be both fully refreshed and reprocessed "
                    "from a version; choose one"
                )

    @property
    def reprocesses_silver(self) -> bool:
        """Whether silver decodes bronze records again (from a version or from offsets)."""
        return self.reprocess_silver_from_version is not None or bool(
            self.reprocess_silver_from_offsets
        )

    def reprocessable(self, contract: Contract) -> list[str]:
        """The tables of this request's DAG that ``reprocess_gold_from_version`` puts back."""
        return reprocessable(contract, self.tables)

    def reprocessed(self, contract: Contract) -> list[str]:
        """The gold tables this run puts back from a silver version (none unless asked)."""
        if self.reprocess_gold_from_version is None:
            return []
        return self.reprocessable(contract)

    def describe(self, contract: Contract) -> list[str]:
        """What the run will do, in words (printed by the DAG's first task)."""
        lines = [f"topic {contract.topic}: layers {', '.join(self.layers)}"]
        if self.dry_run:
            lines.append(
                "dry run: every layer prints what it would read and write; no table changes"
            )
        if self.reprocess_silver_from_version is not None:
            lines.append(
                f"silver {contract.stream}: decode again the bronze records from bronze version "
                f"{self.reprocess_silver_from_version} on"
            )
        if self.reprocess_silver_from_offsets:
            lines.append(
                f"silver {contract.stream}: decode again the bronze records from offsets "
                f"{format_offsets(self.reprocess_silver_from_offsets)} (partition:offset)"
            )
        if self.reprocess_gold_from_version is not None:
            lines.append(
                f"gold: rebuild {', '.join(self.reprocessable(contract)) or 'no table'} as of "
                f"silver version {self.reprocess_gold_from_version - 1} and read again from "
                f"{self.reprocess_gold_from_version}"
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
        if (tables is None or t.name in tables) and t.changelog is None and t.other_topic is None
    ]


def dag_id(topic: str) -> str:
    """The DAG of a topic's pipeline: bronze, silver and the gold tables of its own stream."""
    return f"pipeline__{topic}"


def join_dag_id(topic: str) -> str:
    """The DAG of a topic's joins (:func:`joined`)."""
    return f"joins__{topic}"


def joined(contract: Contract) -> list[str]:
    """The gold tables that need another topic's stream: the joins, and the tables reading a
    join's changelog (directly or through others). They live in the topic's join DAG, which is
    scheduled on both topics' streams."""
    joins = [t.name for t in contract.tables if t.other_topic is not None]
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
    if request.reprocesses_silver:
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
    changed = list(request.full_refresh) + request.reprocessed(contract)
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


def _layers(value: Any, said: str) -> tuple[Layer, ...]:
    """Some of the layers, in pipeline order (none given: all of them)."""
    if not value:
        return LAYERS
    if (
        isinstance(value, str)
        or not isinstance(value, Sequence)
        or any(x not in LAYERS for x in value)
    ):
        raise ConfigError(f"{said}: {value!r}: each must be one of {list(LAYERS)}")
    return tuple(x for x in LAYERS if x in value)


def _names(value: Any, said: str) -> tuple[str, ...]:
    """A list of table names, without repeats (each is then checked against the DAG's)."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{said}: {value!r} is not a list of table names")
    for item in value:
        if not isinstance(item, str):
            raise ConfigError(f"{said}: {item!r} is not a table name")
    return tuple(dict.fromkeys(value))


def _flag(value: Any, said: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{said}: {value!r} is not true or false")


def _version(value: Any, said: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{said}: {value!r} is not a table version (an integer >= 0)")
    return value


def _offsets(value: Any, said: str) -> dict[int, int]:
    """``partition:offset,...`` text (none: no offsets)."""
    if value is None:
        return {}
    if not isinstance(value, str):
        raise ConfigError(f"{said}: {value!r} is not a list of partition:offset pairs")
    text = value.strip()
    return parse_offsets(text, said) if text else {}


def _same(value: Any) -> Any:
    return value


def _list(value: Sequence[str]) -> list[str]:
    return list(value)


def _offsets_text(value: Mapping[int, int]) -> str | None:
    return format_offsets(value) if value else None


@dataclass(frozen=True)
class Option:
    """One thing a run can ask for, under one name: the Param of the DAGs' trigger form, the
    field of :class:`RunRequest`, the key of a spark-submitted job's argument and, with dashes,
    the flag of ``lakehouse run``."""

    name: str
    read: Callable[[Any, str], Any]
    """The field's value from the value given (None: not given), or a ConfigError that starts
    with the name it is given for the option (a Param's, or a flag's)."""
    write: Callable[[Any], Any]
    """The field's value as the Param holds it (JSON): :meth:`read` gives the field back."""
    help: str
    """What it asks, for the command line's help."""
    flag: Mapping[str, Any] | None = None
    """The keywords of its ``lakehouse run`` flag (``argparse``), beside ``help``; None: the
    command line asks for it in a way of its own (``layers``: ``--layer``, repeated)."""
    one_topic: bool = False
    """Whether it names one topic's tables, versions or offsets: ``lakehouse run`` then needs
    one ``--topic``."""


OPTIONS: tuple[Option, ...] = (
    Option("layers", _layers, _list, "the layers to run, in pipeline order"),
    Option(
        "dry_run",
        _flag,
        _same,
        "print what each layer would read and write; change nothing",
        flag={"action": "store_true"},
    ),
    Option(
        "full_refresh",
        _names,
        _list,
        "gold: rebuild this table from the whole stream (repeatable)",
        flag={"action": "append", "metavar": "TABLE"},
        one_topic=True,
    ),
    Option(
        "reprocess_silver_from_version",
        _version,
        _same,
        "silver: decode again the bronze records from bronze version V",
        flag={"type": int, "metavar": "V"},
        one_topic=True,
    ),
    Option(
        "reprocess_silver_from_offsets",
        _offsets,
        _offsets_text,
        "silver: decode again from these offsets, e.g. 0:120,1:0",
        flag={"metavar": "P:O,..."},
        one_topic=True,
    ),
    Option(
        "reprocess_gold_from_version",
        _version,
        _same,
        "gold: rebuild as of silver version V-1 and read again from V",
        flag={"type": int, "metavar": "V"},
        one_topic=True,
    ),
)


def run_requests(
    catalog: Catalog,
    topics: Sequence[str],
    layers: Sequence[Layer],
    asked: Mapping[str, Any] | None = None,
) -> dict[str, RunRequest]:
    """``lakehouse run``'s flags as each topic's run request (every topic when ``topics`` is
    empty, every layer when ``layers`` is), checked as a triggered run's Params are
    (:meth:`RunRequest.from_params`). A reprocess or a refresh names versions, offsets or tables
    of one topic, so it needs one ``--topic``."""
    asked = dict(asked or {})
    given = [o.name for o in OPTIONS if o.one_topic and asked.get(o.name) not in (None, "", [], ())]
    if given and len(topics) != 1:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        if not topics:
            raise ConfigError(f"{flags}: name the topic it is for with --topic")
        raise ConfigError(
            f"{flags}: name the one topic it is for with --topic (given {', '.join(topics)})"
        )
    params = {"layers": list(layers or LAYERS), **asked}
    contracts = [catalog.topic(t) for t in topics] if topics else list(catalog)
    return {c.topic: RunRequest.from_params(params, c, flags=True) for c in contracts}


def flag_options() -> list[Option]:
    """What a run can ask that ``lakehouse run`` has a flag for (the layers: ``--layer``)."""
    return [o for o in OPTIONS if o.flag is not None]
