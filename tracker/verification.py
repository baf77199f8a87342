"""Face verification: LFW-format pair files and the figures measured on them.

Pair files (LFW's `pairs*.txt`): a header line (`N` for View 1, `folds N` for View 2), then `name i j`
lines (a matched pair: images i and j of one person) and `name1 i name2 j` lines (a mismatched
pair); image i of `name` is `<images>/<name>/<name>_<i:04d>.jpg`.

Scores are cosine similarities (higher: more alike); `same` is True for matched pairs.
- `ten_fold_accuracy`: LFW's 10-fold scheme: each fold is scored at the threshold that is best on
  the other nine; the mean and standard deviation over folds. The folds are dealt in turn (matched
  and mismatched pairs each, so every fold has both), which suits View 1's files (one block of
  each); View 2's file has its own ten fixed blocks, so figures on it are close to, not the same
  as, published ones.
- `roc_auc`: the probability that a random matched pair scores above a random mismatched one.
- `threshold_at_far(scores, same, far)`: the smallest threshold at which at most a fraction `far` of
  the mismatched pairs is accepted (score >= threshold), and the true-accept rate there.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tracker.errors import InputError
from tracker.files import open_regular_file

MAX_PAIRS = 100_000  # LFW's View 2 has 6,000: a bound on what a wrong file can make us hold
MAX_LINE_CHARS = 1024  # a pair line is two names and two numbers


def _pair_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its end) of `path`, read a line at a time; InputError for
    a file that cannot be read, a line longer than MAX_LINE_CHARS or more than MAX_PAIRS + 1 lines."""
    try:  # (utf-8-sig: a BOM an editor wrote is no header)
        with io.TextIOWrapper(open_regular_file(path), encoding="utf-8-sig") as file:
            for number, line in enumerate(iter(lambda: file.readline(MAX_LINE_CHARS + 1), ""), 1):
                if len(line.rstrip("\r\n")) > MAX_LINE_CHARS:
                    raise InputError(f"pairs file {path}:{number}: a line of over {MAX_LINE_CHARS} characters; "
                                     "expected LFW's pairs format")
                if number > MAX_PAIRS + 1:
                    raise InputError(f"pairs file {str(path)!r}: over {MAX_PAIRS} pairs; expected LFW's pairs format "
                                     "(View 2 has 6,000)")
                yield number, line.rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"pairs file {str(path)!r}: cannot read ({err}); expected LFW's pairs format") from None


def read_pairs(path: Path, images: Path) -> list[tuple[Path, Path, bool]]:
    """(image a, image b, same person) per pair line; InputError naming the line for a missing
    header (it was skipped unread, and with it a first pair), a malformed line or an image that
    does not exist, and for a file beyond LFW's size (`_pair_lines`)."""
    lines = _pair_lines(path)
    number, first = next(lines, (1, ""))
    header = first.split()
    if not 1 <= len(header) <= 2 or not all(field.isdecimal() for field in header):
        raise InputError(f"pairs file {path}:{number}: {first[:80]!r}; expected LFW's header line: 'N' "
                         "(View 1) or 'folds N' (View 2)")
    pairs = []
    for number, line in lines:
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) == 3:
                a, b, same = (parts[0], int(parts[1])), (parts[0], int(parts[2])), True
            elif len(parts) == 4:
                a, b, same = (parts[0], int(parts[1])), (parts[2], int(parts[3])), False
            else:
                raise ValueError
        except ValueError:
            raise InputError(f"pairs file {path}:{number}: {line[:80]!r}; expected 'name i j' or "
                             "'name1 i name2 j'") from None
        files = [Path(images) / name / f"{name}_{i:04d}.jpg" for name, i in (a, b)]
        for file in files:
            if not file.is_file():
                raise InputError(f"pairs file {path}:{number}: image {str(file)!r} does not exist; expected "
                                 f"<images>/<name>/<name>_NNNN.jpg under {str(images)!r}")
        pairs.append((files[0], files[1], same))
    matched = sum(s for *_, s in pairs)
    if min(matched, len(pairs) - matched) < 2:  # each fold's threshold is chosen on the other folds' pairs
        raise InputError(f"pairs file {str(path)!r}: {matched} matched and {len(pairs) - matched} mismatched pairs; "
                         "expected at least 2 of each")
    return pairs


def _accuracy(scores: np.ndarray, same: np.ndarray, threshold: float) -> float:
    return float(((scores >= threshold) == same).mean())


def best_threshold(scores: np.ndarray, same: np.ndarray) -> float:
    """The threshold of highest accuracy (the midpoint between two neighbouring scores; the lowest
    of equals). Counted from running sums over the sorted scores, not by trying each candidate on
    every score: that took about 100 s at MAX_PAIRS."""
    scores, same = np.asarray(scores, np.float64), np.asarray(same, bool)
    ordered = np.unique(scores)
    candidates = np.concatenate([[ordered[0] - 1e-6], (ordered[1:] + ordered[:-1]) / 2.0, [ordered[-1] + 1e-6]])
    # candidate i accepts the scores of rank ordered[i] and above
    rank = np.searchsorted(ordered, scores)
    same_below = np.concatenate([[0], np.cumsum(np.bincount(rank[same], minlength=len(ordered)))])
    different_below = np.concatenate([[0], np.cumsum(np.bincount(rank[~same], minlength=len(ordered)))])
    right = (same_below[-1] - same_below) + different_below  # matched accepted + mismatched refused
    return float(candidates[int(np.argmax(right))])


def folds(same: np.ndarray, k: int = 10) -> np.ndarray:
    """Fold index per pair: matched and mismatched pairs each dealt in turn into k folds."""
    fold = np.empty(len(same), np.int64)
    for flag in (True, False):
        rows = np.flatnonzero(same == flag)
        fold[rows] = np.arange(len(rows)) % k
    return fold


def ten_fold_accuracy(scores: np.ndarray, same: np.ndarray) -> tuple[float, float]:
    """(mean, std) of LFW's 10-fold accuracy (see the module docstring)."""
    scores, same = np.asarray(scores, np.float64), np.asarray(same, bool)
    fold = folds(same)
    results = []
    for k in range(10):
        train, test = fold != k, fold == k
        if not test.any():
            continue
        results.append(_accuracy(scores[test], same[test], best_threshold(scores[train], same[train])))
    return float(np.mean(results)), float(np.std(results))


def roc_auc(scores: np.ndarray, same: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U; ties count a half)."""
    scores, same = np.asarray(scores, np.float64), np.asarray(same, bool)
    pos, neg = scores[same], scores[~same]
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    # average ranks over ties
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    u = ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(pos) * len(neg)))


def threshold_at_far(scores: np.ndarray, same: np.ndarray, far: float) -> tuple[float, float]:
    """(threshold, true-accept rate) for a false-accept rate of at most `far` (see the module
    docstring). With fewer than 1 / far mismatched pairs the threshold accepts none of them."""
    scores, same = np.asarray(scores, np.float64), np.asarray(same, bool)
    negatives = np.sort(scores[~same])[::-1]
    allowed = int(np.floor(far * len(negatives)))  # mismatched pairs that may be accepted
    threshold = float(np.nextafter(negatives[allowed], np.inf)) if allowed < len(negatives) else float(negatives[-1])
    return threshold, float((scores[same] >= threshold).mean())
