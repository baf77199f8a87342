"""The calibration profile that the `auto` backend reads: `<state_dir>/profile.json`.

Format (schema 1):

    {"schema": 1,
     "machine": {"cpu": "AMD EPYC", "cores": 2, "arch": "x86_64"},
     "results": [{"backend": "caffe-openblas", "precision": "fp32", "batch": 1, "ms_per_image": 2.5}, ...],
     "picks": [{"precision": "fp32", "batch": 1, "backend": "onnxruntime"}, ...]}

`ms_per_image` is a cell's median pass time per image: a stall of the machine moves the mean of
a hundred passes, not their median, and `auto` must not change its pick because one run had one.
For the backends with the fastest cells of a batch size it is their runoff's median instead,
rescaled to their cells' level (tracker.bench.runoff: timed interleaved in one process, so that a
slow phase of the machine that covered one cell whole does not decide the pick).
A profile belongs to one machine. The benchmark merges its cells into a profile of the same
machine (a new measurement replaces the old one of the same backend, precision and batch; a cell
that failed now removes the old entry, since it no longer runs here) and replaces a profile of
another machine, or an unreadable one, with a warning that says why. `auto` is never written:
its own time is not a candidate for picking.

`picks` holds, per precision and batch size, the backend `auto` runs first: what
tracker.backends.auto.rank puts first given the merged results and the pick the profile had
when the benchmark run began (`recorded_at_start`), so a pick holds while it stays within auto's
tie margin of the fastest (see that module). Not the pick of the previous write: the benchmark
writes after every cell, and between two cells the merged results mix this run's medians with
the last run's, which can move a pick that the finished run would have held.
"""

from __future__ import annotations

import json
from pathlib import Path

from tracker.backends.auto import PROFILE_NAME, PROFILE_SCHEMA, UnusableProfile, rank_all, read_profile
from tracker.files import atomic_write

SCHEMA = PROFILE_SCHEMA  # of the profile and of the last run's record
LAST_RUN = "benchmark.json"


def profile_path(state_dir: Path) -> Path:
    return Path(state_dir) / PROFILE_NAME


def _existing(path: Path, machine: dict) -> tuple[list[tuple[str, str, int, float]], dict[tuple[str, int], str], str | None]:
    """Entries and picks of a valid profile of this machine at `path` (`auto.read_profile`), or
    ([], {}, why it is not reused: None when there is none)."""
    try:
        return (*read_profile(path, machine), None)
    except FileNotFoundError:
        return [], {}, None
    except UnusableProfile as err:
        return [], {}, f"profile {str(path)!r} {err}; replacing it"


def recorded_at_start(path: Path, machine: dict) -> dict[tuple[str, int], str]:
    """The picks of this machine's profile at `path` as {(precision, batch): backend}; {} when
    there is none (or it is unreadable or another machine's)."""
    return _existing(path, machine)[1]


def update_profile(path: Path, machine: dict, measured: dict[tuple[str, str, int], float], failed: set[tuple[str, str, int]],
                   held: dict[tuple[str, int], str]) -> str | None:
    """Merge this run's cells into the profile at `path` and write it atomically.

    measured: (backend, precision, batch) -> median ms per image; failed: keys that failed now;
    held: the picks to hold (`recorded_at_start`). Returns a warning when an existing profile was
    replaced rather than merged, else None.
    """
    entries, _, warning = _existing(path, machine)
    merged = {(backend, precision, batch): ms for backend, precision, batch, ms in entries}
    for key in failed:
        merged.pop(key, None)
    merged.update(measured)
    kept = sorted((b, p, n, ms) for (b, p, n), ms in merged.items() if b != "auto")
    ranking = rank_all(kept, held)
    document = {
        "schema": SCHEMA,
        "machine": machine,
        "results": [{"backend": b, "precision": p, "batch": n, "ms_per_image": ms} for b, p, n, ms in kept],
        # per precision and batch size, the backend auto runs first: rank's first given `held`
        "picks": [{"precision": p, "batch": n, "backend": ranking[p][n][0][1]} for p in sorted(ranking) for n in sorted(ranking[p])],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(document, indent=1) + "\n").encode())
    return warning


def last_run_path(state_dir: Path) -> Path:
    """`<state_dir>/benchmark.json`: {"out": the absolute --out folder of the latest benchmark run},
    so that the guard's web page finds its results.json and plots."""
    return Path(state_dir) / LAST_RUN


def record_last_run(state_dir: Path, out: Path) -> None:
    path = last_run_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps({"schema": SCHEMA, "out": str(Path(out).resolve())}) + "\n").encode())
