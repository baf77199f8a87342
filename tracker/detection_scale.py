"""How a frame is scaled for face detection: its size in detection pixels.

Every detector scales a frame so that it is `detect_width` detection pixels wide, except that

- its longer side is at most MAX_ASPECT detection widths: a portrait camera's frame (9:16) is far
  within it, and a strip of an image (16 x 12,000 px from a photo folder) is not scaled up to a
  window of gigabytes;
- it holds at most MAX_DETECT_PIXELS detection pixels: YuNet's peak memory grows with them (a
  320 x 240 frame at a detect_width of 4,096 is 12.6 megapixels: a 968 MB peak RSS, of a 1 GB
  Pi's; 218 MB within the bound; one-off `ru_maxrss` readings on the x86-64 VM here).

The CNN detectors (YuNet, BlazeFace) find nothing in a frame with a side under MIN_WINDOW_PX
detection pixels (below it YuNet returns non-finite or huge boxes: ../shared/models/README.md, its yunet/ section),
which the config check refuses for the camera's frames (`tracker.config`). Pure arithmetic: the
config imports it without the detectors' OpenCV.
"""

from __future__ import annotations

import math

MIN_WINDOW_PX = 64
MAX_ASPECT = 4
MAX_DETECT_PIXELS = 1920 * 1080


def detection_scale(width: int, height: int, detect_width: int) -> float:
    """Frame pixels -> detection pixels for a `width` x `height` frame (see the module docstring)."""
    return min(asked_scale(width, height, detect_width), math.sqrt(MAX_DETECT_PIXELS / (width * height)))


def asked_scale(width: int, height: int, detect_width: int) -> float:
    """`detection_scale` before the bound of detection pixels: what `detect_width` asks for."""
    return min(detect_width / width, MAX_ASPECT * detect_width / height)
