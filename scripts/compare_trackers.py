#!/usr/bin/env python3
"""The tracker against SORT on MOTChallenge sequences, online, through `tracker eval-mot`.

    .venv/bin/python scripts/compare_trackers.py DIR [DIR ...] [--sort-output DIR]

Each DIR is one sequence holding `det.txt` (detections: frame,-1,x,y,w,h,score,...) and `gt.txt`
(ground truth); its name names the sequence. For SORT's public MOT15 detections, take
`data/<SEQ>/det.txt` (or `data/train/<SEQ>/det/det.txt`) from github.com/abewley/sort and the
ground truth from MOTChallenge's 2DMOT2015 train set (also in github.com/cheind/py-motmetrics,
`data/train/<SEQ>/gt/gt.txt`). `--sort-output DIR` also scores SORT's own output `DIR/<SEQ>.txt`
(what its sort.py writes) with `tracker eval-mot --tracks`.

Every row is one run of the real CLI with `--no-backfill` (what an online tracker knows):

    sort-settings   SORT's parameters (min_hits 3, max_age 1, IoU 0.3), no low-score stage
    + byte          the same with ByteTrack's second association (high score 0.6)
    bytetrack       ByteTrack's published settings: high score 0.6, tracks kept 30 frames
    + oc            the same with OC-SORT's recovery and re-update (--observation-centric)
    guard-defaults  the config's tracking section as shipped (max_age 10, no low-score stage)

None of these settings was tuned on the sequences measured: they are the papers' (SORT, ByteTrack)
and the guard's. Prints one table of MOTA / IDF1 (percent); asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from tracker.arguments import ArgumentParser, one_line_errors, path_to

ROWS = {
    "sort-settings": ["--min-hits", "3", "--max-age", "1", "--iou-threshold", "0.3", "--high-score", "none"],
    "+ byte": ["--min-hits", "3", "--max-age", "1", "--iou-threshold", "0.3", "--high-score", "0.6"],
    "bytetrack": ["--min-hits", "3", "--max-age", "30", "--iou-threshold", "0.3", "--high-score", "0.6"],
    "+ oc": ["--min-hits", "3", "--max-age", "30", "--iou-threshold", "0.3", "--high-score", "0.6",
             "--observation-centric"],
    "guard-defaults": [],
}


def eval_mot(args: list[str]) -> tuple[float, float]:
    """MOTA and IDF1 (fractions) from one `tracker eval-mot` run."""
    proc = subprocess.run([sys.executable, "-m", "tracker", "eval-mot", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"compare_trackers: tracker eval-mot {' '.join(args)} failed: {proc.stderr.strip()}")
    header, values = proc.stdout.strip().splitlines()[-2:]
    columns = header.split()[1:]
    table = dict(zip(columns, values.split()[-len(columns):]))  # (the first cell, a sequence's name, may hold spaces)
    return float(table["MOTA"]), float(table["IDF1"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, and every file they name there, checked before the first run: InputError
    (one line, exit 2) otherwise (a missing folder was exit 1, a user's mistake said as a failure)."""
    ap = ArgumentParser(prog="compare_trackers.py", description=__doc__.splitlines()[0])
    ap.add_argument("sequences", type=path_to("a folder with det.txt and gt.txt"), nargs="+",
                    help="folders with det.txt and gt.txt")
    ap.add_argument("--sort-output", type=path_to("a folder of SORT's own output, <SEQ>.txt"),
                    help="folder of SORT's own output, <SEQ>.txt")
    args = ap.parse_args(argv)
    for seq in args.sequences:
        for name in ("det.txt", "gt.txt"):
            if not (seq / name).is_file():
                ap.error(f"{str(seq / name)!r}: not found; expected a folder with det.txt and gt.txt")
        if args.sort_output is not None and not (args.sort_output / f"{seq.name}.txt").is_file():
            ap.error(f"--sort-output: {str(args.sort_output / f'{seq.name}.txt')!r}: not found; "
                     "expected SORT's output of each sequence, <SEQ>.txt")
    return args


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [seq.name for seq in args.sequences]
    print("| tracker (online) | " + " | ".join(f"{n} MOTA / IDF1" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    if args.sort_output is not None:
        cells = [eval_mot(["--tracks", str(args.sort_output / f"{seq.name}.txt"), "--gt", str(seq / "gt.txt")])
                 for seq in args.sequences]
        print("| SORT's own output | " + " | ".join(f"{100 * a:.2f} / {100 * b:.2f}" for a, b in cells) + " |")
    for row, options in ROWS.items():
        cells = [eval_mot([str(seq / "det.txt"), "--gt", str(seq / "gt.txt"), "--no-backfill", *options])
                 for seq in args.sequences]
        print(f"| {row} | " + " | ".join(f"{100 * a:.2f} / {100 * b:.2f}" for a, b in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
