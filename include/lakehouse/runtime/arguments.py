"""The command lines' argument types (argparse): a parser whose options that take a value are
given once, a whole number with a floor, a topic name that is not empty."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def topic_name(text: str) -> str:
    """``--topic``: one topic. Empty is refused: left to mean "every topic", an unset variable
    in ``--topic "$TOPIC"`` would act on all of them."""
    if not text:
        raise argparse.ArgumentTypeError("empty topic name (leave --topic out for every topic)")
    return text


def count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse


class Once(argparse.Action):
    """An option that takes one value, given at most once. argparse's own keeps the last of
    several silently (``--format json --format table``); a second one is refused instead."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None:
            given: set[str] = namespace.__dict__.setdefault("_given", set())
            if self.dest in given:
                first = getattr(namespace, self.dest)
                parser.error(
                    f"argument {'/'.join(self.option_strings)}: given twice ({first!r}, then "
                    f"{values!r}); give it once"
                )
            given.add(self.dest)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """The command line's parser: an option that takes a value is given once (:class:`Once`),
    unless it says it combines (``action="append"``: several ``--topic`` or ``--layer``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, Once)
        self.register("action", "store", Once)
