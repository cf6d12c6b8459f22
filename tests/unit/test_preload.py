"""What a cold job imports before and after its first verdict (lakehouse.pipeline)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from lakehouse import pipeline


def _fresh(code: str) -> None:
    """Run ``code`` in a new interpreter (this one has imported everything already)."""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_module_named_for_preloading_exists() -> None:
    # A renamed module would otherwise only make the preload quietly useless.
    for names in pipeline._LAZY_IMPORTS.values():
        for entry in names:
            name, _, function = entry.partition(":")
            assert importlib.util.find_spec(name) is not None, name
            if function:
                assert callable(getattr(importlib.import_module(name), function)), entry


def test_committing_does_not_load_spark() -> None:
    # A batch done in the driver commits without Spark: its import is 0.1 s of a cold batch.
    _fresh(
        "import sys; import lakehouse.storage.commits, lakehouse.storage.store, lakehouse.pipeline;"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'"
    )


def test_the_preload_imports_the_later_layers_modules() -> None:
    _fresh(
        "import sys; from lakehouse import pipeline;"
        "assert 'pyspark' not in sys.modules and 'lakehouse.tables_arrow' not in sys.modules;"
        "pipeline._preload(['bronze', 'silver', 'gold']);"
        "assert {'pyspark.sql.pandas.types', 'lakehouse.streams_arrow', 'lakehouse.tables_arrow',"
        " 'lakehouse.storage.commits', 'duckdb'} <= set(sys.modules);"
        "from lakehouse import tables_arrow; assert tables_arrow._CONNECTION.con is not None"
    )


def test_only_a_run_with_gold_opens_duckdb() -> None:
    _fresh(
        "from lakehouse import pipeline, tables_arrow;"
        "pipeline._preload(['bronze', 'silver']);"
        "assert tables_arrow._CONNECTION.con is None"
    )


def test_a_module_that_cannot_be_imported_is_left_to_its_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(pipeline._LAZY_IMPORTS, "gold", ("lakehouse_no_such_module", "csv"))
    sys.modules.pop("csv", None)
    pipeline._preload(["gold"])
    assert "csv" in sys.modules  # the next one still imported
    assert "lakehouse_no_such_module" not in sys.modules


def test_a_run_queues_the_preload_for_its_waits_and_drops_it_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from lakehouse import gx_worker

    seen: list[list[object]] = []

    def layer(*args: object, **kwargs: object) -> list[str]:
        seen.append(list(gx_worker._WAITING))
        return []

    monkeypatch.setattr(pipeline, "run_layer", layer)
    catalog = SimpleNamespace(topic=lambda name: SimpleNamespace(topic=name))
    pipeline.run(None, None, catalog, topics=["t"], layers=["bronze", "silver"], echo=print)  # type: ignore[arg-type]
    assert len(seen) == 2 and len(seen[0]) == 1 and seen[1] == seen[0]  # queued, not run here
    assert gx_worker._WAITING == []
