"""Face verification figures (tracker.verification) on scores with known answers, and LFW pair files."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.errors import InputError
from tracker.verification import best_threshold, folds, read_pairs, roc_auc, ten_fold_accuracy, threshold_at_far


def test_separable_scores_verify_perfectly_and_random_ones_at_chance():
    same = np.array([True] * 50 + [False] * 50)
    scores = np.where(same, 0.8, 0.2) + np.linspace(0, 0.1, 100)
    assert ten_fold_accuracy(scores, same) == (1.0, 0.0)
    assert roc_auc(scores, same) == 1.0
    assert 0.3 < best_threshold(scores, same) < 0.8
    noise = np.random.default_rng(0).random(2000)
    accuracy, _ = ten_fold_accuracy(noise, np.arange(2000) % 2 == 0)
    assert 0.45 < accuracy < 0.55


def test_roc_auc_counts_ordered_pairs_and_ties_as_half():
    same = np.array([True, True, False, False])
    assert roc_auc(np.array([0.9, 0.8, 0.1, 0.85]), same) == 0.75  # 3 of the 4 (matched, mismatched) pairs ordered
    assert roc_auc(np.array([0.5, 0.5, 0.5, 0.5]), same) == 0.5


def test_threshold_at_far_accepts_at_most_that_share_of_mismatched_pairs():
    negatives = np.arange(100) / 100.0  # 0.00 .. 0.99
    positives = np.array([0.985, 0.995, 0.5])
    scores = np.concatenate([positives, negatives])
    same = np.array([True] * 3 + [False] * 100)
    threshold, tar = threshold_at_far(scores, same, 0.01)
    assert (negatives >= threshold).sum() == 1 and 0.98 < threshold <= 0.99
    assert tar == pytest.approx(2 / 3)  # 0.985 and 0.995, not 0.5
    threshold, _ = threshold_at_far(scores, same, 0.001)  # fewer than 1000 negatives: accept none
    assert (negatives >= threshold).sum() == 0


def test_folds_deal_matched_and_mismatched_pairs_into_every_fold():
    same = np.array([True] * 30 + [False] * 30)
    fold = folds(same)
    for k in range(10):
        assert same[fold == k].sum() == 3 and (~same[fold == k]).sum() == 3


def _lfw(tmp_path, people: dict[str, int]):
    for name, count in people.items():
        (tmp_path / name).mkdir(parents=True)
        for i in range(1, count + 1):
            (tmp_path / name / f"{name}_{i:04d}.jpg").write_bytes(b"jpeg")
    return tmp_path


def test_pairs_files_in_lfw_format(tmp_path):
    images = _lfw(tmp_path / "images", {"Ann": 2, "Bob": 1})
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("2\nAnn\t1\t2\nAnn\t2\t1\nAnn\t1\tBob\t1\nBob\t1\tAnn\t2\n")
    assert read_pairs(pairs, images) == [(images / "Ann" / "Ann_0001.jpg", images / "Ann" / "Ann_0002.jpg", True),
                                         (images / "Ann" / "Ann_0002.jpg", images / "Ann" / "Ann_0001.jpg", True),
                                         (images / "Ann" / "Ann_0001.jpg", images / "Bob" / "Bob_0001.jpg", False),
                                         (images / "Bob" / "Bob_0001.jpg", images / "Ann" / "Ann_0002.jpg", False)]


@pytest.mark.parametrize("text, message", [
    ("1\nAnn\t1\t3\nAnn\t1\tBob\t1\n", r"pairs.txt:2: image .*Ann_0003.jpg' does not exist"),
    ("1\nAnn\t1\t2\nAnn\tone\tBob\t1\n", r"pairs.txt:3: .*expected 'name i j' or 'name1 i name2 j'"),
    ("1\nAnn\t1\t2\n", r"1 matched and 0 mismatched pairs; expected at least 2 of each"),
    ("1\nAnn\t1\t2\nAnn\t1\tBob\t1\n", r"1 matched and 1 mismatched pairs; expected at least 2 of each"),
    ("Ann\t1\t2\nAnn\t1\tBob\t1\n", r"pairs.txt:1: 'Ann\\t1\\t2'; expected LFW's header line: 'N' \(View 1\) or 'folds N'"),
    ("", r"pairs.txt:1: ''; expected LFW's header line"),
    ("10 300 2\nAnn\t1\t2\nAnn\t1\tBob\t1\n", r"pairs.txt:1: '10 300 2'; expected LFW's header line"),
    ("1\nAnn\t1\t2\n" + "x" * 10**6, r"pairs.txt:3: a line of over 1024 characters; expected LFW's pairs format"),
    ("1\n" + "Ann\t1\t2\n" * 100_001, r"pairs.txt': over 100000 pairs; expected LFW's pairs format"),
    (b"1\nAnn\t1\t2\n\xff\n", r"pairs.txt': cannot read \('utf-8' codec can't decode byte 0xff"),
])
def test_bad_pairs_files_name_the_line_and_what_is_expected(tmp_path, text, message):
    images = _lfw(tmp_path / "images", {"Ann": 2, "Bob": 1})
    pairs = tmp_path / "pairs.txt"
    pairs.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError, match=message):
        read_pairs(pairs, images)


def test_a_pairs_file_with_a_bom_reads_and_a_fifo_is_refused(tmp_path):
    """A BOM an editor wrote made the header 'not LFW's'; a FIFO named as the pairs file waited for
    a writer for ever, after the detector and backend had loaded."""
    import os

    images = _lfw(tmp_path / "images", {"Ann": 2, "Bob": 1})
    pairs = tmp_path / "pairs.txt"
    pairs.write_bytes(b"\xef\xbb\xbf" + b"2\nAnn\t1\t2\nAnn\t2\t1\nAnn\t1\tBob\t1\nBob\t1\tAnn\t2\n")
    assert len(read_pairs(pairs, images)) == 4
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"pairs file '.*fifo.txt': cannot read \(.*not a regular file\)"):
        read_pairs(fifo, images)


def test_the_best_threshold_is_the_lowest_of_highest_accuracy():
    """best_threshold counts from running sums: the same choice as trying every midpoint."""
    rng = np.random.default_rng(5)
    for n, decimals in ((2, 6), (11, 1), (500, 2), (2000, 6)):
        same = rng.random(n) < 0.5
        scores = np.round(rng.normal(same * 0.5, 0.4), decimals)
        ordered = np.unique(scores)
        candidates = np.concatenate([[ordered[0] - 1e-6], (ordered[1:] + ordered[:-1]) / 2.0, [ordered[-1] + 1e-6]])
        accuracy = [((scores >= t) == same).mean() for t in candidates]
        assert best_threshold(scores, same) == candidates[int(np.argmax(accuracy))]
