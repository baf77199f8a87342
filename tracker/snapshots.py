"""Snapshots: the best face seen of each live track, saved as a JPEG when the track makes an event.

"Best" is the largest detected box (closest to the camera, most pixels of the face). Memory: one
small image (at most `side` x `side` BGR) per live track; disk: at most `keep` JPEG files in
`<state_dir>/snapshots/`, the oldest removed first. A file is whole or absent under its event's
name (written beside it as `.<name>.partial`, then renamed: a guard killed mid-write left half a
JPEG that its event named; a partial file such a kill leaves is removed at the next start). A
folder removed while the guard runs is made again. A snapshot the disk refuses (full) is logged,
and its event goes on without a file: the sinks still get the JPEG.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

import cv2
import numpy as np

from tracker.crops import square_region
from tracker.types import Box

log = logging.getLogger(__name__)


def snapshots_folder(state_dir: Path) -> Path:
    """Where the guard keeps its snapshots (SnapshotStore) and the page serves them from:
    `<state_dir>/snapshots`."""
    return Path(state_dir) / "snapshots"


class SnapshotStore:
    def __init__(self, folder: Path, keep: int = 200, side: int = 160, quality: int = 85):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for partial in self.folder.glob(".*.jpg.partial"):  # a kill mid-write
            partial.unlink(missing_ok=True)
        self.keep = keep
        self.side = side
        self.quality = quality
        self._best: dict[int, tuple[float, np.ndarray]] = {}
        self._written: OrderedDict[Path, None] = OrderedDict(
            (p, None) for p in sorted(self.folder.glob("*.jpg"), key=_modified))
        self._failures = 0  # snapshots not written since the last one that was

    def offer(self, track_id: int, image: np.ndarray, box: Box) -> None:
        """Keep this face of track `track_id` if it is the track's largest so far.
        image: the frame, BGR (H, W, 3) uint8; box: the detection in that frame."""
        area = box.w * box.h
        if track_id in self._best and self._best[track_id][0] >= area:
            return
        face = square_region(image, box)
        if face.shape[0] > self.side:
            face = cv2.resize(face, (self.side, self.side), interpolation=cv2.INTER_AREA)
        self._best[track_id] = (area, np.ascontiguousarray(face))

    def save(self, track_id: int, event_id: str) -> tuple[str | None, bytes | None]:
        """Write the track's best face as `<event_id>.jpg`; returns (path, JPEG bytes), (None, JPEG
        bytes) if the file could not be written, or (None, None) if the track has no face yet."""
        best = self._best.get(track_id)
        if best is None:
            return None, None
        ok, encoded = cv2.imencode(".jpg", best[1], [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        if not ok:
            return None, None
        jpeg = encoded.tobytes()
        path = self.folder / f"{event_id}.jpg"
        partial = self.folder / f".{path.name}.partial"
        try:
            try:  # no fsync, on the guard's own thread: a snapshot is not worth one
                partial.write_bytes(jpeg)
            except FileNotFoundError:  # the folder was removed (by hand, a clean-up): made again
                self.folder.mkdir(parents=True, exist_ok=True)
                partial.write_bytes(jpeg)
            partial.replace(path)
        except OSError as err:
            try:
                partial.unlink(missing_ok=True)  # half a file, outside the `keep` bound
            except OSError:
                pass
            self._failures += 1
            if self._failures == 1:
                log.error("snapshots: cannot write %s (%s); events go on without their snapshot files until it can",
                          path, err.strerror or err)
            return None, jpeg
        if self._failures:
            log.warning("snapshots: writing again; %d snapshot(s) were not kept meanwhile", self._failures)
            self._failures = 0
        self._written[path] = None
        while len(self._written) > self.keep:
            oldest, _ = self._written.popitem(last=False)
            try:
                oldest.unlink(missing_ok=True)
            except OSError as err:  # not ours to remove any more: it stays, the next ones still go
                log.warning("snapshots: cannot remove %s (%s)", oldest, err.strerror or err)
        return str(path), jpeg

    def forget(self, track_id: int) -> None:
        self._best.pop(track_id, None)

    def merge(self, into: int, source: int) -> None:
        """Track `source` was track `into` all along: the larger of their best faces is `into`'s."""
        theirs = self._best.pop(source, None)
        if theirs is not None and (into not in self._best or self._best[into][0] < theirs[0]):
            self._best[into] = theirs


def _modified(path: Path) -> float:
    """path's modification time, or 0 for one gone or dangling (listed first, removed first)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
