"""Face detection: one interface, three detectors, and the choice between them.

`FaceDetector.detect(image, regions=None) -> list[Detection]`:
- image: a `Frame` (its `luma` plane is used when the source provides one, e.g. the Pi camera's
  low-resolution stream) or an image, BGR (H, W, 3) or grey (H, W) uint8;
- regions: None searches the whole frame; a sequence of boxes (full-frame pixels: the motion
  gate's moving regions, the live tracks' predicted boxes) searches only around them
  (`tracker.detect.regions`); an empty sequence searches nothing;
- returns, per face, the box in full-frame pixels, a score and, where the model gives them
  (`gives_landmarks`), five landmarks (see `tracker.types.Detection`).
A frame smaller than the detector's minimum gives no faces; a frame that is not an image is an
InputError. A detector made by `create_detector` returns at most MAX_FACES faces a frame, those of
highest score (`CappedDetector`, the one place every detector's faces pass): each face costs a
crop, one or two CNN passes and a column of the tracker's cost matrices, and nothing else bounds
how many a frame holds (a 1920 x 1080 frame tiled with 20 px faces gave 4,987, a 154 MB crop batch
and 1.3 GB in the tracker; 640 x 480 gave 798, 1,600 CNN passes with mirror-mean).

Detectors (`detect.detector` in the config):
- `yunet` (tracker.detect.yunet): OpenCV's FaceDetectorYN, boxes, five landmarks;
- `blazeface` (tracker.detect.blazeface): MediaPipe's full-range BlazeFace on LiteRT;
- `haar` (tracker.detect.haar): OpenCV's frontal-face cascade, no model file, no landmarks
  (OpenCV < 5 only);
- `auto`: yunet when its model file is present, otherwise blazeface (when its model file and
  LiteRT are), otherwise haar; the choice is logged once.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from tracker.detect.haar import HaarDetector, check_cascade, default_cascade_path
from tracker.detect.model_files import BLAZEFACE, YUNET
from tracker.errors import BackendUnavailable
from tracker.types import Box, Detection, Frame

if TYPE_CHECKING:  # the detectors' modules are imported when one is made (they need their runtime)
    from tracker.detect.blazeface import BlazeFaceDetector
    from tracker.detect.yunet import YuNetDetector

DETECTORS = ("auto", "yunet", "blazeface", "haar")
# Faces kept a frame, the highest scores (module docstring): a home's scene has a handful, a crowded
# room a few dozen. Far below the tracker's MAX_TRACKS (2,000, tracker.tracking.sort), so the
# tracks a frame can add stay a small part of that bound; at most 64 CNN passes with mirror-mean.
MAX_FACES = 32
# A frame over MAX_FACES is said at once, then at most once a minute (as the MQTT sink's lasting
# errors), with the frames and faces dropped meanwhile: a crowd in view must not flood the journal.
CAPPED_WARNING_EVERY_S = 60.0
log = logging.getLogger(__name__)


@runtime_checkable
class FaceDetector(Protocol):
    """Anything that finds faces; see the module docstring for the contract."""

    name: str
    gives_landmarks: bool
    detect_width: int  # pixels: images are scaled to about this width to be searched

    def detect(self, image: Frame | np.ndarray, regions: Sequence[Box] | None = None) -> list[Detection]:
        ...


class CappedDetector:
    """`detector`, returning at most MAX_FACES faces a frame: when it finds more, the MAX_FACES of
    highest score, in the detector's order (of equal scores, the earlier). What it drops is
    logged (CAPPED_WARNING_EVERY_S). Has the wrapped detector's name, landmarks and width, and its
    `model_path` (None for haar), which names its crops for `tracker train` (train.data.definition_key)."""

    def __init__(self, detector: FaceDetector) -> None:
        self.detector = detector
        self.name, self.gives_landmarks = detector.name, detector.gives_landmarks
        self.detect_width = detector.detect_width
        self.model_path = getattr(detector, "model_path", None)
        self._capped_frames = self._dropped_faces = 0  # since the last warning
        self._next_warning_s = -math.inf  # time.monotonic() from which the next one may be said

    def detect(self, image: Frame | np.ndarray, regions: Sequence[Box] | None = None) -> list[Detection]:
        found = self.detector.detect(image, regions)
        if len(found) <= MAX_FACES:
            return found
        strongest = sorted(sorted(range(len(found)), key=lambda i: -found[i].score)[:MAX_FACES])
        self._capped_frames += 1
        self._dropped_faces += len(found) - MAX_FACES
        now = time.monotonic()
        if now >= self._next_warning_s:
            log.warning("detect: %s found %d faces in a frame; only the %d of highest score are kept "
                        "(tracker.detect.MAX_FACES): %d face(s) dropped in %d frame(s) since the last such line",
                        self.name, len(found), MAX_FACES, self._dropped_faces, self._capped_frames)
            self._capped_frames = self._dropped_faces = 0
            self._next_warning_s = now + CAPPED_WARNING_EVERY_S
        return [found[i] for i in strongest]


def resolve_detector(config) -> str:
    """The detector `config` (a `tracker.config.DetectConfig`) names, with `auto` resolved from
    the model files present (not yet checked) and the runtimes installed."""
    if config.detector != "auto":
        return config.detector
    if YUNET.find() is not None:
        return "yunet"
    if BLAZEFACE.find() is not None and importlib.util.find_spec("ai_edge_litert") is not None:
        return "blazeface"
    return "haar"


def check_detector(config) -> str:
    """What `create_detector` would use, with its model file checked (sha256; haar's cascade: a
    readable file), without loading a runtime: for `tracker --check-config`. Returns the detector's
    name; ModelError otherwise, or BackendUnavailable (exit 3) for an explicit blazeface without
    LiteRT (`auto` would not pick it)."""
    name = resolve_detector(config)
    if name == "haar":
        check_cascade(default_cascade_path())
    else:
        (YUNET if name == "yunet" else BLAZEFACE).locate(config.model)
    if name == "blazeface" and importlib.util.find_spec("ai_edge_litert") is None:
        from tracker.detect.blazeface import LITERT_MISSING  # what the run would say

        raise BackendUnavailable(LITERT_MISSING)
    return name


def create_detector(config, *, quiet: bool = False) -> CappedDetector:
    """The detector of a `tracker.config.DetectConfig`, capped at MAX_FACES faces a frame
    (`CappedDetector`); ModelError (exit 2) for a missing or wrong model file, BackendUnavailable
    (exit 3) for a missing runtime. `auto` says what it chose, and warns when it chose haar with a
    score_threshold set, which haar does not apply (the config refuses one with an explicit haar)."""
    name = resolve_detector(config)
    if config.detector == "auto" and not quiet:
        log.info("detect: auto chose %s (yunet when its model file is found, then blazeface, then haar)", name)
    if name == "haar" and config.score_threshold is not None:
        log.warning("detect: auto chose haar, which has no face scores: detect.score_threshold %g does not apply "
                    "(haar's filter is detect.min_neighbors)", config.score_threshold)
    chosen: type[YuNetDetector] | type[BlazeFaceDetector]
    if name == "yunet":
        from tracker.detect.yunet import YuNetDetector as chosen
    elif name == "blazeface":
        from tracker.detect.blazeface import BlazeFaceDetector as chosen
    else:
        return CappedDetector(HaarDetector.from_config(config))
    threshold = chosen.SCORE_THRESHOLD if config.score_threshold is None else config.score_threshold
    return CappedDetector(chosen(config.detect_width, threshold, config.model))


__all__ = ["DETECTORS", "MAX_FACES", "CappedDetector", "FaceDetector", "HaarDetector", "check_detector",
           "create_detector", "resolve_detector"]
