"""Batcher: groups face crops across frames for the backend, keeping frames in order.

A batch is a run of consecutive whole frames (a frame's crops are never split between batches,
so every frame is complete when its batch returns). Rules, in this order:
- a frame is appended to the pending run; frames with no crops join it too, so order is kept;
- the run is released as soon as it holds `max_batch` crops or more (`max_batch=1`: every frame
  is released on arrival: pure streaming), or frames of `max_frame_bytes` or more (the caller
  says what each item holds: a run of large frames with few faces is bounded too);
- otherwise it is released when `max_wait_ms` has passed since the capture time of its first
  frame with crops (`due(now_ns)`), or when nothing is pending but crop-less frames;
- or at once, when the next frame cannot come before that deadline: captured no sooner than the
  shortest of the last GAPS_KEPT gaps between frames after this one, it would find the run due
  already, so waiting for the deadline only adds latency (a camera at 10 frames/s: all of
  `max_wait_ms` for every frame with faces, for nothing). Until GAPS_KEPT gaps are known, and
  whenever frames come faster than the deadline, the run waits as above;
- `flush()` releases whatever is pending (end of stream, shutdown).
Memory: at most `max_batch - 1` crops and frames of less than `max_frame_bytes` wait, plus one
frame's worth; frames without crops never wait behind an empty run. Pure: the caller passes the monotonic time; no clock is read here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")

# Gaps between frames' capture times the early release goes by (see the module docstring): its
# shortest, so that one late frame (a slow read, a hiccup) does not make the source look slower
# than it is; eight frames are under a second at a camera's pace.
GAPS_KEPT = 8


@dataclass(frozen=True)
class Batch(Generic[T]):
    """Consecutive frames' items and their crops stacked: crops (N, C, H, W) float32 (N >= 0),
    counts[i] = how many of those rows belong to items[i], in order."""

    items: tuple[T, ...]
    crops: np.ndarray
    counts: tuple[int, ...]

    def split(self, rows: np.ndarray) -> list[np.ndarray | None]:
        """Cut a per-crop array of the first M crops (M, ...), M <= N, back into one array per
        item; None for an item with a crop past M (a backend that failed part-way through the
        batch: the items before keep their rows)."""
        parts: list[np.ndarray | None] = []
        end = 0
        for count in self.counts:
            start, end = end, end + count
            parts.append(rows[start:end] if end <= len(rows) else None)
        return parts


@dataclass
class Batcher(Generic[T]):
    """Holds the pending run; see the module docstring for when it is released."""

    max_batch: int
    max_wait_ms: float
    max_frame_bytes: int = 64 << 20  # a 1080p BGR frame is 6 MB: 10 of them (a Pi 3 has 1 GB)
    _items: list = field(default_factory=list)
    _crops: list = field(default_factory=list)
    _counts: list = field(default_factory=list)
    _first_crop_ns: int | None = None
    _frame_bytes: int = 0
    _last_t_ns: int | None = None  # the capture time of the frame added last
    _gaps_ns: deque = field(default_factory=lambda: deque(maxlen=GAPS_KEPT))

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_wait_ms < 0:
            raise ValueError(f"batcher: max_batch {self.max_batch} must be >= 1 and max_wait_ms {self.max_wait_ms} >= 0")

    @property
    def pending_crops(self) -> int:
        return sum(self._counts)

    def add(self, item: T, crops: np.ndarray, t_ns: int, frame_bytes: int = 0) -> Batch[T] | None:
        """Append one frame's `item` with its crops (k, C, H, W) float32, k >= 0 (every frame's
        crops of one (C, H, W), also when k is 0), captured at `t_ns`, holding `frame_bytes` of
        images; returns the released batch, if this frame completed one."""
        self._items.append(item)
        self._crops.append(crops)
        self._counts.append(len(crops))
        self._frame_bytes += frame_bytes
        if self._last_t_ns is not None:
            self._gaps_ns.append(t_ns - self._last_t_ns)
        self._last_t_ns = t_ns
        if len(crops) and self._first_crop_ns is None:
            self._first_crop_ns = t_ns
        if (self.pending_crops >= self.max_batch or self._frame_bytes >= self.max_frame_bytes
                or self._first_crop_ns is None or self._next_frame_too_late(t_ns)):
            return self.flush()
        return None

    def _next_frame_too_late(self, t_ns: int) -> bool:
        """The next frame after one captured at `t_ns`, at the shortest of the recent gaps, would
        be captured at or after the pending run's deadline (see the module docstring)."""
        deadline = self.deadline_ns()
        return (deadline is not None and len(self._gaps_ns) == GAPS_KEPT
                and t_ns + min(self._gaps_ns) >= deadline)

    def deadline_ns(self) -> int | None:
        """Monotonic time at which the pending run must be released, or None if nothing waits."""
        if self._first_crop_ns is None:
            return None
        return self._first_crop_ns + int(self.max_wait_ms * 1e6)

    def due(self, now_ns: int) -> Batch[T] | None:
        """Release the pending run if its deadline has passed at `now_ns`."""
        deadline = self.deadline_ns()
        if deadline is not None and now_ns >= deadline:
            return self.flush()
        return None

    def flush(self) -> Batch[T] | None:
        """Release everything pending (None if nothing is)."""
        if not self._items:
            return None
        crops = np.ascontiguousarray(np.concatenate(self._crops))  # (0, C, H, W) when no frame had a face
        batch = Batch(tuple(self._items), crops, tuple(self._counts))
        self._items, self._crops, self._counts, self._first_crop_ns, self._frame_bytes = [], [], [], None, 0
        return batch
