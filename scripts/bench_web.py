#!/usr/bin/env python3
"""What one viewer of the web page's live view costs the guard: its processing loop's frame rate
with one viewer against none.

    .venv/bin/python scripts/bench_web.py [--frames 1500] [--repeats 3] [--backend caffe-openblas-dl]
                                          [--out bench-web.json]

Runs `tracker --demo` unpaced (`source.realtime: false`: the loop never waits for a frame, so its
frame rate is what the guard can do), alternately without a viewer and with one (soak_demo.watch:
a client reading /live.mjpg as a browser does, so the page draws and encodes a frame at its
`stream_fps`, 5 by default), `--repeats` times each, interleaved so that a change in the
machine's load hits both. Each run's frame rate comes from its latency log as bench_pipeline.py
computes it, over the frames after the first SKIP_FRAMES (150: the page starting, the viewer
connecting, the backend warming up), with or without the viewer alike. Prints both medians and their ratio, and the load average around the
runs. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench_pipeline import analyse_unpaced
from soak_demo import free_port, watch

from tracker.arguments import ArgumentParser, file_to_write, int_between, one_line_errors, positive_int, words
from tracker.files import atomic_write
from tracker.machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
TRACKER = Path(sys.executable).with_name("tracker")
SKIP_FRAMES = 150  # the first frames: the page starting, the viewer connecting, the backend warming up


def run(frames: int, backend: str, viewer: bool) -> dict:
    """One unpaced demo run; its frame rate after SKIP_FRAMES, and the frames the viewer got."""
    with tempfile.TemporaryDirectory(prefix="tracker-bench-web-") as tmp:
        state, port = Path(tmp), free_port()
        config = {"state_dir": str(state), "source": {"realtime": False}, "sinks": {"console": False},
                  "latency": {"report_every_s": 3600}, "web": {"listen": f"127.0.0.1:{port}"}}
        (state / "tracker.yaml").write_text(json.dumps(config), encoding="utf-8")
        command = [str(TRACKER), "--demo", "--backend", backend, "--frames", str(frames), "--config",
                   str(state / "tracker.yaml")]
        stop, seen = threading.Event(), {"frames": 0}
        watcher = threading.Thread(target=watch, args=(port, stop, seen), daemon=True)
        if viewer:
            watcher.start()
        proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        stop.set()
        if proc.returncode != 0:
            sys.exit(f"bench_web: {' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in (state / "demo" / "latency.jsonl").read_text(encoding="utf-8").splitlines()]
    return {"viewer": viewer, "fps": analyse_unpaced(rows[SKIP_FRAMES:])["fps"], "viewer_frames": seen["frames"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every one checked before the runs (minutes): a bad one raises InputError."""
    ap = ArgumentParser(prog="bench_web.py", description=__doc__.split("\n\n")[0])
    # 100 frames at least after the SKIP_FRAMES left out of each run's frame rate
    ap.add_argument("--frames", type=int_between(SKIP_FRAMES + 101), default=1500)
    ap.add_argument("--repeats", type=positive_int, default=3)  # a median of none was a StatisticsError at the end
    ap.add_argument("--backend", type=words("a backend name"), default="caffe-openblas-dl")
    ap.add_argument("--out", type=file_to_write("a JSON file to write in an existing folder"))
    return ap.parse_args(argv)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = []
    for k in range(args.repeats):
        for viewer in (False, True):
            runs.append(run(args.frames, args.backend, viewer))
            print(f"run {k + 1}, {'one viewer' if viewer else 'no viewer '}: {runs[-1]['fps']:.1f} frames/s"
                  + (f" ({runs[-1]['viewer_frames']} frames streamed)" if viewer else ""), flush=True)
    alone = statistics.median(r["fps"] for r in runs if not r["viewer"])
    watched = statistics.median(r["fps"] for r in runs if r["viewer"])
    result = {"cpu": cpu_model(), "cores": os.cpu_count(), "backend": args.backend, "frames": args.frames,
              "load_average_before": load_before, "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "fps_no_viewer": alone, "fps_one_viewer": watched, "ratio": round(watched / alone, 3), "runs": runs}
    print(f"median frames/s: {alone:.1f} without a viewer, {watched:.1f} with one: {100 * watched / alone:.1f}% "
          f"(load average {load_before} before, {result['load_average_after']} after; {result['cpu']})")
    if args.out:
        atomic_write(args.out, (json.dumps(result, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
