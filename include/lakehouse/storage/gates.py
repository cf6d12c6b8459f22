"""What the storage layer asks of a table's gate (the data-quality gates of
:mod:`lakehouse.quality` are one): the write functions of :mod:`lakehouse.storage.delta_spark`
take a table's gate as an argument and run it in their one publish sequence
(:func:`lakehouse.storage.delta_spark._publish`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from lakehouse.runtime.objectstore import Location


class PublishGate(Protocol):
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
        lineage: Mapping[str, Any] | None = None,
        at_most: tuple[int | None, int | None] = (None, None),
        marker: str | None = None,
    ) -> Any:
        """Judge a batch (the rows a write is about to publish), and ``whole`` (the table after
        it) if given, each known to have at most ``at_most`` rows if given; raise to stop the
        write. ``marker``: a boolean column of ``whole`` that is true on the batch's rows (the
        batch can be read out of it)."""

    def created(self, spark: Any, path: Location) -> None:
        """The table was just created, and is empty: give it what every write to it must meet
        (the contract's CHECK constraints), before the first rows arrive."""

    def commit_metadata(self, verdict: Any) -> dict[str, Any]:
        """Commit metadata the gated commit carries (merged into the write's own)."""

    def record(self, verdict: Any, *, table_version: int | None, published: bool) -> None:
        """Keep the verdict once the write is done."""
