"""The operating system's refusal, for the readers' server: a process whose view of the machine's
files is read-only where the lake is, with the lakehouse's secrets out of sight, kept running
through a statement that exhausts its heap.

    python -m lakehouse.runtime.sandbox [--mounts SPEC] -- COMMAND...

Linux's namespaces do it, with no daemon and no root where unprivileged user namespaces are
allowed (most distributions). :func:`command` wraps a command as::

    unshare [--user --map-root-user] --mount --pid --fork --mount-proc --kill-child \
        --propagation private -- python -m lakehouse.runtime.sandbox --mounts SPEC -- COMMAND...

Inside the new namespaces this module, before it runs the command:

* binds each ``read_only`` folder onto itself and makes that mount read-only: every write to a
  file there fails with ``EROFS`` in the kernel, whatever program asks;
* binds each ``writable`` folder (inside a read-only one) onto itself, writable;
* mounts an empty ``tmpfs`` over each ``hidden`` folder (the tokens, the databases' passwords and
  files), so no file there can be read;
* and goes on through ``setpriv``, which drops every capability and sets ``no_new_privs``:
  nothing after it can mount, unmount or remount anything, or gain a capability back. The new
  process namespace shows only its own processes in ``/proc`` (not the pipeline's, whose
  environment holds its credentials).

What runs the command, in the sandbox or (where namespaces are not allowed) on its own, is a
supervisor (:func:`supervise`): it reads the command's standard input once (the server's token),
gives it to the command, and starts the command again when it ends with the JVM's exit status for
an exhausted heap (``-XX:+ExitOnOutOfMemoryError``), so a reader's statement that needs more
memory than the readers' server has ends that server's sessions, not the service.

Where the namespaces are not allowed (macOS, a container without ``CAP_SYS_ADMIN``, a kernel that
forbids unprivileged user namespaces), :func:`available` says why, and the readers' server runs
without this layer (docker-compose's readers' service holds no file of the lake and no secret of
the pipeline's instead).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

# HotSpot's exit status after -XX:+ExitOnOutOfMemoryError.
OUT_OF_MEMORY_EXIT = 3
MODULE = "lakehouse.runtime.sandbox"  # run as python -m (where __name__ is __main__)


@dataclass(frozen=True)
class Spec:
    """The folders a sandboxed command sees read-only, writable, or not at all."""

    read_only: tuple[str, ...]
    writable: tuple[str, ...]
    hidden: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        raw = json.loads(text)
        return cls(tuple(raw["read_only"]), tuple(raw["writable"]), tuple(raw["hidden"]))


def _unshare() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [
        "unshare",
        *user,
        "--mount",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "--propagation",
        "private",
        "--",
    ]


_DROP = ["setpriv", "--no-new-privs", "--bounding-set", "-all", "--inh-caps", "-all"]


@functools.cache
def available() -> str | None:
    """None when this machine can sandbox a command; else why it cannot (said by the status)."""
    if sys.platform != "linux":
        return f"Linux namespaces are needed (this is {sys.platform})"
    for program in ("unshare", "setpriv", "mount"):
        if shutil.which(program) is None:
            return f"{program} (util-linux) is not installed"
    probe = subprocess.run(
        [*_unshare(), *_DROP, "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        why = (probe.stderr or probe.stdout).strip().splitlines()
        return f"unshare is not permitted here ({why[-1] if why else probe.returncode})"
    return None


def command(spec: Spec | None, argv: Sequence[str]) -> list[str]:
    """``argv`` under the supervisor, in the sandbox ``spec`` describes (None: no sandbox; check
    :func:`available` first)."""
    if spec is None:
        return [sys.executable, "-m", MODULE, "--", *argv]
    return [*_unshare(), sys.executable, "-m", MODULE, "--mounts", spec.to_json(), "--", *argv]


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"sandbox: mount {' '.join(args)} failed: {done.stderr.strip()}")


def enter(spec: Spec, argv: Sequence[str]) -> None:
    """Make the mounts of ``spec`` (in the namespaces unshare made), then supervise ``argv`` with
    no capability left. Never returns."""
    for folder in (*spec.read_only, *spec.writable):
        Path(folder).mkdir(parents=True, exist_ok=True)
    for folder in spec.read_only:
        _mount("--bind", folder, folder)
        _mount("-o", "remount,bind,ro", folder)
    for folder in spec.writable:
        _mount("--bind", folder, folder)
        _mount("-o", "remount,bind,rw", folder)
    for folder in spec.hidden:
        if Path(folder).is_dir():
            _mount("-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", folder)
    supervisor = [sys.executable, "-m", MODULE, "--", *argv]
    os.execvp("setpriv", [*_DROP, "--ambient-caps", "-all", *supervisor])


def supervise(argv: Sequence[str]) -> int:
    """Run ``argv`` with this process's standard input (read once) on its own, again each time
    it ends out of memory; end with its exit status otherwise. SIGTERM and SIGINT are passed on
    to it, and end this too once it has ended."""
    given = sys.stdin.buffer.read()
    stopping: list[int] = []
    child: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for proc in child:
            if proc.poll() is None:
                proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    while True:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE)
        child[:] = [proc]
        assert proc.stdin is not None
        try:
            with proc.stdin:
                proc.stdin.write(given)
        except BrokenPipeError:
            pass
        code = proc.wait()
        if stopping or code != OUT_OF_MEMORY_EXIT:
            return code
        print(
            f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: ended out of memory (a statement "
            "needed more than its heap); starting it again",
            flush=True,
        )
        time.sleep(1.0)


def main(args: Sequence[str]) -> int:
    rest = list(args)
    spec = None
    if rest[:1] == ["--mounts"] and len(rest) > 1:
        spec, rest = Spec.from_json(rest[1]), rest[2:]
    if len(rest) < 2 or rest[0] != "--":
        print(
            "usage: python -m lakehouse.runtime.sandbox [--mounts SPEC] -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    if spec is not None:
        enter(spec, rest[1:])
    return supervise(rest[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
