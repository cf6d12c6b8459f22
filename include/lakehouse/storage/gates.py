"""Checks a job registers for the tables it writes, consulted by :class:`DeltaStore` just before
it commits to one of them (the data-quality gates of :mod:`lakehouse.quality`).

A table may be written by several calls in one job (a gold table by merges and appends): a hook
here sees every batch about to be published, whichever call publishes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from lakehouse.runtime.objectstore import Location, as_location


class PublishGate(Protocol):
    @property
    def at_commit(self) -> bool:
        """Whether DeltaStore runs the gate at every commit to the table; if not, the job that
        writes the table runs it itself (silver, bronze: they route or stage rows first)."""

    @property
    def columns(self) -> list[str] | None:
        """The columns :meth:`check` reads of a batch (None: any one, for a row count)."""

    @property
    def needs_whole_table(self) -> bool:
        """Whether :meth:`check` also judges the table as it would be after the batch."""

    def check(
        self,
        batch: Any,
        rows: int | None = None,
        *,
        whole: Any = None,
        source: Mapping[str, Any] | None = None,
        at_most: tuple[int | None, int | None] = (None, None),
    ) -> Any:
        """Judge a batch (the rows a write is about to publish), and ``whole`` (the table after
        it) if given, each known to have at most ``at_most`` rows if given; raise to stop the
        write."""

    def created(self, spark: Any, path: Location) -> None:
        """The table was just created, and is empty: give it what every write to it must meet
        (the contract's CHECK constraints), before the first rows arrive."""

    def commit_metadata(self, verdict: Any) -> dict[str, Any]:
        """Commit metadata the gated commit carries (merged into the write's own)."""

    def record(self, verdict: Any, *, table_version: int | None, published: bool) -> None:
        """Keep the verdict once the write is done."""


_GATES: ContextVar[Mapping[Location, PublishGate] | None] = ContextVar(
    "lakehouse_gates", default=None
)


@contextmanager
def gating(gates: Mapping[Location, PublishGate]) -> Iterator[None]:
    """Register gates by table path for the writes made inside the ``with`` block."""
    token = _GATES.set({as_location(p): g for p, g in gates.items()})
    try:
        yield
    finally:
        _GATES.reset(token)


def gate_for(path: Location, *, at_commit: bool = False) -> PublishGate | None:
    """The gate registered for a table; with ``at_commit``, only one DeltaStore should run."""
    gates = _GATES.get()
    gate = None if not gates else gates.get(as_location(path))
    return None if gate is None or (at_commit and not gate.at_commit) else gate
