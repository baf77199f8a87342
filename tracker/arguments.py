"""The command-line argument parser every `tracker` command uses, and its shared value types.

Low in the house (it imports only `tracker.errors`), so that a command module never imports
`tracker.cli` for it: a user's mistake in any command's arguments is one line and exit 2.
"""

from __future__ import annotations

import argparse

from tracker.errors import InputError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises InputError (exit 2, one line) instead of printing usage and exiting."""

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


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"bad value {text!r}; expected an integer >= 1")
    return value


def int_between(low: int, high: int):
    """argparse type factory: an integer from `low` to `high` (a huge one overflowed where it was
    used: a float timeout, setrlimit)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"bad value {text!r}; expected an integer from {low} to {high}")
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
