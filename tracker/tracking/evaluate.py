"""`tracker eval-mot`: run the tracker alone on a MOTChallenge detection file and score it.

    tracker eval-mot DETECTIONS [--gt GT] [--out TRACKS] [--config F]
                     [--min-hits N] [--max-age N] [--iou-threshold F] [--high-score F|none]
                     [--[no-]observation-centric] [--no-backfill]
    tracker eval-mot --tracks TRACKS --gt GT          score tracks made elsewhere (another tracker)

The tracker (`sort.Tracker`, IoU only: detection files carry no appearance, so no
re-identification by face either) is fed every frame from 1 to the last frame of DETECTIONS (or of
GT, if later), empty frames included. The tracks written are the confirmed tracks on the frames a
detection was assigned to them, with the Kalman posterior box and that detection's score.
`--high-score none --no-observation-centric` is the tracker before ByteTrack and OC-SORT (SORT).

Back-filling (default on), because eval-mot is offline and knows what happened next:
- a track becomes confirmed only after `min_hits` consecutive hits, so an online tracker announces
  it late; once it is confirmed, its tentative frames are written too, under the same id;
- a confirmed track that is LOST for a few frames and then re-acquired is written on the frames
  in between with its Kalman predictions (conf 0), as the object was evidently still there.
Tentative tracks that never get confirmed, and LOST frames of tracks that end without being
re-acquired, are never written. `--no-backfill` writes only what an online consumer (the guard)
sees: confirmed tracks on the frames a detection was assigned to them.

Output: TRACKS in MOTChallenge format if --out is given; to stdout if neither --out nor --gt is.
With --gt, the CLEAR-MOT and IDF1 table (`metrics.MotMetrics.COLUMNS`) is printed to stdout.
Defaults of the tracker's parameters come from the `tracking` section of the config (--config, or
the package's own); the options override them. With --tracks, nothing is tracked: the file is
scored as it is (tracker options are refused then, as they would change nothing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tracker.arguments import CONFIG_DEFAULT, ArgumentParser, config_path, float_between, int_between, path_to, refuse_overwriting
from tracker.errors import InputError
from tracker.tracking.metrics import MotMetrics, evaluate
from tracker.tracking.mot import MotTable, format_rows, read_mot, write_mot
from tracker.tracking.sort import Tracker, TrackState
from tracker.types import Box, Detection


def track_detections(detections: MotTable, tracker: Tracker, last_frame: int, *, backfill: bool = True) -> MotTable:
    """Run `tracker` on frames 1..last_frame of `detections`; the confirmed tracks as a table
    (ids = track ids, conf = the assigned detection's score, 0 for a back-filled gap), sorted by
    (frame, id). `backfill`: also write the tentative frames of tracks that got confirmed and the
    predicted boxes of LOST frames of tracks that were re-acquired (see the module docstring)."""
    per_frame = detections.by_frame()
    rows: list[tuple[int, int, float, float, float, float, float]] = []
    # Rows of a track that are written only if it later is confirmed (tentative frames) or
    # re-acquired (LOST frames); dropped if it ends first.
    pending: dict[int, list[tuple[int, int, float, float, float, float, float]]] = {}
    for frame in range(1, last_frame + 1):
        dets: list[Detection] = []
        if frame in per_frame:
            _, boxes, scores = per_frame[frame]
            dets = [Detection(Box(*map(float, b)), float(s)) for b, s in zip(boxes, scores)]
        for view in tracker.update(dets):
            b = view.box
            if view.state is TrackState.ENDED:
                pending.pop(view.track_id, None)
            elif view.detection_index is None:  # LOST: predicted only
                if backfill:
                    pending.setdefault(view.track_id, []).append((frame, view.track_id, b.x, b.y, b.w, b.h, 0.0))
            else:
                row = (frame, view.track_id, b.x, b.y, b.w, b.h, dets[view.detection_index].score)
                if view.state is TrackState.TENTATIVE:
                    if backfill:
                        pending.setdefault(view.track_id, []).append(row)
                else:
                    rows.extend(pending.pop(view.track_id, []))
                    rows.append(row)
    rows.sort(key=lambda r: (r[0], r[1]))
    return MotTable.from_rows(rows)


_score = float_between(0, what="a finite detection score")


def _score_or_none(text: str) -> float | str:
    """argparse type: a detection score >= 0, or "none" (every detection is a high one)."""
    if text.lower() == "none":
        return "none"
    try:
        return _score(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}, or none") from None


TRACKER_OPTIONS = ("min_hits", "max_age", "iou_threshold", "high_score")


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="tracker eval-mot", description="Run the tracker on MOTChallenge detections; score against ground truth.")
    p.add_argument("detections", type=path_to("a MOTChallenge detection file"), nargs="?",
                   help="MOTChallenge detection file: frame,-1,x,y,w,h,score,...")
    p.add_argument("--tracks", type=path_to("a MOTChallenge tracks file"),
                   help="score this MOTChallenge tracks file (another tracker's output) instead of tracking")
    p.add_argument("--gt", type=path_to("a MOTChallenge ground-truth file"), help="MOTChallenge ground truth; prints CLEAR-MOT and IDF1")
    p.add_argument("--out", type=path_to("a tracks file to write"), help="write the tracks here (MOTChallenge format)")
    p.add_argument("--config", type=config_path, help=f"YAML config whose tracking section gives the defaults ({CONFIG_DEFAULT})")
    p.add_argument("--min-hits", type=int_between(1, 100), help="default: the config's tracking.min_hits")
    p.add_argument("--max-age", type=int_between(1, 1000), help="default: the config's tracking.max_age")
    p.add_argument("--iou-threshold", type=float_between(0, 1), help="default: the config's tracking.iou_threshold")
    p.add_argument("--high-score", type=_score_or_none,
                   help="detections scoring below this only continue tracks (ByteTrack); none: every detection "
                        "may start one; default: the config's tracking.high_score")
    p.add_argument("--observation-centric", action=argparse.BooleanOptionalAction, default=None,
                   help="OC-SORT's recovery by the last observed box and re-update after a gap, or not (default: "
                        "the config's tracking.observation_centric)")
    p.add_argument("--no-backfill", action="store_true",
                   help="write only what an online tracker knows: no tentative frames of confirmed tracks, no predicted boxes in re-acquired gaps")
    return p


def _sequence_name(gt_path: Path) -> str:
    """MOTChallenge layouts are <seq>/gt/gt.txt and <seq>/gt.txt: name the sequence, not the file."""
    if gt_path.stem != "gt":
        return gt_path.stem
    folder = gt_path.resolve().parent
    if folder.name == "gt":
        folder = folder.parent
    return folder.name or gt_path.stem


def format_table(name: str, metrics: MotMetrics) -> str:
    """Two aligned lines: header and values, columns as in the README's reference table."""
    headers = ["seq"] + [h for h, _, _ in MotMetrics.COLUMNS]
    values = [name] + metrics.row()
    widths = [max(len(h), len(v)) for h, v in zip(headers, values)]

    def line(cells: list[str]) -> str:  # name left-aligned, numbers right-aligned
        return "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths)))

    return line(headers) + "\n" + line(values)


def eval_mot_command(argv: list[str]) -> int:
    """Entry point of `tracker eval-mot`; user mistakes raise InputError (exit 2 via the CLI)."""
    args = _parser().parse_args(argv)
    if args.detections is None and args.tracks is None:
        raise InputError("tracker eval-mot: expected a detections file to track, or --tracks FILE to score")
    if args.detections is not None and args.tracks is not None:
        raise InputError("tracker eval-mot: give a detections file to track or --tracks FILE to score, not both")
    if args.tracks is not None:
        given = [f"--{name.replace('_', '-')}" for name in TRACKER_OPTIONS if getattr(args, name) is not None]
        given += [flag for flag, on in (("--no-backfill", args.no_backfill), ("--out", args.out is not None),
                                        ("--config", args.config is not None),
                                        ("--[no-]observation-centric", args.observation_centric is not None)) if on]
        if args.gt is None or given:
            raise InputError(f"tracker eval-mot --tracks: scores a finished tracks file against --gt; "
                             f"{'--gt is missing' if args.gt is None else ', '.join(given) + ' would change nothing'}")
    gt = read_mot(args.gt, "gt") if args.gt is not None else None
    if gt is not None and not len(gt):
        raise InputError(f"gt file {str(args.gt)!r}: no boxes to score against; expected at least one row with conf != 0")
    if args.tracks is not None:
        assert gt is not None  # --tracks without --gt was refused above
        tracks = read_mot(args.tracks, "tracks")
        print(format_table(_sequence_name(args.gt), evaluate(gt, tracks)))
        return 0
    from tracker.config import load_config

    settings = load_config(args.config).tracking
    overrides = {name: getattr(args, name) for name in TRACKER_OPTIONS if getattr(args, name) is not None}
    if overrides.get("high_score") == "none":
        overrides["high_score"] = None
    if args.observation_centric is not None:
        overrides["observation_centric"] = args.observation_centric
    if args.out is not None:
        refuse_overwriting(args.out, {"detections": args.detections, "ground-truth": args.gt, "config": args.config})
    detections = read_mot(args.detections, "detections")
    last_frame = max(detections.last_frame, gt.last_frame if gt is not None else 0)
    tracker = Tracker.from_config(settings, embedding_weight=0.0, reid_threshold=None, **overrides)
    tracks = track_detections(detections, tracker, last_frame, backfill=not args.no_backfill)

    if args.out is not None:
        write_mot(args.out, tracks)
    elif gt is None:
        sys.stdout.writelines(format_rows(tracks))
    n_ids = len(set(tracks.ids.tolist()))
    print(
        f"eval-mot: {last_frame} frames, {len(detections)} detections -> {n_ids} tracks, {len(tracks)} boxes"
        + (f" written to {args.out}" if args.out is not None else ""),
        file=sys.stderr,
    )
    if gt is not None:
        print(format_table(_sequence_name(args.gt), evaluate(gt, tracks)))
    return 0
