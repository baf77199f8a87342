#!/usr/bin/env python3
"""Evaluation data of people the shipped face CNN never saw, for `tracker eval-faces`.

CelebA's first 10,000 images (../shared/datasets/celeba-10k) hold 5,429 identities; `tracker train`
trains a photo only when it is of one of fc2's classes (the weights' card lists them) or has a
teacher descriptor, so the other identities' photos were never in training. This script lays those
people out as LFW does, as symbolic links (no photo is copied), and writes an LFW-format pairs file:

    scripts/heldout_faces.py --out DIR [--pairs 1000] [--seed 0] [--teacher NPZ]...
    tracker eval-faces --pairs DIR/pairs.txt --images DIR/images      # verification
    tracker eval-faces --folder DIR/people3 --enroll 2                  # identification, 3+ photos each

`--teacher`: a teacher file the weights trained with that covers CelebA photos (made by
`scripts/teacher_descriptors.py`); every person with a photo in it is left out too.

DIR/images/<id>/<id>_NNNN.jpg: every held-out identity with two or more photos; DIR/people3: those
with three or more. Pairs: N matched pairs (two photos of one person, persons drawn in turn) and N
mismatched pairs (two people drawn at random), seeded. DIR must be new or empty (links left by an
earlier run with another card would hold people trained on since). Caveat: a CelebA celebrity may also be an LFW
person (the two sets' identities are not linked), whose LFW photos were in training.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tracker import shared_data
from tracker.errors import TrackerError
from tracker.files import NPZ_UNREADABLE, atomic_write, load_npz

REPO = Path(__file__).resolve().parents[1]
IDENTITIES = "datasets/celeba-10k/identity_CelebA_first10000.txt"  # in the shared data


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
        classes = json.loads(args.card.read_text(encoding="utf-8"))["classes"]
        trained = {c.split(":", 1)[1] for c in classes if c.startswith("celeba-10k:")}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        p.error(f"--card {args.card}: unreadable ({type(err).__name__}: {err}); expected a weights' card with 'classes'")
    try:
        identities = shared_data.locate(IDENTITIES, "heldout_faces")
        celeba = identities.parent
        rows = [line.split() for line in identities.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    except (TrackerError, OSError, UnicodeDecodeError) as err:
        p.error(str(err))
    photos = {image for image, _ in rows}
    distilled = set()
    for teacher in args.teacher:
        try:
            with load_npz(teacher) as data:
                paths = {str(path) for path in data["paths"]}
        except NPZ_UNREADABLE as err:
            p.error(f"--teacher {teacher}: unreadable ({err}); expected an .npz with 'paths'")
        if not paths & photos:  # a teacher of other photos (LFW's) would leave no one out, and say nothing
            p.error(f"--teacher {teacher}: describes none of CelebA's photos; expected one made of them")
        distilled |= paths
    people: dict[str, list[str]] = {}
    for image, identity in rows:
        if image in distilled:
            trained.add(identity)
        people.setdefault(identity, []).append(image)
    people = {k: v for k, v in people.items() if k not in trained and len(v) >= 2}
    if len(people) < 2:
        p.error(f"{len(people)} CelebA people with two photos or more are held out; expected two at least to pair")
    for folder, least in (("images", 2), ("people3", 3)):
        for identity, images in people.items():
            if len(images) < least:
                continue
            (args.out / folder / identity).mkdir(parents=True, exist_ok=True)
            for i, image in enumerate(images, 1):
                (args.out / folder / identity / f"{identity}_{i:04d}.jpg").symlink_to(celeba / image)
    rng = np.random.default_rng(args.seed)
    names = sorted(people)
    matched, mismatched = [], []
    for k in range(args.pairs):
        name = names[k % len(names)]
        i, j = rng.choice(len(people[name]), 2, replace=False) + 1
        matched.append(f"{name}\t{i}\t{j}")
        a, b = rng.choice(len(names), 2, replace=False)
        mismatched.append(f"{names[a]}\t{rng.integers(len(people[names[a]])) + 1}\t"
                          f"{names[b]}\t{rng.integers(len(people[names[b]])) + 1}")
    atomic_write(args.out / "pairs.txt", (f"{args.pairs}\n" + "\n".join(matched + mismatched) + "\n").encode())
    print(f"{len(people)} held-out people with 2+ photos ({sum(len(v) >= 3 for v in people.values())} with 3+); "
          f"{args.pairs} + {args.pairs} pairs in {args.out / 'pairs.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
