"""The command-line argument parser every `tracker` command uses, and its shared value types.

Low in the house (it imports only `tracker.errors`), so that a command module never imports
`tracker.cli` for it: a user's mistake in any command's arguments is one line and exit 2.
"""

from __future__ import annotations

import argparse

from tracker.errors import InputError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises InputError (exit 2, one line) instead of printing usage and exiting,
    and takes no abbreviation of an option (`--detector` was taken for the benchmark's
    `--detectors`, and refused under a name the user never typed)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise InputError(f"{self.prog}: {message}")


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"bad value {text!r}; expected a number of seconds >= 0")
    return value


def int_between(low: int, high: int | None = None):
    """argparse type factory: an integer from `low` to `high`, or >= `low` without one (a bound
    where a huge value would overflow where it is used: a float timeout, setrlimit)."""
    expected = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"bad value {text!r}; expected {expected}")
        return value

    return parse


positive_int = int_between(1)  # argparse type: an integer >= 1


def float_between(low: float, high: float):
    """argparse type factory: a number from `low` to `high` (so never NaN nor infinite)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"bad value {text!r}; expected a number from {low:g} to {high:g}")
        return value

    return parse


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"bad value {text!r}; expected a number > 0")
    return value
