"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser import Browser


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    holder = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield holder
    finally:
        holder.quit()
