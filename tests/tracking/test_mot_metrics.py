"""CLEAR-MOT and IDF1 (tracker/tracking/metrics.py) and MOTChallenge parsing (mot.py).

The reference figures are the table in ../shared/testdata/README.md: a published tracker's output
(test.txt) scored against MOTChallenge 2015 ground truth, as the MOTChallenge devkit scores it.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from tmpfs import tmpfs

from tracker.errors import InputError
from tracker.tracking.assign import iou_matrix
from tracker.tracking.metrics import evaluate
from tracker.tracking.mot import MotTable, format_rows, parse_mot, read_mot, write_mot

# seq: IDF1, Rcll, Prcn, GT, MT, PT, ML, FP, FN, IDsw, FM, MOTA, MOTP  (README of the test data)
REFERENCE = {
    "TUD-Campus": (0.557659, 0.582173, 0.941441, 8, 1, 6, 1, 13, 150, 7, 7, 0.526462, 0.722799),
    "TUD-Stadtmitte": (0.644619, 0.608997, 0.939920, 10, 5, 4, 1, 45, 452, 7, 6, 0.564014, 0.654096),
}
FIELDS = (
    "idf1", "recall", "precision", "num_objects", "mostly_tracked", "partially_tracked", "mostly_lost",
    "false_positives", "misses", "id_switches", "fragmentations", "mota", "motp",
)  # fmt: skip


@pytest.mark.parametrize("seq", sorted(REFERENCE))
def test_reference_table(testdata, seq):
    gt = read_mot(testdata / "mot" / seq / "gt.txt", "gt")
    hyp = read_mot(testdata / "mot" / seq / "test.txt", "tracks")
    m = evaluate(gt, hyp)
    for name, expected in zip(FIELDS, REFERENCE[seq]):
        got = getattr(m, name)
        if isinstance(expected, int):
            assert got == expected, name
        else:
            assert got == pytest.approx(expected, abs=1e-3), name
    assert m.mota == pytest.approx(1 - (m.misses + m.false_positives + m.id_switches) / m.num_gt_boxes)
    assert m.idtp + m.idfn == m.num_gt_boxes and m.idtp + m.idfp == m.num_hyp_boxes


def test_ignore_rows_are_dropped(testdata, tmp_path):
    """Adding conf-0 gt rows (ignore boxes) on top of every hypothesis box changes nothing."""
    src = testdata / "mot" / "TUD-Campus"
    extra = [f"{line.split(',')[0]},{900 + k},{','.join(line.split(',')[2:6])},0,-1,-1,-1"
             for k, line in enumerate(src.joinpath("test.txt").read_text().splitlines())]
    gt_path = tmp_path / "gt.txt"
    gt_path.write_text(src.joinpath("gt.txt").read_text() + "\n".join(extra) + "\n")
    m = evaluate(read_mot(gt_path, "gt"), read_mot(src / "test.txt", "tracks"))
    assert (m.mota, m.idf1, m.num_objects) == pytest.approx((0.526462, 0.557659, 8), abs=1e-6)


def table(rows) -> MotTable:
    return MotTable.from_rows([(f, i, x, 0.0, 10.0, 10.0, 1.0) for f, i, x in rows])


def test_perfect_tracking():
    gt = table([(f, i, 20.0 * i) for f in range(1, 11) for i in (1, 2)])
    hyp = table([(f, i + 100, 20.0 * i) for f in range(1, 11) for i in (1, 2)])
    m = evaluate(gt, hyp)
    assert (m.mota, m.motp, m.idf1, m.recall, m.precision) == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert (m.false_positives, m.misses, m.id_switches, m.fragmentations, m.mostly_tracked) == (0, 0, 0, 0, 2)


def test_switch_fragmentation_and_mostly_tracked():
    # Object 1 present on frames 1..10. Hypothesis 7 covers 1..4, nothing on 5..6, hypothesis 8
    # covers 7..10: one fragmentation (tracked -> missed), one switch (7 -> 8), FN 2.
    gt = table([(f, 1, 0.0) for f in range(1, 11)])
    hyp = table([(f, 7, 1.0) for f in range(1, 5)] + [(f, 8, 1.0) for f in range(7, 11)])
    m = evaluate(gt, hyp)
    assert (m.misses, m.false_positives, m.id_switches, m.fragmentations) == (2, 0, 1, 1)
    assert m.mota == pytest.approx(1 - 3 / 10)
    assert m.motp == pytest.approx(9 / 11)  # IoU of boxes shifted by 1 px of 10
    assert (m.mostly_tracked, m.partially_tracked, m.mostly_lost) == (0, 1, 0)  # 8/10 is not > 0.8
    assert m.idtp == 4 and m.idf1 == pytest.approx(2 * 4 / (10 + 8))


def test_nothing_paired():
    # One object, one hypothesis far from it: no pair, so no overlap to average (MOTP 0, not 1).
    m = evaluate(table([(1, 1, 0.0)]), table([(1, 2, 100.0)]))
    assert (m.num_matches, m.misses, m.false_positives, m.motp, m.mota) == (0, 1, 1, 0.0, -1.0)


def test_false_positives_without_any_ground_truth_are_no_perfect_mota():
    """MOTA divided by no ground-truth boxes was taken as 0: 100 false positives scored 1.0."""
    m = evaluate(MotTable.from_rows([]), table([(f, 7, 0.0) for f in range(1, 101)]))
    assert (m.false_positives, m.mota, m.idf1) == (100, -99.0, 0.0)


def test_mostly_lost_and_partially_tracked_thresholds():
    """TrackEval's and the devkit's: MT over 0.8, ML under 0.2, PT from 0.2 to 0.8 (the first
    version took 0.8 for MT)."""
    gt = table([(f, i, 50.0 * i) for f in range(1, 11) for i in (1, 2, 3, 4)])
    hyp = table([(1, 5, 50.0)] + [(f, 6, 100.0) for f in range(1, 3)]  # 1/10 and 2/10 tracked
                + [(f, 7, 150.0) for f in range(1, 9)] + [(f, 8, 200.0) for f in range(1, 10)])  # 8/10, 9/10
    m = evaluate(gt, hyp)
    assert (m.mostly_tracked, m.partially_tracked, m.mostly_lost) == (1, 2, 1)


def test_a_frame_an_object_is_absent_from_breaks_its_run_of_tracked_frames():
    """Object 1 is annotated on frames 1-3 and 6-8 (absent from 4-5) and tracked whenever it is
    there: two runs, one fragmentation, as TrackEval and the devkit count it (it was 0)."""
    gt = table([(f, 1, 0.0) for f in (1, 2, 3, 6, 7, 8)] + [(f, 2, 50.0) for f in range(1, 9)])
    hyp = table([(f, 9, 0.0) for f in (1, 2, 3, 6, 7, 8)] + [(f, 10, 50.0) for f in range(1, 9)])
    m = evaluate(gt, hyp)
    assert (m.fragmentations, m.id_switches, m.misses, m.mostly_tracked) == (1, 0, 0, 2)


def test_previous_frame_pairs_are_kept_even_if_another_is_closer():
    # Frame 1: object pairs with hypothesis 1. Frame 2: hypothesis 2 fits better, but 1 is still
    # within IoU 0.5, so the pair is kept: no switch.
    gt = table([(1, 1, 0.0), (2, 1, 0.0)])
    hyp = table([(1, 1, 0.0), (2, 1, 2.0), (2, 2, 0.0)])
    m = evaluate(gt, hyp)
    assert (m.id_switches, m.false_positives) == (0, 1)
    assert m.motp == pytest.approx((1 + 8 / 12) / 2)


def test_pairs_are_not_kept_across_a_missed_frame():
    # Frame 2: the object is missed (no hypothesis). Frame 3: hypothesis 1 is back but 2 fits
    # better; the devkit keeps only the previous frame's pairs, so the Hungarian step picks 2: a switch.
    gt = table([(1, 1, 0.0), (2, 1, 0.0), (3, 1, 0.0)])
    hyp = table([(1, 1, 0.0), (3, 1, 2.0), (3, 2, 0.0)])
    m = evaluate(gt, hyp)
    assert (m.id_switches, m.misses, m.false_positives, m.fragmentations) == (1, 1, 1, 1)


def test_hungarian_pairs_minimise_total_distance():
    # Two objects, two hypotheses; greedy by best IoU would pair (o1, hA) and strand o2.
    gt = MotTable.from_rows([(1, 1, 0, 0, 10, 10, 1), (1, 2, 4, 0, 10, 10, 1)])
    hyp = MotTable.from_rows([(1, 10, 2, 0, 10, 10, 1), (1, 11, -3, 0, 10, 10, 1)])
    m = evaluate(gt, hyp)
    assert (m.num_matches, m.false_positives, m.misses) == (2, 0, 0)


def test_parse_formats_and_errors(tmp_path):
    t = parse_mot("1,3,10,20,30,40,0.9,-1,-1,-1\n\n2 3 11 21 30 40\n3, 3, 12, 22, 30, 40, 0.8, , ,\n", "tracks", "x")
    assert t.frames.tolist() == [1, 2, 3] and t.ids.tolist() == [3, 3, 3] and t.conf.tolist() == [0.9, 1.0, 0.8]
    assert t.boxes[1].tolist() == [11, 21, 30, 40]
    assert parse_mot("1,5,0,0,1,1,0\n", "gt", "x").frames.size == 0  # ignore row dropped
    bad = {
        "1,1,0,0,1\n": "expected at least 6",
        "0,1,0,0,1,1,1\n": "frames count from 1",
        "1.5,1,0,0,1,1,1\n": "expected an integer",
        "1000001,1,0,0,1,1,1\n": "'1000001'; expected an integer from 1 to 1000000",
        "1e20,1,0,0,1,1,1\n": "expected an integer from 1 to 1000000",
        "1,2147483648,0,0,1,1,1\n": "field 'id' is '2147483648'; expected an integer from -2147483648 to 2147483647",
        "1,1,,10,20,30,0.9\n": "field 'x' is empty",
        "1,1,5,10,20,30,,0\n": "field 'conf' is empty",
        "1,1,zero,0,1,1,1\n": "field 'x' is 'zero'; expected a number",
        "1,1,0,0,0,1,1\n": "box size w=0 h=1; expected w and h of at least 0.001",
        # the tracker's filter turned this box into one 1e149 px wide, which eval-mot then refused
        "1,1,0,0,1,1e-300,1\n": "box size w=1 h=1e-300; expected w and h of at least 0.001",
        "1,1,0,0,1e80,1,1\n": "box x=0 y=0 w=1e80 h=1; expected coordinates and sizes within 1,000,000 pixels",
        "1,1,-2e6,0,1,1,1\n": "within 1,000,000 pixels",
        "1,1,0,0,1,1,nan\n": "finite",
        "1,1,0,0,1,1,1\n1,1,5,5,1,1,1\n": "appears twice in frame 1 (first on line 1)",
        "".join(f"7,{i},0,0,1,1,1\n" for i in range(1, 1002)): "line 1001: box number 1001 of frame 7; expected at most 1000",
    }
    for text, message in bad.items():
        with pytest.raises(InputError, match=r"line \d") as err:
            parse_mot(text, "gt", "g.txt")
        assert message in str(err.value) and "'g.txt'" in str(err.value)
    with pytest.raises(InputError, match="not found"):
        read_mot(tmp_path / "absent.txt", "gt")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(InputError, match="not text"):
        read_mot(binary, "detections")
    with_bom = tmp_path / "bom.txt"  # as Windows editors save UTF-8
    with_bom.write_bytes(b"\xef\xbb\xbf1,-1,10,20,30,40,0.9\n")
    assert read_mot(with_bom, "detections").boxes.tolist() == [[10, 20, 30, 40]]


def test_write_read_roundtrip(tmp_path):
    t = MotTable.from_rows([(2, 4, 1.25, 2.5, 3.0, 4.0, 0.5), (1, 3, 0.0, 0.0, 1.0, 1.0, 1.0)])
    path = tmp_path / "t.txt"
    write_mot(path, t)
    assert path.read_text().splitlines()[0] == "1,3,0.000,0.000,1.000,1.000,1.000,-1,-1,-1"
    back = read_mot(path, "tracks")
    assert back.frames.tolist() == [1, 2] and back.boxes.tolist() == t.boxes.tolist()
    assert list(format_rows(back)) == path.read_text().splitlines(keepends=True)
    with pytest.raises(InputError, match="cannot write"):
        write_mot(tmp_path / "no" / "such" / "dir.txt", t)
    write_mot(Path("/dev/null"), t)  # a device is written as it is, not replaced
    thin = tmp_path / "thin.txt"  # a size that rounds to 0.000 is written as the smallest one a reader takes
    write_mot(thin, MotTable.from_rows([(1, 1, 0.0, 0.0, 1e6, 1e-6, 1.0)]))
    assert read_mot(thin, "tracks").boxes.tolist() == [[0, 0, 1e6, 0.001]]


def test_a_tracks_file_that_cannot_be_written_whole_is_left_as_it_was(tmp_path):
    """A full disk left half a file, which eval-mot --tracks then scored as a run's tracks."""
    rows = [(f, i, 10.0 * i, 20.0, 30.0, 40.0, 1.0) for f in range(1, 2001) for i in range(1, 6)]
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        path = disk / "tracks.txt"
        write_mot(path, MotTable.from_rows(rows[:5]))
        before = path.read_bytes()
        with pytest.raises(InputError, match="cannot write .*No space left on device"):
            write_mot(path, MotTable.from_rows(rows))  # about 400 kB
        assert path.read_bytes() == before and [p.name for p in disk.iterdir()] == ["tracks.txt"]


def _dense_identity_true_positives(gt: MotTable, hyp: MotTable) -> int:
    """IDTP the direct way: every (object, hypothesis) pair's co-occurring frames in one dense
    matrix, one assignment over all of it."""
    gt_ids, hyp_ids = list(np.unique(gt.ids)), list(np.unique(hyp.ids))
    counts = np.zeros((len(gt_ids), len(hyp_ids)), np.int64)
    hyp_frames = hyp.by_frame()
    for frame, (o_ids, o_boxes, _) in gt.by_frame().items():
        h_ids, h_boxes, _ = hyp_frames.get(frame, (np.zeros(0), np.zeros((0, 4)), None))
        for i, j in zip(*np.nonzero(iou_matrix(o_boxes, h_boxes) >= 0.5)):
            counts[gt_ids.index(o_ids[i]), hyp_ids.index(h_ids[j])] += 1
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return int(counts[rows, cols].sum())


@pytest.mark.parametrize("seed", range(6))
def test_identity_matching_equals_one_dense_assignment(seed):
    """Crowded random scenes (objects overlap, hypotheses jitter, drift between objects and change
    ids), so the pairs form components of several objects and hypotheses."""
    rng = np.random.default_rng(seed)
    gt_rows, hyp_rows = [], []
    for obj in range(12):
        start = int(rng.integers(1, 30))
        x, hyp_id = float(rng.uniform(0, 60)), 1000 + obj
        for f in range(start, start + int(rng.integers(5, 40))):
            x += float(rng.normal(0, 2))
            gt_rows.append((f, obj, x))
            if rng.random() < 0.15:
                hyp_id = int(rng.integers(1000, 1030))  # a switch, possibly to another object's id
            if rng.random() < 0.85:
                hyp_rows.append((f, hyp_id, x + float(rng.normal(0, 2))))
    gt, hyp = table(gt_rows), table(hyp_rows)
    m = evaluate(gt, hyp)
    assert m.idtp == _dense_identity_true_positives(gt, hyp) > 0


@pytest.mark.timeout(60)
def test_a_tracker_that_fragments_every_track_is_scored_without_a_dense_id_matrix():
    """2,000 objects, 100 at a time for 20 frames each, and a new hypothesis id on every frame:
    40,000 hypothesis ids. Each hypothesis covers one frame of one object, so IDTP is one frame per
    object. The old way, a dense 2,000 x 40,000 count matrix, took 640 MB."""
    gt_rows, hyp_rows = [], []
    for obj in range(2000):
        first = (obj // 100) * 20 + 1
        for f in range(first, first + 20):
            gt_rows.append((f, obj, 20.0 * (obj % 100)))
            hyp_rows.append((f, 100_000 + len(hyp_rows), 20.0 * (obj % 100)))
    gt, hyp = table(gt_rows), table(hyp_rows)
    tracemalloc.start()  # numpy reports its arrays' memory to tracemalloc
    try:
        m = evaluate(gt, hyp)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"  # 1,226 MiB the old way, 10 MiB now
    assert (m.idtp, m.num_hyp_boxes, m.num_matches, m.id_switches) == (2000, 40_000, 40_000, 2000 * 19)
    assert m.idf1 == pytest.approx(2 * 2000 / 80_000)
