"""Assignment of detections to tracks: IoU and embedding costs, gating, Hungarian solution.

Boxes are arrays of shape (N, 4) in [x, y, w, h] pixels (float64). The cost of pairing track i
with detection j is

    cost[i, j] = (1 - IoU[i, j]) + embedding_weight * cosine_distance[i, j]

where a pair of which one has no embedding (a NaN row) takes NEUTRAL_COSINE_DISTANCE as its cosine
distance (see `cosine_distance`); the term is left out when embedding_weight is 0 or either side's
embeddings are not given.
A pair is allowed only if its boxes overlap with IoU >= iou_threshold (and IoU > 0: boxes that do
not touch never match, whatever the threshold). The minimum-cost assignment is found with the
Hungarian method (scipy's `linear_sum_assignment`) over the allowed pairs, so that as many allowed
pairs as possible are matched and, among those, the total cost is least.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from tracker.types import Box

# Cost given to forbidden pairs so the solver uses them only when nothing else remains; they are
# removed from the result afterwards. Larger than any sum of allowed costs (each <= 3).
_FORBIDDEN = 1e6

# Cosine distance used for a pair where one side has no embedding: the middle of the [0, 1] range,
# so such a pair is neither favoured nor penalised against pairs that have both embeddings.
NEUTRAL_COSINE_DISTANCE = 0.5


def box_rows(boxes: Sequence[Box]) -> np.ndarray:
    """Boxes as the (N, 4) float64 [x, y, w, h] array this module's functions take."""
    return np.array([[b.x, b.y, b.w, b.h] for b in boxes], dtype=np.float64).reshape(-1, 4)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in `a` (N, 4) with every box in `b` (M, 4), both [x, y, w, h]; (N, M)
    float64 in [0, 1]. Boxes of zero area have IoU 0 with everything."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    ax1, ay1, aw, ah = (a[:, k, None] for k in range(4))
    bx1, by1, bw, bh = (b[None, :, k] for k in range(4))
    iw = np.clip(np.minimum(ax1 + aw, bx1 + bw) - np.maximum(ax1, bx1), 0.0, None)
    ih = np.clip(np.minimum(ay1 + ah, by1 + bh) - np.maximum(ay1, by1), 0.0, None)
    inter = iw * ih
    union = aw * ah + bw * bh - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0.0, inter / union, 0.0)
    return iou


def cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """1 - cosine similarity of every row of `a` (N, D) with every row of `b` (M, D), clipped to
    [0, 1]: (N, M) float64. Negative similarity (impossible for ReLU embeddings such as fc1) counts
    as fully different; a zero vector is at distance 1 from everything."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    an = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return np.clip(1.0 - an @ bn.T, 0.0, 1.0)


@dataclass(frozen=True)
class Assignment:
    """Result of one frame's association: `matches` are (track_index, detection_index) pairs in
    increasing track index; the unmatched indices are sorted."""

    matches: tuple[tuple[int, int], ...]
    unmatched_tracks: tuple[int, ...]
    unmatched_detections: tuple[int, ...]


def solve(cost: np.ndarray, allowed: np.ndarray) -> list[tuple[int, int]]:
    """Minimum-cost matching of rows to columns of `cost` (N, M) that uses only `allowed` (N, M)
    bool pairs and, first, as many of them as possible. Returns (row, col) pairs sorted by row."""
    if cost.size == 0:
        return []
    rows, cols = linear_sum_assignment(np.where(allowed, cost, _FORBIDDEN))
    return [(int(i), int(j)) for i, j in zip(rows, cols) if allowed[i, j]]


def associate(
    track_boxes: np.ndarray,
    detection_boxes: np.ndarray,
    *,
    iou_threshold: float,
    embedding_weight: float = 0.0,
    track_embeddings: np.ndarray | None = None,
    detection_embeddings: np.ndarray | None = None,
) -> Assignment:
    """Assign detections to tracks for one frame.

    track_boxes (N, 4), detection_boxes (M, 4): [x, y, w, h] px.
    track_embeddings (N, D), detection_embeddings (M, D): optional; a row containing NaN, or all
    zeros (no direction to compare), means "no embedding for this one": the neutral distance. The
    embedding term is used only when embedding_weight > 0.
    """
    track_boxes = np.asarray(track_boxes, dtype=np.float64).reshape(-1, 4)
    detection_boxes = np.asarray(detection_boxes, dtype=np.float64).reshape(-1, 4)
    n, m = len(track_boxes), len(detection_boxes)
    iou = iou_matrix(track_boxes, detection_boxes)
    cost = 1.0 - iou
    allowed = (iou >= iou_threshold) & (iou > 0.0)
    if embedding_weight > 0.0 and track_embeddings is not None and detection_embeddings is not None and n and m:
        t_ok = np.isfinite(track_embeddings).all(axis=1) & np.asarray(track_embeddings).any(axis=1)
        d_ok = np.isfinite(detection_embeddings).all(axis=1) & np.asarray(detection_embeddings).any(axis=1)
        dist = np.full((n, m), NEUTRAL_COSINE_DISTANCE)
        if t_ok.any() and d_ok.any():
            dist[np.ix_(t_ok, d_ok)] = cosine_distance(track_embeddings[t_ok], detection_embeddings[d_ok])
        cost = cost + embedding_weight * dist
    matches = solve(cost, allowed)
    matched_t = {i for i, _ in matches}
    matched_d = {j for _, j in matches}
    return Assignment(
        matches=tuple(matches),
        unmatched_tracks=tuple(i for i in range(n) if i not in matched_t),
        unmatched_detections=tuple(j for j in range(m) if j not in matched_d),
    )
