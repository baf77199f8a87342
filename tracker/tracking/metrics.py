"""CLEAR-MOT and identity (IDF1) metrics of tracker output against ground truth.

Written from the metric definitions, matching the MOTChallenge devkit's conventions:

- A ground-truth box o and a hypothesis box h may correspond in a frame when IoU(o, h) >= 0.5
  (IoU distance 1 - IoU <= 0.5).
- CLEAR-MOT (Bernardin & Stiefelhagen 2008), frame by frame: first keep the previous frame's
  pairs (o, h) where both are present and still may correspond; then pair the remaining
  objects and hypotheses by a minimum-total-distance (Hungarian) assignment over the allowed pairs.
  Unpaired objects are misses (FN), unpaired hypotheses false positives (FP). An object paired with a
  hypothesis other than the one it was last paired with (in any earlier frame) is an identity switch.
  An object's fragmentations are its runs of consecutively numbered paired frames less one: a
  frame it was absent from breaks a run as a frame it was missed in does (the devkit's
  `alltracked(first:last)`, TrackEval's `Frag`). Per object, the tracked ratio (frames paired /
  frames present) makes it mostly tracked (> 0.8), mostly lost (< 0.2) or partially tracked (in
  between, both ends included), as TrackEval and the devkit count them.
- MOTA = 1 - (FN + FP + IDsw) / (ground-truth boxes, at least 1, as TrackEval: without any, false
  positives still count against it, where 1 would read as perfect); MOTP = 1 - mean IoU distance of the pairs,
  i.e. the mean IoU (larger is better), and 0 when nothing was paired (as TrackEval reports it: a
  mean over no pairs is undefined, and 1 would read as perfect overlap).
- IDF1 (Ristani et al. 2016): whole trajectories are matched one-to-one to maximise the number of
  frames in which matched trajectories may correspond (a global minimum-cost bipartite matching of
  IDFN + IDFP); IDTP counts those frames, IDFN = gt boxes - IDTP, IDFP = hypothesis boxes - IDTP,
  IDF1 = 2 IDTP / (2 IDTP + IDFP + IDFN).

(py-motmetrics instead keeps an object's most recent pair even across frames where it was missed;
on the reference sequences TUD-Campus and TUD-Stadtmitte both rules give the same figures.)

Ground-truth ignore boxes (conf 0) are dropped by `mot.read_mot` before this module sees them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linear_sum_assignment
from scipy.sparse.csgraph import connected_components

from tracker.tracking.assign import iou_matrix, solve
from tracker.tracking.mot import MotTable

MATCH_IOU = 0.5


@dataclass(frozen=True)
class MotMetrics:
    """Scores of one sequence. Ratios are fractions in [0, 1] (MOTA can be negative)."""

    idf1: float
    recall: float
    precision: float
    num_objects: int  # GT: distinct ground-truth ids
    mostly_tracked: int
    partially_tracked: int
    mostly_lost: int
    false_positives: int
    misses: int  # FN
    id_switches: int
    fragmentations: int
    mota: float
    motp: float
    num_gt_boxes: int
    num_hyp_boxes: int
    num_matches: int
    idtp: int
    idfp: int
    idfn: int

    # (header, attribute, format) of the table `tracker eval-mot` prints, as the README's table.
    COLUMNS = (
        ("IDF1", "idf1", "{:.6f}"),
        ("Rcll", "recall", "{:.6f}"),
        ("Prcn", "precision", "{:.6f}"),
        ("GT", "num_objects", "{:d}"),
        ("MT", "mostly_tracked", "{:d}"),
        ("PT", "partially_tracked", "{:d}"),
        ("ML", "mostly_lost", "{:d}"),
        ("FP", "false_positives", "{:d}"),
        ("FN", "misses", "{:d}"),
        ("IDsw", "id_switches", "{:d}"),
        ("FM", "fragmentations", "{:d}"),
        ("MOTA", "mota", "{:.6f}"),
        ("MOTP", "motp", "{:.6f}"),
    )

    def row(self) -> list[str]:
        return [fmt.format(getattr(self, attr)) for _, attr, fmt in self.COLUMNS]


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def _identity_true_positives(rows: list[np.ndarray], cols: list[np.ndarray], n_objects: int, n_hypotheses: int) -> int:
    """IDTP: the most frames that one-to-one (object, hypothesis) trajectory pairs may correspond
    in. rows[k], cols[k]: the object and hypothesis indices of frame k's allowed pairs (int64).

    The counts are a sparse matrix and the matching is solved per connected component of its
    pairs: a pair that never corresponds adds nothing, so trajectories of different components
    never need comparing. A dense (objects x hypotheses) matrix and its assignment took 1.2 GiB for
    2,000 objects against 40,000 hypothesis ids (a tracker that fragments; tests/tracking)."""
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    if not r.size:
        return 0
    counts = sparse.coo_matrix((np.ones(r.size, np.int64), (r, c)), shape=(n_objects, n_hypotheses)).tocsr()
    graph = sparse.bmat([[None, counts], [counts.T, None]], format="csr")
    _, component = connected_components(graph, directed=False)
    object_component, hypothesis_component = component[:n_objects], component[n_objects:]
    has_pairs = np.diff(counts.indptr) > 0  # objects with any allowed pair
    idtp = 0
    for label in np.unique(object_component[has_pairs]):
        objects = np.flatnonzero(object_component == label)
        hypotheses = np.flatnonzero(hypothesis_component == label)
        block = counts[objects][:, hypotheses].toarray()
        a, b = linear_sum_assignment(block, maximize=True)
        idtp += int(block[a, b].sum())
    return idtp


def evaluate(gt: MotTable, hyp: MotTable, match_iou: float = MATCH_IOU) -> MotMetrics:
    """Score hypothesis tracks against ground truth over every frame either has rows in."""
    gt_frames = gt.by_frame()
    hyp_frames = hyp.by_frame()
    gt_ids = np.unique(gt.ids)
    hyp_ids = np.unique(hyp.ids)
    gt_index = {int(o): k for k, o in enumerate(gt_ids)}
    hyp_index = {int(h): k for k, h in enumerate(hyp_ids)}
    empty = (np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros(0))

    last_pair: dict[int, int] = {}  # object id -> hypothesis id it was most recently paired with
    prev_pair: dict[int, int] = {}  # object id -> hypothesis id it was paired with in the previous frame
    present = np.zeros(len(gt_ids), np.int64)  # frames each object is present
    tracked = np.zeros(len(gt_ids), np.int64)  # frames each object is paired
    last_paired = np.full(len(gt_ids), -2, np.int64)  # frame each object was last paired in
    runs = np.zeros(len(gt_ids), np.int64)  # runs of consecutive frames each object was paired in
    co_rows: list[np.ndarray] = []  # per frame, the (object, hypothesis) indices that may correspond
    co_cols: list[np.ndarray] = []
    fp = fn = switches = matches = 0
    distance_sum = 0.0

    previous_frame = None
    for frame in sorted(set(gt_frames) | set(hyp_frames)):
        if previous_frame is not None and frame != previous_frame + 1:
            prev_pair = {}  # a frame with no rows at all lay between: it paired nothing
        previous_frame = frame
        o_ids, o_boxes, _ = gt_frames.get(frame, empty)
        h_ids, h_boxes, _ = hyp_frames.get(frame, empty)
        dist = 1.0 - iou_matrix(o_boxes, h_boxes)
        allowed = dist <= 1.0 - match_iou
        oi = np.array([gt_index[int(o)] for o in o_ids], dtype=np.int64)
        hi = np.array([hyp_index[int(h)] for h in h_ids], dtype=np.int64)
        rows, cols = np.nonzero(allowed)
        co_rows.append(oi[rows])
        co_cols.append(hi[cols])

        # 1. Keep the previous frame's pairs that are still allowed (the devkit's rule; an object
        #    that was missed in between is re-paired by the Hungarian step below).
        pairs: list[tuple[int, int]] = []
        col_of = {int(h): j for j, h in enumerate(h_ids)}
        free_o = np.ones(len(o_ids), bool)
        free_h = np.ones(len(h_ids), bool)
        for i, o in enumerate(o_ids):
            previous = prev_pair.get(int(o))
            j = None if previous is None else col_of.get(previous)
            if j is not None and free_h[j] and allowed[i, j]:
                pairs.append((i, j))
                free_o[i] = free_h[j] = False
        # 2. Hungarian on the rest.
        ro, rh = np.flatnonzero(free_o), np.flatnonzero(free_h)
        sub = np.ix_(ro, rh)
        for a, b in solve(dist[sub], allowed[sub]):
            i, j = int(ro[a]), int(rh[b])
            o, h = int(o_ids[i]), int(h_ids[j])
            if o in last_pair and last_pair[o] != h:
                switches += 1
            pairs.append((i, j))

        paired_o = np.zeros(len(o_ids), bool)
        prev_pair = {int(o_ids[i]): int(h_ids[j]) for i, j in pairs}
        for i, j in pairs:
            last_pair[int(o_ids[i])] = int(h_ids[j])
            paired_o[i] = True
            distance_sum += float(dist[i, j])
        matches += len(pairs)
        fn += len(o_ids) - len(pairs)
        fp += len(h_ids) - len(pairs)
        present[oi] += 1
        paired_k = oi[paired_o]
        tracked[paired_k] += 1
        runs[paired_k] += last_paired[paired_k] != frame - 1
        last_paired[paired_k] = frame

    fragmentations = int(np.maximum(runs - 1, 0).sum())
    ratio = np.divide(tracked, present, out=np.zeros(len(gt_ids)), where=present > 0)
    mt = int(np.sum(ratio > 0.8))
    ml = int(np.sum(ratio < 0.2))

    idtp = _identity_true_positives(co_rows, co_cols, len(gt_ids), len(hyp_ids))
    n_gt, n_hyp = len(gt), len(hyp)
    idfn, idfp = n_gt - idtp, n_hyp - idtp

    return MotMetrics(
        idf1=_ratio(2 * idtp, n_gt + n_hyp),
        recall=_ratio(matches, n_gt),
        precision=_ratio(matches, matches + fp),
        num_objects=len(gt_ids),
        mostly_tracked=mt,
        partially_tracked=len(gt_ids) - mt - ml,
        mostly_lost=ml,
        false_positives=fp,
        misses=fn,
        id_switches=switches,
        fragmentations=fragmentations,
        mota=1.0 - (fn + fp + switches) / max(n_gt, 1),
        motp=_ratio(matches - distance_sum, matches),
        num_gt_boxes=n_gt,
        num_hyp_boxes=n_hyp,
        num_matches=matches,
        idtp=idtp,
        idfp=idfp,
        idfn=idfn,
    )
