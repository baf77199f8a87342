#!/usr/bin/env python3
"""A person-disjoint split of LFW's View 1 training people, to measure the training recipe on LFW
people the net never saw (a stand-in for LFW's View 1 test people, which ../shared does not hold).

The shipped weights trained on every photo of ../shared/datasets/lfw-devtrain, so `tracker
eval-faces` on its own pairs is optimistic. This script holds out a share of its people, lays out
the others for `tracker train` as symbolic links (no photo is copied), and writes pairs files:

    scripts/lfw_person_split.py --out DIR [--share 0.2] [--pairs 500] [--seed 11]
    tracker train --data DIR/images --data ../shared/datasets/celeba-10k/identity_CelebA_first10000.txt \\
        --teacher ../shared/datasets/lfw-devtrain/dlib_descriptors.npz \\
        --pairs DIR/pairsTrainPeople.txt --pairs-images DIR/images --epochs 40 --out DIR/split.caffemodel \\
        --work DIR/work    # not train-work: that holds the shipped run's checkpoint
    tracker eval-faces --config CONFIG --pairs DIR/pairsHeldout.txt --images ../shared/datasets/lfw-devtrain/images

(CONFIG: the guard's config with `model.weights` set to DIR/split.caffemodel.)

Held out: `share` of the people with 2 to 50 photos, drawn with Python's `random.Random(seed)`
(people with more photos stay in training, as most of them are in LFW's own training split).
DIR/images/<person>: links to every other person's folder (a link an earlier split left there to
a person now held out is removed). Files not named as LFW's photos (`<person>_NNNN.jpg`) are not
photos. DIR/pairsHeldout.txt: `pairs` matched
pairs (a held-out person drawn at random, two of their photos) and `pairs` mismatched pairs (two
held-out people, one photo each), no pair twice. DIR/pairsTrainPeople.txt: the lines of
pairsDevTrain.txt whose people all train (the threshold is set on them). DIR/heldout_people.txt:
the held-out names, written last (each file is replaced whole; an earlier split's three lists are
removed before its links change, so a write that fails leaves no list naming the wrong people).

`--lfw` defaults to datasets/lfw-devtrain of the shared data (`tracker.shared_data`:
$TRACKER_SHARED_DIR, else ../shared). DIR must be new, empty or an earlier split's; every input is
read and DIR probed before anything in it changes, so a mistake (one line, exit 2) leaves it as it was.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

from tracker import shared_data
from tracker.errors import TrackerError
from tracker.files import atomic_write, make_writable_folder, nearest_existing, probe_writable

LFW = "datasets/lfw-devtrain"  # in the shared data
MOST_PHOTOS = 50  # people with more photos than this are never held out
SPLIT_LISTS = ("pairsHeldout.txt", "pairsTrainPeople.txt", "heldout_people.txt")  # written in this order


def photo_number(name: str) -> int | None:
    """LFW's photo number: 3 for 'Aaron_Peirsol_0003.jpg'; None for a file not named so (a
    Thumbs.db, a .DS_Store)."""
    found = re.fullmatch(r".+_(\d+)\.jpg", name, re.IGNORECASE | re.ASCII)
    return int(found[1]) if found else None


def split(people: dict[str, list[int]], share: float, pairs: int, seed: int):
    """(held-out names, matched pairs, mismatched pairs) for {person: photo numbers}; ValueError
    when the held-out people cannot give that many pairs."""
    rng = random.Random(seed)
    eligible = [p for p, numbers in people.items() if 2 <= len(numbers) <= MOST_PHOTOS]
    held = sorted(rng.sample(eligible, int(len(eligible) * share)))
    if len(held) < 2:
        raise ValueError(f"--share {share} holds out {len(held)} people; expected at least 2")
    matched: set[tuple[str, int, int]] = set()
    mismatched: set[tuple[str, int, str, int]] = set()
    possible = sum(len(people[p]) * (len(people[p]) - 1) // 2 for p in held)
    photos = [len(people[p]) for p in held]
    possible_mismatched = (sum(photos) ** 2 - sum(n * n for n in photos)) // 2  # one photo of each of two people
    if pairs > min(possible, possible_mismatched):  # (the loops below would draw for ever)
        raise ValueError(f"--pairs {pairs}: the held-out people have only {possible} matched and "
                         f"{possible_mismatched} mismatched pairs")
    while len(matched) < pairs:
        person = rng.choice(held)
        a, b = sorted(rng.sample(people[person], 2))
        matched.add((person, a, b))
    while len(mismatched) < pairs:
        p, q = sorted(rng.sample(held, 2))
        mismatched.add((p, rng.choice(people[p]), q, rng.choice(people[q])))
    return held, sorted(matched), sorted(mismatched)


def read_train_pairs(path: Path) -> list[list[str]]:
    """The pair lines of an LFW pairs file (its first line, the count, skipped), each split into its
    3 (matched) or 4 (mismatched) fields; ValueError naming the file (and line) it cannot read."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()[1:]
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--lfw: cannot read {path} ({err}); expected LFW's pairsDevTrain.txt") from None
    fields = [line.split() for line in lines]
    for number, parts in enumerate(fields, 2):
        if len(parts) not in (3, 4):
            raise ValueError(f"--lfw: {path}:{number}: {lines[number - 2][:80]!r}; expected "
                             "'person i j' or 'person i other j'")
    return fields


def check_out(out: Path) -> None:
    """ValueError unless `out` is absent, an empty folder or an earlier split's (one holding
    images/ or heldout_people.txt), and writable; nothing is made."""
    earlier = ("images", "heldout_people.txt")
    try:
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: not a folder; expected a new or earlier split's folder")
        if out.is_dir() and any(out.iterdir()) and not any((out / name).exists() for name in earlier):
            raise ValueError(f"--out {out}: holds files but no {' or '.join(earlier)}; "
                             "expected a new or earlier split's folder")
        probe_writable(nearest_existing(out / "images"))
    except OSError as err:
        raise ValueError(f"--out {out}: cannot write there ({err.strerror or err}); "
                         "expected a new or earlier split's folder") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--lfw", type=Path, help="the LFW set: images/<person>/<photo> and pairsDevTrain.txt "
                   f"(default: {LFW} of the shared data)")
    p.add_argument("--share", type=float, default=0.2, help="share of the people with 2-50 photos held out (0..1)")
    p.add_argument("--pairs", type=int, default=500, help="matched pairs, and as many mismatched")
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args(argv)
    if not 0 < args.share < 1:
        p.error(f"--share {args.share}: expected a number between 0 and 1")
    if args.pairs < 1:
        p.error(f"--pairs {args.pairs}: expected a positive number")
    # every input read and --out probed before anything is written: a failed run changes nothing
    try:
        lfw = args.lfw if args.lfw is not None else shared_data.locate(LFW, "lfw_person_split", "--lfw")
        images = (lfw / "images").resolve()
        if not images.is_dir():
            raise ValueError(f"--lfw {lfw}: no images/ folder; expected LFW's images/<person>/<photo> layout")
        people = {d.name: sorted(n for f in d.iterdir() if (n := photo_number(f.name)) is not None)
                  for d in sorted(images.iterdir()) if d.is_dir()}
        train_pairs = read_train_pairs(lfw / "pairsDevTrain.txt")
        held, matched, mismatched = split(people, args.share, args.pairs, args.seed)
        check_out(args.out)
        held_set = set(held)
        stale = []  # an earlier split's links: its held-out people train no more
        if (args.out / "images").is_dir():
            stale = [e for e in (args.out / "images").iterdir() if e.name in held_set or e.name not in people]
        for entry in stale:
            if not entry.is_symlink():
                raise ValueError(f"--out {args.out}: {entry} is not a link this script made; "
                                 "expected a new or earlier split's folder")
    except (TrackerError, ValueError) as err:
        p.error(str(err))
    except OSError as err:
        p.error(f"--lfw {args.lfw}: cannot read it ({err}); expected LFW's images/<person>/<photo> layout")
    keep_matched = [parts for parts in train_pairs if len(parts) == 3 and parts[0] not in held_set]
    keep_mismatched = [parts for parts in train_pairs if len(parts) == 4 and not {parts[0], parts[2]} & held_set]
    lines = [f"{m[0]}\t{m[1]}\t{m[2]}" for m in matched] + [f"{m[0]}\t{m[1]}\t{m[2]}\t{m[3]}" for m in mismatched]
    train_lines = ["\t".join(parts) for parts in keep_matched + keep_mismatched]
    try:
        # an earlier split's lists go first: a write failing below would otherwise leave them
        # beside links of the new split, naming as held out people it trains on
        for name in SPLIT_LISTS:
            (args.out / name).unlink(missing_ok=True)
        make_writable_folder(args.out / "images")
        for entry in stale:
            entry.unlink()
        for person in people:
            link = args.out / "images" / person
            if person not in held_set and not link.exists():
                link.symlink_to(images / person)
        atomic_write(args.out / "pairsHeldout.txt", (f"{args.pairs}\n" + "\n".join(lines) + "\n").encode())
        atomic_write(args.out / "pairsTrainPeople.txt",
                     (f"{len(keep_matched)}\n" + "\n".join(train_lines) + "\n").encode())
        atomic_write(args.out / "heldout_people.txt", ("\n".join(held) + "\n").encode())  # last: the split is whole
    except OSError as err:
        p.error(f"--out {args.out}: cannot write the split ({err}), so it holds no split lists; expected a "
                "writable folder (run again)")
    photos = sum(len(people[person]) for person in held)
    print(f"{len(people)} people; {len(held)} held out with {photos} photos; {args.pairs} + {args.pairs} held-out pairs; "
          f"training pairs kept: {len(keep_matched)} matched, {len(keep_mismatched)} mismatched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
