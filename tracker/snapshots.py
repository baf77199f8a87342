"""Snapshots: the best face seen of each live track, saved as a JPEG when the track makes an event.

"Best" is the largest detected box (closest to the camera, most pixels of the face). Memory: one
small image (at most `side` x `side` BGR) per live track; disk: at most `keep` JPEG files in
`<state_dir>/snapshots/`, the oldest removed first.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import cv2
import numpy as np

from tracker.crops import square_region
from tracker.types import Box


class SnapshotStore:
    def __init__(self, folder: Path, keep: int = 200, side: int = 160, quality: int = 85):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.side = side
        self.quality = quality
        self._best: dict[int, tuple[float, np.ndarray]] = {}
        self._written: OrderedDict[Path, None] = OrderedDict(
            (p, None) for p in sorted(self.folder.glob("*.jpg"), key=lambda p: p.stat().st_mtime))

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
        """Write the track's best face as `<event_id>.jpg`; returns (path, JPEG bytes), or
        (None, None) if the track has no face yet."""
        best = self._best.get(track_id)
        if best is None:
            return None, None
        ok, encoded = cv2.imencode(".jpg", best[1], [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        if not ok:
            return None, None
        jpeg = encoded.tobytes()
        path = self.folder / f"{event_id}.jpg"
        path.write_bytes(jpeg)
        self._written[path] = None
        while len(self._written) > self.keep:
            oldest, _ = self._written.popitem(last=False)
            oldest.unlink(missing_ok=True)
        return str(path), jpeg

    def forget(self, track_id: int) -> None:
        self._best.pop(track_id, None)
