"""YuNet (2023mar): OpenCV's `cv2.FaceDetectorYN`, a 232 kB CNN face detector with five landmarks.

The model file is found and checked by `tracker.detect.model_files.YUNET`. FaceDetectorYN takes
any input size (`setInputSize`, set per window); it returns per face x, y, w, h, the five landmarks
in `Detection`'s order (right eye, left eye, nose tip, right and left mouth corner) and a score.
OpenCV's default score threshold of 0.9 loses recall at 320 px (25/43 dlib faces against 43/43
at 0.6, ../shared/models/README.md, its yunet/ section), so the project's default is 0.6.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from tracker.detect.model_files import YUNET
from tracker.detect.windowed import WindowedDetector
from tracker.errors import ModelError

NMS_THRESHOLD = 0.3  # overlap above which OpenCV keeps only the better of two boxes
# Candidates (score over the threshold) kept per window before NMS, the highest scores. A face gives
# up to about 8 (dlib's photos: the 25 faces of bald_guys.jpg need 198, 8 of 2008_004176.jpg 61), so
# 10 for each of the MAX_FACES a frame keeps (tracker.detect). OpenCV's default, 5000, returned 4,987
# faces of a 1920 x 1080 frame tiled with 20 px faces, and half the detector's time went on them
# (0.7 s a frame against 0.3 s at 320, this VM).
TOP_K = 320


class YuNetDetector(WindowedDetector):
    """YuNet on windows at `detect_width` (see WindowedDetector). One instance per thread."""

    name = "yunet"
    SCORE_THRESHOLD = 0.6

    def __init__(self, detect_width: int = 320, score_threshold: float = SCORE_THRESHOLD, model: Path | None = None) -> None:
        super().__init__(detect_width, score_threshold)
        self.model_path, content = YUNET.load(model)
        try:  # from the checked bytes, as ONNX: the file's name says nothing
            self._net = cv2.FaceDetectorYN.create("onnx", np.frombuffer(content, np.uint8), np.empty(0, np.uint8),
                                                  (320, 240), score_threshold, NMS_THRESHOLD, TOP_K)
        except cv2.error as err:  # the sha256 matched, so this is an OpenCV without YuNet support
            raise ModelError(f"yunet detector: OpenCV {cv2.__version__} cannot load {str(self.model_path)!r} "
                             f"({str(err).strip().splitlines()[-1]}); expected OpenCV >= 4.8") from None
        self._size: tuple[int, int] = (320, 240)

    def _detect_window(self, bgr: np.ndarray) -> np.ndarray:
        size = (bgr.shape[1], bgr.shape[0])
        if size != self._size:
            self._net.setInputSize(size)
            self._size = size
        _, faces = self._net.detect(bgr)
        return np.empty((0, 15), np.float32) if faces is None else faces
