"""Delta commits on local files start no process: Hadoop's local file system would start
`chmod` and `readlink` (no native Hadoop library), about 24 a commit; the platform's settings
(lakehouse.runtime.spark.LOCAL_FILES_CONF) avoid every one. Counted with strace, as
bench/processes_per_commit.py counts them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from lakehouse.runtime.config import REPO_ROOT

pytestmark = pytest.mark.integration


def test_a_delta_commit_on_local_files_starts_no_process(tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.fail("strace not found: `make install` installs it (Debian's strace)", False)
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        from processes_per_commit import per_commit
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))

    assert per_commit(2, peer=False, folder=tmp_path) == 0
