from __future__ import annotations

import os
from pathlib import Path

import pytest

from lakehouse.errors import JavaNotFoundError
from lakehouse.runtime import process


def test_finds_java_17_or_newer() -> None:
    java, major, home = process.find_java()
    assert major >= process.MIN_JAVA
    assert Path(java).exists()
    assert home is not None and (home / "bin" / "java").exists()


def test_stale_java_home_is_corrected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    process.ensure_java()
    assert Path(os.environ["JAVA_HOME"], "bin", "java").exists()


def test_missing_java_explains_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(process, "_candidates", lambda: [(str(tmp_path / "java"), None)])
    with pytest.raises(
        JavaNotFoundError, match=r"Java 17\+.*apt-get install openjdk-17-jre-headless.*make jdk"
    ):
        process.find_java()


def test_old_java_is_not_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake.chmod(0o755)
    assert process.java_major(str(fake)) == 11
    monkeypatch.setattr(process, "_candidates", lambda: [(str(fake), None)])
    with pytest.raises(JavaNotFoundError, match="-> 11"):
        process.find_java()
