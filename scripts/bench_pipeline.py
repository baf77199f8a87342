#!/usr/bin/env python3
"""Pipeline benchmark: the whole guard on the synthetic scene, measured from its own latency log.

    .venv/bin/python scripts/bench_pipeline.py [--backend caffe-openblas-dl] [--frames 600]
                      [--width 640 --height 480] [--paced-fps 30 --paced-seconds 20] [--out bench.json]

Two runs of `tracker --demo` (the real CLI, the scene's people enrolled, default config otherwise,
state in a temporary directory):

1. Unpaced (`source.realtime: false`): the scene is rendered as fast as the guard takes frames,
   so the guard is never idle for lack of a frame and every frame is processed. From its latency
   log (one line per frame, README "How it works", "Latency log"):
   - frames per second = (frames - 1) / (end of the last frame - end of the first), where a
     frame's end is t_ns + total_ms;
   - per-stage p50/p95 over all frames (infer_ms also over backend calls, counted once per call);
   - the pipeline's own overhead, from the processing thread's wall time W = end of the last
     frame - start of the first (start = t_ns + capture_ms):
         overhead = W - sum(detect_ms) - sum(infer_ms of each backend call, once)
     i.e. everything but face detection and the CNN: motion gate, crops, batching, identity,
     tracking, events, sinks, the latency log itself and any wait for the next frame; printed
     as a percentage of W, split into the logged motion/track/publish and the unlogged rest.
   - waiting for frames: per frame, the gap between its start and the last thing the thread
     finished before (the previous frame's detection or any frame's publishing). An upper bound
     on time spent waiting for the capture thread (it also holds crops and batching).
2. Paced faster than the guard can follow (`--paced-fps`, realtime): the capture thread keeps
   the camera's schedule whatever processing does. From the log: frames dropped by the capture
   queue, the capture interval per captured frame (t_ns difference / seq difference between
   processed frames: equal to 1/fps when capture never waited on processing), and capture_ms,
   the age of a frame when processing took it (bounded by the queue length).

Speed figures for the README come from this script; it asserts nothing. Other processes on the
machine disturb the numbers: the load average before and after each run is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tracker.arguments import (
    MAX_BENCH_BATCH,
    ArgumentParser,
    file_to_write,
    float_between,
    int_between,
    one_line_errors,
    positive_int,
    words,
)
from tracker.files import atomic_write
from tracker.latency import STAGES
from tracker.machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
TRACKER = Path(sys.executable).with_name("tracker")


def run_demo(state: Path, frames: int, *, backend: str, width: int, height: int, realtime: bool, fps: float,
             max_batch: int | None, max_wait_ms: float | None, detect: dict | None = None) -> tuple[list[dict], dict]:
    """One `tracker --demo` run (`detect`: the config's detect section, default its defaults);
    returns its latency records and the run's conditions."""
    source = {"realtime": realtime, "width": width, "height": height, "fps": fps}
    batcher = {k: v for k, v in (("max_batch", max_batch), ("max_wait_ms", max_wait_ms)) if v is not None}
    config = {"state_dir": str(state), "source": source, "sinks": {"console": False}, "batcher": batcher,
              "latency": {"report_every_s": 3600}, "detect": detect or {}}
    path = state.with_suffix(".yaml")
    path.write_text(json.dumps(config), encoding="utf-8")
    command = [str(TRACKER), "--demo", "--backend", backend, "--frames", str(frames), "--config", str(path)]
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"bench_pipeline: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    log = state / "demo" / "latency.jsonl"
    rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return rows, {"command": " ".join(command), "wall_s": round(time.monotonic() - started, 1),
                  "load_before": [round(x, 2) for x in load_before],
                  "load_after": [round(x, 2) for x in os.getloadavg()]}


def backend_calls(rows: list[dict]) -> list[dict]:
    """One entry per backend call: the frames that shared it carry its `batch` (crop count) and
    `infer_ms`, are consecutive among frames with batch > 0, and their faces add up to batch."""
    calls, current = [], None
    for row in rows:
        if row["batch"] == 0:
            continue
        if current is None:
            current = {"batch": row["batch"], "infer_ms": row["infer_ms"], "frames": 0, "faces": 0}
        current["frames"] += 1
        current["faces"] += row["faces"]
        if current["faces"] >= current["batch"]:
            calls.append(current)
            current = None
    return calls


def percentiles(values) -> dict:
    values = np.asarray(list(values), dtype=np.float64)
    if values.size == 0:
        return {"p50": None, "p95": None}
    p50, p95 = np.percentile(values, [50, 95])
    return {"p50": round(float(p50), 3), "p95": round(float(p95), 3)}


def analyse_unpaced(rows: list[dict]) -> dict:
    start = [r["t_ns"] + r["capture_ms"] * 1e6 for r in rows]
    end = [r["t_ns"] + r["total_ms"] * 1e6 for r in rows]
    wall_ms = (end[-1] - start[0]) / 1e6
    calls = backend_calls(rows)
    detect = sum(r["detect_ms"] for r in rows)
    infer = sum(c["infer_ms"] for c in calls)
    motion = sum(r["motion_ms"] for r in rows)
    track = sum(r["track_ms"] for r in rows)
    publish = sum(r["publish_ms"] for r in rows)
    overhead = wall_ms - detect - infer
    # Gaps: from the last thing the processing thread is known to have finished to a frame's start.
    gaps, ends_sorted, j = [], sorted(end), 0
    for k in range(1, len(rows)):
        prev = rows[k - 1]
        front_end = start[k - 1] + (prev["motion_ms"] + prev["detect_ms"]) * 1e6
        while j < len(ends_sorted) and ends_sorted[j] <= start[k]:
            j += 1
        last_end = ends_sorted[j - 1] if j else 0
        gaps.append(max(0.0, (start[k] - max(front_end, last_end)) / 1e6))
    n = len(rows)
    return {
        "frames": n,
        "fps": round((n - 1) / ((end[-1] - end[0]) / 1e9), 2),
        "frame_time_ms": round(wall_ms / n, 2),
        "stages": {s: percentiles(r[s] for r in rows) for s in STAGES},
        "infer_ms_per_call": percentiles(c["infer_ms"] for c in calls),
        "calls": len(calls),
        "crops": sum(c["batch"] for c in calls),
        "frames_with_detection": sum(r["detect_ms"] > 0.05 for r in rows),
        "share_pct": {
            "detect": round(100 * detect / wall_ms, 1),
            "infer": round(100 * infer / wall_ms, 1),
            "overhead": round(100 * overhead / wall_ms, 1),
            "overhead_motion": round(100 * motion / wall_ms, 2),
            "overhead_track": round(100 * track / wall_ms, 2),
            "overhead_publish": round(100 * publish / wall_ms, 2),
            "overhead_unlogged": round(100 * (overhead - motion - track - publish) / wall_ms, 2),
        },
        "gap_ms": {**percentiles(gaps), "sum": round(sum(gaps), 1),
                   "pct_of_wall": round(100 * sum(gaps) / wall_ms, 2)},
        "dropped": rows[-1]["dropped"],
    }


def analyse_paced(rows: list[dict], fps: float, queue_size: int) -> dict:
    intervals = [(b["t_ns"] - a["t_ns"]) / 1e6 / (b["seq"] - a["seq"]) for a, b in zip(rows, rows[1:])]
    captured = rows[-1]["seq"] + 1
    return {
        "fps_requested": fps,
        "captured": captured,
        "processed": len(rows),
        "dropped": rows[-1]["dropped"],
        "capture_interval_ms": {**percentiles(intervals), "expected": round(1000 / fps, 2)},
        "capture_ms": {**percentiles(r["capture_ms"] for r in rows), "max": round(max(r["capture_ms"] for r in rows), 1),
                       "queue_bound_ms": round(1000 * queue_size / fps, 1)},
        "processing_fps": round((len(rows) - 1) / ((rows[-1]["t_ns"] + rows[-1]["total_ms"] * 1e6
                                                   - rows[0]["t_ns"] - rows[0]["total_ms"] * 1e6) / 1e9), 2),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every one checked before the runs (minutes): a bad one raises InputError."""
    ap = ArgumentParser(prog="bench_pipeline.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", type=words("a backend name"), default="caffe-openblas-dl")
    # two frames at least: fps is over the time between the first frame's end and the last's
    ap.add_argument("--frames", type=int_between(2), default=600, help="frames of the unpaced run (default 600: 3 scene cycles)")
    ap.add_argument("--width", type=positive_int, default=640)
    ap.add_argument("--height", type=positive_int, default=480)
    ap.add_argument("--max-batch", type=int_between(1, MAX_BENCH_BATCH), help="batcher.max_batch (default: the config's)")
    ap.add_argument("--max-wait-ms", type=float_between(0, what="a number of ms"), help="batcher.max_wait_ms (default: the config's)")
    ap.add_argument("--paced-fps", type=float_between(0, what="a number of frames per second"), default=30.0,
                    help="capture rate of the paced run (0: skip it)")
    ap.add_argument("--paced-seconds", type=float_between(0, above_low=True, what="a number of seconds"), default=20.0)
    ap.add_argument("--compare-haar", action="store_true",
                    help="also run unpaced with the former detector (Haar at 640 px, whole frames) and compare fps")
    ap.add_argument("--out", type=file_to_write("a JSON file to write in an existing folder"),
                    help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if args.paced_fps > 0 and int(args.paced_fps * args.paced_seconds) < 2:
        ap.error(f"--paced-fps {args.paced_fps:g} for --paced-seconds {args.paced_seconds:g}: fewer than 2 frames; "
                 "expected a paced run of 2 frames or more (or --paced-fps 0 to skip it)")
    return args


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    from tracker.config import SourceConfig

    queue_size = SourceConfig().queue_size
    result = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "arch": platform.machine()},
              "backend": args.backend, "size": f"{args.width}x{args.height}"}
    with tempfile.TemporaryDirectory(prefix="tracker-bench-") as tmp:
        rows, cond = run_demo(Path(tmp) / "unpaced", args.frames, backend=args.backend, width=args.width,
                              height=args.height, realtime=False, fps=10.0, max_batch=args.max_batch,
                              max_wait_ms=args.max_wait_ms)
        result["unpaced"] = {**analyse_unpaced(rows), "run": cond}
        if args.compare_haar:
            haar = {"detector": "haar", "detect_width": 640, "regions": False}
            rows, cond = run_demo(Path(tmp) / "haar", args.frames, backend=args.backend, width=args.width,
                                  height=args.height, realtime=False, fps=10.0, max_batch=args.max_batch,
                                  max_wait_ms=args.max_wait_ms, detect=haar)
            result["unpaced_haar"] = {**analyse_unpaced(rows), "run": cond, "detect": haar}
        if args.paced_fps > 0:
            frames = int(args.paced_fps * args.paced_seconds)
            rows, cond = run_demo(Path(tmp) / "paced", frames, backend=args.backend, width=args.width,
                                  height=args.height, realtime=True, fps=args.paced_fps,
                                  max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
            result["paced"] = {**analyse_paced(rows, args.paced_fps, queue_size), "run": cond}

    u = result["unpaced"]
    print(f"machine: {result['machine']['cpu']}, {result['machine']['cores']} cores ({result['machine']['arch']})")
    print(f"backend {args.backend}, scene {result['size']}, unpaced, {u['frames']} frames "
          f"({u['frames_with_detection']} with detection, {u['crops']} crops in {u['calls']} backend calls); "
          f"load average {u['run']['load_before'][0]} -> {u['run']['load_after'][0]}")
    print(f"  {u['fps']:.2f} frames/s, {u['frame_time_ms']:.1f} ms per frame")
    print("  stage        p50 ms    p95 ms")
    for stage, p in u["stages"].items():
        print(f"  {stage[:-3]:<10} {p['p50']:8.2f}  {p['p95']:8.2f}")
    pc = u["infer_ms_per_call"]
    if pc["p50"] is not None:
        print(f"  infer/call {pc['p50']:8.2f}  {pc['p95']:8.2f}")
    s = u["share_pct"]
    print(f"  share of the processing thread's time: detect {s['detect']}%, infer {s['infer']}%, "
          f"pipeline overhead {s['overhead']}% (motion {s['overhead_motion']}%, track {s['overhead_track']}%, "
          f"publish {s['overhead_publish']}%, crops/batching/identity/log/hand-off {s['overhead_unlogged']}%)"
          f"  [target <= 10%: {'met' if s['overhead'] <= 10 else 'NOT met'}]")
    g = u["gap_ms"]
    print(f"  between frames (upper bound on waiting for capture): p50 {g['p50']} ms, p95 {g['p95']} ms, "
          f"{g['pct_of_wall']}% of the time")
    if "unpaced_haar" in result:
        h = result["unpaced_haar"]
        print(f"  the same with Haar at 640 px, whole frames: {h['fps']:.2f} frames/s, detect p50/p95 "
              f"{h['stages']['detect_ms']['p50']:.2f}/{h['stages']['detect_ms']['p95']:.2f} ms "
              f"(default detector: {u['fps'] / h['fps']:.2f}x the frame rate); load average "
              f"{h['run']['load_before'][0]} -> {h['run']['load_after'][0]}")
    if "paced" in result:
        p = result["paced"]
        ci, cm = p["capture_interval_ms"], p["capture_ms"]
        print(f"paced at {p['fps_requested']:g} fps for {args.paced_seconds:g} s: {p['captured']} captured, "
              f"{p['processed']} processed ({p['processing_fps']} fps), {p['dropped']} dropped by the capture queue; "
              f"load average {p['run']['load_before'][0]} -> {p['run']['load_after'][0]}")
        print(f"  capture interval per captured frame p50 {ci['p50']} ms, p95 {ci['p95']} ms "
              f"(schedule {ci['expected']} ms: capture kept its pace while processing lagged)")
        print(f"  frame age when processing took it (capture_ms) p50 {cm['p50']} ms, p95 {cm['p95']} ms, "
              f"max {cm['max']} ms (the queue holds {queue_size} frames = {cm['queue_bound_ms']} ms, plus the "
              "frame being processed when it filled)")
    if args.out:
        atomic_write(args.out, json.dumps(result, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
