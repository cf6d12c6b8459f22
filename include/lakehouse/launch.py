"""The ``lakehouse`` command's entry point: every command skips the interpreter's last garbage
collections (:func:`quiet_exit`). Only the standard library loads before the command line.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence

# The options ``lakehouse`` takes before its command, each followed by a value.
_GLOBAL_OPTIONS = ("--home", "--contracts")


def command_of(argv: Sequence[str]) -> str | None:
    """The command of a ``lakehouse`` command line (the first word that is not an option or an
    option's value), or None. Only a guess: the command line module parses it for real."""
    words = iter(argv)
    for word in words:
        if word in _GLOBAL_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def quiet_exit() -> None:
    """Leave the last garbage collections out of this process's exit.

    When the interpreter finalizes, it collects garbage while it tears the modules down; after a
    micro-batch that loaded pyarrow, pandas, polars and deltalake that took 0.25-0.3 s (measured
    on ``lakehouse run``), every time. Frozen objects are not collected; reference counting
    still frees what it frees, and the ``atexit`` handlers and ``weakref.finalize`` callbacks
    still run (Spark's session ends). Only reference cycles are left
    for the operating system to reclaim with the rest of the process. Call it last.
    """
    gc.disable()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from lakehouse.cli import main as command

    code = command(args)
    quiet_exit()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
