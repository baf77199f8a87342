"""Noisy detections derived from ground truth, to evaluate the tracker without a detector.

Each ground-truth box becomes a detection unless dropped (probability `drop`); its centre moves by
Gaussian noise of `pos_sigma` times its width/height and its width and height are scaled by
exp(N(0, size_sigma)). A noisy box beyond eval-mot's bound on coordinates and sizes (mot.MAX_PIXELS:
a huge box, or a large sigma) is left out like a dropped one, and counted in the command's output
line. Each frame also gets Poisson(`false_per_frame`) false detections (as many
as fit in eval-mot's bound of boxes a frame, mot.MAX_BOXES_PER_FRAME, beside the kept ones), each
with the size of a random ground-truth box, placed uniformly inside the area the ground truth
covers. Everything is drawn from one generator seeded with `seed`: same inputs, same file.

    python -m tracker.tracking.noisy GT OUT [--seed 0] [--pos-sigma 0.05] [--size-sigma 0.05]
                                            [--drop 0.1] [--false-per-frame 0.2]

writes OUT as a MOTChallenge detection file (`frame,-1,x,y,w,h,1,-1,-1,-1`), ready for
`tracker eval-mot OUT --gt GT`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tracker.arguments import ArgumentParser, float_between, int_between, refuse_overwriting
from tracker.errors import InputError, TrackerError
from tracker.tracking.mot import MAX_BOXES_PER_FRAME, MAX_PIXELS, MotTable, read_mot, within_bounds, write_mot

# The rows are held in memory, as Python tuples until the table is built (about 150 bytes each): a
# few hundred thousand false ones cover any MOTChallenge sequence at any sensible rate.
MAX_FALSE_DETECTIONS = 200_000


@dataclass(frozen=True)
class DetectionNoise:
    """pos_sigma, size_sigma: fractions of the box size; drop: probability in [0, 1);
    false_per_frame: mean false detections per frame (>= 0)."""

    seed: int = 0
    pos_sigma: float = 0.05
    size_sigma: float = 0.05
    drop: float = 0.1
    false_per_frame: float = 0.2


def noisy_detections(gt: MotTable, noise: DetectionNoise = DetectionNoise()) -> tuple[MotTable, int]:
    """Detections (ids -1, scores 1) for frames 1..gt.last_frame derived from `gt`, and how many
    noisy boxes were left out for falling beyond mot.MAX_PIXELS."""
    rng = np.random.default_rng(noise.seed)
    rows: list[tuple[int, int, float, float, float, float, float]] = []
    out_of_bounds = 0
    if not len(gt):
        return MotTable.from_rows(rows), out_of_bounds
    x0, y0 = gt.boxes[:, 0].min(), gt.boxes[:, 1].min()
    x1 = (gt.boxes[:, 0] + gt.boxes[:, 2]).max()
    y1 = (gt.boxes[:, 1] + gt.boxes[:, 3]).max()
    per_frame = gt.by_frame()
    for frame in range(1, gt.last_frame + 1):
        _, boxes, _ = per_frame.get(frame, (None, np.zeros((0, 4)), None))
        first_row = len(rows)
        for x, y, w, h in boxes:
            if rng.random() < noise.drop:
                continue
            cx = x + w / 2 + rng.normal(0.0, noise.pos_sigma) * w
            cy = y + h / 2 + rng.normal(0.0, noise.pos_sigma) * h
            nw = w * float(np.exp(rng.normal(0.0, noise.size_sigma)))
            nh = h * float(np.exp(rng.normal(0.0, noise.size_sigma)))
            if not within_bounds(cx - nw / 2, cy - nh / 2, nw, nh):
                out_of_bounds += 1
                continue
            rows.append((frame, -1, cx - nw / 2, cy - nh / 2, nw, nh, 1.0))
        room = MAX_BOXES_PER_FRAME - (len(rows) - first_row)  # a file eval-mot reads: its bound a frame
        for _ in range(min(int(rng.poisson(noise.false_per_frame)), room)):
            w, h = gt.boxes[int(rng.integers(len(gt))), 2:4]
            x = rng.uniform(x0, max(x0, x1 - w))
            y = rng.uniform(y0, max(y0, y1 - h))
            rows.append((frame, -1, float(x), float(y), float(w), float(h), 1.0))
    return MotTable.from_rows(rows), out_of_bounds


def _parser() -> ArgumentParser:
    d = DetectionNoise()
    p = ArgumentParser(prog="python -m tracker.tracking.noisy", description="Derive noisy MOTChallenge detections from ground truth.")
    p.add_argument("gt", type=Path, help="MOTChallenge ground-truth file")
    p.add_argument("out", type=Path, help="detection file to write")
    p.add_argument("--seed", type=int_between(0), default=d.seed)
    p.add_argument("--pos-sigma", type=float_between(0, 10), default=d.pos_sigma, help="centre noise, fraction of box size")
    p.add_argument("--size-sigma", type=float_between(0, 10), default=d.size_sigma, help="log-size noise")
    p.add_argument("--drop", type=float_between(0, 0.99), default=d.drop, help="probability a box is missed")
    # in all, at most MAX_FALSE_DETECTIONS (main); a frame's are cut to eval-mot's bound (noisy_detections)
    p.add_argument("--false-per-frame", type=float_between(0, 100), default=d.false_per_frame,
                   help="mean false detections per frame")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        refuse_overwriting(args.out, {"ground-truth": args.gt})
        noise = DetectionNoise(args.seed, args.pos_sigma, args.size_sigma, args.drop, args.false_per_frame)
        gt = read_mot(args.gt, "gt")
        expected = gt.last_frame * noise.false_per_frame
        if expected > MAX_FALSE_DETECTIONS:
            raise InputError(f"--false-per-frame: {noise.false_per_frame:g} over the {gt.last_frame:,} frames of "
                             f"{str(args.gt)!r} is {expected:,.0f} false detections; expected at most "
                             f"{MAX_FALSE_DETECTIONS:,} in all (a lower rate)")
        dets, out_of_bounds = noisy_detections(gt, noise)
        write_mot(args.out, dets)
    except TrackerError as err:
        print(f"tracker: error: {err}", file=sys.stderr)
        return err.exit_code
    left_out = f" ({out_of_bounds} noisy boxes beyond {MAX_PIXELS:,} pixels left out)" if out_of_bounds else ""
    print(f"wrote {len(dets)} detections to {args.out}{left_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
