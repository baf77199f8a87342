"""The command-line argument parser every `tracker` command uses, and its shared value types.

Low in the house (it imports only `tracker.errors` at its top, and `tracker.files` when it checks an
output file's folder), so that a command module never imports
`tracker.cli` for it: a user's mistake in any command's arguments is one line and exit 2.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tracker.errors import InputError, TrackerError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises InputError (exit 2, one line) instead of printing usage and exiting,
    and takes no abbreviation of an option (`--detector` was taken for the benchmark's
    `--detectors`, and refused under a name the user never typed)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # the CLI prints "tracker: error: " first: a subcommand's name is worth repeating, "tracker" is not
        raise InputError(message if self.prog == "tracker" else f"{self.prog}: {message}")


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


# The largest batch a benchmark times: the study's largest, and the backend worker's default
# max_batch (tracker.backends.worker.DEFAULT_MAX_BATCH). A bound because a batch is allocated
# whole: --batches 100000 asked for gigabytes before the first pass.
MAX_BENCH_BATCH = 256


def batch_list(text: str) -> list[int]:
    """argparse type of every benchmark's --batches: comma-separated batch sizes from 1 to
    MAX_BENCH_BATCH ("1,8,64") -> the sizes, each once, in the order given."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:  # an empty part ("1,,2") too
        values = []
    if not values or any(not 1 <= v <= MAX_BENCH_BATCH for v in values):
        raise argparse.ArgumentTypeError(f"bad value {text!r}; expected comma-separated batch sizes from 1 to "
                                         f"{MAX_BENCH_BATCH}, e.g. 1,2,4,8")
    return list(dict.fromkeys(values))


def float_between(low: float, high: float = math.inf, *, above_low: bool = False, what: str = "a number"):
    """argparse type factory: a finite number from `low` (with `above_low`, greater than it) to
    `high`; `what` names it in the message ("a number of seconds"). Never NaN nor infinite: a
    value that overflows where it is used (a timer, a sample count) is refused here."""
    expected = f"{what} {'>' if above_low else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if above_low else value >= low) and value <= high):
            raise argparse.ArgumentTypeError(f"bad value {text!r}; expected {expected}")
        return value

    return parse


positive_float = float_between(0, above_low=True)  # argparse type: a finite number > 0


def words(what: str):
    """argparse type factory: text that is not blank; `what` says what is expected ("a backend
    name"). An empty value (`--backend ""`, a shell variable unset) is no value: the command must
    not take it for the option left out."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"bad value {text!r}; expected {what}")
        return text

    return parse


# What every command's --config defaults to (tracker.config.DEFAULT_CONFIG), for its help: "config/tracker.yaml"
# read as a file of the working directory
CONFIG_DEFAULT = ("default: the package's own tracker.yaml, with the demo's settings, not one in the working "
                  "directory; tracker --check-config names its path")


def path_to(what: str):
    """argparse type factory of every option naming a file or folder: a Path from text that is not
    blank; `what` says what is expected ("a caffemodel file to write"). An empty value became
    Path("."), the working directory: read, listed or written into as if the user had named it
    (`tracker train --work ""` put its checkpoint there), or named '.' in an error."""
    not_blank = words(what)

    def parse(text: str) -> Path:
        return Path(not_blank(text))

    return parse


def file_to_write(what: str):
    """argparse type factory of an option naming a file a command writes when its work is done (a
    JSON of results, written with files.atomic_write): a Path, not a folder, in a folder that takes
    a new file (files.probe_writable); `what` says what is expected. Checked when the options are
    read: a bad one was a traceback after the minutes of work whose results it lost."""
    not_blank = path_to(what)

    def parse(text: str) -> Path:
        # here, not at the top: tracker.files loads numpy, which tracker.cli must not load before it
        # bounds OpenBLAS's idle threads (tracker.blas_idle)
        from tracker.files import probe_writable

        path = not_blank(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"bad value {text!r}: a folder; expected {what}")
        try:
            probe_writable(path.parent)
        except OSError as err:
            raise argparse.ArgumentTypeError(f"bad value {text!r}: cannot write in {str(path.parent)!r} "
                                             f"({err.strerror or err}); expected {what}") from None
        return path

    return parse


def refuse_overwriting(out: Path, inputs: dict[str, Path | Sequence[Path] | None]) -> None:
    """InputError if `out` is one of the `inputs` ({what: a path, several, or None for one not
    given}): writing it would destroy what the command reads (eval-mot's tracks over its
    detections, eval-faces' JSON over its pairs file, convert's model over the caffemodel it
    converts, train's weights over a teacher)."""
    for what, given in inputs.items():
        for path in [given] if isinstance(given, (str, Path)) else given or ():
            if Path(out).resolve() == Path(path).resolve() or (Path(out).exists() and Path(path).exists()
                                                               and Path(out).samefile(path)):
                raise InputError(f"output file {str(out)!r} is the {what} file; expected another path (writing it "
                                 f"would destroy the {what})")


config_path = path_to("a YAML config file")  # argparse type of every command's --config


def comma_names(text: str, valid: Sequence[str], option: str, noun: str) -> tuple[list[str], bool]:
    """`a,b` or `all` -> (the names, each once, in the order given; whether `all` was asked, which
    gives every valid name). InputError naming `option` for a name not in `valid` (a `noun`) or an
    empty one ("a,,b")."""
    if text.strip() == "all":
        return list(valid), True
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in valid:
            what = f"unknown {noun} {name!r}" if name else f"an empty name in {text!r}"
            raise InputError(f"{option}: {what}; expected a comma list of {', '.join(valid)}, or all")
    return list(dict.fromkeys(names)), False


def one_line_errors(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """A script's `main(argv) -> exit code` whose TrackerError (a bad option, as this module's
    parser raises it, or a file it cannot use) is printed as its one line on stderr, its exit code
    returned: the measuring scripts' mistakes are one line, never a traceback, as the commands'."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except TrackerError as err:
            print(str(err), file=sys.stderr)
            return err.exit_code

    return run
