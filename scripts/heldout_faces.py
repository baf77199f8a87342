#!/usr/bin/env python3
"""Evaluation data of people the shipped face CNN never saw, for `tracker eval-faces`.

CelebA's first 10,000 images (../shared/datasets/celeba-10k) hold 5,429 identities; `tracker train`
trains a photo only when it is of one of fc2's classes (the weights' card lists them) or has a
teacher descriptor, so the other identities' photos were never in training. This script lays those
people out as LFW does, as symbolic links (no photo is copied), and writes an LFW-format pairs file:

    scripts/heldout_faces.py --out DIR [--pairs 1000] [--seed 0] [--teacher NPZ]...
    tracker eval-faces --pairs DIR/pairs.txt --images DIR/images      # verification
    tracker eval-faces --folder DIR/people3 --enroll 2                  # identification, 3+ photos each

Every person with a photo in a teacher file the weights trained with is left out too: the files the
card lists in `training.teacher` (a listed file that is missing is an error), and each `--teacher`
(made by `scripts/teacher_descriptors.py`; it must cover CelebA photos).

DIR/images/<id>/<id>_NNNN.jpg: every held-out identity with two or more photos; DIR/people3: those
with three or more. Pairs: N matched pairs (two photos of one person, persons drawn in turn) and N
mismatched pairs (two people drawn at random), seeded, no pair twice; more than the people have is
refused. DIR must be new or empty (links left by an
earlier run with another card would hold people trained on since). Caveat: a CelebA celebrity may also be an LFW
person (the two sets' identities are not linked), whose LFW photos were in training.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from tracker import shared_data
from tracker.errors import TrackerError
from tracker.files import NPZ_UNREADABLE, atomic_write, load_npz, make_writable_folder
from tracker.train.data import data_root, list_samples

REPO = Path(__file__).resolve().parents[1]
IDENTITIES = "datasets/celeba-10k/identity_CelebA_first10000.txt"  # in the shared data


def draw_pairs(photos: dict[str, int], pairs: int, seed: int):
    """(matched, mismatched) for {person: photo count}, `pairs` of each, none twice (a repeated pair
    would land in two folds of `tracker eval-faces`): matched (person, i, j), the people drawn in
    turn (one without an unused pair skipped); mismatched (person, i, other person, j), two people at
    random. Photo numbers count from 1. A pair drawn before is drawn again, so a draw with no repeat
    (any --pairs up to the number of people) is the one earlier versions made for the seed, and so
    are the figures measured on it. ValueError when the people do not have that many distinct pairs
    of either kind."""
    names = sorted(photos)
    counts = [photos[n] for n in names]
    own = [n * (n - 1) // 2 for n in counts]
    possible_mismatched = (sum(counts) ** 2 - sum(n * n for n in counts)) // 2
    if pairs > min(sum(own), possible_mismatched):  # (the draws below would run out, or draw for ever)
        raise ValueError(f"--pairs {pairs}: the held-out people have only {sum(own)} matched and "
                         f"{possible_mismatched} mismatched pairs")
    rng = np.random.default_rng(seed)
    used = [0] * len(names)
    seen: set[tuple] = set()
    matched: list[tuple[str, int, int]] = []
    mismatched: list[tuple[str, int, str, int]] = []
    turn = 0
    while len(matched) < pairs:
        while used[turn % len(names)] == own[turn % len(names)]:
            turn += 1
        person = turn % len(names)
        turn += 1
        while True:
            i, j = (int(k) + 1 for k in rng.choice(counts[person], 2, replace=False))
            if (names[person], min(i, j), max(i, j)) not in seen:
                break
        seen.add((names[person], min(i, j), max(i, j)))
        used[person] += 1
        matched.append((names[person], i, j))
        while True:
            a, b = rng.choice(len(names), 2, replace=False)
            x, y = int(rng.integers(counts[a])) + 1, int(rng.integers(counts[b])) + 1
            key = tuple(sorted([(names[a], x), (names[b], y)]))
            if key not in seen:
                break
        seen.add(key)
        mismatched.append((names[a], x, names[b], y))
    return matched, mismatched


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--card", type=Path, default=REPO / "models" / "face_cnn.caffemodel.json")
    p.add_argument("--pairs", type=int, default=1000, help="matched pairs, and as many mismatched")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--teacher", type=Path, action="append", default=[],
                   help="a teacher file of CelebA photos the weights trained on")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs {args.pairs}: expected a positive number")
    if args.seed < 0:
        p.error(f"--seed {args.seed}: expected a number >= 0")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out}: not a folder; expected a new or empty folder")
    if args.out.is_dir() and any(args.out.iterdir()):
        p.error(f"--out {args.out}: not empty; expected a new or empty folder (an earlier run's links would stay)")
    try:
        card = json.loads(args.card.read_text(encoding="utf-8"))
        trained = {c for c in card["classes"] if c.startswith("celeba-10k:")}
        card_teachers = [Path(t) for t in card.get("training", {}).get("teacher", [])]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        p.error(f"--card {args.card}: unreadable ({type(err).__name__}: {err}); expected a weights' card with 'classes'")
    try:
        identities = shared_data.locate(IDENTITIES, "heldout_faces")
        # absolute (not resolved: the list may be a link into another folder) so the links made
        # below work from DIR whatever the working folder or a relative $TRACKER_SHARED_DIR
        celeba = data_root(identities).absolute()
        samples = list_samples(celeba / identities.name)
    except TrackerError as err:
        p.error(str(err))
    identity_of = {s.path.relative_to(celeba).as_posix(): s.identity for s in samples}
    # the card's teachers trained the weights whether or not --teacher repeats them; those of other
    # photos (LFW's) leave no one out, which only a --teacher given by hand is refused for
    for teacher, given in [(t, False) for t in card_teachers] + [(t, True) for t in args.teacher]:
        where = "--teacher" if given else f"--card {args.card}: training.teacher"
        try:
            with load_npz(teacher) as data:
                paths = {str(path) for path in data["paths"]}
        except NPZ_UNREADABLE as err:
            p.error(f"{where} {teacher}: unreadable ({err}); expected the .npz with 'paths' the weights trained with")
        if given and not paths & identity_of.keys():
            p.error(f"--teacher {teacher}: describes none of CelebA's photos; expected one made of them")
        trained |= {identity_of[path] for path in paths & identity_of.keys()}
    people: dict[str, list[Path]] = {}
    for sample in samples:
        people.setdefault(sample.identity.split(":", 1)[1], []).append(sample.path)
    people = {k: v for k, v in people.items() if f"celeba-10k:{k}" not in trained and len(v) >= 2}
    if len(people) < 2:
        p.error(f"{len(people)} CelebA people with two photos or more are held out; expected two at least to pair")
    try:
        matched, mismatched = draw_pairs({name: len(photos) for name, photos in people.items()}, args.pairs, args.seed)
    except ValueError as err:
        p.error(str(err))
    try:
        make_writable_folder(args.out)
    except OSError as err:
        p.error(f"--out {args.out}: cannot make or write it ({err.strerror or err}); expected a new or empty folder")
    lines = [f"{n}\t{i}\t{j}" for n, i, j in matched] + [f"{a}\t{i}\t{b}\t{j}" for a, i, b, j in mismatched]
    try:
        for folder, least in (("images", 2), ("people3", 3)):
            for identity, images in people.items():
                if len(images) < least:
                    continue
                (args.out / folder / identity).mkdir(parents=True, exist_ok=True)
                for i, image in enumerate(images, 1):
                    (args.out / folder / identity / f"{identity}_{i:04d}.jpg").symlink_to(image)
        atomic_write(args.out / "pairs.txt", (f"{args.pairs}\n" + "\n".join(lines) + "\n").encode())
    except OSError as err:
        # --out was new or empty: what this run made goes, so a rerun is not refused as "not empty"
        # and no half set is taken for a whole one
        for folder in ("images", "people3"):
            shutil.rmtree(args.out / folder, ignore_errors=True)
        p.error(f"--out {args.out}: cannot make the set in it ({err.strerror or err}); expected a folder with "
                "room for a link per photo")
    print(f"{len(people)} held-out people with 2+ photos ({sum(len(v) >= 3 for v in people.values())} with 3+); "
          f"{args.pairs} + {args.pairs} pairs in {args.out / 'pairs.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
