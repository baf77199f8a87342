#!/usr/bin/env python3
"""Time the capture-side stages on the synthetic scene at 640x480 (or --size): scene rendering,
the motion gate, Haar detection (whole frame at several detect widths, and inside the motion
gate's regions) and the 88x88 crops. Prints median and 95th percentile milliseconds per frame.

    .venv/bin/python scripts/time_detect_motion.py [--frames 200] [--size 640x480] [--threads N]

Single process, frames in scene order (the motion gate needs consecutive frames). --threads sets
OpenCV's worker threads (default: OpenCV's own choice, all cores).
"""

from __future__ import annotations

import argparse
import platform
import time

import cv2
import numpy as np

from tracker.config import DetectConfig, MotionConfig
from tracker.crops import crop_batch
from tracker.detect import HaarDetector
from tracker.motion import MotionGate
from tracker.sources.synthetic import SyntheticScene


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--size", default="640x480")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    if args.threads is not None:
        cv2.setNumThreads(args.threads)
    scene = SyntheticScene(width, height, fps=10.0, seed=args.seed)
    gate = MotionGate.from_config(MotionConfig())
    default = DetectConfig()
    detectors = {w: HaarDetector.from_config(default.model_copy(update={"detect_width": w})) for w in (width, 320, 160)}
    times: dict[str, list[float]] = {}

    def timed(name, fn, *a, **k):
        t0 = time.perf_counter()
        result = fn(*a, **k)
        times.setdefault(name, []).append((time.perf_counter() - t0) * 1000.0)
        return result

    faces = 0
    for n in range(args.frames):
        image, _ = timed("render synthetic frame", scene.render, n)
        motion = timed(f"motion gate ({MotionConfig().downscale_width} px wide)", gate.update, image)
        found = []
        for w, detector in detectors.items():
            result = timed(f"detect whole frame, detect_width {w}", detector.detect, image)
            if w == width:
                found = result
        if motion.moving:
            timed(f"detect in motion regions, detect_width {width}", detectors[width].detect, image, motion.regions)
        faces += len(found)
        if found:
            timed("crops, per face (88x88 float32)", lambda image=image, found=found: crop_batch(image, [d.box for d in found]))
            times["crops, per face (88x88 float32)"][-1] /= len(found)
    print(f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()} "
          f"opencv {cv2.__version__} threads {cv2.getNumThreads()}; {args.frames} frames {width}x{height}, {faces} faces")
    print(f"{'stage':48s} {'calls':>6s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for name, values in times.items():
        v = np.array(values)
        print(f"{name:48s} {len(v):6d} {np.percentile(v, 50):8.2f} {np.percentile(v, 95):8.2f}")


if __name__ == "__main__":
    main()
