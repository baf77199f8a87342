"""IoU/embedding costs and the gated Hungarian assignment (tracker/tracking/assign.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.tracking.assign import NEUTRAL_COSINE_DISTANCE, associate, cosine_distance, iou_matrix, solve


def test_iou_known_values():
    a = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], float)
    b = np.array([[0, 0, 10, 10], [5, 0, 10, 10], [20, 20, 5, 5], [0, 0, 0, 0]], float)
    iou = iou_matrix(a, b)
    assert iou.shape == (2, 4)
    assert iou[0].tolist() == pytest.approx([1.0, 50 / 150, 0.0, 0.0])
    assert iou_matrix(np.zeros((0, 4)), b).shape == (0, 4)


def test_cosine_distance_range_and_zero_vector():
    a = np.array([[1, 0], [0, 0]], float)
    b = np.array([[1, 0], [0, 1], [-1, 0]], float)
    d = cosine_distance(a, b)
    assert d[0].tolist() == pytest.approx([0.0, 1.0, 1.0])  # opposite clipped to 1
    assert d[1].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_hungarian_beats_greedy():
    # Greedy would take (0, 0) (cost 0.1) and then be forced to (1, 1) (cost 0.9): total 1.0.
    # The optimum is (0, 1) + (1, 0): 0.2 + 0.2.
    cost = np.array([[0.1, 0.2], [0.2, 0.9]])
    assert solve(cost, np.ones((2, 2), bool)) == [(0, 1), (1, 0)]


def test_forbidden_pairs_never_returned_and_cardinality_first():
    cost = np.array([[0.0, 0.5], [0.1, 9.0]])
    allowed = np.array([[True, True], [True, False]])
    # Matching (0, 0) alone would be cheapest but leaves row 1 unmatched; two allowed pairs win.
    assert solve(cost, allowed) == [(0, 1), (1, 0)]
    assert solve(cost, np.zeros((2, 2), bool)) == []


def test_iou_gating():
    tracks = np.array([[0, 0, 10, 10]], float)
    dets = np.array([[6, 0, 10, 10], [100, 100, 10, 10]], float)  # IoU 0.25 and 0
    loose = associate(tracks, dets, iou_threshold=0.2)
    assert loose.matches == ((0, 0),) and loose.unmatched_detections == (1,)
    strict = associate(tracks, dets, iou_threshold=0.3)
    assert strict.matches == () and strict.unmatched_tracks == (0,) and strict.unmatched_detections == (0, 1)
    # Threshold 0 still never pairs boxes that do not overlap.
    far = associate(tracks, dets[1:], iou_threshold=0.0)
    assert far.matches == ()


def test_crossing_boxes_assigned_by_iou():
    # Two tracks predicted to have just crossed: each detection overlaps both, more its own.
    tracks = np.array([[48, 0, 20, 40], [32, 0, 20, 40]], float)  # A moving right, B moving left
    dets = np.array([[31, 0, 20, 40], [49, 0, 20, 40]], float)
    a = associate(tracks, dets, iou_threshold=0.3)
    assert a.matches == ((0, 1), (1, 0))


def test_embedding_breaks_an_iou_tie():
    tracks = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], float)  # fully overlapping
    dets = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], float)
    t_emb = np.array([[1, 0, 0], [0, 1, 0]], float)
    d_emb = np.array([[0, 1, 0], [1, 0, 0]], float)
    a = associate(tracks, dets, iou_threshold=0.3, embedding_weight=0.3, track_embeddings=t_emb, detection_embeddings=d_emb)
    assert a.matches == ((0, 1), (1, 0))
    # Without the weight the embeddings are ignored (identity order wins the tie).
    b = associate(tracks, dets, iou_threshold=0.3, embedding_weight=0.0, track_embeddings=t_emb, detection_embeddings=d_emb)
    assert b.matches == ((0, 0), (1, 1))


def test_missing_embedding_is_neutral():
    tracks = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], float)
    dets = np.array([[0, 0, 10, 10]], float)
    # Track 0 has no embedding (NaN row), track 1 a mismatching one: track 0 (neutral 0.5)
    # must beat track 1 (distance 1).
    t_emb = np.array([[np.nan, np.nan], [0, 1]], float)
    d_emb = np.array([[1, 0]], float)
    a = associate(tracks, dets, iou_threshold=0.3, embedding_weight=1.0, track_embeddings=t_emb, detection_embeddings=d_emb)
    assert a.matches == ((0, 0),)
    assert 0 < NEUTRAL_COSINE_DISTANCE < 1
    # a zero row has no direction either (it was at distance 1: track 1 won the tie by order)
    a = associate(tracks, dets, iou_threshold=0.3, embedding_weight=1.0, track_embeddings=np.array([[0, 1], [0, 0]], float),
                  detection_embeddings=d_emb)
    assert a.matches == ((1, 0),)


def test_empty_inputs():
    a = associate(np.zeros((0, 4)), np.array([[0, 0, 1, 1]], float), iou_threshold=0.3)
    assert a.matches == () and a.unmatched_detections == (0,)
    b = associate(np.array([[0, 0, 1, 1]], float), np.zeros((0, 4)), iou_threshold=0.3)
    assert b.matches == () and b.unmatched_tracks == (0,)
