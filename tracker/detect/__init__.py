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
InputError.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from tracker.detect.haar import HaarDetector
from tracker.detect.model_files import BLAZEFACE, YUNET
from tracker.errors import BackendUnavailable
from tracker.types import Box, Detection, Frame

if TYPE_CHECKING:  # the detectors' modules are imported when one is made (they need their runtime)
    from tracker.detect.blazeface import BlazeFaceDetector
    from tracker.detect.yunet import YuNetDetector

DETECTORS = ("auto", "yunet", "blazeface", "haar")
log = logging.getLogger(__name__)


@runtime_checkable
class FaceDetector(Protocol):
    """Anything that finds faces; see the module docstring for the contract."""

    name: str
    gives_landmarks: bool
    detect_width: int  # pixels: images are scaled to about this width to be searched

    def detect(self, image: Frame | np.ndarray, regions: Sequence[Box] | None = None) -> list[Detection]:
        ...


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
    """What `create_detector` would use, with its model file checked (sha256), without loading a
    runtime: for `tracker --check-config`. Returns the detector's name; ModelError otherwise, or
    BackendUnavailable (exit 3) for an explicit blazeface without LiteRT (`auto` would not pick it)."""
    name = resolve_detector(config)
    if name != "haar":
        (YUNET if name == "yunet" else BLAZEFACE).locate(config.model)
    if name == "blazeface" and importlib.util.find_spec("ai_edge_litert") is None:
        from tracker.detect.blazeface import LITERT_MISSING  # what the run would say

        raise BackendUnavailable(LITERT_MISSING)
    return name


def create_detector(config, *, quiet: bool = False) -> FaceDetector:
    """The detector of a `tracker.config.DetectConfig`; ModelError (exit 2) for a missing or wrong
    model file, BackendUnavailable (exit 3) for a missing runtime. `auto` says what it chose, and
    warns when it chose haar with a score_threshold set, which haar does not apply (the config
    refuses one with an explicit haar)."""
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
        return HaarDetector.from_config(config)
    threshold = chosen.SCORE_THRESHOLD if config.score_threshold is None else config.score_threshold
    return chosen(config.detect_width, threshold, config.model)


__all__ = ["DETECTORS", "FaceDetector", "HaarDetector", "check_detector", "create_detector", "resolve_detector"]
