"""MOTChallenge text files: detections, ground truth and tracker output.

One box a line, comma-separated (or, in a line without commas, whitespace-separated):

    frame, id, x, y, w, h, conf, ...        (frames count from 1; x, y top-left; pixels)

- detections: id is -1 (ignored); conf is the detector score.
- ground truth: conf 0 marks an "ignore" box, dropped here before any scoring; (frame, id) unique.
- tracks (tracker output): (frame, id) unique; we write `frame,id,x,y,w,h,conf,-1,-1,-1`.

Columns after the seventh (world coordinates, class, visibility) are read past and ignored. A
missing seventh column counts as conf 1. Frames run from 1 to MAX_FRAME, ids (gt, tracks) within
a signed 32-bit integer, box coordinates and sizes within MAX_PIXELS, sizes at least MIN_SIDE, at
most MAX_BOXES_PER_FRAME boxes a frame. A malformed line (an empty field among the first seven
too: it would shift the columns after it) raises `InputError` naming the file, the line number, the
field and what was expected. A UTF-8 byte-order mark at the start is read past.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from tracker.errors import InputError
from tracker.files import atomic_write

Kind = Literal["detections", "gt", "tracks"]

_FIELDS = ("frame", "id", "x", "y", "w", "h", "conf")
# The tracker steps through every frame up to the last (`evaluate.track_detections`): a million is
# over nine hours at 30 fps, and a frame number past it is far more likely a wrong column than video.
MAX_FRAME = 1_000_000
MAX_PIXELS = 1_000_000  # |x|, |y|, w and h of a box: far beyond any camera's frame
# Smallest w and h of a box: the smallest the files' three decimals can hold. Thinner boxes were
# read, and the tracker's filter (which clamps the area, not the sides) turned a 1 x 1e-300 box
# into one 1e149 px wide.
MIN_SIDE = 1e-3
# Association and scoring compare every box of a frame with every other (dense matrices): 3,000 a
# frame took 529 MB. MOT20's crowds are a few hundred people a frame.
MAX_BOXES_PER_FRAME = 1000
_ID_RANGE = (-(2**31), 2**31 - 1)  # ids pass through float64 and int64 arrays: exact well beyond this


@dataclass(frozen=True)
class MotTable:
    """Rows of a MOTChallenge file, as parallel arrays sorted by (frame, file order).

    frames (n,) int64 >= 1; ids (n,) int64; boxes (n, 4) float64 [x, y, w, h] px; conf (n,) float64.
    """

    frames: np.ndarray
    ids: np.ndarray
    boxes: np.ndarray
    conf: np.ndarray

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    @property
    def last_frame(self) -> int:
        """Largest frame number, 0 for an empty table."""
        return int(self.frames.max()) if len(self) else 0

    def by_frame(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """frame -> (ids (k,), boxes (k, 4), conf (k,)) for frames that have rows."""
        out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if not len(self):
            return out
        starts = np.flatnonzero(np.r_[True, self.frames[1:] != self.frames[:-1]])
        ends = np.r_[starts[1:], len(self)]
        for a, b in zip(starts, ends):
            out[int(self.frames[a])] = (self.ids[a:b], self.boxes[a:b], self.conf[a:b])
        return out

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, float, float, float, float, float]]) -> MotTable:
        """Build from (frame, id, x, y, w, h, conf) tuples (stable-sorted by frame)."""
        if not rows:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros(0))
        arr = np.array(rows, dtype=np.float64)
        order = np.argsort(arr[:, 0], kind="stable")
        arr = arr[order]
        return cls(arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2:6].copy(), arr[:, 6].copy())


def _number(text: str, where: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{where}: field {name!r} is {text!r}; expected a number") from None
    if not math.isfinite(value):
        raise InputError(f"{where}: field {name!r} is {text!r}; expected a finite number")
    return value


def _integer(text: str, where: str, name: str, low: int, high: int, why: str = "") -> int:
    value = _number(text, where, name)
    if value != int(value) or not low <= value <= high:
        raise InputError(f"{where}: field {name!r} is {text!r}; expected an integer from {low} to {high}{why}")
    return int(value)


def within_bounds(x: float, y: float, w: float, h: float) -> bool:
    """Whether a box's |x|, |y|, w and h are all within MAX_PIXELS, as `parse_mot` requires."""
    return max(abs(x), abs(y), w, h) <= MAX_PIXELS


def parse_mot(text: str, kind: Kind, origin: str) -> MotTable:
    """Parse MOTChallenge text. `origin` names the source in error messages (e.g. the path).
    Ground-truth rows with conf 0 are dropped (ignore boxes)."""
    rows = []
    seen: dict[tuple[int, int], int] = {}
    per_frame: dict[int, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        where = f"{kind} file {origin!r} line {lineno}"
        parts = [p.strip() for p in line.split(",")] if "," in line else line.split()
        if len(parts) < 6:
            raise InputError(
                f"{where}: {len(parts)} fields in {line[:60]!r}; expected at least 6: frame, id, x, y, w, h[, conf, ...]"
            )
        for name, part in zip(_FIELDS, parts):
            if not part:
                raise InputError(f"{where}: field {name!r} is empty in {line[:60]!r}; expected a number")
        frame = _integer(parts[0], where, "frame", 1, MAX_FRAME, " (frames count from 1)")
        ident = _integer(parts[1], where, "id", *_ID_RANGE) if kind != "detections" else -1
        x, y, w, h = (_number(parts[k], where, _FIELDS[k]) for k in range(2, 6))
        if w < MIN_SIDE or h < MIN_SIDE:
            raise InputError(f"{where}: box size w={parts[4]} h={parts[5]}; expected w and h of at least {MIN_SIDE}")
        if not within_bounds(x, y, w, h):  # the Kalman filter's squares of them would overflow
            raise InputError(f"{where}: box x={parts[2]} y={parts[3]} w={parts[4]} h={parts[5]}; expected "
                             f"coordinates and sizes within {MAX_PIXELS:,} pixels")
        conf = _number(parts[6], where, "conf") if len(parts) > 6 else 1.0
        if kind == "gt" and conf == 0:
            continue
        per_frame[frame] = per_frame.get(frame, 0) + 1
        if per_frame[frame] > MAX_BOXES_PER_FRAME:
            raise InputError(f"{where}: box number {per_frame[frame]} of frame {frame}; expected at most "
                             f"{MAX_BOXES_PER_FRAME} a frame")
        if kind != "detections":
            first = seen.setdefault((frame, ident), lineno)
            if first != lineno:
                raise InputError(f"{where}: id {ident} appears twice in frame {frame} (first on line {first}); expected each id once per frame")
        rows.append((frame, ident, x, y, w, h, conf))
    return MotTable.from_rows(rows)


def read_mot(path: Path, kind: Kind) -> MotTable:
    """Read a MOTChallenge file; InputError (exit 2) if it cannot be read or a line is malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{kind} file {str(path)!r}: not found; expected a MOTChallenge text file") from None
    except IsADirectoryError:
        raise InputError(f"{kind} file {str(path)!r}: is a directory; expected a MOTChallenge text file") from None
    except UnicodeDecodeError:
        raise InputError(f"{kind} file {str(path)!r}: not text (cannot decode as UTF-8); expected a MOTChallenge text file") from None
    except OSError as err:
        raise InputError(f"{kind} file {str(path)!r}: cannot read ({err.strerror}); expected a readable MOTChallenge text file") from None
    return parse_mot(text, kind, str(path))


def format_rows(table: MotTable) -> Iterator[str]:
    """Lines `frame,id,x,y,w,h,conf,-1,-1,-1` (with newline), in table order."""
    for f, i, (x, y, w, h), c in zip(table.frames, table.ids, table.boxes, table.conf):
        # a size below MIN_SIDE would print as 0.000 or be refused on reading
        yield f"{int(f)},{int(i)},{x:.3f},{y:.3f},{max(w, MIN_SIDE):.3f},{max(h, MIN_SIDE):.3f},{c:.3f},-1,-1,-1\n"


def write_mot(path: Path, table: MotTable) -> None:
    """Write a tracks table, whole or not at all (a full disk left half a file, which the
    evaluation then scored as a run's tracks), or into a device or pipe (/dev/stdout) as it is;
    InputError if the file cannot be written."""
    path = Path(path)

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.writelines(format_rows(table))

    try:
        if path.exists() and not path.is_file():
            write(path)
        else:
            atomic_write(path, write)
    except OSError as err:
        raise InputError(f"output file {str(path)!r}: cannot write ({err.strerror}); expected a writable path") from None
