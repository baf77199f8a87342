#!/usr/bin/env python3
"""Soak test of the guard's memory: run `tracker --demo` for a while and watch its RSS.

    .venv/bin/python scripts/soak_demo.py [--duration 600] [--interval 5] [--warmup 180]
                                          [--backend caffe-openblas-dl] [--viewer] [--out soak.json]

Starts `tracker --demo` (the synthetic scene paced at 10 fps, the scene's people enrolled, the
chosen backend) in a child process with its state in a temporary directory (nothing touches
~/.local/state), samples the resident set size of the guard and of any child processes it starts
(a worker backend) every `interval` seconds with psutil, and stops it with SIGTERM after
`duration` seconds. It prints, and optionally writes as JSON:

    peak RSS             the largest sample, MB (1 MB = 2**20 bytes)
    RSS after warm-up    the median of the samples in the minute after `warmup` seconds, MB
    final RSS            the median of the last minute of samples, MB
    slope after warm-up  least-squares slope of RSS over the samples after warm-up, MB per hour
    frames, dropped      from the guard's latency log (frames processed, frames the capture
                         queue dropped because processing fell behind)

Warm-up: the guard's bounded buffers fill during the first minutes (the rolling latency window of
1000 frames takes 100 s at 10 fps, longer when frames are dropped; the scene's sprite cache two
cycles, 40 s), so growth is judged from 180 s on.

The issue's target: peak under 250 MB and no growth after warm-up. "No growth" is judged as
final - after-warm-up under 2 MB and a slope under 5 MB/hour (allocator noise is a few hundred kB);
the verdict is printed, the exit status is 0 unless the guard itself failed.

The guard serves its web page on a free loopback port; `--viewer` keeps one viewer on its live view
for the whole run (a client reading /live.mjpg as a browser does), and reports the frames it got.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from tracker.arguments import ArgumentParser, file_to_write, float_between, one_line_errors, words
from tracker.files import atomic_write
from tracker.machine import cpu_model

MB = 2**20
REPO = Path(__file__).resolve().parents[1]
TRACKER = Path(sys.executable).with_name("tracker")
TARGET_PEAK_MB = 250.0
GROWTH_MB = 2.0
SLOPE_MB_PER_H = 5.0
MIN_INTERVAL_S = 0.1  # --interval: reading the process tree's RSS is not free
MAX_DURATION_S = 7 * 86_400.0  # --duration, --warmup: a week; more is a typo, and a frame count that overflows
GUARD_FAILED = 1  # soak's exit status when the guard ended before --duration


def tree_rss(proc: psutil.Process) -> int:
    """RSS of `proc` plus its live descendants, bytes (0 once it has exited)."""
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t_s, mb) samples, MB per hour; 0.0 for fewer than 2 samples."""
    if len(samples) < 2:
        return 0.0
    ts = [t for t, _ in samples]
    ms = [m for _, m in samples]
    t_mean, m_mean = statistics.fmean(ts), statistics.fmean(ms)
    var = sum((t - t_mean) ** 2 for t in ts)
    if var == 0:
        return 0.0
    return sum((t - t_mean) * (m - m_mean) for t, m in zip(ts, ms)) / var * 3600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watch(port: int, stop: threading.Event, seen: dict) -> None:
    """One viewer of the page's live view until `stop`: a session, then /live.mjpg read as it
    comes; counts the JPEG parts in seen["frames"]."""
    cookie = None
    while cookie is None and not stop.wait(1.0):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", "/api/session")
            cookie = connection.getresponse().getheader("Set-Cookie", "").split(";")[0] or None
            connection.close()
        except OSError:
            continue  # the guard is still starting
    if cookie is None:
        return
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /live.mjpg HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {cookie}\r\n\r\n".encode())
        tail = b""
        while not stop.is_set():
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            data = tail + chunk
            seen["frames"] += data.count(b"--frame\r\n")
            tail = data[-16:]


def latency_summary(path: Path) -> dict:
    frames, dropped = 0, 0
    if path.exists():
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                frames += 1
                dropped = max(dropped, row["dropped"])
    return {"frames": frames, "dropped": dropped}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every one checked before the run (minutes): a bad one raises InputError."""
    ap = ArgumentParser(prog="soak_demo.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float_between(60, MAX_DURATION_S, what="a number of seconds"), default=600.0,
                    help="seconds to run (default 600)")
    # at most half a minute: the minute after warm-up gets two samples whatever their phase (one
    # every 61 s left it none, and its median was a StatisticsError after the run); at least
    # MIN_INTERVAL_S: 0 read the RSS in a busy loop
    ap.add_argument("--interval", type=float_between(MIN_INTERVAL_S, 30, what="a number of seconds"), default=5.0,
                    help="seconds between RSS samples (default 5)")
    ap.add_argument("--warmup", type=float_between(0, MAX_DURATION_S, what="a number of seconds"), default=180.0,
                    help="seconds before growth is judged (default 180)")
    ap.add_argument("--backend", type=words("a backend name"), default="caffe-openblas-dl")
    ap.add_argument("--viewer", action="store_true", help="keep one viewer on the web page's live view")
    ap.add_argument("--out", type=file_to_write("a JSON file to write in an existing folder"),
                    help="also write the result as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the state directory (logs, events)")
    args = ap.parse_args(argv)
    if args.warmup + 60.0 > args.duration:
        ap.error(f"--duration {args.duration:g}: shorter than --warmup {args.warmup:g} + 60 s; expected at least "
                 f"{args.warmup + 60:g} (one minute of samples after warm-up)")
    return args


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="tracker-soak-"))
    code = None
    try:
        code = soak(args, state)
        return code
    finally:  # an error's end too: the state folder is not left in /tmp, unless asked for or its log named
        if args.keep or code == GUARD_FAILED:
            print(f"state, logs and events kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


def soak(args: argparse.Namespace, state: Path) -> int:
    """The run with its state in `state`, and its report: 0, or GUARD_FAILED if the guard ended early."""
    config = state / "tracker.yaml"
    # No console lines: a long run would fill the pipe; the guard's own log goes to a file.
    port = free_port()
    config.write_text(f"state_dir: {json.dumps(str(state))}\nsinks:\n  console: false\n"
                      f"latency:\n  report_every_s: 60\nweb:\n  listen: 127.0.0.1:{port}\n", encoding="utf-8")
    frames = int(args.duration * 10 * 2)  # the demo's 10 fps, with room: SIGTERM ends the run
    command = [str(TRACKER), "--demo", "--backend", args.backend, "--config", str(config), "--frames", str(frames)]
    print("running:", " ".join(command), flush=True)
    with open(state / "guard.log", "w", encoding="utf-8") as log_file:
        child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)
        proc = psutil.Process(child.pid)
        stop, seen = threading.Event(), {"frames": 0}
        viewer = threading.Thread(target=watch, args=(port, stop, seen), daemon=True)
        if args.viewer:
            viewer.start()
        start = time.monotonic()
        samples: list[tuple[float, float]] = []
        try:
            while (t := time.monotonic() - start) < args.duration and child.poll() is None:
                rss = tree_rss(proc) / MB
                if rss:
                    samples.append((t, rss))
                    print(f"{t:7.1f} s  RSS {rss:7.1f} MB", flush=True)
                time.sleep(max(0.0, args.interval - (time.monotonic() - start - t)))
        finally:
            stop.set()
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                code = child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
    if code != 0 or t < args.duration:
        print(f"the guard exited with status {code} after {t:.0f} s; see {state / 'guard.log'}")
        return GUARD_FAILED

    after = [(t, m) for t, m in samples if t >= args.warmup]
    first_min = [m for t, m in after if t < args.warmup + 60.0]
    last_min = [m for t, m in after if t >= samples[-1][0] - 60.0]
    result = {
        "backend": args.backend,
        "viewer_frames": seen["frames"] if args.viewer else None,
        "duration_s": round(samples[-1][0], 1),
        "samples": len(samples),
        "peak_rss_mb": round(max(m for _, m in samples), 1),
        "rss_after_warmup_mb": round(statistics.median(first_min), 1),
        "final_rss_mb": round(statistics.median(last_min), 1),
        "slope_after_warmup_mb_per_h": round(slope_per_hour(after), 2),
        **latency_summary(state / "demo" / "latency.jsonl"),
        "machine": {"cpu": cpu_model(), "cores": psutil.cpu_count()},
    }
    growth = result["final_rss_mb"] - result["rss_after_warmup_mb"]
    ok_peak = result["peak_rss_mb"] < TARGET_PEAK_MB
    ok_growth = growth < GROWTH_MB and result["slope_after_warmup_mb_per_h"] < SLOPE_MB_PER_H
    print(f"\n{args.backend}, {result['duration_s']:.0f} s, {result['frames']} frames "
          f"({result['dropped']} dropped by the capture queue)"
          + (f"; one viewer of the live view got {seen['frames']} frames" if args.viewer else ""))
    print(f"peak RSS            {result['peak_rss_mb']:7.1f} MB   (target < {TARGET_PEAK_MB:.0f}: "
          f"{'ok' if ok_peak else 'OVER'})")
    print(f"RSS after warm-up   {result['rss_after_warmup_mb']:7.1f} MB   (median of the minute after {args.warmup:.0f} s)")
    print(f"final RSS           {result['final_rss_mb']:7.1f} MB   (median of the last minute; growth {growth:+.1f} MB)")
    print(f"slope after warm-up {result['slope_after_warmup_mb_per_h']:+7.2f} MB/h  "
          f"({'no growth' if ok_growth else 'GROWING'})")
    if args.out:
        atomic_write(args.out, json.dumps({**result, "rss_samples": samples}, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
