"""Where to search: the motion gate's moving regions (and the live tracks' predicted boxes) ->
the windows a detector runs on.

Every detector searches windows, not regions: a moving blob may be only part of a face (its
leading edge, or the middle of a face whose uniform cheeks hide the motion), so each region is
grown on every side, small windows are enlarged to a minimum side (a CNN detector needs some
context and misbehaves on tiny inputs: YuNet returns non-finite boxes on 24-32 px windows),
overlapping windows are merged (a face on a seam would be cut in two), and when the windows cover
most of the frame the whole frame is searched instead (one pass is cheaper than several
overlapping ones).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracker.types import Box

# A region is grown by this fraction of its larger side on every side.
ROI_GROWTH = 0.5
# Windows covering more than this fraction of the frame: search the whole frame.
ROI_MAX_FRACTION = 0.6

Window = tuple[int, int, int, int]  # x0, y0, x1, y1 in integer pixels, x1/y1 exclusive


def search_windows(regions: Sequence[Box], width: int, height: int, *, min_side: float) -> list[Window]:
    """Regions (boxes in the pixels of a `width` x `height` image), each grown by ROI_GROWTH ->
    non-overlapping windows in the same pixels, each inside the image and at least `min_side` on
    both sides where the image allows; [(0, 0, width, height)] when they cover more than
    ROI_MAX_FRACTION of the image; [] for no regions. Regions wholly outside the image are ignored."""
    spans: list[tuple[float, float, float, float]] = []  # (x0, x1, y0, y1)
    for r in regions:
        x0, y0, x1, y1 = r.x, r.y, r.x + r.w, r.y + r.h
        if not all(np.isfinite((x0, y0, x1, y1))) or x1 <= 0 or y1 <= 0 or x0 >= width or y0 >= height:
            continue
        grow = ROI_GROWTH * max(x1 - x0, y1 - y0)
        x0, y0, x1, y1 = x0 - grow, y0 - grow, x1 + grow, y1 + grow
        spans.append(_at_least(x0, x1, min_side, width) + _at_least(y0, y1, min_side, height))
    boxes = [[b[0], b[2], b[1], b[3]] for b in spans]  # (x0, x1, y0, y1) -> (x0, y0, x1, y1)
    merged = True
    while merged:  # merge until no two windows overlap
        merged = False
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                a, b = boxes[i], boxes[j]
                if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]:
                    boxes[i] = [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]
                    del boxes[j]
                    merged = True
                    break
            if merged:
                break
    windows = [(int(x0), int(y0), int(np.ceil(x1)), int(np.ceil(y1))) for x0, y0, x1, y1 in boxes]
    if sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in windows) > ROI_MAX_FRACTION * width * height:
        return [(0, 0, width, height)]
    return windows


def _at_least(lo: float, hi: float, side: float, limit: int) -> tuple[float, float]:
    """[lo, hi] clipped to [0, limit], then widened about its centre to `side` (at most `limit`),
    shifted back inside [0, limit] when widening pushed it over an edge."""
    lo, hi = max(lo, 0.0), min(hi, float(limit))
    if hi - lo < side:
        side = min(side, float(limit))
        centre = (lo + hi) / 2.0
        lo = min(max(centre - side / 2.0, 0.0), limit - side)
        hi = lo + side
    return lo, hi
