"""Per-frame latency log (docs/ARCHITECTURE.md, section 3) and its rolling percentiles.

One JSON line per processed frame with the keys of `FrameLatency`, in that order. Stage times are
milliseconds of the monotonic clock:
    capture_ms  frame waiting between capture (Frame.t_ns) and the start of its processing (in the
                capture queue, then behind a batch of earlier frames that fell due)
    motion_ms, detect_ms   each stage's own time
    batch_wait_ms   from the end of the frame's detection to the start of its batch's backend call:
                cutting its crops, then waiting in the batcher for other frames' faces (until about
                batcher.max_wait_ms after the first crop's capture, plus one frame's detection: the
                deadline is checked between frames) while later frames are detected;
                a frame without faces waits too when it joined a pending batch
    infer_ms, track_ms, publish_ms   each stage's own time; infer_ms is the time the backend took
                for the batch that carried the frame's crops (shared by the batch's frames; a batch
                of more than batcher.max_batch crops is several calls)
    total_ms    from capture to the end of publishing the frame's results: the stages above, plus,
                for a frame late in its batch, the tracking and publishing of the batch's earlier
                frames
`dropped` is the running count of frames dropped by the capture queue, plus the frames whose crops
a failed backend call lost (those are tracked, without identities).
The file rotates by size (`path`, `path.1`, ... `path.<backups>`), so the disk use is bounded; a
full disk loses lines (logged, counted) but never stops the guard (tracker.files.LineFile).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tracker.files import LineFile

STAGES = ("capture_ms", "motion_ms", "detect_ms", "batch_wait_ms", "infer_ms", "track_ms", "publish_ms", "total_ms")


@dataclass(frozen=True)
class FrameLatency:
    seq: int
    t_ns: int
    backend: str
    batch: int  # crops in the batch that carried this frame's (0: no faces); run in calls of at most batcher.max_batch
    faces: int
    capture_ms: float
    motion_ms: float
    detect_ms: float
    batch_wait_ms: float
    infer_ms: float
    track_ms: float
    publish_ms: float
    total_ms: float
    dropped: int


class LatencyLog:
    """Appends FrameLatency records as JSON lines, rotating at `max_bytes` keeping `backups` files.

    Each line is written whole as it comes (a crash loses at most the line being written); one the
    disk refuses is lost, never raised, and the count said in the log (`LineFile`).
    """

    def __init__(self, path: Path, max_bytes: int = 10_000_000, backups: int = 3):
        self._file = LineFile(path, "latency log", max_bytes=max_bytes, backups=backups)

    def write(self, record: FrameLatency) -> None:
        self._file.append(json.dumps(asdict(record), separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.end()


class RollingStats:
    """p50/p95 per stage over the last `window` frames (bounded memory), for the state topic."""

    def __init__(self, window: int = 1000):
        self._rows: deque[tuple[float, ...]] = deque(maxlen=window)

    def add(self, record: FrameLatency) -> None:
        self._rows.append(tuple(getattr(record, s) for s in STAGES))

    def __len__(self) -> int:
        return len(self._rows)

    def percentiles(self) -> dict[str, dict[str, float]]:
        """{stage: {"p50": ms, "p95": ms}}; empty when no frame has been recorded."""
        if not self._rows:
            return {}
        table = np.asarray(self._rows, dtype=np.float64)
        p50, p95 = np.percentile(table, [50, 95], axis=0)
        return {s: {"p50": round(float(a), 3), "p95": round(float(b), 3)} for s, a, b in zip(STAGES, p50, p95)}
